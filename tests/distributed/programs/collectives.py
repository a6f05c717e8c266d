"""Run by tests/distributed/test_multiprocess.py in every instance of a job:
what popdist says, the Horovod-style collectives, and an IPUConfig set by
popdist.tensorflow.set_ipu_config, written as JSON to OUT_DIR/instance-<i>.json.
"""

import json
import os
import sys

import numpy as np

import keras_ipu.popdist.tensorflow
from keras_ipu import distributed as hvd
from keras_ipu import popdist
from keras_ipu.config import IPUConfig
from keras_ipu.device.config import get_system

hvd.init()
config = keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig())
config.configure_ipu_system()
system = get_system()
rank = hvd.rank()
x = np.arange(4, dtype=np.float32) + 10 * rank
result = {
    "popdist": {
        "env_set": popdist.isPopdistEnvSet(),
        "instances": popdist.getNumInstances(),
        "index": popdist.getInstanceIndex(),
        "total_replicas": popdist.getNumTotalReplicas(),
        "local_replicas": popdist.getNumLocalReplicas(),
        "offset": popdist.getReplicaIndexOffset(),
        "ipus_per_replica": popdist.getNumIpusPerReplica(),
        "device_id": popdist.getDeviceId(),
    },
    "system": {
        "pod": system.pod.num_ipus,
        "ipus": list(system.devices[0].ipus),
        "process_count": config.experimental.multi_replica_distribution.process_count,
        "process_index": config.experimental.multi_replica_distribution.process_index,
    },
    "hvd": {"size": hvd.size(), "rank": rank, "local_size": hvd.local_size(), "local_rank": hvd.local_rank()},
    "sum": hvd.allreduce(x, op=hvd.Sum).tolist(),
    "average": hvd.allreduce(x).tolist(),
    "scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist(),
    "half": hvd.allreduce(x.astype(np.float16), op=hvd.Sum).tolist(),
    "int_sum": hvd.allreduce(np.array([rank + 1], np.int32), op=hvd.Sum).tolist(),
    "scalar": hvd.allreduce(float(rank + 1)),
    "broadcast": hvd.broadcast(x, root_rank=hvd.size() - 1).tolist(),
    "allgather": hvd.allgather(np.full((rank + 1, 2), rank, np.int64)).tolist(),
    "on_instance_0": popdist.execute_on_instances({0}, lambda: "ran"),
}
with open(os.path.join(sys.argv[1], f"instance-{rank}.json"), "w") as f:
    json.dump(result, f)
