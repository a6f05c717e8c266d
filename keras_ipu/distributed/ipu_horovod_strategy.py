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
from keras_ipu.distributed.popdist_strategy import PopDistStrategy


class IPUHorovodStrategyV1(PopDistStrategy):
    """Data parallelism over the MPI processes, reduced on the hosts.

    `variables_on_host=True` (weights and their update kept on the host) is
    not supported.
    """

    def __init__(self, ipu_device="/device:IPU:0", variables_on_host=False):
        warnings.warn(
            f"{type(self).__name__} is deprecated: use PopDistStrategy instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        if variables_on_host:
            raise NotImplementedError(
                "variables_on_host=True is not supported: the weights and their update "
                "stay on the IPU (leave variables_on_host at False)."
            )
        super().__init__(ipu_device=ipu_device)
        partition.reduce_on_hosts()


IPUHorovodStrategy = IPUHorovodStrategyV1
