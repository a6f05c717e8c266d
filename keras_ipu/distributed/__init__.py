"""keras_ipu.distributed: tensorflow.python.ipu.distributed on MPI.

The Horovod-shaped API of Graphcore's SDK (init, size, rank, allreduce,
broadcast, allgather, ...) on mpi4py and the MPI library of the `[mpi]`
extra; PopDistStrategy and IPUHorovodStrategy live in the submodules of the
same names. MPI is initialised on first use (`init()` or any collective),
never at import.
"""

from keras_ipu._lazy_modules import lazy_submodules as _lazy_submodules

from keras_ipu.distributed.host_collectives import (  # noqa: F401
    Adasum,
    Average,
    ReduceOp,
    Sum,
    allgather,
    allreduce,
    broadcast,
    local_rank,
    local_size,
    rank,
    size,
)
from keras_ipu.distributed.mpi_world import (  # noqa: F401
    CollectiveTimeoutError,
    DistributedError,
    InstanceFailedError,
)

__getattr__, __dir__ = _lazy_submodules(__name__, {"popdist_strategy", "ipu_horovod_strategy"})


def init(comm=None):
    """Initialise MPI (and the fault handling of keras_ipu.distributed).

    `comm` (Horovod's list of ranks or communicator) is not supported: every
    process of the job takes part.
    """
    if comm is not None:
        raise NotImplementedError(
            "init(comm=...) is not supported: keras_ipu.distributed always uses every "
            "process of the job (MPI_COMM_WORLD)."
        )
    from keras_ipu.distributed import mpi_world

    mpi_world.world()


def shutdown():
    """Kept for Horovod compatibility: MPI is finalised at interpreter exit,
    after every process has reached its own exit."""


def is_initialized():
    from keras_ipu.distributed import mpi_world

    return mpi_world.is_initialized()


def mpi_threads_supported():
    from keras_ipu.distributed import mpi_world

    MPI = mpi_world.world().MPI
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled():
    return True


def mpi_built():
    return True


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return 0


def ddl_built():
    return False


def is_homogeneous():
    """Whether every host of the job runs the same number of processes."""
    from keras_ipu.distributed import mpi_world

    w = mpi_world.world()
    hosts = {}
    for host, _pid in w.peers:
        hosts[host] = hosts.get(host, 0) + 1
    return len(set(hosts.values())) == 1
