"""Multi-process jobs, launched for real: keras_ipu.poprun and plain mpiexec
start MPI processes (MPICH from the `[mpi]` extra) running the programs in
programs/; the tests read what each instance wrote and what the launcher
said. CI runs them (the test extra includes the MPI extra): each job takes
a few seconds, most of it Python start-up.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py")

PROGRAMS = Path(__file__).parent / "programs"
# Every fault must end the whole job within this many seconds of its start
# (start-up included, on a loaded 2-core machine); the faults themselves are
# noticed at once (raise, kill) or after EXIT_GRACE_S / the timeout below.
JOB_LIMIT_S = 90
# A job still running after this long is hung. Only a guard: how long a job
# takes is not what these tests check (where it is, they measure it), and on
# CI's 2 cores, beside the other pytest worker's own multi-process job, a
# fit job has taken more than JOB_LIMIT_S (about 50 s at load 10 here).
HANG_LIMIT_S = 300
# Long enough that a loaded machine never keeps the healthy instance waiting
# that long at the start (both import and join MPI first), short enough for
# the job to end well within JOB_LIMIT_S.
COLLECTIVE_TIMEOUT_S = 10
# The launcher must end the job within this many seconds of an instance's
# death (hydra notices the closed PMI socket at once).
STOP_LIMIT_S = 30


def _run(command, tmp_path, timeout=HANG_LIMIT_S, **env):
    environment = dict(os.environ, **env)
    start = time.monotonic()
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start


def _poprun(*args):
    return [sys.executable, "-m", "keras_ipu.poprun", *map(str, args)]


def _mpiexec():
    return os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _results(tmp_path, n):
    return [json.loads((tmp_path / f"instance-{i}.json").read_text()) for i in range(n)]


def test_poprun_two_instances_four_replicas(tmp_path):
    done, _ = _run(
        _poprun(
            "--num-instances", 2, "--num-replicas", 4, "--print-topology", "yes",
            sys.executable, PROGRAMS / "collectives.py", tmp_path,
        ),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "| replicas  |" in done.stdout and "0-1" in done.stdout and "2-3" in done.stdout
    r0, r1 = _results(tmp_path, 2)
    for i, r in enumerate((r0, r1)):
        assert r["popdist"] == {
            "env_set": True, "instances": 2, "index": i, "total_replicas": 4,
            "local_replicas": 2, "offset": 2 * i, "ipus_per_replica": 1,
            # The 2-IPU devices of a Pod16's listing start at id 16.
            "device_id": 16 + i,
        }
        assert r["system"]["pod"] == 16
        assert r["system"]["process_count"] == 2 and r["system"]["process_index"] == i
        assert r["hvd"] == {"size": 2, "rank": i, "local_size": 2, "local_rank": i}
        assert r["on_instance_0"] == ("ran" if i == 0 else None)
    # Instance 0 owns ladder positions 0-1, instance 1 positions 2-3 (PCIe
    # ids of the reference's gc-info listing: 5, 7 and 4, 6).
    assert r0["system"]["ipus"] == [5, 7] and r1["system"]["ipus"] == [4, 6]
    x0, x1 = [0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]
    for r in (r0, r1):
        assert r["sum"] == [a + b for a, b in zip(x0, x1)]
        assert r["average"] == [(a + b) / 2 for a, b in zip(x0, x1)]
        assert r["scaled"] == r["sum"]  # 2x before, 0.5x after
        assert r["half"] == r["sum"]
        assert r["int_sum"] == [3]
        assert r["scalar"] == 1.5  # a Python number stays a scalar
        assert r["broadcast"] == x1
        assert r["allgather"] == [[0, 0], [1, 1], [1, 1]]


def test_plain_mpiexec_one_replica_per_instance(tmp_path):
    done, _ = _run(
        [_mpiexec(), "-n", "2", sys.executable, PROGRAMS / "collectives.py", tmp_path], tmp_path
    )
    assert done.returncode == 0, done.stderr
    for i, r in enumerate(_results(tmp_path, 2)):
        assert r["popdist"]["env_set"] is False
        assert (r["popdist"]["instances"], r["popdist"]["index"]) == (2, i)
        assert (r["popdist"]["total_replicas"], r["popdist"]["local_replicas"]) == (2, 1)
        # One IPU each: ladder positions 0 and 1, PCIe ids (= device ids) 5 and 7.
        assert r["popdist"]["offset"] == i and r["popdist"]["device_id"] == [5, 7][i]
        assert r["sum"] == [10.0, 12.0, 14.0, 16.0]


def test_poprun_four_instances_of_two_ipu_replicas(tmp_path):
    # 4 instances x 2 replicas x 4 IPUs = 32 IPUs: a Pod32 is simulated, and
    # every instance owns an aligned block of 8.
    done, _ = _run(
        _poprun(
            "--num-instances", 4, "--num-replicas", 8, "--ipus-per-replica", 4,
            sys.executable, PROGRAMS / "collectives.py", tmp_path,
        ),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path, 4)
    for i, r in enumerate(results):
        assert r["system"]["pod"] == 32
        assert r["system"]["ipus"] == list(range(8 * i, 8 * i + 8))
        assert r["popdist"]["offset"] == 2 * i
        assert r["allgather"] == [[k, k] for k in range(4) for _ in range(k + 1)]


@pytest.mark.parametrize(
    "mode, says",
    [
        ("raise", "instance 1 (replica 1) raised ValueError: instance 1 gives up"),
        ("kill", "instance 1 (replica 1) was killed by signal 9 (SIGKILL)"),
        ("exit", "Instance 1 of 2 ended its program while instance 0 waits for it"),
        ("hang", f"waited {COLLECTIVE_TIMEOUT_S} s in allreduce"),
        ("mismatch", "instance 1: broadcast from 0 of float64[5]"),
        ("before_mpi", "instance 1 had ended its program (code 0)"),
    ],
)
def test_a_failing_instance_ends_the_job_and_is_named(tmp_path, mode, says):
    # Only the stuck instance needs the short timeout; elsewhere a loaded
    # machine may legitimately keep an instance away for seconds.
    env = {}
    if mode in ("hang", "before_mpi"):
        env["KERAS_IPU_COLLECTIVE_TIMEOUT"] = str(COLLECTIVE_TIMEOUT_S)
    done, seconds = _run(
        _poprun("--num-instances", 2, sys.executable, PROGRAMS / "faults.py", mode, tmp_path),
        tmp_path,
        **env,
    )
    assert done.returncode != 0
    assert says in done.stderr, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("keras_ipu.poprun: instance 1 (replica 1)") or (
        mode in ("hang", "mismatch", "before_mpi")
        and last_line.startswith("keras_ipu.poprun: instance 0")
    ), last_line
    # Instance 0 was working (it wrote progress) and was stopped.
    assert (tmp_path / "progress-0").exists() or mode == "before_mpi"
    assert seconds < JOB_LIMIT_S


def test_plain_mpiexec_exception_in_one_rank_ends_the_job(tmp_path):
    done, _ = _run([_mpiexec(), "-n", "2", sys.executable, PROGRAMS / "faults.py", "raise", tmp_path], tmp_path)
    assert done.returncode != 0
    assert "instance 1 of 2 failed (ValueError: instance 1 gives up)" in done.stderr


def test_horovod_ops_on_tensorflow_values(tmp_path):
    done, _ = _run(
        _poprun("--num-instances", 2, sys.executable, PROGRAMS / "tensorflow_collectives.py", tmp_path),
        tmp_path,
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert done.returncode == 0, done.stderr
    for r in _results(tmp_path, 2):
        assert r["eager_type"] == "EagerTensor"
        assert r["average"] == [1.5, 3.0]
        assert r["variable_broadcast"] == [10.0]
        assert r["graph_sum"] == [3.0, 6.0]
        # IndexedSlices are gathered, as Horovod does.
        assert r["slices"] == [[[0.0], [1.0]], [0, 1]]


def test_poprun_output_of_one_instance_and_verbose_command(tmp_path):
    program = "import os; print('instance', os.environ['PMI_RANK'], os.environ['POPDIST_REPLICA_INDEX_OFFSET'])"
    done, _ = _run(
        _poprun("--num-instances", 3, "--num-replicas", 3, "--only-output-from-instance", 1, "-v",
                sys.executable, "-c", program),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "keras_ipu.poprun: running " in done.stdout and "-m keras_ipu.poprun.instance" in done.stdout
    printed = [line for line in done.stdout.splitlines() if line.startswith("instance")]
    assert printed == ["instance 1 1"]
@pytest.mark.parametrize("reduction", ["NONE", "MEAN"])
def test_two_processes_of_two_replicas_train_as_one_process_of_four(tmp_path, reduction):
    """fit in a PopDistStrategy scope: 2 instances x 2 replicas x batch 4
    reach the weights of 1 instance x 4 replicas x batch 4 (float32
    rounding: the instances' partial sums are added in another order), and
    instance 1, which starts from other random weights, gets instance 0's."""
    program = PROGRAMS / "data_parallel_fit.py"
    runs = {}
    for instances in (1, 2):
        out = tmp_path / f"x{instances}"
        out.mkdir()
        done, _ = _run(
            _poprun("--num-instances", instances, "--num-replicas", 4,
                    sys.executable, program, out, reduction),
            tmp_path, TF_CPP_MIN_LOG_LEVEL="3",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[instances] = _results(out, instances)
    (one,), (first, second) = runs[1], runs[2]
    assert one["replicas_in_sync"] == first["replicas_in_sync"] == 4
    # strategy.extended.read_var: instance i's sync-on-read variable holds i + 1.
    assert first["extended"] == "PopDistExtendedV1"
    assert one["read_var"] == {"sum": 1.0, "mean": 1.0, "only_first_replica": 1.0, "on_write": 1.0}
    for i, r in enumerate((first, second)):
        assert r["read_var"] == {"sum": 3.0, "mean": 1.5, "only_first_replica": 1.0, "on_write": i + 1.0}
    # Instance 1's first replica is the job's replica 2: its seeds are moved
    # by two replicas' stride (models/execution.py), never instance 0's.
    stride = 0x9E3779B9
    assert first["seed_state"] == one["seed_state"]
    assert second["seed_state"][0][0] == (first["seed_state"][0][0] + 2 * stride) % 2**32
    for w1, w2a, w2b in zip(one["weights"], first["weights"], second["weights"]):
        np.testing.assert_array_equal(w2a, w2b)  # the instances stay identical
        np.testing.assert_allclose(w2a, w1, rtol=1e-5, atol=1e-6)
    # Asynchronous callbacks: every step's logs, each step once.
    assert len(one["step_losses"]) == len(first["step_losses"]) == 2 * 6
    if reduction == "MEAN":
        # The mean over the replicas of every instance: the same everywhere.
        np.testing.assert_allclose(first["loss"], one["loss"], rtol=1e-5)
        assert first["loss"] == second["loss"]
        np.testing.assert_allclose(first["step_losses"], one["step_losses"], rtol=1e-5)
        assert first["step_losses"] == second["step_losses"]
    else:
        # Graphcore's NONE: the last replica of each instance (the outfeed is
        # per instance): instance 1's last replica is the job's last.
        np.testing.assert_allclose(second["loss"], one["loss"], rtol=1e-5)


def test_tensorflow_custom_loop_on_two_processes_trains_as_one_process(tmp_path):
    """A Graphcore-style TF2 custom loop (tf.GradientTape and
    optimizer.apply_gradients in strategy.run, strategy.reduce) of a tf.keras
    model under PopDistStrategy on 2 instances x 2 replicas: the weights of
    plain TensorFlow training on the same global batches in one process
    (float32 rounding), both instances identical (instance 1 starts from
    other random weights: instance 0's are broadcast). One replica per
    instance: tests/frontends/tensorflow/test_replica_context.py. Then
    tf.keras fit of the same model in the scope, to the same weights."""
    replicas = 4
    program = PROGRAMS / "tensorflow_custom_loop.py"
    done, _ = _run(
        _poprun("--num-instances", 2, "--num-replicas", replicas, sys.executable, program, tmp_path),
        # Two TensorFlow traces and XLA bridge compiles per instance.
        tmp_path, timeout=2 * HANG_LIMIT_S, TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = _results(tmp_path, 2)
    assert first["replicas_in_sync"] == second["replicas_in_sync"] == replicas
    for w0, w1, reference in zip(first["weights"], second["weights"], first["reference_weights"]):
        np.testing.assert_array_equal(w0, w1)
        np.testing.assert_allclose(w0, reference, rtol=1e-5, atol=1e-6)
    # tf.keras fit of the same model in the scope (the front end's trainer):
    # the gradients averaged over all 4 replicas of both instances.
    for f0, f1, reference in zip(first["fit_weights"], second["fit_weights"], first["reference_weights"]):
        np.testing.assert_array_equal(f0, f1)
        np.testing.assert_allclose(f0, reference, rtol=1e-5, atol=1e-6)
    # strategy.reduce(MEAN) of the job's loss (all-reduced inside the program).
    assert first["loss"] == second["loss"] and first["loss"][1] < first["loss"][0]


@pytest.mark.parametrize("kind", ["horovod", "multiworker"])
def test_horovod_style_strategies_reduce_over_plain_mpi_processes(tmp_path, kind):
    """IPUHorovodStrategy / IPUMultiWorkerStrategy (TF_CONFIG's cluster) under
    plain mpiexec, one replica per process and no multi-process IPUConfig:
    the same weights as one process of two replicas."""
    program = PROGRAMS / "data_parallel_fit.py"
    reference = tmp_path / "reference"
    reference.mkdir()
    done, _ = _run(
        _poprun("--num-instances", 1, "--num-replicas", 2, sys.executable, program, reference),
        tmp_path, TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / kind
    out.mkdir()
    cluster = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]}})
    done, _ = _run(
        [_mpiexec(), "-n", "2", sys.executable, program, out, "NONE", kind],
        tmp_path, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=cluster,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (one,), (first, second) = _results(reference, 1), _results(out, 2)
    assert first["replicas_in_sync"] == 2
    assert first["extended"] == {"horovod": "IPUHorovodExtended", "multiworker": "IPUMultiWorkerExtended"}[kind]
    assert second["read_var"] == {"sum": 3.0, "mean": 1.5, "only_first_replica": 1.0, "on_write": 2.0}
    for w1, w2a, w2b in zip(one["weights"], first["weights"], second["weights"]):
        np.testing.assert_array_equal(w2a, w2b)
        np.testing.assert_allclose(w2a, w1, rtol=1e-5, atol=1e-6)


def _atomic_saves_active():
    from keras.src.saving import saving_lib

    return getattr(saving_lib.save_weights_only, "writes_atomically", False)


def test_a_checkpoint_being_written_when_an_instance_dies_is_whole_and_the_job_resumes(tmp_path):
    """Instance 1 is killed while instance 0 writes its BackupAndRestore
    backup: the job ends, the backup and the checkpoint on disk are whole
    (the previous epoch's), and the job run again resumes from that backup
    and ends with the weights of a job that never stopped."""
    import keras

    if not _atomic_saves_active():
        pytest.skip("needs the atomic saves of the import hook (issue 14, item 8)")
    program = PROGRAMS / "checkpointed_fit.py"
    job = tmp_path / "job"
    job.mkdir()
    done, _ = _run(_poprun("--num-instances", 2, sys.executable, program, job, "crash"),
                   tmp_path, TF_CPP_MIN_LOG_LEVEL="3")
    ended = time.time()
    assert done.returncode != 0
    assert "instance 1 (replica 1) was killed by signal 9" in done.stderr, done.stderr[-2000:]
    assert (job / "instance-0-is-writing").exists()  # the kill landed mid-write
    # Instance 0 would sleep in its write for an hour: the launcher stopped it.
    killed = float((job / "instance-1-killed-at").read_text())
    assert ended - killed < STOP_LIMIT_S
    metadata = json.loads((job / "backup" / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1  # the backup of epoch 0: resume at epoch 1
    for path in (job / "backup" / "latest.weights.h5", job / "ckpt.weights.h5"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.load_weights(str(path))  # whole: it loads
    (job / "instance-0-is-writing").unlink()
    (job / "instance-1-killed-at").unlink()
    done, _ = _run(_poprun("--num-instances", 2, sys.executable, program, job, "resume"),
                   tmp_path, TF_CPP_MIN_LOG_LEVEL="3")
    assert done.returncode == 0, done.stderr[-3000:]
    reference = tmp_path / "reference"
    reference.mkdir()
    done, _ = _run(_poprun("--num-instances", 2, sys.executable, program, reference, "reference"),
                   tmp_path, TF_CPP_MIN_LOG_LEVEL="3")
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((job / "result-0.json").read_text())
    whole = json.loads((reference / "result-0.json").read_text())
    assert resumed["epochs"] == [1, 2, 3] and whole["epochs"] == [0, 1, 2, 3]
    for a, b in zip(resumed["weights"], whole["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_graphcore_popdist_tutorial_ported(tmp_path):
    """examples/popdist_training.py: Graphcore's PopDist tutorial after the
    porting contract's import edits (synthetic CIFAR-10-shaped data), on 2
    instances x 2 replicas. 128 samples: each instance's shard is 2 batches
    of 32, one step of its 2 replicas (the job trains, reduces over both
    instances and saves; most of the time is the processes' start-up)."""
    import keras

    example = Path(__file__).resolve().parents[2] / "examples" / "popdist_training.py"
    saved = tmp_path / "saved_model.keras"
    done, _ = _run(
        _poprun("--num-instances", 2, "--num-replicas", 4, sys.executable, example,
                "--samples", 128, "--save", saved),
        tmp_path, timeout=2 * HANG_LIMIT_S, TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Data distribution within each instance (2 local replica(s))" in done.stdout
    assert "Batches per shard:\t2" in done.stdout and "Steps per execution:\t1" in done.stdout
    losses = re.findall(r" - loss: ([0-9.]+)", done.stdout)  # instance 0's epoch log (verbose=2)
    assert len(losses) == 1 and np.isfinite(float(losses[0])), done.stdout[-2000:]
    assert saved.exists() and f"saved {saved}" in done.stdout
    model = keras.saving.load_model(saved)  # instance 0's save is whole
    assert [w.shape for w in model.get_weights()][-1] == (10,)
    assert all(np.isfinite(w).all() for w in model.get_weights())
