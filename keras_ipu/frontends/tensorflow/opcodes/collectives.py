"""Collectives TensorFlow emits on CPU: all-reduce, reduce-scatter,
replica-id (XlaAllReduce, XlaReduceScatter, XlaReplicaId; TensorFlow's
all-to-all and collective-permute have no CPU kernels).

The front end compiles the program of one replica (SPMD). In a group of
one, all-reduce and reduce-scatter return their operand, as XLA defines
them for a single participant. Across replicas, an all-reduce with add is
the cross_replica_sum primitive (replicas meet in its kernel,
simulator/replicas.py; its cost is the ring all-reduce over the
IPU-Links; in a multi-process job the kernel adds the other instances'
partial sums, even for a program of one replica). replica-id is the
running replica's index (cross_replica_index, counting the replicas of the
instances before this one; 0 on one replica of one instance). The other
collectives across replicas are not supported yet (NotImplementedError).
"""

import numpy as np

from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.opcodes.reductions import monoid


def _group_size(imp, instr):
    groups = [list(g.replica_ids) for g in instr.replica_groups]
    if groups and any(groups):
        return max(len(g) for g in groups)
    return imp.replicas


def _single(imp, instr):
    size = _group_size(imp, instr)
    if size != 1:
        raise NotImplementedError(
            f"{instr.opcode} across {size} replicas: replicated TensorFlow "
            "programs are not supported by the TensorFlow front end yet "
            "(replication_factor must be 1 here)."
        )


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
    from keras_ipu.device.primitives import collective

    out = [collective.cross_replica_sum(imp.raw(imp.array(x)), imp.replicas, size)
           for x in operands]
    return out[0] if len(out) == 1 else tuple(out)


@rule("reduce-scatter")
def _reduce_scatter(imp, instr, operands):
    _single(imp, instr)
    return _values(operands)


@rule("replica-id")
def _replica_id(imp, instr, operands):
    if imp.replicas == 1 and not _other_instances():
        return np.zeros((), np.uint32)
    from keras_ipu.device.primitives import collective

    return collective.cross_replica_index(imp.replicas)
