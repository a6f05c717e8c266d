import os
import sys

# The hand-built graph helpers sit beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
