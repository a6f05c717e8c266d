"""XLA frontend attributes on TensorFlow ops: how TensorFlow code tells the
importer something about an op.

TensorFlow copies an op's `_XlaFrontendAttributes` attribute onto every
HLO instruction the op lowers to. The front end uses that channel for what
XLA has no words for: which host stream a send/recv belongs to (feeds.py),
which instructions run on the host (outside compilation), and Graphcore's
own `scopes.frontend_attribute`.
"""

import contextlib

OUTSIDE_COMPILATION = "_keras_ipu_outside_compilation"
_ATTR = "_XlaFrontendAttributes"


def _current(graph):
    from tensorflow.compiler.xla import xla_data_pb2

    attrs = xla_data_pb2.FrontendAttributes()
    value = graph._attr_scope_map.get(_ATTR)  # noqa: SLF001 - TensorFlow's own scope map
    if value is not None and not callable(value):
        attrs.ParseFromString(value.s)
    return attrs


def current_attributes():
    """The frontend attributes ops made now get (a dict)."""
    from tensorflow.python.framework import ops

    return dict(_current(ops.get_default_graph()).map)


@contextlib.contextmanager
def frontend_attributes(values, restore_to=None):
    """Ops made inside get the attributes `values` (name -> string), on top
    of the ones already in force. `restore_to` (name -> string): what an
    attribute that was unset becomes after the scope, as Graphcore's
    `frontend_attribute(..., restore_to=)` does; otherwise the previous
    attributes come back."""
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    before = _current(graph)
    attrs = type(before)()
    attrs.CopyFrom(before)
    for name, value in values.items():
        attrs.map[str(name)] = str(value)
    with graph._attr_scope({_ATTR: attr_value_pb2.AttrValue(s=attrs.SerializeToString())}):  # noqa: SLF001
        yield
    if restore_to:
        after = type(before)()
        after.CopyFrom(before)
        for name, value in restore_to.items():
            if name not in before.map:
                after.map[str(name)] = str(value)
        graph._attr_scope_map[_ATTR] = attr_value_pb2.AttrValue(s=after.SerializeToString())  # noqa: SLF001
