"""keras_ipu.sharding: Graphcore's `tensorflow.python.ipu.sharding`.

Utilities over a TensorFlow graph's sharding marks: the `_XlaSharding`
attribute `scopes.ipu_shard` puts on the ops made in its scope (an XLA
OpSharding naming the IPU). They read and copy the marks; what the
simulator does with a sharded TensorFlow program is scopes.ipu_shard's
business.
"""

from keras_ipu._unavailable import unavailable_function

XLA_SHARDING = "_XlaSharding"

enable_sharded_gradient_tape = unavailable_function(
    "sharding.enable_sharded_gradient_tape",
    "it makes tf.GradientTape copy a forward op's sharding onto its backward "
    "ops by replacing TensorFlow's private gradient recording "
    "(pywrap_tfe.TFE_Py_RegisterGradientFunction, execute.record_gradient), "
    "which keras_ipu does not patch; in a tf.function use "
    "sharding.propagate_sharding(graph) after building the gradients.")


def has_attr(o, attr_name):
    """Whether operation `o` has the attribute `attr_name`."""
    return attr_name in o.node_def.attr


def get_sharding(op):
    """The IPUs (shard indices) `op` is marked for, or None."""
    from tensorflow.compiler.xla import xla_data_pb2

    if not has_attr(op, XLA_SHARDING):
        return None
    proto = xla_data_pb2.OpSharding()
    proto.ParseFromString(op.get_attr(XLA_SHARDING))
    return list(proto.tile_assignment_devices)


def dependencies(roots):
    """Every operation the root operations (or tensors) depend on, through
    their inputs and control inputs, the roots included."""
    import tensorflow as tf

    seen = set()
    work = [r.op if isinstance(r, tf.Tensor) else r for r in roots]
    while work:
        op = work.pop()
        if op in seen:
            continue
        seen.add(op)
        work.extend(t.op for t in op.inputs)
        work.extend(op.control_inputs)
    return seen


def get_shard_from_colocation(op):
    """The serialized sharding of an op `op` is co-located with (its
    `_class` groups, as TensorFlow marks a gradient op with its forward op),
    else of the first of its inputs' ops that has one; None otherwise."""
    graph = op.graph
    for group in op.colocation_groups():
        try:
            other = graph.get_operation_by_name(group.decode("utf-8")[len("loc:@"):])
        except KeyError:
            continue
        if has_attr(other, XLA_SHARDING):
            return other.get_attr(XLA_SHARDING)
    for tensor in op.inputs:
        if has_attr(tensor.op, XLA_SHARDING):
            return tensor.op.get_attr(XLA_SHARDING)
    return None


def propagate_sharding(g):
    """Give every co-located op of graph `g` that has no sharding the
    sharding of its co-location (get_shard_from_colocation), until nothing
    changes: backward ops follow their forward ops' IPUs."""
    from tensorflow.core.framework import attr_value_pb2

    changed = True
    while changed:
        changed = False
        for op in g.get_operations():
            if not has_attr(op, "_class") or has_attr(op, XLA_SHARDING):
                continue
            sharding = get_shard_from_colocation(op)
            if sharding is not None:
                op._set_attr(XLA_SHARDING, attr_value_pb2.AttrValue(s=sharding))  # noqa: SLF001 - TensorFlow's only attribute setter
                changed = True
