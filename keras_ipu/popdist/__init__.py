"""keras_ipu.popdist: the `popdist` module of Graphcore's PopDist, for
programs launched by `python -m keras_ipu.poprun` (or plain mpirun).

Port a PopDist program with `from keras_ipu import popdist` and
`import keras_ipu.popdist.tensorflow` in place of `import popdist` and
`import popdist.tensorflow` (DESIGN.md, porting contract). The answers come
from the launcher's environment (keras_ipu.device.simulator.partition): the
job's replicas, this instance's share of them and its IPUs in the simulated
Pod. Only `init`, `synchronize` and `execute_on_instances` talk to MPI.
"""

from keras_ipu.device.simulator import partition as _partition


def _current():
    return _partition.current()


def isPopdistEnvSet():
    """Whether the program was launched by poprun (its POPDIST_* variables are set)."""
    return _current().from_poprun


def getNumInstances():
    return _current().num_instances


def getInstanceIndex():
    return _current().instance_index


def getNumTotalReplicas():
    return _current().num_total_replicas


def getNumLocalReplicas():
    return _current().num_local_replicas


def getReplicaIndexOffset():
    """The global index of this instance's first replica."""
    return _current().replica_index_offset


def getNumIpusPerReplica():
    return _current().ipus_per_replica


def checkNumIpusPerReplica(ipus_per_replica):
    """Whether `ipus_per_replica` is what the job was launched with."""
    return int(ipus_per_replica) == _current().ipus_per_replica


def isUniformReplicasPerInstance():
    return True  # poprun's --num-replicas must be a multiple of --num-instances


def getDeviceId(ipus_per_replica=None):
    """The device id (keras_ipu.utils.device_listing) of this instance's IPUs."""
    return _current().device_id(ipus_per_replica=ipus_per_replica)


def init():
    """Initialise the communication between the instances (MPI)."""
    from keras_ipu.distributed import mpi_world

    mpi_world.world()


def finalizeBackend():
    """Kept for compatibility: MPI is finalised when the program exits."""


def synchronize():
    """Wait until every instance reaches this point (an MPI barrier)."""
    if getNumInstances() > 1:
        from keras_ipu.distributed import mpi_world

        mpi_world.world().barrier("popdist.synchronize")


def execute_on_instances(instances, fn, *args, **kwargs):
    """Run fn(*args, **kwargs) on the instances in `instances` only, then
    synchronise all instances; the result on those instances, None elsewhere."""
    instances = {int(i) for i in instances}
    count = getNumInstances()
    bad = sorted(i for i in instances if not 0 <= i < count)
    if bad:
        raise ValueError(
            f"execute_on_instances: instance(s) {bad} do not exist; this job has "
            f"{count} instance(s), numbered 0 to {count - 1}."
        )
    result = fn(*args, **kwargs) if getInstanceIndex() in instances else None
    synchronize()
    return result
