"""keras_ipu.sharding: Graphcore's `tensorflow.python.ipu.sharding`.

Utilities over a TensorFlow graph's sharding marks: the `_XlaSharding`
attribute `scopes.ipu_shard` puts on the ops made in its scope (an XLA
OpSharding naming the IPU). They read and copy the marks (propagate_sharding
for the colocated gradient ops of tf.gradients, which ShardedOptimizer
uses; enable_sharded_gradient_tape for tf.GradientTape's); what the
simulator does with a sharded TensorFlow program is scopes.ipu_shard's
business.
"""

XLA_SHARDING = "_XlaSharding"

# -- tf.GradientTape's backward ops on their forward op's shard ---------------


def enable_sharded_gradient_tape():
    """Make the backward ops `tf.GradientTape` builds inherit the sharding
    (scopes.ipu_shard's mark) of the forward op they differentiate, so that
    a sharded program's backward pass runs on the forward pass's IPUs.

    As Graphcore's: the sharding in scope when an op is recorded on a tape
    travels with the op's recorded attributes, and its gradient function
    runs inside an attribute scope of that sharding. This replaces
    TensorFlow's gradient recording for the process (eager execution is
    unchanged: sharding applies to traced functions only). The front end's
    importer then reads each backward op's shard from its HLO, as for any
    marked op (keras_ipu/frontends/tensorflow/importer.py), and the
    program compiles with it on that IPU."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import execute

    # The gradient function TensorFlow registers, then ours around it.
    pywrap_tfe.TFE_Py_RegisterGradientFunction(_sharded_gradient_function)
    execute.record_gradient = _record_gradient_with_sharding


def _sharding_supported():
    from tensorflow.python.eager import context

    # Sharding marks ops of a traced graph; eager ops run as they come.
    return not context.executing_eagerly()


def _record_gradient_with_sharding(op_name, inputs, attrs, *args, **kwargs):
    from tensorflow.python.eager import backprop
    from tensorflow.python.framework import ops

    # A pipeline stage's backward pass is placed by its stage, not marked.
    if _sharding_supported() and op_name != "PipelineStage":
        scoped = ops.get_default_graph()._attr_scope_map  # noqa: SLF001 - ipu_shard's scope
        shard = scoped.get(XLA_SHARDING)
        if shard:
            attrs = (attrs or ()) + (XLA_SHARDING, shard)
    return backprop.record_gradient(op_name, inputs, attrs, *args, **kwargs)


def _sharded_gradient_function(op_name, attr_tuple, *args, **kwargs):
    from tensorflow.python.eager import backprop
    from tensorflow.python.framework import ops

    scope = {}
    if _sharding_supported() and len(attr_tuple) >= 2 and attr_tuple[-2] == XLA_SHARDING:
        scope[XLA_SHARDING] = attr_tuple[-1]
        attr_tuple = attr_tuple[:-2]
    with ops.get_default_graph()._attr_scope(scope):  # noqa: SLF001 - TensorFlow's op attribute scope
        return backprop._gradient_function(op_name, attr_tuple, *args, **kwargs)  # noqa: SLF001


# -- utilities over a graph's sharding marks ------------------------------------


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
