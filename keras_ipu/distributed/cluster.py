"""The cluster of IPUMultiWorkerStrategy: TF_CONFIG, checked against MPI.

Graphcore's IPUMultiWorkerStrategy takes a cluster resolver (usually
`tf.distribute.cluster_resolver.TFConfigClusterResolver()`, which reads the
TF_CONFIG environment variable) and reduces between the workers over gRPC.
Here the workers are the MPI processes and reduce over MPI, so the cluster a
resolver describes must be the MPI world: as many workers as processes, and
this process's task index (when TF_CONFIG gives one) equal to its rank.
"""

import json
import os

from keras_ipu.device.simulator import partition


class TFConfigClusterResolver:
    """The cluster of TF_CONFIG (`{"cluster": {"worker": [...]}, "task":
    {"type": "worker", "index": i}}`), without TensorFlow: the fields of
    TensorFlow's resolver that the strategy reads."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        text = environ.get("TF_CONFIG", "")
        try:
            config = json.loads(text) if text else {}
        except json.JSONDecodeError as e:
            raise ValueError(
                f"TF_CONFIG is not JSON ({e}): give e.g. "
                '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
                '"task": {"type": "worker", "index": 0}}.'
            ) from None
        self._cluster = config.get("cluster", {})
        task = config.get("task", {})
        self.task_type = task.get("type")
        self.task_id = task.get("index")

    def cluster_spec(self):
        return _ClusterSpec(self._cluster)


class _ClusterSpec:
    def __init__(self, cluster):
        self._cluster = {k: list(v) for k, v in cluster.items()}

    def as_dict(self):
        return dict(self._cluster)

    def num_tasks(self, job_name):
        return len(self._cluster.get(job_name, ()))

    @property
    def jobs(self):
        return list(self._cluster)


def workers(cluster_resolver):
    """(number of workers, this worker's index) of the resolver, checked
    against the MPI processes of this job."""
    if cluster_resolver is None:
        cluster_resolver = TFConfigClusterResolver()
    spec = cluster_resolver.cluster_spec()
    jobs = spec.as_dict() if hasattr(spec, "as_dict") else {}
    count = sum(len(tasks) for name, tasks in jobs.items() if name in ("worker", "chief"))
    rank, size = partition.mpi_rank_and_size()
    if count == 0:
        count = size  # an empty cluster: the MPI world is the cluster
    if count != size:
        raise ValueError(
            f"The cluster resolver describes {count} worker(s) ({jobs}) but MPI launched "
            f"{size} process(es): keras_ipu's IPUMultiWorkerStrategy reduces over MPI, so "
            f"launch one process per worker (mpirun -np {count} ... or python -m "
            f"keras_ipu.poprun --num-instances {count} ...)."
        )
    task_id = getattr(cluster_resolver, "task_id", None)
    if task_id is not None and int(task_id) != rank:
        raise ValueError(
            f"TF_CONFIG says this process is worker {task_id}, but it is MPI rank {rank}: "
            "give each process the task index of its rank, or leave 'task' out of "
            "TF_CONFIG (the rank is then the worker index)."
        )
    return count, rank
