"""keras_ipu.ipu_multi_worker_strategy: Graphcore's
`tensorflow.python.ipu.ipu_multi_worker_strategy` (deprecated there: use
PopDistStrategy).

Graphcore's IPUMultiWorkerStrategy reduces between the workers of a
cluster (a cluster resolver, usually TF_CONFIG's) over gRPC, on the hosts.
Here the workers are the MPI processes of the job and reduce over MPI:
the resolver's cluster must be that job (keras_ipu/distributed/cluster.py).
`fit` works (Graphcore's reference says it does not there).
"""

from keras_ipu.distributed.cluster import TFConfigClusterResolver  # noqa: F401
from keras_ipu.distributed.extended import IPUMirroredVariable  # noqa: F401
from keras_ipu.distributed.extended import IPUMultiWorkerExtended
from keras_ipu.distributed.extended import IPUSyncOnReadVariable  # noqa: F401
from keras_ipu.distributed.ipu_horovod_strategy import IPUHorovodStrategyV1


class IPUMultiWorkerStrategyV1(IPUHorovodStrategyV1):
    """Synchronous training on the IPUs of several workers (MPI processes)."""

    _extended_class = IPUMultiWorkerExtended

    def __init__(self, cluster_resolver, ipu_device="/device:IPU:0", variables_on_host=False):
        from keras_ipu.distributed import cluster

        self._num_workers, self._worker_index = cluster.workers(cluster_resolver)
        self._cluster_resolver = cluster_resolver
        super().__init__(ipu_device=ipu_device, variables_on_host=variables_on_host)

    @property
    def cluster_resolver(self):
        return self._cluster_resolver


IPUMultiWorkerStrategy = IPUMultiWorkerStrategyV1
