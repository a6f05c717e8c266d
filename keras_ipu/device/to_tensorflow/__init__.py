"""keras_ipu IR -> TensorFlow ops (one rule per primitive, as jax2tf).

`emit_graph(graph, inputs, mode)` emits a Graph inside the caller's
TensorFlow context, for XLA (`mode="xla"`) or for TensorFlow's graph
runtime (`mode="graph"`); `missing_rules(graph, mode)` names the
primitives that have no rule. Importing this package imports TensorFlow:
only the XLA and TensorFlow engines (compiler/engines.py) and exporters
import it, when they are used.
"""

from keras_ipu.device.to_tensorflow.emitter import MODE_RULES  # noqa: F401
from keras_ipu.device.to_tensorflow.emitter import MODES  # noqa: F401
from keras_ipu.device.to_tensorflow.emitter import RULES  # noqa: F401
from keras_ipu.device.to_tensorflow.emitter import EmitError  # noqa: F401
from keras_ipu.device.to_tensorflow.emitter import emit_graph  # noqa: F401
from keras_ipu.device.to_tensorflow.emitter import missing_rules  # noqa: F401
# The rules, registered once the emitter is (each module decorates its
# functions with emitter.rule, xla_rule or graph_rule).
from keras_ipu.device.to_tensorflow import array_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import contraction_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import control_flow_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import elementwise_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import graph_array_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import graph_contraction_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import pooling_rules  # noqa: F401,E402
from keras_ipu.device.to_tensorflow import random_rules  # noqa: F401,E402
