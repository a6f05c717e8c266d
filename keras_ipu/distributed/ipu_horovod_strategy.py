"""IPUHorovodStrategy (deprecated in Graphcore's SDK: use PopDistStrategy).

Graphcore's Horovod strategy reduces between the processes with Horovod's
allreduce on the hosts, whatever the IPUConfig says: the all-reduce of the
gradients is taken out of the compiled program and run on the host. Here:
PopDistStrategy's program and state handling, with the replicas of every
MPI process of the job reducing together even without
multi_replica_distribution, and the reduction costed on the hosts
(cost_model.host_allreduce_seconds) instead of GCL's links.
"""

import warnings

from keras_ipu.device.simulator import partition
from keras_ipu.distributed.extended import IPUHorovodExtended
from keras_ipu.distributed.popdist_strategy import PopDistStrategy


class IPUHorovodStrategyV1(PopDistStrategy):
    """Data parallelism over the MPI processes, reduced on the hosts.

    `variables_on_host=True` (weights and their update kept on the host) is
    not supported.
    """

    _extended_class = IPUHorovodExtended

    def __init__(self, ipu_device="/device:IPU:0", variables_on_host=False):
        warnings.warn(
            f"{type(self).__name__} is deprecated: use PopDistStrategy instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        extended = self._extended_class(
            self, getattr(self, "_cluster_resolver", None), ipu_device, variables_on_host
        )
        super().__init__(ipu_device=ipu_device)
        self.extended = extended
        partition.reduce_on_hosts()


IPUHorovodStrategy = IPUHorovodStrategyV1
