"""keras_ipu.ops: the `tensorflow.python.ipu.ops` namespace (pipelining_ops,
...), imported on first use."""

import importlib as _importlib

_LAZY_SUBMODULES = frozenset({"pipelining_ops"})


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        module = _importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY_SUBMODULES)
