"""Values that depend on the iterations of the device loop an op runs in:
Graphcore's `internal_ops.get_current_iteration_counter` and
`internal_ops.fifo`, for TensorFlow code compiled through the front end.

- The iteration counter is the loop counter TensorFlow gives every
  while-loop body (while_v2's first loop variable, which XLA keeps as the
  HLO while's induction variable): 0, 1, ... in the innermost loop around
  the op (loops.repeat, a tf.range loop in IPUStrategy.run, a pipeline).
  The functional pipeline runs repeat_count x G micro-batches in one loop,
  so inside its stages the counter is taken modulo G: the gradient
  accumulation iteration, as Graphcore's pipeline counts it. Outside any
  loop the program's body runs once per execution: 0.
- A FIFO keeps its last `depth` values in a ring buffer that lives between
  iterations and executions: two resource variables (the buffer and the
  next slot), made for the n-th FIFO of a function and reused when
  TensorFlow traces the function again. Each run reads the slot's old
  value (x of `depth` runs before; zeros before that, where Graphcore says
  "unspecified") and writes x in its place. Like Graphcore's, no gradient
  flows through it.
"""

import threading
import weakref

from keras_ipu.ops import program_state

_fifos = {}
_calls = weakref.WeakKeyDictionary()  # a traced function's graph -> FIFOs made so far
_lock = threading.Lock()
_pipelines = threading.local()


def _innermost_loop_body():
    import tensorflow as tf
    from tensorflow.python.ops.control_flow_v2_func_graphs import WhileBodyFuncGraph

    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if isinstance(graph, WhileBodyFuncGraph):
            return graph
        graph = getattr(graph, "outer_graph", None)
    return None


class pipeline_iterations:
    """Context of a functional pipeline's loop body: its counter counts
    `count` gradient accumulation iterations, then starts again."""

    def __init__(self, count):
        self.count = count

    def __enter__(self):
        stack = getattr(_pipelines, "stack", None)
        if stack is None:
            stack = _pipelines.stack = []
        stack.append((_innermost_loop_body(), self.count))
        return self

    def __exit__(self, *exc):
        _pipelines.stack.pop()


def iteration_counter():
    """The iteration of the innermost loop around the caller (int32 scalar)."""
    import tensorflow as tf

    body = _innermost_loop_body()
    if body is None:
        return tf.constant(0, tf.int32)
    # The body's first input is while_v2's loop counter; in a branch or
    # function nested in the body TensorFlow captures it.
    counter = body.inputs[0]
    for graph, count in reversed(getattr(_pipelines, "stack", [])):
        if graph is body:
            return tf.math.floormod(counter, count)
    return tf.identity(counter)


def _outermost_graph():
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):
        graph = graph.outer_graph
    return graph


def _ring(x, depth):
    """The n-th FIFO the trace of a function makes gets the same variables
    on every trace of that function (TensorFlow traces a function in the
    same order each time; a variable made on a second trace is refused)."""
    import tensorflow as tf

    graph = _outermost_graph()
    with _lock:
        ordinal = _calls.get(graph, 0)
        _calls[graph] = ordinal + 1
        key = (getattr(graph, "name", ""), ordinal)
        shape = [depth] + x.shape.as_list()
        ring = _fifos.get(key)
        if ring is None or ring[0].shape.as_list() != shape or ring[0].dtype != x.dtype:
            # Made outside the function being traced, as tf.function lifts
            # variables.
            with tf.init_scope():
                ring = _fifos[key] = program_state.mark(
                    tf.Variable(tf.zeros(shape, x.dtype), trainable=False, name="fifo_buffer"),
                    tf.Variable(0, dtype=tf.int32, trainable=False, name="fifo_slot"))
    return ring


def fifo(x, depth):
    """`x` of `depth` runs before (see the module doc)."""
    import tensorflow as tf

    x = tf.stop_gradient(tf.convert_to_tensor(x))
    if not x.shape.is_fully_defined():
        raise ValueError(f"fifo needs a tensor of known shape, got {x.shape}.")
    buffer, slot = _ring(x, depth)
    index = slot.read_value()
    out = tf.gather(buffer, index)
    with tf.control_dependencies([out]):
        written = buffer.scatter_nd_update([[index]], x[None])
    with tf.control_dependencies([written]):
        advanced = slot.assign(tf.math.floormod(index + 1, depth))
    with tf.control_dependencies([advanced]):
        return tf.identity(out)
