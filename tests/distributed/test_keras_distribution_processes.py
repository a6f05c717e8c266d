"""keras.distribution in a job of several processes (poprun / MPI): each
process's DeviceMesh covers its own IPUs (list_devices()), the model axis
within them, and the replicas of all the processes train as one
data-parallel job (the gradients all-reduced over MPI as PopDistStrategy's,
every process starting from instance 0's weights)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras

PROGRAMS = Path(__file__).parent / "programs"
sys.path.insert(0, str(PROGRAMS))
import keras_distribution_fit as program  # noqa: E402


def test_model_parallel_on_two_processes_trains_as_one_process(tmp_path):
    pytest.importorskip("mpi4py")
    done = subprocess.run(
        [sys.executable, "-m", "keras_ipu.poprun", "--num-instances", "2", "--num-replicas", "2",
         "--ipus-per-replica", "2", sys.executable, PROGRAMS / "keras_distribution_fit.py",
         tmp_path],
        cwd=tmp_path, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"instance-{i}.json").read_text()) for i in range(2))
    # Each process: one replica on its 2 IPUs, the kernels split over them
    # (and d1's bias, added to d1's split columns).
    assert first["devices"] == second["devices"] == ["ipu:0", "ipu:1"]
    assert first["split"] == [1, 0, 0, None]

    # The same model on one process: a (2, 2) mesh, 2 replicas of 2 IPUs,
    # the global batch of 16 split over the replicas as the instances split it.
    import keras_ipu as ipu

    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 4
    config.configure_ipu_system()
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"],
                                         keras.distribution.list_devices())
    x, y = program.data()
    with keras.distribution.ModelParallel(layout_map=program.layout_map(mesh)).scope():
        one = program.model(1)
        history = one.fit(x, y, batch_size=program.GLOBAL_BATCH, epochs=1, shuffle=False,
                          verbose=0)
    for w, a, b in zip(one.get_weights(), first["weights"], second["weights"]):
        np.testing.assert_array_equal(a, b)  # the instances stay identical
        # (float32 rounding: the instances' partial sums are added over MPI.)
        np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-7)
    # The loss is the mean over every replica of every process.
    np.testing.assert_allclose(first["loss"], history.history["loss"], rtol=1e-6)
    assert first["loss"] == second["loss"]


def test_processes_that_would_not_all_reduce_together_are_refused(monkeypatch):
    import keras_ipu as ipu

    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    config = ipu.config.IPUConfig()  # not popdist's: no multi_replica_distribution
    config.auto_select_ipus = 2
    config.configure_ipu_system()
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"],
                                         keras.distribution.list_devices())
    with keras.distribution.ModelParallel(layout_map=program.layout_map(mesh)).scope():
        with pytest.raises(ValueError, match=r"one of 2 \(its MPI launcher's\).*all-reduce over "
                           r"1 process.*set_ipu_config"):
            program.model(1)
