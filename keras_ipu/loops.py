"""tensorflow.python.ipu.loops: on-device loops for TensorFlow code compiled
for the IPU.

The loop is a TensorFlow while loop inside the function being compiled, so
XLA lowers it to one HLO `while` and the whole loop runs in one program on
the simulated IPU. With an infeed queue, each iteration dequeues one element
and passes it to the body after the loop-carried values (a dict element as
keyword arguments).
"""


def _as_list(xs):
    if xs is None:
        return []
    if isinstance(xs, (list, tuple)):
        return list(xs)
    return [xs]


def _check_context(what):
    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    if not tracing_for_ipu():
        raise ValueError(
            f"{what} builds an on-device loop and can only be used inside a "
            "function compiled for the IPU: call it from the function passed "
            "to IPUStrategy.run, or from a computation passed to "
            "ipu_compiler.compile."
        )


def _arity_error(kind, fn, arity, inputs, infeed_queue, condition=False):
    from tensorflow.python.compiler.xla import xla

    error = xla.check_function_argument_count(fn, arity, None if condition else infeed_queue)
    if error is None:
        return None
    if infeed_queue is None:
        return TypeError(
            f"Supplied loop {kind} function cannot be called with the specified "
            f"inputs. You specified {arity} inputs: {inputs}, but the loop {kind} "
            f"needs {error}.")
    if condition:
        return TypeError(
            f"Supplied loop condition function cannot be called with the specified "
            f"inputs. You specified {arity} inputs: {inputs}, but the loop condition "
            f"needs {error}. Note that infeed is not passed to the loop condition.")
    return TypeError(
        f"Supplied loop body function cannot be called with the specified inputs. "
        f"You specified {arity} inputs: {inputs} and "
        f"{infeed_queue.number_of_tuple_elements} additional inputs from infeed, "
        f"but the computation needs {error}.")


def _body_arguments(element):
    if isinstance(element, dict):
        return [], element
    return _as_list(element), {}


def while_loop(condition, body, inputs=None, infeed_queue=None,
               maximum_iterations=None, use_while_v1=True):
    """Builds a while loop for IPUs.

    `condition(*loop_values)` returns a boolean scalar; `body(*loop_values,
    *infeed_element)` returns the new loop values (tensors first, then any
    operations to run, such as an outfeed enqueue). Returns the final loop
    values.

    Raises:
      TypeError: if body or condition has the wrong signature.
    """
    import tensorflow as tf

    _check_context("loops.while_loop")
    inputs = [x if isinstance(x, tf.TensorArray) else tf.convert_to_tensor(x)
              for x in _as_list(inputs)]
    arity = len(inputs)
    for err in (_arity_error("body", body, arity, inputs, infeed_queue),
                _arity_error("condition", condition, arity, inputs, infeed_queue,
                             condition=True)):
        if err is not None:
            raise err
    in_types = [x.dtype for x in inputs]

    def cond_fn(*values):
        return condition(*(values if arity else ()))

    def body_fn(*values):
        values = list(values) if arity else []
        args, kwargs = _body_arguments(infeed_queue._dequeue() if infeed_queue else [])  # noqa: SLF001
        outputs = body(*(values + args), **kwargs)
        outputs = [o if isinstance(o, tf.Operation) else tf.convert_to_tensor(o)
                   for o in _as_list(outputs)]
        operations = [o for o in outputs if isinstance(o, tf.Operation)]
        tensors = [o for o in outputs if not isinstance(o, tf.Operation)]
        if outputs != tensors + operations:
            raise ValueError("IPU loop body must return zero or more Tensor values "
                             "followed by zero or more Operations.")
        out_types = [t.dtype for t in tensors]
        if out_types != in_types:
            raise TypeError("Mismatch between input types and output types for loop "
                            f"body: {in_types} vs {out_types}.")
        if not tensors:
            tensors = [tf.constant(0)]
        if operations:
            tensors = tf.tuple(tensors, control_inputs=operations)
        return tensors[0] if len(tensors) == 1 else tensors

    loop_vars = inputs if arity else [tf.constant(0)]
    outputs = tf.while_loop(cond_fn, body_fn, loop_vars,
                            maximum_iterations=maximum_iterations,
                            parallel_iterations=1)
    if infeed_queue is not None and not infeed_queue.dequeued:
        raise ValueError("The infeed queue has not been dequeued.")
    outputs = _as_list(outputs)
    if len(outputs) == 1:
        return outputs[0].op if not arity else outputs[0]
    return outputs


def repeat(n, body, inputs=None, infeed_queue=None, use_while_v1=True):
    """Builds a loop that runs `body` `n` times (see while_loop).

    Raises:
      ValueError: if there is a type error.
      TypeError: if body has the wrong signature.
    """
    _check_context("loops.repeat")
    inputs = _as_list(inputs)
    err = _arity_error("body", body, len(inputs), inputs, infeed_queue)
    if err is not None:
        raise err
    import tensorflow as tf

    return while_loop(lambda *args: tf.constant(True), body, inputs=inputs,
                      infeed_queue=infeed_queue, maximum_iterations=n,
                      use_while_v1=use_while_v1)
