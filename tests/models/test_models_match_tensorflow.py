"""Inference of real models on the ipu backend equals Keras on TensorFlow.

Each model of model_zoo.SPECS is built here (KERAS_BACKEND=ipu), given
random weights, and saved with its inputs; one subprocess under
KERAS_BACKEND=tensorflow loads every model's weights and writes its
predictions and evaluate() results, which must match ours to float32
precision.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import model_zoo  # noqa: E402

import keras  # noqa: E402

RTOL = 1e-5
ATOL = 1e-6  # for entries that are ~0, where a relative bound means nothing
SPEC_IDS = [spec.name for spec in model_zoo.SPECS]


def build_with_weights(spec, seed=0):
    model = spec.build(keras)
    model_zoo.randomize_weights(model, np.random.default_rng(seed))
    return model


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """{name: (model dir, reference arrays or the ipu-side build error)}."""
    workdir = tmp_path_factory.mktemp("tf_reference")
    build_errors = {}
    for spec in model_zoo.SPECS:
        model_dir = workdir / spec.name
        model_dir.mkdir()
        x, y = spec.data(np.random.default_rng(1))
        model_zoo.save_data(model_dir / "data.npz", x, y)
        try:
            model = build_with_weights(spec)
            model.save_weights(model_dir / "model.weights.h5")
        except Exception as e:  # reported by that model's tests
            build_errors[spec.name] = e
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, model_zoo.__file__, str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"TensorFlow reference run failed:\n{proc.stderr[-6000:]}")
    results = {}
    for spec in model_zoo.SPECS:
        model_dir = workdir / spec.name
        if spec.name in build_errors:
            results[spec.name] = (model_dir, build_errors[spec.name])
        else:
            with np.load(model_dir / "reference.npz") as f:
                results[spec.name] = (model_dir, dict(f))
    return results


def reference_for(reference, name):
    model_dir, ref = reference[name]
    if isinstance(ref, Exception):
        raise ref
    return model_dir, ref


def load_ipu_model(model_dir, spec):
    model = spec.build(keras)
    model.load_weights(model_dir / "model.weights.h5")
    return model


@pytest.mark.parametrize("name", SPEC_IDS)
def test_predict_matches_tensorflow(reference, name):
    spec = model_zoo.SPECS_BY_NAME[name]
    model_dir, ref = reference_for(reference, name)
    model = load_ipu_model(model_dir, spec)
    x, _ = model_zoo.load_data(model_dir / "data.npz", spec)

    got = model_zoo.flat_outputs(
        model.predict(x, batch_size=spec.batch_size, verbose=0)
    )
    expected = [ref[f"predict{i}"] for i in range(len(got))]
    assert len([k for k in ref if k.startswith("predict")]) == len(got)
    for g, e in zip(got, expected):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", SPEC_IDS)
def test_evaluate_matches_tensorflow(reference, name):
    spec = model_zoo.SPECS_BY_NAME[name]
    model_dir, ref = reference_for(reference, name)
    model = load_ipu_model(model_dir, spec)
    x, y = model_zoo.load_data(model_dir / "data.npz", spec)
    model_zoo.compile_for_evaluate(model, spec, keras)

    got = model.evaluate(
        x, y, batch_size=spec.batch_size, verbose=0, return_dict=True
    )
    expected = {
        k.split("/", 1)[1]: float(v) for k, v in ref.items() if k.startswith("evaluate/")
    }
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize("name", SPEC_IDS)
def test_keras_file_round_trip(tmp_path, name):
    spec = model_zoo.SPECS_BY_NAME[name]
    model = build_with_weights(spec, seed=2)
    x, _ = spec.data(np.random.default_rng(3))
    before = model_zoo.flat_outputs(model.predict(x, verbose=0))

    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")

    after = model_zoo.flat_outputs(restored.predict(x, verbose=0))
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    for v1, v2 in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(v1), keras.ops.convert_to_numpy(v2)
        )


@pytest.mark.parametrize("name", SPEC_IDS)
def test_weights_file_round_trip(tmp_path, name):
    spec = model_zoo.SPECS_BY_NAME[name]
    model = build_with_weights(spec, seed=4)
    model.save_weights(tmp_path / "model.weights.h5")
    other = build_with_weights(spec, seed=5)
    x, _ = spec.data(np.random.default_rng(6))
    differs = model_zoo.flat_outputs(other.predict(x, verbose=0))

    other.load_weights(tmp_path / "model.weights.h5")

    expected = model_zoo.flat_outputs(model.predict(x, verbose=0))
    got = model_zoo.flat_outputs(other.predict(x, verbose=0))
    assert any(not np.array_equal(d, e) for d, e in zip(differs, expected))
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
