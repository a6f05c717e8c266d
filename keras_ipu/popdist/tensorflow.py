"""keras_ipu.popdist.tensorflow: popdist.tensorflow for IPUConfig."""

from keras_ipu import popdist as _popdist


def set_ipu_config(config, ipus_per_replica=None, configure_device=True):
    """Make `config` describe this instance's share of the job.

    With `configure_device`, select the device of this instance's IPUs
    (`popdist.getDeviceId`); always set
    `experimental.multi_replica_distribution` to the instance count and
    index, so that the replicas of every instance form one replicated
    program. Returns `config`.
    """
    per_replica = _popdist.getNumIpusPerReplica() if ipus_per_replica is None else ipus_per_replica
    if not _popdist.checkNumIpusPerReplica(per_replica):
        raise ValueError(
            f"set_ipu_config(ipus_per_replica={per_replica}) but the job was launched with "
            f"--ipus-per-replica {_popdist.getNumIpusPerReplica()}: pass the same number to "
            "both (or leave ipus_per_replica out)."
        )
    if configure_device:
        config.select_ipus = [_popdist.getDeviceId(per_replica)]
    distribution = config.experimental.multi_replica_distribution
    if _popdist.getNumInstances() > 1:
        distribution.process_count = _popdist.getNumInstances()
        distribution.process_index = _popdist.getInstanceIndex()
    return config
