"""Collectives across replicas: the all-reduce of a replicated program, and
the collectives that move data between replicas (XLA's reduce-scatter,
all-gather, all-to-all and collective-permute).

`cross_replica_sum` / `cross_replica_mean` reduce an operand over the
replicas of the program (params: `replicas`, the replication factor the
program is compiled for, and `group_size`, consecutive groups of replicas
that reduce among themselves, as Graphcore's `replica_group_size`). The
program is one replica's program (SPMD): the replicas run it side by side
(simulator/replicas.py) and meet in this kernel. Its cost is the ring
all-reduce over the IPU-Links (cost_model.all_reduce_link_traffic).

Outside a replicated run the program has one replica and the result is the
operand itself.

The data-moving collectives take XLA's replica groups (`groups`: a tuple of
tuples of replica indices, each replica in exactly one, groups of one
size; `replica_groups` normalises them, none meaning one group of every
replica) and XLA's semantics (operation_semantics.md), with a member's
position in its group ordering the blocks:
- `cross_replica_reduce_scatter(x, op, dimension)`: the group's reduction
  (in member order, so every replica gets the same bits) split into k
  blocks along `dimension`; member i gets block i;
- `cross_replica_all_gather(x, dimension)`: the members' operands
  concatenated along `dimension`, in member order;
- `cross_replica_all_to_all(x, split_dimension, concat_dimension)`: each
  member splits its operand into k blocks; member i gets block i of every
  member, concatenated along `concat_dimension` in member order;
- `collective_permute(x, pairs)`: replica t gets the operand of s for each
  (s, t) of `pairs`; a replica no pair targets gets zeros.
Their costs are link traffic of cost_model ([RING] for reduce-scatter and
all-gather, [MPICH] for all-to-all). Across the instances of a
multi-process job they raise NotImplementedError (only the all-reduce
spans instances, through MPI).
"""

import functools

import numpy as np

from keras_ipu.device.config import system_config
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


def _running_replica(name, replicas):
    """(replica group, index) of the replica running a collective compiled
    for `replicas` replicas; None outside a replicated run (one replica)."""
    here = _replicas.current()
    if here is None:
        if replicas != 1:
            raise RuntimeError(
                f"{name} was compiled for {replicas} replicas but runs outside a "
                "replicated execution: run the program through IPUStrategy.run (or a "
                "model's fit/evaluate/predict, or the TensorFlow front end's "
                "BridgedFunction.run(replicas=n)), which runs every replica.")
        return None
    group, index = here
    if group.n != replicas:
        raise RuntimeError(
            f"{name} was compiled for {replicas} replicas but runs in a group of {group.n}.")
    return here


def _kernel(op):
    def kernel(x, *, replicas, group_size):
        here = _running_replica(f"cross_replica_{op}", replicas)
        if here is None:
            return _replicas.reduce_alone(x, op)
        group, index = here
        return group.all_reduce(index, np.asarray(x), op, group_size)

    kernel.__name__ = f"cross_replica_{op}"
    return kernel


def _bind(p, x, **params):
    builder = current_builder()
    if builder is not None:
        # Recorded even for a concrete operand: its value depends on the
        # other replicas, known only when the program runs.
        return p.bind_traced(builder, x, **params)
    return p.bind(x, **params)


def _make(op):
    # Its value depends on the other replicas: known only when it runs.
    p = Primitive(f"cross_replica_{op}", _rule, _kernel(op), runtime_value=True)

    def bind(x, replicas, group_size=None):
        group_size = replicas if group_size is None else group_size
        _check(replicas, group_size)
        return _bind(p, x, replicas=replicas, group_size=group_size)

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


# -- collectives that move data between replicas ------------------------------------


def replica_groups(replicas, groups=None):
    """XLA's replica groups as a tuple of tuples (None or empty: one group
    of every replica), checked: every replica in exactly one group, all
    groups of one size."""
    if not groups or not any(groups):
        return (tuple(range(replicas)),)
    out = tuple(tuple(int(r) for r in g) for g in groups)
    members = sorted(r for g in out for r in g)
    if members != list(range(replicas)) or len({len(g) for g in out}) != 1:
        raise ValueError(
            f"Replica groups {[list(g) for g in out]} must split the {replicas} replicas "
            "of the program into groups of one size, each replica in one group.")
    return out


def _member(groups, replica):
    for group in groups:
        if replica in group:
            return group, group.index(replica)
    raise ValueError(f"Replica {replica} is in no replica group of {groups}.")


