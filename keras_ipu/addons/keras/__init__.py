"""`ipu_tensorflow_addons.keras`: its `layers` are keras_ipu.layers and its
`optimizers` keras_ipu.optimizers (one module under both names)."""

import importlib as _importlib

_MODULES = {"layers": "keras_ipu.layers", "optimizers": "keras_ipu.optimizers"}


def __getattr__(name):
    if name in _MODULES:
        return _importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'ipu_tensorflow_addons.keras' has no attribute {name!r}")
