"""The import rules, one per HLO opcode, by family. Importing this package
registers them in importer.RULES."""

from keras_ipu.frontends.tensorflow.opcodes import collectives  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import control  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import effects  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import elementwise  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import indexing  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import linalg  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import reductions  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import shapes  # noqa: F401
from keras_ipu.frontends.tensorflow.opcodes import sort  # noqa: F401
