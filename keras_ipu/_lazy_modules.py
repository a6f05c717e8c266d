"""Submodules a package imports on first attribute access.

`import keras_ipu` must stay light (no TensorFlow, no MPI: DESIGN decision
8), yet `keras_ipu.ops.nn_ops` or `keras_ipu.distributed.popdist_strategy`
must work as attributes, as in Graphcore's namespaces: the packages that
face users list their heavy submodules and get their module `__getattr__`
and `__dir__` (PEP 562) from here.
"""

import importlib
import sys


def lazy_submodules(package, names):
    """(__getattr__, __dir__) for `package` (its __name__) whose submodules
    `names` are imported when first read as attributes."""
    names = frozenset(names)

    def __getattr__(name):
        if name in names:
            module = importlib.import_module(f"{package}.{name}")
            setattr(sys.modules[package], name, module)
            return module
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | names)

    return __getattr__, __dir__
