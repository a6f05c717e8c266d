import os
import sys

# The hand-built graph helpers of the compiler tests (compiler_graphs).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "compiler"))
