"""The pieces of a multi-process job that need no processes: what an
instance sees of the Pod (device/simulator/partition.py, keras_ipu.popdist),
the launcher's options, command line and failure summary."""

import json

import pytest

from keras_ipu.device.config import IPUConfig
from keras_ipu.device.config.system_config import build_system
from keras_ipu.device.simulator import partition
from keras_ipu.device.simulator.system import Pod
from keras_ipu.poprun import launcher


def _env(rank, size, **popdist):
    env = {"PMI_RANK": str(rank), "PMI_SIZE": str(size)}
    env.update({f"POPDIST_{k.upper()}": str(v) for k, v in popdist.items()})
    return env


def test_single_process_is_one_replica_on_a_pod16():
    p = partition.current({})
    assert (p.num_instances, p.instance_index, p.num_total_replicas) == (1, 0, 1)
    assert (p.num_local_replicas, p.replica_index_offset, p.ipus_per_replica) == (1, 0, 1)
    assert not p.from_poprun and not p.is_distributed
    assert p.pod_size == 16
    assert p.device_id() == 5  # ladder position 0 is PCIe id 5 in the Pod16 listing


def test_mpi_rank_from_open_mpi_variables():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    assert partition.mpi_rank_and_size(env) == (3, 4)
    p = partition.current(env)
    assert (p.num_total_replicas, p.replica_index_offset) == (4, 3)


def test_poprun_share_of_each_instance():
    shares = [
        partition.current(
            _env(i, 4, num_total_replicas=16, num_ipus_per_replica=2, replica_index_offset=4 * i)
        )
        for i in range(4)
    ]
    pod = Pod(shares[0].pod_size)
    assert pod.num_ipus == 32  # 16 replicas x 2 IPUs
    for i, p in enumerate(shares):
        assert p.from_poprun and p.num_local_replicas == 4 and p.num_local_ipus == 8
        config = pod.configurations[p.device_id(pod)]
        assert config.num_ipus == 8 and config.ladder_positions == tuple(range(8 * i, 8 * i + 8))


@pytest.mark.parametrize(
    "env, message",
    [
        (_env(0, 3, num_total_replicas=4), "multiple of --num-instances"),
        (_env(0, 2, num_total_replicas=0), "at least 1"),
        ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK='x' is not an integer"),
        (_env(2, 2), r"MPI rank 2 is not in \[0, 2\)"),
    ],
)
def test_bad_launcher_environment(env, message):
    with pytest.raises(ValueError, match=message):
        partition.current(env)


def test_device_of_a_non_power_of_two_share_is_refused():
    p = partition.current(_env(0, 2, num_total_replicas=6))
    with pytest.raises(ValueError, match="a device of 3 IPUs"):
        p.device_id()


def test_popdist_and_set_ipu_config(monkeypatch):
    from keras_ipu import popdist
    from keras_ipu.popdist import tensorflow as popdist_tf

    for name, value in _env(1, 2, num_total_replicas=4, replica_index_offset=2).items():
        monkeypatch.setenv(name, value)
    assert popdist.isPopdistEnvSet() and popdist.getNumInstances() == 2
    assert popdist.getInstanceIndex() == 1 and popdist.getNumLocalReplicas() == 2
    assert popdist.getReplicaIndexOffset() == 2 and popdist.getDeviceId() == 17
    assert popdist.checkNumIpusPerReplica(1) and not popdist.checkNumIpusPerReplica(2)
    config = popdist_tf.set_ipu_config(IPUConfig())
    assert config.select_ipus == [17]
    mrd = config.experimental.multi_replica_distribution
    assert (mrd.process_count, mrd.process_index) == (2, 1)
    system = build_system(config)
    assert system.devices[0].ipus == (4, 6)  # ladder positions 2 and 3
    with pytest.raises(ValueError, match="launched with --ipus-per-replica 1"):
        popdist_tf.set_ipu_config(IPUConfig(), ipus_per_replica=2)
    with pytest.raises(ValueError, match=r"instance\(s\) \[2\] do not exist"):
        popdist.execute_on_instances({2}, print)


def test_multi_replica_distribution_must_match_the_processes():
    config = IPUConfig()
    config.experimental.multi_replica_distribution.process_count = 2
    with pytest.raises(ValueError, match="this process is instance 0 of 1 launched by MPI"):
        build_system(config)


def _args(*argv):
    args = launcher._parser().parse_args([*map(str, argv), "python", "train.py"])
    return args


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--num-instances", 3, "--num-replicas", 4), "not a multiple of --num-instances 3"),
        (("--num-instances", 2, "--num-replicas", 6), "= 3 IPUs"),
        (("--num-instances", 0), "start at least one instance"),
        (("--num-instances", 2, "--only-output-from-instance", 2), "numbered 0 to 1"),
        (("--host", "elsewhere"), "remote hosts ['elsewhere'] are not supported"),
    ],
)
def test_launcher_option_errors(argv, message):
    assert message in launcher._check(_args(*argv))


