"""The share of the Pod that one process of a multi-process job owns.

Graphcore's poprun (and `python -m keras_ipu.poprun`) launches N instances
through mpirun and tells each, in POPDIST_* environment variables, how many
replicas the job has in all (R), how many IPUs one replica spans (K), how
many replicas this instance runs (L = R / N) and the global index of its
first replica. The instance index and count are the MPI rank and size, read
from what the MPI launcher exports (MPICH's hydra: PMI_RANK / PMI_SIZE; Open
MPI: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE), so nothing here has to
initialise MPI. Without poprun's variables (plain `mpirun -np N`, or a single
process) each instance runs one replica of one IPU.

The job's R x K IPUs are one partition, simulated as a Pod of that many IPUs
(at least a Pod16): instance i owns the aligned block of L x K IPUs at ladder
positions [i L K, (i + 1) L K), which is one multi-IPU device of the Pod's
listing (`device_id`), as `popdist.getDeviceId()` names it on a real Pod.
"""

import dataclasses
import os

from keras_ipu.device.simulator import system as _system

# Names Graphcore's poprun exports (PopDist and PopRun user guide, and the
# mpirun command line poprun prints with --vv).
NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
UNIFORM_REPLICAS_PER_INSTANCE = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"

# (rank, size) variables of the MPI launchers, in the order they are tried.
_MPI_RANK_SIZE = (
    ("PMI_RANK", "PMI_SIZE"),  # MPICH (hydra), Intel MPI
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMIX_RANK", "PMIX_SIZE"),  # other PMIx launchers
)


def _int_env(environ, name, default=None):
    text = environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"The environment variable {name}={text!r} is not an integer: it is set by "
            "the launcher (poprun / mpirun); unset it or launch the job again."
        ) from None


def mpi_rank_and_size(environ=None):
    """(rank, size) the MPI launcher gave this process; (0, 1) when launched alone."""
    environ = os.environ if environ is None else environ
    for rank_name, size_name in _MPI_RANK_SIZE:
        size = _int_env(environ, size_name)
        if size is not None:
            return _int_env(environ, rank_name, 0), size
    return 0, 1


@dataclasses.dataclass(frozen=True)
class Partition:
    """What one instance of a multi-process job sees of the Pod."""

    num_instances: int
    instance_index: int
    num_total_replicas: int
    num_local_replicas: int
    replica_index_offset: int
    ipus_per_replica: int
    from_poprun: bool  # POPDIST_* variables were set (popdist.isPopdistEnvSet)

    @property
    def num_ipus(self):
        """IPUs of the whole job (the partition)."""
        return self.num_total_replicas * self.ipus_per_replica

    @property
    def num_local_ipus(self):
        """IPUs this instance attaches to."""
        return self.num_local_replicas * self.ipus_per_replica

    @property
    def pod_size(self):
        """IPUs of the simulated Pod holding the partition: a power of two, at least 16."""
        size = _system.DEFAULT_POD_SIZE
        while size < self.num_ipus:
            size *= 2
        return size

    @property
    def is_distributed(self):
        return self.num_instances > 1

    def device_id(self, pod=None, ipus_per_replica=None):
        """The id, in the Pod's device listing, of this instance's IPUs.

        `ipus_per_replica` (popdist.getDeviceId's argument) overrides K; it
        must then still give a device of a power-of-two number of IPUs.
        """
        k = self.ipus_per_replica if ipus_per_replica is None else ipus_per_replica
        size = self.num_local_replicas * k
        if not _system.is_power_of_two(size):
            raise ValueError(
                f"This instance runs {self.num_local_replicas} replica(s) of {k} IPU(s): "
                f"a device of {size} IPUs, but a device has 1, 2, 4, 8, ... IPUs. Choose "
                "--num-replicas / --num-instances and --ipus-per-replica so that "
                "(replicas per instance) x (IPUs per replica) is a power of two."
            )
        pod = _system.Pod(self.pod_size) if pod is None else pod
        first = self.instance_index * size
        for cfg in pod.configurations:
            if cfg.num_ipus == size and cfg.ladder_positions[0] == first:
                return cfg.id
        raise ValueError(
            f"Instance {self.instance_index} needs IPUs {first}..{first + size - 1} of a "
            f"{pod.num_ipus}-IPU Pod, which has no such device: the job asks for more "
            "IPUs than the Pod has."
        )


def current(environ=None):
    """The Partition of this process, from the launcher's environment variables."""
    environ = os.environ if environ is None else environ
    rank, size = mpi_rank_and_size(environ)
    from_poprun = NUM_TOTAL_REPLICAS in environ
    total = _int_env(environ, NUM_TOTAL_REPLICAS, size)
    per_replica = _int_env(environ, NUM_IPUS_PER_REPLICA, 1)
    if total < 1 or per_replica < 1 or size < 1:
        raise ValueError(
            f"{NUM_TOTAL_REPLICAS}={total}, {NUM_IPUS_PER_REPLICA}={per_replica} and "
            f"{size} MPI process(es): every count must be at least 1."
        )
    if total % size:
        raise ValueError(
            f"{total} replicas cannot be shared evenly by {size} instances: "
            "--num-replicas must be a multiple of --num-instances."
        )
    local = _int_env(environ, NUM_LOCAL_REPLICAS, total // size)
    offset = _int_env(environ, REPLICA_INDEX_OFFSET, rank * local)
    if not 0 <= rank < size:
        raise ValueError(f"MPI rank {rank} is not in [0, {size}): the launcher's variables disagree.")
    return Partition(
        num_instances=size,
        instance_index=rank,
        num_total_replicas=total,
        num_local_replicas=local,
        replica_index_offset=offset,
        ipus_per_replica=per_replica,
        from_poprun=from_poprun,
    )


# Set by the strategies that reduce on the hosts whatever the IPUConfig
# says (IPUHorovodStrategy, IPUMultiWorkerStrategy: Horovod's allreduce).
_reduce_on_hosts = False


def reduce_on_hosts():
    """From now on the replicas' all-reduces span every MPI process of the
    job, on the hosts (a Horovod-style strategy was made)."""
    global _reduce_on_hosts
    _reduce_on_hosts = True


def reduces_on_hosts():
    return _reduce_on_hosts


def configured_instances(system):
    """(process count, process index) of the instances whose replicas
    all-reduce together: `system`'s multi_replica_distribution (the current
    one: system_config.configured_instances()), or every MPI process once a
    Horovod-style strategy exists; (1, 0) otherwise."""
    if _reduce_on_hosts:
        rank, size = mpi_rank_and_size()
        return (size, rank) if size > 1 else (1, 0)
    mrd = system.config.experimental.multi_replica_distribution
    if mrd.process_count <= 1:
        return 1, 0
    return mrd.process_count, mrd.process_index


def sum_over_instances(array):
    """`array` summed over the instances of the job, by MPI."""
    # Imported here: MPI is loaded only by multi-process jobs.
    from keras_ipu.distributed import mpi_world

    return mpi_world.sum_over_instances(array)
