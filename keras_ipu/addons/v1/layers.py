"""`ipu_tensorflow_addons.v1.layers`: Graphcore's TensorFlow 1 Popnn RNN
layers, which keras_ipu does not provide. They are graph-mode layers
(time-major inputs, called inside a tf.compat.v1 graph or an
ipu_compiler.compile computation, lowered to PopLibs' RNN ops by
Graphcore's XLA backend); the TensorFlow front end imports standard HLO
only. Each class here raises NotImplementedError naming the replacement.
"""

from keras_ipu._unavailable import unavailable_class

_REASON = (
    "the TensorFlow 1 graph-mode Popnn RNN layers of ipu_tensorflow_addons.v1 "
    "are not provided (they lower to PopLibs RNN ops, which the TensorFlow front "
    "end cannot import); use the Keras layers keras_ipu.layers.PopnnLSTM / "
    "PopnnGRU (ipu_tensorflow_addons.keras.layers) on batch-major data, or "
    "tf.keras.layers.LSTM / GRU inside the compiled function."
)

PopnnLSTM = unavailable_class("addons.v1.layers.PopnnLSTM", _REASON)
PopnnDynamicLSTM = unavailable_class("addons.v1.layers.PopnnDynamicLSTM", _REASON)
PopnnGRU = unavailable_class("addons.v1.layers.PopnnGRU", _REASON)
PopnnDynamicGRU = unavailable_class("addons.v1.layers.PopnnDynamicGRU", _REASON)
PopnnAUGRU = unavailable_class("addons.v1.layers.PopnnAUGRU", _REASON)