def test_launcher_rejects_bad_options_before_starting_anything(capsys):
    assert launcher.main(["--num-instances", "3", "--num-replicas", "4", "python", "x.py"]) == 2
    assert "not a multiple" in capsys.readouterr().err


@pytest.mark.parametrize("flavour", ["hydra", "openmpi"])
def test_launcher_command_line(flavour):
    args = _args("--num-instances", 2, "--num-replicas", 4, "--ipus-per-replica", 2)
    command, env = launcher.build_command(args, "/bin/mpiexec", flavour)
    assert env["POPDIST_NUM_TOTAL_REPLICAS"] == "4" and env["POPDIST_NUM_LOCAL_REPLICAS"] == "2"
    assert env["POPDIST_NUM_IPUS_PER_REPLICA"] == "2"
    sections = " ".join(command).split(" : ")
    assert len(sections) == 2
    for i, section in enumerate(sections):
        offset = f"POPDIST_REPLICA_INDEX_OFFSET={2 * i}" if flavour == "openmpi" else f"POPDIST_REPLICA_INDEX_OFFSET {2 * i}"
        assert offset in section
        assert section.endswith("-m keras_ipu.poprun.instance -- python train.py")
    assert ("--oversubscribe" in command) == (flavour == "openmpi")


def _status(tmp_path, i, kind, record):
    (tmp_path / f"instance-{i}.{kind}").write_text(json.dumps(record))


def test_summary_names_the_instance_that_raised(tmp_path):
    _status(tmp_path, 0, "error", {"error": "InstanceFailedError: Instance 1 failed", "blames": 1})
    _status(tmp_path, 1, "error", {"error": "ValueError: boom", "blames": None})
    _status(tmp_path, 1, "exit", {"code": 1, "signal": None, "time": 2.0, "stopped": False})
    _status(tmp_path, 0, "exit", {"code": None, "signal": 15, "time": 1.0, "stopped": True})
    assert launcher.summarise(tmp_path, 2, 4) == (
        "instance 1 (replicas 2-3) raised ValueError: boom; the other instances were stopped."
    )


def test_summary_names_the_first_instance_that_died(tmp_path):
    _status(tmp_path, 2, "exit", {"code": None, "signal": 9, "time": 1.0, "stopped": False})
    _status(tmp_path, 1, "exit", {"code": 3, "signal": None, "time": 2.0, "stopped": False})
    summary = launcher.summarise(tmp_path, 3, 3)
    assert summary.startswith("instance 2 (replica 2) was killed by signal 9 (SIGKILL)")
    assert launcher.summarise(tmp_path / "nothing", 3, 3) is None


def test_topology_table():
    table = launcher.topology(2, 4)
    assert "| instances |" in table and "0-1" in table and "2-3" in table


def test_collective_timeout_setting(monkeypatch):
    from keras_ipu.distributed import mpi_world

    monkeypatch.setenv(mpi_world.TIMEOUT_ENV, "2.5")
    assert mpi_world.timeout_seconds() == 2.5
    monkeypatch.setenv(mpi_world.TIMEOUT_ENV, "-1")
    with pytest.raises(ValueError, match="a positive number; default 300"):
        mpi_world.timeout_seconds()


def test_collectives_refuse_traced_values_and_strings():
    from keras_ipu.device.trace import Tracer
    from keras_ipu.distributed import host_collectives

    tracer = Tracer.__new__(Tracer)
    with pytest.raises(NotImplementedError, match="runs on the host"):
        host_collectives._to_numpy(tracer, "allreduce")
    with pytest.raises(TypeError, match="dtype <U1"):
        host_collectives._to_numpy(["a"], "allreduce")
    with pytest.raises(NotImplementedError, match="Adasum"):
        host_collectives.allreduce(1.0, op=host_collectives.Adasum)
    with pytest.raises(ValueError, match="use ipu.distributed.Sum"):
        host_collectives.allreduce(1.0, op="sum")


def test_tf_config_cluster_must_be_the_mpi_world(monkeypatch):
    from keras_ipu.distributed import cluster

    config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'
    resolver = cluster.TFConfigClusterResolver({"TF_CONFIG": config})
    assert resolver.cluster_spec().num_tasks("worker") == 2 and resolver.task_id == 1
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "1")
    assert cluster.workers(resolver) == (2, 1)
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(ValueError, match="worker 1, but it is MPI rank 0"):
        cluster.workers(resolver)
    monkeypatch.setenv("PMI_SIZE", "3")
    with pytest.raises(ValueError, match=r"2 worker\(s\) .* but MPI launched 3"):
        cluster.workers(resolver)
    assert cluster.workers(cluster.TFConfigClusterResolver({})) == (3, 0)
    with pytest.raises(ValueError, match="TF_CONFIG is not JSON"):
        cluster.TFConfigClusterResolver({"TF_CONFIG": "{"})