def _exchange(name, x, replicas, groups, combine_for):
    """The value of a data-moving collective on the calling replica:
    combine_for(its group of `groups`, its position there) applied to every
    replica's operand (simulator/replicas.ReplicaGroup.exchange)."""
    if system_config.configured_instances()[0] > 1:
        raise NotImplementedError(
            f"{name} across the instances of a multi-process job is not supported: "
            "only the all-reduce (cross_replica_sum) spans instances; run the "
            "program in one process (one instance with every replica).")
    x = np.asarray(x)
    here = _running_replica(name, replicas)
    if here is None:
        return np.array(combine_for((0,), 0)([x]))
    group, index = here
    return group.exchange(index, x, combine_for(*_member(groups, index)))


def _blocks(x, k, axis, what):
    if x.shape[axis] % k:
        raise ValueError(f"{what}: dimension {axis} of size {x.shape[axis]} does not "
                         f"split into {k} equal blocks (the replica group size).")
    return np.split(x, k, axis=axis)


def _resized(shape, axis, factor=None, divisor=None, what=""):
    shape = list(shape)
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"{what}: dimension {axis} is out of range for rank {len(shape)}.")
    if divisor is not None:
        if shape[axis] is not None and shape[axis] % divisor:
            raise ValueError(f"{what}: dimension {axis} of size {shape[axis]} does not split "
                             f"into {divisor} equal blocks (the replica group size).")
        shape[axis] = None if shape[axis] is None else shape[axis] // divisor
    if factor is not None:
        shape[axis] = None if shape[axis] is None else shape[axis] * factor
    return tuple(shape)


_REDUCERS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduce_scatter_rule(x, *, replicas, groups, op, dimension):
    k = len(groups[0])
    return ShapedArray(_resized(x.shape, dimension, divisor=k, what="reduce-scatter"), x.dtype)


def _reduce_scatter_kernel(x, *, replicas, groups, op, dimension):
    def combine_for(members, position):
        def combine(values):
            total = functools.reduce(_REDUCERS[op], [values[m] for m in members])
            return _blocks(np.asarray(total, values[0].dtype), len(members), dimension,
                           "reduce-scatter")[position]
        return combine

    return _exchange("reduce-scatter", x, replicas, groups, combine_for)


def _all_gather_rule(x, *, replicas, groups, dimension):
    k = len(groups[0])
    return ShapedArray(_resized(x.shape, dimension, factor=k, what="all-gather"), x.dtype)


def _all_gather_kernel(x, *, replicas, groups, dimension):
    def combine_for(members, position):
        return lambda values: np.concatenate([values[m] for m in members], axis=dimension)

    return _exchange("all-gather", x, replicas, groups, combine_for)


def _all_to_all_rule(x, *, replicas, groups, split_dimension, concat_dimension):
    k = len(groups[0])
    shape = _resized(x.shape, split_dimension, divisor=k, what="all-to-all")
    return ShapedArray(_resized(shape, concat_dimension, factor=k, what="all-to-all"), x.dtype)


def _all_to_all_kernel(x, *, replicas, groups, split_dimension, concat_dimension):
    def combine_for(members, position):
        def combine(values):
            return np.concatenate(
                [_blocks(values[m], len(members), split_dimension, "all-to-all")[position]
                 for m in members], axis=concat_dimension)
        return combine

    return _exchange("all-to-all", x, replicas, groups, combine_for)


def _permute_rule(x, *, replicas, pairs):
    return ShapedArray(tuple(x.shape), x.dtype)


def _permute_kernel(x, *, replicas, pairs):
    groups = (tuple(range(replicas)),)

    def combine_for(members, position):
        sources = [s for s, t in pairs if t == members[position]]

        def combine(values):
            return values[sources[0]] if sources else np.zeros_like(values[position])
        return combine

    return _exchange("collective-permute", x, replicas, groups, combine_for)


def _check_pairs(replicas, pairs):
    pairs = tuple((int(s), int(t)) for s, t in pairs)
    for s, t in pairs:
        if not (0 <= s < replicas and 0 <= t < replicas):
            raise ValueError(f"collective-permute pair {(s, t)} names a replica outside "
                             f"0..{replicas - 1}.")
    for position in (0, 1):
        seen = [p[position] for p in pairs]
        if len(seen) != len(set(seen)):
            raise ValueError(f"collective-permute pairs {list(pairs)}: a replica "
                             f"{'sends' if position == 0 else 'receives'} twice.")
    return pairs


cross_replica_reduce_scatter_p = Primitive(
    "cross_replica_reduce_scatter", _reduce_scatter_rule, _reduce_scatter_kernel,
    runtime_value=True)
cross_replica_all_gather_p = Primitive(
    "cross_replica_all_gather", _all_gather_rule, _all_gather_kernel, runtime_value=True)
