import sys

from keras_ipu.poprun.launcher import main

sys.exit(main())
