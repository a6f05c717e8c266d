import os
import sys

_TESTS = os.path.dirname(os.path.dirname(__file__))
# The compiler tests' hand-built graph helpers (compiler_graphs) and placed
# training step (two_ipu_step).
sys.path.insert(0, os.path.join(_TESTS, "compiler"))
