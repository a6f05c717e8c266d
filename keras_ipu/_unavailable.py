"""Names of Graphcore's API that keras_ipu does not provide.

Every name of the Python API reference exists at its attribute path under
keras_ipu (tests/compat/test_reference_names.py walks them). A name that
is not implemented is made here: calling it (or constructing it) raises
NotImplementedError with a sentence saying why, and it carries that
sentence as `__keras_ipu_unavailable__`, from which the test and the
README's list of unavailable names are checked.
"""

UNAVAILABLE = "__keras_ipu_unavailable__"
# The public path it was made for (a name reachable by two paths, such as
# keras_ipu.nn_ops.gelu and keras_ipu.ops.nn_ops.gelu, is listed once).
PATH = "__keras_ipu_path__"


# The reason of the names issue 12 (the compatibility modules) is to bring.
PLANNED = "not implemented yet (issue 12)."


def _message(name, reason):
    return f"{name} is not available in keras_ipu: {reason}"


def unavailable_function(name, reason):
    """A function called `name` (its public path) that raises
    NotImplementedError(reason)."""

    def function(*args, **kwargs):
        raise NotImplementedError(_message(name, reason))

    function.__name__ = name.rsplit(".", 1)[-1]
    function.__qualname__ = function.__name__
    function.__doc__ = f"Not available: {reason}"
    setattr(function, UNAVAILABLE, reason)
    setattr(function, PATH, name)
    return function


def unavailable_class(name, reason):
    """A class called `name` whose construction raises
    NotImplementedError(reason)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_message(name, reason))

    short = name.rsplit(".", 1)[-1]
    return type(short, (), {
        "__init__": __init__,
        "__doc__": f"Not available: {reason}",
        UNAVAILABLE: reason,
        PATH: name,
        "__module__": "keras_ipu." + name.rsplit(".", 1)[0] if "." in name else "keras_ipu",
    })


def reason_of(obj):
    """The reason `obj` is unavailable, or None when it is implemented."""
    return getattr(obj, UNAVAILABLE, None)


def path_of(obj):
    """The public path (under keras_ipu) an unavailable `obj` was made for."""
    return getattr(obj, PATH, None)


def declare_unavailable(namespace, module, reason, classes=(), functions=()):
    """Put the unavailable `classes` and `functions` of Graphcore's module
    `module` (its public path under keras_ipu, e.g. "embedding_ops") into
    `namespace` (that module's globals()): one list of the names a module
    lacks, each made once with its public path."""
    for name in classes:
        namespace[name] = unavailable_class(f"{module}.{name}", reason)
    for name in functions:
        namespace[name] = unavailable_function(f"{module}.{name}", reason)
