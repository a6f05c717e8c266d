"""Collectives: all-reduce, reduce-scatter, replica-id (TensorFlow emits
them on CPU: XlaAllReduce, XlaReduceScatter, XlaReplicaId), all-gather,
all-to-all and collective-permute (XLA's, as other front ends emit them).

The front end compiles the program of one replica (SPMD). In a group of
one, all-reduce and reduce-scatter return their operand, as XLA defines
them for a single participant. Across replicas, an all-reduce with add is
the cross_replica_sum primitive (replicas meet in its kernel,
simulator/replicas.py; its cost is the ring all-reduce over the
IPU-Links; in a multi-process job the kernel adds the other instances'
partial sums, even for a program of one replica). replica-id is the
running replica's index (cross_replica_index, counting the replicas of the
instances before this one; 0 on one replica of one instance).
reduce-scatter, all-gather, all-to-all and collective-permute are the
data-moving collective primitives (primitives/collective.py: XLA's
semantics, XLA's replica groups, each replica's share computed when the
replicas meet, link traffic from the cost model); they span the replicas
of one process (NotImplementedError across the instances of a
multi-process job).
"""

import numpy as np

from keras_ipu.device.primitives import collective
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import describe
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.opcodes.reductions import monoid


def _listed_groups(instr):
    """The replica groups an HLO collective lists (XLA writes them in one of
    three places: replica_groups, collective_device_list's list, or an iota
    list: arange reshaped, transposed and cut into groups); [] for none
    (every replica in one group)."""
    listed = [list(g.replica_ids) for g in instr.replica_groups]
    if any(listed):
        return listed
    devices = instr.collective_device_list
    listed = [list(g.replica_ids) for g in devices.replica_groups]
    if any(listed):
        return listed
    for iota in (devices.iota_replica_group_list, instr.iota_collective_device_list):
        if iota.num_replica_groups:
            ids = np.arange(int(np.prod(iota.iota_reshape_dims))).reshape(
                tuple(iota.iota_reshape_dims)).transpose(tuple(iota.iota_transpose_perm))
            return ids.reshape(iota.num_replica_groups, iota.num_devices_per_group).tolist()
    if instr.HasField("mesh_axes_replica_group_list"):
        raise HloImportError(f"{describe(instr)}: replica groups given as mesh axes are "
                             "not supported; a list or an iota list of groups is.")
    return []


def _group_size(imp, instr):
    groups = _listed_groups(instr)
    if groups:
        if any(g != list(range(g[0], g[0] + len(g))) for g in groups):
            raise NotImplementedError(
                f"{describe(instr)}: an all-reduce over replica groups {groups} that are "
                "not runs of consecutive replicas is not supported (cross_replica_sum "
                "reduces consecutive groups, as Graphcore's replica_group_size).")
        return max(len(g) for g in groups)
    return imp.replicas


def _other_instances():
    """Whether the replicas' all-reduces span other processes of the job
    (multi_replica_distribution, or a Horovod-style strategy): then the
    all-reduce of a program of one replica is not its operand."""
    from keras_ipu.device.config import system_config

    return system_config.configured_instances()[0] > 1


def _values(operands):
    return operands[0] if len(operands) == 1 else tuple(operands)


@rule("all-reduce")
def _all_reduce(imp, instr, operands):
    op = monoid(imp.called(instr))
    if op not in ("add", "multiply", "maximum", "minimum", "and", "or"):
        raise HloImportError("all-reduce with a reducer other than add/multiply/maximum/minimum/and/or.")
    size = _group_size(imp, instr)
    if size == 1 and not (imp.replicas == 1 and _other_instances()):
        return _values(operands)
    if op != "add":
        raise NotImplementedError(
            f"all-reduce with {op} across {size} replicas: only sums are supported "
            "across replicas (cross_replica_sum).")
    out = [collective.cross_replica_sum(imp.raw(imp.array(x)), imp.replicas, size)
           for x in operands]
    return out[0] if len(out) == 1 else tuple(out)


# Reducers of reduce-scatter: HLO opcode -> the primitive's op.
_SCATTER_OPS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min"}


def _groups(imp, instr):
    return collective.replica_groups(imp.replicas, _listed_groups(instr))


def _each(imp, operands, fn):
    out = [fn(imp.raw(imp.array(x))) for x in operands]
    return out[0] if len(out) == 1 else tuple(out)


@rule("reduce-scatter")
def _reduce_scatter(imp, instr, operands):
    op = _SCATTER_OPS.get(monoid(imp.called(instr)))
    if op is None:
        raise HloImportError(
            f"{describe(instr)}: reduce-scatter with a reducer other than "
            "add/multiply/maximum/minimum.")
    groups, (dim,) = _groups(imp, instr), instr.dimensions
    return _each(imp, operands, lambda x: collective.cross_replica_reduce_scatter(
        x, imp.replicas, groups, op, dim))


@rule("all-gather")
def _all_gather(imp, instr, operands):
    groups, (dim,) = _groups(imp, instr), instr.dimensions
    return _each(imp, operands, lambda x: collective.cross_replica_all_gather(
        x, imp.replicas, groups, dim))


@rule("all-to-all")
def _all_to_all(imp, instr, operands):
    if len(instr.dimensions) != 1 or len(operands) != 1:
        # XLA's builder (what TensorFlow's XlaAllToAll emits) makes the array
        # form; the tuple form (operand i to member i) has no rule yet.
        raise HloImportError(
            f"{describe(instr)}: only the array form of all-to-all (one operand, "
            "one split/concat dimension) is supported, not the tuple form.")
    (dim,) = instr.dimensions
    return collective.cross_replica_all_to_all(
        imp.raw(imp.array(operands[0])), imp.replicas, _groups(imp, instr), dim, dim)


@rule("collective-permute")
def _collective_permute(imp, instr, operands):
    if len(operands) != 1:
        raise HloImportError(
            f"{describe(instr)}: a collective-permute of {len(operands)} operands "
            "(in-place or combined permutes) is not supported; one operand is.")
    pairs = [(p.source, p.target) for p in instr.source_target_pairs]
    return collective.collective_permute(imp.raw(imp.array(operands[0])), imp.replicas, pairs)


@rule("replica-id")
def _replica_id(imp, instr, operands):
    if imp.replicas == 1 and not _other_instances():
        return np.zeros((), np.uint32)
    return collective.cross_replica_index(imp.replicas)
