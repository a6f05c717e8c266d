"""keras_ipu.addons: Graphcore's `ipu_tensorflow_addons` package, which the
import hook makes importable under that name (keras_ipu/_hook.py,
MODULE_ALIASES) when the real package is not installed:

- `ipu_tensorflow_addons.keras.layers` is keras_ipu.layers (the IPU Keras
  layers), `ipu_tensorflow_addons.keras.optimizers` keras_ipu.optimizers
  (AdamIpuOptimizer, LAMBIpuOptimizer, SGDIpuOptimizer);
- `ipu_tensorflow_addons.v1.layers` (TensorFlow 1 graph-mode Popnn RNN
  layers) names its classes, which raise NotImplementedError saying so.
"""

from keras_ipu._lazy_modules import lazy_submodules as _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, ("keras", "v1"))
