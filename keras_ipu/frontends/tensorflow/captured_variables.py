"""The captured inputs of a traced TensorFlow function: its variables, read
before each bridged run and written after it, each in one TensorFlow call.

A training step captures hundreds of variables (ResNet-50 with momentum:
536). One eager op per variable costs about 30 us of TensorFlow's dispatch,
and a tf.function call about as much again in its own argument handling
(it hashes the function's type, captures included, on every call). So each
direction is one call of one traced TensorFlow graph, made directly on the
eager context with the graph's captured handles (`_GraphCall`): all reads
in one, all assignments of a program's updated variables in another.

The variables stay TensorFlow's: the values the run computed are assigned
before the bridged call returns, so anything that reads them afterwards
(Python, a checkpoint, another tf.function, tf.data threads) sees them.
Graphcore's SDK keeps variables on the IPU and copies them to the host only
when the host needs them; TensorFlow has no hook that would tell us when
the host needs them (a graph function reads a captured handle in C++), so
the values are handed over after every run instead, without a copy: the
executable allocates the arrays it returns aligned as TensorFlow's tensors
are (compiler/host_memory.py), and an AssignVariableOp adopts such an
array as the variable's buffer.
"""

import numpy as np

from keras_ipu.device.compiler.host_memory import ALIGN_MIN_BYTES


def is_variable(x):
    return hasattr(x, "handle") and hasattr(x, "assign") and hasattr(x, "read_value")


def is_resource(x):
    dtype = getattr(x, "dtype", None)
    return getattr(dtype, "name", None) == "resource" or is_variable(x)


def handle_dtype(handle):
    data = handle._handle_data  # noqa: SLF001 - the dtype of a raw resource handle
    if data is None or not data.shape_and_type:
        raise TypeError("A resource handle without dtype information was passed.")
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(data.shape_and_type[0].dtype)


def value_of(x):
    """The NumPy value of a flat input: a tensor, a variable or a resource
    handle (read now)."""
    if is_variable(x):
        return np.asarray(x.read_value())
    if getattr(getattr(x, "dtype", None), "name", None) == "resource":
        from tensorflow.python.ops import gen_resource_variable_ops

        return np.asarray(gen_resource_variable_ops.read_variable_op(x, handle_dtype(x)))
    return np.asarray(x)


def assign(target, value):
    """One eager assignment to a variable or a resource handle."""
    if is_variable(target):
        target.assign(value)
        return
    from tensorflow.python.ops import gen_resource_variable_ops

    gen_resource_variable_ops.assign_variable_op(target, value)


class _GraphCall:
    """A traced TensorFlow graph called as one op on the eager context:
    what a tf.function call does once it has found its trace, without
    finding it again (the graph's captures are fixed: variable handles)."""

    def __init__(self, fn, *specs):
        import tensorflow as tf
        from tensorflow.python.eager import context

        # The concrete function is kept: it owns the graph's registration
        # in the context.
        self._concrete = tf.function(fn, autograph=False).get_concrete_function(*specs)
        self._name = self._concrete.name
        self._captures = list(self._concrete.captured_inputs)
        self._n_outputs = len(self._concrete.outputs)
        self._context = context.context()

    def __call__(self, tensors=()):
        ctx = self._context
        ctx.ensure_initialized()
        return ctx.call_function(self._name, list(tensors) + self._captures, self._n_outputs)


class CapturedInputs:
    """The captured inputs of one trace: the variables (resource handles)
    and the captured tensors (constants of the trace, converted once)."""

    def __init__(self, captured, first):
        from tensorflow.python.ops import gen_resource_variable_ops as rv

        self.n = len(captured)
        self.resources = [k for k, x in enumerate(captured) if is_resource(x)]
        self.constants = {k: first[k] for k in range(self.n) if k not in self.resources}
        self._handles = {k: captured[k] for k in self.resources}
        self._dtypes = {k: handle_dtype(captured[k]) for k in self.resources}
        handles = [(self._handles[k], self._dtypes[k]) for k in self.resources]

        def read():
            return [rv.read_variable_op(h, d) for h, d in handles]

        self._read = _GraphCall(read) if handles else None
        self._writers = {}  # (positions, (shape, dtype) per value) -> _GraphCall

    def read(self):
        """The values of all captured inputs; a variable's is a read-only
        view of TensorFlow's buffer (no copy)."""
        values = dict(self.constants)
        if self._read is not None:
            for k, t in zip(self.resources, self._read()):
                values[k] = np.asarray(t)
        return [values[k] for k in range(self.n)]

    def write(self, positions, values):
        """Assign `values` to the captured variables at `positions`, in one
        TensorFlow call (traced once per positions, shapes and dtypes)."""
        key = (tuple(positions), tuple((v.shape, v.dtype.str) for v in values))
        write = self._writers.get(key)
        if write is None:
            write = self._writers[key] = self._make_writer(positions, values)
        write(values)

    def _make_writer(self, positions, values):
        import tensorflow as tf
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import gen_resource_variable_ops as rv

        handles = [self._handles[k] for k in positions]
        dtypes = [self._dtypes[k].as_numpy_dtype for k in positions]
        # Arrays TensorFlow can take as they are go one tensor each; the
        # small ones (copied by TensorFlow anyway) one flat tensor per
        # dtype, split again inside the graph: wrapping an array as a
        # tensor costs about 10 us, a split in the graph about 1.
        whole = [i for i, v in enumerate(values) if v.nbytes >= ALIGN_MIN_BYTES]
        packs = {}
        for i, v in enumerate(values):
            if v.nbytes < ALIGN_MIN_BYTES:
                packs.setdefault(np.dtype(dtypes[i]), []).append(i)
        packs = list(packs.items())
        shapes = [tuple(v.shape) for v in values]
        sizes = [int(np.prod(s)) for s in shapes]

        def assign_all(*new):
            for i, v in zip(whole, new):
                rv.assign_variable_op(handles[i], v)
            for (_, members), flat in zip(packs, new[len(whole):]):
                parts = tf.split(flat, [sizes[i] for i in members]) if len(members) > 1 else [flat]
                for i, part in zip(members, parts):
                    rv.assign_variable_op(handles[i], tf.reshape(part, shapes[i]))

        specs = [tf.TensorSpec(shapes[i], dtypes[i]) for i in whole]
        specs += [tf.TensorSpec((sum(sizes[i] for i in members),), dtype) for dtype, members in packs]
        call = _GraphCall(assign_all, *specs)
        device = call._context.device_name  # noqa: SLF001 - this module's own class

        def write(arrays):
            # EagerTensor(array) wraps an array aligned as TensorFlow's
            # tensors are without a copy, and the assigns inside the graph
            # adopt those buffers (tests/frontends/tensorflow/
            # test_variable_write_back.py checks that TensorFlow still does).
            tensors = [ops.EagerTensor(np.asarray(arrays[i], dtypes[i]), device) for i in whole]
            for dtype, members in packs:
                flat = np.concatenate([np.ravel(arrays[i]) for i in members]).astype(dtype, copy=False)
                tensors.append(ops.EagerTensor(flat, device))
            call(tensors)

        return write