cross_replica_all_to_all_p = Primitive(
    "cross_replica_all_to_all", _all_to_all_rule, _all_to_all_kernel, runtime_value=True)
collective_permute_p = Primitive(
    "collective_permute", _permute_rule, _permute_kernel, runtime_value=True)


def cross_replica_reduce_scatter(x, replicas, groups=None, op="sum", dimension=0):
    if op not in _REDUCERS:
        raise ValueError(f"reduce-scatter reduces by one of {sorted(_REDUCERS)}; got {op!r}.")
    return _bind(cross_replica_reduce_scatter_p, x, replicas=replicas,
                 groups=replica_groups(replicas, groups), op=op, dimension=int(dimension))


def cross_replica_all_gather(x, replicas, groups=None, dimension=0):
    return _bind(cross_replica_all_gather_p, x, replicas=replicas,
                 groups=replica_groups(replicas, groups), dimension=int(dimension))


def cross_replica_all_to_all(x, replicas, groups=None, split_dimension=0, concat_dimension=0):
    return _bind(cross_replica_all_to_all_p, x, replicas=replicas,
                 groups=replica_groups(replicas, groups),
                 split_dimension=int(split_dimension), concat_dimension=int(concat_dimension))


def collective_permute(x, replicas, pairs):
    return _bind(collective_permute_p, x, replicas=replicas, pairs=_check_pairs(replicas, pairs))


# Gradients: each collective's transpose. A reduce-scatter sums the members'
# operands: its cotangent goes back to every member's block, an all-gather;
# an all-gather's cotangents (one per member) sum back to the blocks, a
# reduce-scatter; an all-to-all's blocks go back by the all-to-all with the
# dimensions swapped; a permute's by the inverse pairs.
def _reduce_scatter_grad(cts, inputs, outputs, *, replicas, groups, op, dimension):
    if op != "sum":
        raise NotImplementedError(
            f"The gradient of a reduce-scatter by {op!r} is not implemented: only "
            "the sum's (an all-gather of the cotangent) is.")
    (g,) = cts
    return [cross_replica_all_gather_p.bind(g, replicas=replicas, groups=groups,
                                            dimension=dimension)]


def _all_gather_grad(cts, inputs, outputs, *, replicas, groups, dimension):
    (g,) = cts
    return [cross_replica_reduce_scatter_p.bind(g, replicas=replicas, groups=groups, op="sum",
                                                dimension=dimension)]


def _all_to_all_grad(cts, inputs, outputs, *, replicas, groups, split_dimension,
                     concat_dimension):
    (g,) = cts
    return [cross_replica_all_to_all_p.bind(g, replicas=replicas, groups=groups,
                                            split_dimension=concat_dimension,
                                            concat_dimension=split_dimension)]


def _permute_grad(cts, inputs, outputs, *, replicas, pairs):
    (g,) = cts
    return [collective_permute_p.bind(g, replicas=replicas,
                                      pairs=tuple((t, s) for s, t in pairs))]


cross_replica_reduce_scatter_p.grad = _reduce_scatter_grad
cross_replica_all_gather_p.grad = _all_gather_grad
cross_replica_all_to_all_p.grad = _all_to_all_grad
collective_permute_p.grad = _permute_grad


def _traffic_cost(traffic, flops_of=lambda x, k: 0):
    def cost(ins, outs, **params):
        (x,) = ins
        k = len(params["groups"][0])
        nbytes = cost_util.nbytes(outs[0] if traffic is cost_model.all_gather_link_traffic
                                  else x)
        link_bytes, link_steps = traffic(nbytes, k)
        return cost_util.make(ins, outs, "collective", flops_of(x, k))._replace(
            link_bytes=link_bytes, link_steps=link_steps)
    return cost


def _permute_cost(ins, outs, *, replicas, pairs):
    (x,) = ins
    link_bytes, link_steps = cost_model.permute_link_traffic(cost_util.nbytes(x), bool(pairs))
    return cost_util.make(ins, outs, "collective")._replace(
        link_bytes=link_bytes, link_steps=link_steps)


# The reduce-scatter's reductions: (k - 1) / k of the elements, as the
# all-reduce's reduce-scatter half.
cross_replica_reduce_scatter_p.cost = _traffic_cost(
    cost_model.reduce_scatter_link_traffic,
    lambda x, k: cost_util.size(x) * (k - 1) // k)
cross_replica_all_gather_p.cost = _traffic_cost(cost_model.all_gather_link_traffic)
cross_replica_all_to_all_p.cost = _traffic_cost(cost_model.all_to_all_link_traffic)
collective_permute_p.cost = _permute_cost
