"""The ResNet-50 calibration of benchmarks/resnet50_calibration.py: the
float16 training step is traced and compiled (not run) and costed. The
images/s figure itself is reported, not asserted beyond sanity."""

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _benchmark():
    import keras

    if keras.backend.backend() != "ipu":
        pytest.skip("needs KERAS_BACKEND=ipu")
    path = os.path.join(ROOT, "benchmarks", "resnet50_calibration.py")
    spec = importlib.util.spec_from_file_location("resnet50_calibration", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def calibration():
    bench = _benchmark()
    return bench, bench.calibrate(micro_batch=16, target="ipu21")


def test_resnet50_training_step_macs(calibration):
    _, cal = calibration
    p = cal.prediction
    convs = [s for s in p.steps if s.name == "conv_general_dilated"]
    # 53 convolutions forward; backward: 53 weight gradients and 52 input
    # gradients (the image is not differentiated).
    assert len(convs) == 158
    # ResNet-50 at 224x224: ~4.1 GMACs per image forward; training ~3x.
    macs = sum(s.macs for s in p.steps)
    assert 11.5e9 * 16 < macs < 13.0e9 * 16
    # Everything is costed in float16 except what Keras itself promotes.
    assert all(n.outputs[0].aval.dtype == np.float16 for n in cal.executable.steps
               if n.primitive.name == "conv_general_dilated")


def test_resnet50_prediction_is_consistent_and_sane(calibration):
    bench, cal = calibration
    p = cal.prediction
    assert p.target.name == "ipu21"
    # Weights and optimizer state stay on the IPU: only images (float16)
    # and labels (int32) go in; only the logs come out.
    assert p.host_bytes_in == 16 * 224 * 224 * 3 * 2 + 16 * 4
    assert p.host_bytes_out < 64
    assert sum(cal.breakdown.values()) == p.cycles
    assert cal.breakdown["conv/matmul compute"] > cal.breakdown["elementwise compute"] > 0
    assert p.samples_per_second == pytest.approx(16 / p.step_seconds)
    # Sanity, not calibration: within a factor 2 of the published figure.
    assert 0.5 < cal.ratio < 2.0
    text = bench.table(cal)
    assert "ratio predicted / published" in text and "host I/O" in text
