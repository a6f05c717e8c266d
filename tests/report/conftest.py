import os
import sys

# The hand-built graph helpers of the simulator tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "simulator"))
