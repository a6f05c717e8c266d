"""Graphcore's data-moving collectives across replicas (reduce_scatter_op,
all_to_all_op) as XLA custom calls the front end imports as the device's
collective primitives (device/primitives/collective.py: each replica's
share computed when the replicas meet, link traffic from the cost model).

Graphcore's `replication_factor` is the size of consecutive replica groups
({0..k-1}, {k..2k-1}, ...); the program is traced once for any number of
replicas, so the groups are made when the front end imports it for the
replicas it runs on (the importer's `replicas`), with Graphcore's error
when k does not divide them. Outside a replicated program there is one
replica: a group of one gives each operator its single-participant value.
"""

import math

from keras_ipu.ops import xla_custom_call

REDUCE_SCATTER = "KerasIpuReduceScatter"
ALL_GATHER = "KerasIpuAllGather"
ALL_TO_ALL = "KerasIpuAllToAll"


def checked_group_size(replication_factor):
    if not (isinstance(replication_factor, int) and replication_factor >= 1):
        raise ValueError(
            f"replication_factor={replication_factor!r}: the number of replicas in each "
            "collective group must be a positive int.")
    return replication_factor


def consecutive_groups(replicas, group_size):
    """Graphcore's replica groups: consecutive runs of `group_size`."""
    if replicas % group_size:
        raise ValueError(
            f"The replica group size (got {group_size}) does not evenly divide the total "
            f"number of replicas (got {replicas}).")
    return tuple(tuple(range(first, first + group_size))
                 for first in range(0, replicas, group_size))


def _operand(imp, instr, operands, config):
    (x,) = operands
    return imp.raw(imp.array(x)), consecutive_groups(imp.replicas, config["group_size"])


@xla_custom_call.import_rule(REDUCE_SCATTER)
def _import_reduce_scatter(imp, instr, operands, config):
    from keras_ipu.device.primitives import collective

    x, groups = _operand(imp, instr, operands, config)
    return collective.cross_replica_reduce_scatter(x, imp.replicas, groups, config["op"], 0)


@xla_custom_call.import_rule(ALL_GATHER)
def _import_all_gather(imp, instr, operands, config):
    from keras_ipu.device.primitives import collective

    x, groups = _operand(imp, instr, operands, config)
    return collective.cross_replica_all_gather(x, imp.replicas, groups, 0)


@xla_custom_call.import_rule(ALL_TO_ALL)
def _import_all_to_all(imp, instr, operands, config):
    from keras_ipu.device.primitives import collective

    x, groups = _operand(imp, instr, operands, config)
    return collective.cross_replica_all_to_all(
        x, imp.replicas, groups, config["split_dimension"], config["concat_dimension"])


def reduce_scatter_blocks(x, group_size, op):
    """Rank-1 `x` reduced by `op` ("sum", "prod", "max" or "min") over the
    group and cut into `group_size` blocks: this replica's block. `x` is
    zero-padded to a multiple of the group size first (Graphcore's
    [ceil(n / k)] result)."""
    import tensorflow as tf

    block = math.ceil(x.shape[0] / group_size)
    x = tf.pad(x, [[0, block * group_size - x.shape[0]]])
    (out,) = xla_custom_call.emit(REDUCE_SCATTER, [x], [x.dtype], [[block]],
                                  {"group_size": group_size, "op": op})
    return out


def gathered(x, group_size):
    """[group_size, *x.shape]: the group's operands, in replica order."""
    import tensorflow as tf

    (out,) = xla_custom_call.emit(ALL_GATHER, [tf.expand_dims(x, 0)], [x.dtype],
                                  [[group_size] + x.shape.as_list()],
                                  {"group_size": group_size})
    return out


def exchanged(x, split_dimension, concat_dimension, group_size):
    """XLA's all-to-all in the group (see all_to_all_op.all_to_all); its
    gradient is the all-to-all with the two dimensions swapped."""
    import tensorflow as tf

    shape = x.shape.as_list()
    shape[split_dimension] //= group_size
    shape[concat_dimension] *= group_size

    @tf.custom_gradient
    def exchange(t):
        (out,) = xla_custom_call.emit(
            ALL_TO_ALL, [t], [t.dtype], [shape],
            {"group_size": group_size, "split_dimension": split_dimension,
             "concat_dimension": concat_dimension})
        return out, lambda dy: exchanged(dy, concat_dimension, split_dimension, group_size)

    return exchange(x)
