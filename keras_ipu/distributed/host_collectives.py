"""Horovod-style collectives on the host, over MPI (ipu.distributed's ops).

`allreduce`, `broadcast` and `allgather` take what a program has in hand:
NumPy arrays and scalars, keras_ipu tensors and Keras variables (eager), and
TensorFlow tensors and variables (eager, or inside a tf.function that runs
on the host, through tf.numpy_function). They return the same kind of value
they were given. Inside a compiled keras_ipu program (a traced value) they
raise: there the replicas reduce with the compiled all-reduce of the
strategy (IPUStrategy / PopDistStrategy), as GCL does on the IPU.
"""

import enum

import numpy as np

from keras_ipu.distributed import mpi_world


class ReduceOp(enum.Enum):
    """Horovod's reduction operations (ipu.distributed.Average, Sum, Adasum)."""

    AVERAGE = "Average"
    SUM = "Sum"
    ADASUM = "Adasum"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM


def _is_tensorflow(value):
    return type(value).__module__.startswith("tensorflow")


def _to_numpy(value, what):
    from keras_ipu.device.trace import Tracer

    if isinstance(value, Tracer) or isinstance(getattr(value, "value", None), Tracer):
        raise NotImplementedError(
            f"ipu.distributed.{what} runs on the host, between compiled programs; it was "
            "given a value traced inside a compiled keras_ipu program. Inside a "
            "replicated program the replicas reduce with the strategy's compiled "
            "all-reduce (replica_context.all_reduce / cross_replica_ops)."
        )
    array = np.asarray(value)
    if array.dtype.kind not in "biufc" and array.dtype.name != "bfloat16":
        raise TypeError(
            f"ipu.distributed.{what}: cannot send a value of dtype {array.dtype} between "
            "processes; give a numeric tensor."
        )
    return np.asarray(array, order="C")


def _wire(array):
    """The array in a dtype MPI reduces natively (bfloat16 travels as float32)."""
    if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    return array


def _like(result, original, kind):
    """`result` (NumPy) as the kind of value the caller passed."""
    if kind == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor(result, dtype=original.dtype)
    if kind == "keras":
        from keras import ops

        return ops.convert_to_tensor(result, dtype=str(np.asarray(original).dtype))
    if kind == "scalar":
        return result[()] if result.ndim == 0 else result
    return result


def _kind(value):
    if _is_tensorflow(value):
        return "tensorflow"
    if isinstance(value, np.ndarray):
        return "numpy"
    if isinstance(value, (int, float, complex, bool, np.generic)):
        return "scalar"
    if hasattr(value, "__array__"):
        return "keras"
    return "numpy"


def _host_call(name, fn, value):
    """Run fn(array) -> array on `value`, in TensorFlow's graph too."""
    if _is_tensorflow(value):
        import tensorflow as tf

        if not tf.executing_eagerly() or (
            hasattr(value, "graph") and not isinstance(value, tf.Variable)
        ):
            out = tf.numpy_function(lambda a: fn(np.asarray(a)), [value], value.dtype, name=name)
            return out
    kind = _kind(value)
    array = _to_numpy(value.numpy() if kind == "tensorflow" else value, name)
    return _like(fn(array), value, kind)


def _mpi_op(op):
    MPI = mpi_world.world().MPI
    return {ReduceOp.SUM: MPI.SUM, ReduceOp.AVERAGE: MPI.SUM}[op]


def _reduce_array(array, op, prescale_factor, postscale_factor):
    w = mpi_world.world()
    if array.dtype.kind == "b":
        raise TypeError(
            "ipu.distributed.allreduce: cannot sum or average booleans; cast the tensor "
            "to a numeric dtype first."
        )
    wire = _wire(array)
    if prescale_factor != 1.0:
        wire = (wire * prescale_factor).astype(wire.dtype)
    result = w.allreduce(wire, _mpi_op(op), f"allreduce ({op.value})")
    _predict(wire.nbytes, w.size)
    if op == ReduceOp.AVERAGE:
        result = result / w.size if result.dtype.kind in "fc" else result // w.size
    if postscale_factor != 1.0:
        result = result * postscale_factor
    return result.astype(array.dtype, copy=False)


def _predict(nbytes, instances):
    """What the reduction would take on a Pod's hosts (the cycle report)."""
    from keras_ipu.device.simulator import prediction

    prediction.predict_host_allreduce(nbytes, instances)


def _check_op(op):
    if op is None:
        return ReduceOp.AVERAGE
    if op == ReduceOp.ADASUM:
        raise NotImplementedError("The Adasum reduction is not implemented.")
    if not isinstance(op, ReduceOp):
        raise ValueError(
            f"allreduce(op={op!r}): use ipu.distributed.Sum or ipu.distributed.Average "
            "(None means Average)."
        )
    return op


def allreduce(tensor, op=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce `tensor` over all processes (Average when `op` is None).

    tf.IndexedSlices are gathered (values and indices) instead, as Horovod
    does, and divided by the number of processes for Average.
    """
    op = _check_op(op)
    if type(tensor).__name__ == "IndexedSlices" and _is_tensorflow(tensor):
        import tensorflow as tf

        values = allgather(tensor.values)
        indices = allgather(tensor.indices)
        if op == ReduceOp.AVERAGE:
            values = values / tf.cast(size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    return _host_call(
        "allreduce", lambda a: _reduce_array(a, op, prescale_factor, postscale_factor), tensor
    )


def broadcast(tensor, root_rank, name=None):
    """The value of `tensor` on process `root_rank`, on every process."""
    w = mpi_world.world()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < w.size:
        raise ValueError(
            f"broadcast(root_rank={root_rank!r}): the root is a process rank in "
            f"[0, {w.size})."
        )
    label = f"broadcast '{name}'" if name else "broadcast"

    def fn(a):
        wire = _wire(a)
        return w.broadcast(wire, int(root_rank), label).astype(a.dtype, copy=False)

    return _host_call("broadcast", fn, tensor)


def allgather(tensor, name=None):
    """`tensor` of every process, concatenated on the first dimension."""
    w = mpi_world.world()
    label = f"allgather '{name}'" if name else "allgather"

    def fn(a):
        if a.ndim == 0:
            raise ValueError(
                "allgather concatenates on the first dimension: give a tensor of rank "
                "at least 1 (a scalar has none; reshape it to [1])."
            )
        return w.allgather(_wire(a), label).astype(a.dtype, copy=False)

    return _host_call("allgather", fn, tensor)


def size():
    return mpi_world.world().size


def rank():
    return mpi_world.world().rank


def local_size():
    return len(mpi_world.world().local_ranks)


def local_rank():
    w = mpi_world.world()
    return w.local_ranks.index(w.rank)
