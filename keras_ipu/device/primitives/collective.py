"""Collectives across replicas: the all-reduce of a replicated program.

`cross_replica_sum` / `cross_replica_mean` reduce an operand over the
replicas of the program (params: `replicas`, the replication factor the
program is compiled for, and `group_size`, consecutive groups of replicas
that reduce among themselves, as Graphcore's `replica_group_size`). The
program is one replica's program (SPMD): the replicas run it side by side
(simulator/replicas.py) and meet in this kernel. Its cost is the ring
all-reduce over the IPU-Links (cost_model.all_reduce_link_traffic).

Outside a replicated run the program has one replica and the result is the
operand itself.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import replicas as _replicas
from keras_ipu.device.trace import current_builder


def _rule(x, *, replicas, group_size):
    return x


def _check(replicas, group_size):
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be a positive int, got {replicas!r}.")
    if not (isinstance(group_size, int) and group_size >= 1) or replicas % group_size:
        raise ValueError(
            f"replica_group_size {group_size!r} must divide the {replicas} "
            "replicas of the program into equal groups of consecutive replicas."
        )


def _kernel(op):
    def kernel(x, *, replicas, group_size):
        here = _replicas.current()
        if here is None:
            if replicas != 1:
                raise RuntimeError(
                    f"cross_replica_{op} was compiled for {replicas} replicas but "
                    "runs outside a replicated execution: run the program "
                    "through IPUStrategy.run (or a model's fit/evaluate/predict), "
                    "which runs every replica."
                )
            return _replicas.reduce_alone(x, op)
        group, index = here
        if group.n != replicas:
            raise RuntimeError(
                f"cross_replica_{op} was compiled for {replicas} replicas but "
                f"runs in a group of {group.n}."
            )
        return group.all_reduce(index, np.asarray(x), op, group_size)

    kernel.__name__ = f"cross_replica_{op}"
    return kernel


def _make(op):
    # Its value depends on the other replicas: known only when it runs.
    p = Primitive(f"cross_replica_{op}", _rule, _kernel(op), runtime_value=True)

    def bind(x, replicas, group_size=None):
        group_size = replicas if group_size is None else group_size
        _check(replicas, group_size)
        builder = current_builder()
        if builder is not None:
            # Recorded even for a concrete operand: its value depends on
            # the other replicas, known only when the program runs.
            return p.bind_traced(builder, x, replicas=replicas, group_size=group_size)
        return p.bind(x, replicas=replicas, group_size=group_size)

    return p, bind


cross_replica_sum_p, cross_replica_sum = _make("sum")
cross_replica_mean_p, cross_replica_mean = _make("mean")


# The index of the replica running the program (XLA's replica-id): a run
# time value of each replica (runtime_value: constant folding leaves it to
# the run). In a multi-process job it counts the replicas of the instances
# before this one.
def _index_rule(*, replicas):
    return ShapedArray((), np.dtype(np.uint32))


def _index_kernel(*, replicas):
    return np.asarray(_replicas.replica_index(), np.uint32)


cross_replica_index_p = Primitive(
    "cross_replica_index", _index_rule, _index_kernel, nondiff="an integer index",
    runtime_value=True,
)


def cross_replica_index(replicas):
    """The running replica's index (uint32 scalar) in a program compiled for
    `replicas` replicas."""
    _check(replicas, replicas)
    builder = current_builder()
    if builder is not None:
        return cross_replica_index_p.bind_traced(builder, replicas=replicas)
    return cross_replica_index_p.bind(replicas=replicas)


# -- gradient rules (contract: keras_ipu/device/autodiff/__init__.py) -----------------
# y = sum_r x_r on every replica: d loss / d x_r = sum over the replicas of
# their cotangents of y, again an all-reduce (the mean: of the mean).
def _sum_grad(cts, inputs, outputs, *, replicas, group_size):
    (g,) = cts
    return [cross_replica_sum_p.bind(g, replicas=replicas, group_size=group_size)]


def _mean_grad(cts, inputs, outputs, *, replicas, group_size):
    (g,) = cts
    return [cross_replica_mean_p.bind(g, replicas=replicas, group_size=group_size)]


cross_replica_sum_p.grad = _sum_grad
cross_replica_mean_p.grad = _mean_grad


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _cost(ins, outs, *, replicas, group_size):
    (x,) = ins
    nbytes = cost_util.nbytes(x)
    link_bytes, link_steps = cost_model.all_reduce_link_traffic(nbytes, group_size)
    # The additions of the reduce-scatter half: (k - 1) / k of the elements.
    flops = cost_util.size(x) * (group_size - 1) // group_size
    return cost_util.make(ins, outs, "collective", flops)._replace(
        link_bytes=link_bytes, link_steps=link_steps
    )


cross_replica_sum_p.cost = _cost
cross_replica_mean_p.cost = _cost
cross_replica_index_p.cost = lambda ins, outs, **params: cost_util.make(ins, outs, "elementwise")
