import os
import sys

_TESTS = os.path.dirname(os.path.dirname(__file__))
# The hand-built graph helpers of the simulator tests; the placed training
# step of the compiler tests (two_ipu_step).
sys.path.insert(0, os.path.join(_TESTS, "simulator"))
sys.path.insert(0, os.path.join(_TESTS, "compiler"))
