"""AdamIpuOptimizer, LAMBIpuOptimizer, SGDIpuOptimizer and the Keras
GradientAccumulationOptimizer: their updates against Keras' optimizers
and NumPy transcriptions of Graphcore's formulas."""

import keras
import numpy as np
import pytest

from keras_ipu.keras import optimizers as keras_ipu_optimizers
from keras_ipu.optimizers import AdamIpuOptimizer
from keras_ipu.optimizers import LAMBIpuOptimizer
from keras_ipu.optimizers import SGDIpuOptimizer

GradientAccumulationOptimizer = keras_ipu_optimizers.GradientAccumulationOptimizer

RNG = np.random.default_rng(0)
W0 = RNG.normal(size=(3, 4)).astype("float32")
GRADS = [RNG.normal(size=(3, 4)).astype("float32") for _ in range(5)]


def applied(optimizer, w0=W0, grads=GRADS, name=None):
    variable = keras.Variable(w0, name=name)
    for g in grads:
        optimizer.apply([g], [variable])
    return np.asarray(variable), optimizer


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_is_keras_sgd(momentum, nesterov):
    ours, _ = applied(SGDIpuOptimizer(0.1, momentum=momentum, nesterov=nesterov))
    theirs, _ = applied(keras.optimizers.SGD(0.1, momentum=momentum, nesterov=nesterov))
    np.testing.assert_array_equal(ours, theirs)


def adam_reference(w, grads, lr, b1, b2, eps, amsgrad=False, debiasing=True):
    w = w.astype(np.float64)
    m = v = vhat = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if debiasing else (m, v)
        if amsgrad:
            vhat = np.maximum(vhat, v_hat)
            v_hat = vhat
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("debiasing", [True, False])
def test_adam_is_graphcore_formula(amsgrad, debiasing):
    ours, _ = applied(AdamIpuOptimizer(0.05, epsilon=1e-3, amsgrad=amsgrad,
                                       debiasing=debiasing))
    want = adam_reference(W0, GRADS, 0.05, 0.9, 0.999, 1e-3, amsgrad, debiasing)
    # float32 against a float64 reference over 5 steps of size ~0.15.
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=2e-5)


def test_adam_without_epsilon_is_keras_adam():
    # Keras adds epsilon before debiasing, Graphcore after: with none they
    # are one formula.
    ours, _ = applied(AdamIpuOptimizer(0.05, epsilon=0.0))
    theirs, _ = applied(keras.optimizers.Adam(0.05, epsilon=0.0))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def lamb_reference(w, grads, lr, b1, b2, eps, wd, decay=True, adapt=True, clip=None):
    w = w.astype(np.float64)
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        if decay:
            u = u + wd * w
        ratio = 1.0
        if adapt:
            w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
            if clip is not None:
                w_norm = min(w_norm, clip)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        w = w - lr * ratio * u
    return w


def test_lamb_is_graphcore_formula():
    ours, _ = applied(LAMBIpuOptimizer(0.01, weight_decay_rate=0.1), name="kernel")
    want = lamb_reference(W0, GRADS, 0.01, 0.9, 0.999, 1e-6, 0.1)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)
    clipped, _ = applied(LAMBIpuOptimizer(0.01, weight_norm_clip=0.5))
    np.testing.assert_allclose(
        clipped, lamb_reference(W0, GRADS, 0.01, 0.9, 0.999, 1e-6, 0.0, clip=0.5),
        rtol=1e-5, atol=1e-6)
    # Exclusions match the weight's path; a zero weight gets ratio 1.
    excluded, _ = applied(LAMBIpuOptimizer(
        0.01, weight_decay_rate=0.1, exclude_from_weight_decay=["bias"],
        exclude_from_layer_adaptation=["bi.s"]), name="bias")
    np.testing.assert_allclose(
        excluded, lamb_reference(W0, GRADS, 0.01, 0.9, 0.999, 1e-6, 0.1, False, False),
        rtol=1e-5, atol=1e-6)
    zero, _ = applied(LAMBIpuOptimizer(0.01), w0=np.zeros_like(W0), grads=GRADS[:1])
    np.testing.assert_allclose(
        zero, lamb_reference(np.zeros_like(W0), GRADS[:1], 0.01, 0.9, 0.999, 1e-6, 0.0),
        rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="Must provide a list of two elements for "
                       "the optimizer compute precision"):
        LAMBIpuOptimizer(optimizer_compute_precisions=("float32",))


def test_state_precisions():
    _, adam = applied(AdamIpuOptimizer(m_dtype="float16", v_dtype=np.float32,
                                       vhat_dtype="float16", amsgrad=True))
    assert [v.dtype for v in (adam._momentums[0], adam._velocities[0],
                              adam._velocity_hats[0])] == ["float16", "float32", "float16"]
    _, sgd = applied(SGDIpuOptimizer(momentum=0.5, momentum_accum_dtype="float16"))
    assert sgd.momentums[0].dtype == "float16"
    _, lamb = applied(LAMBIpuOptimizer(m_dtype="float16"))
    assert lamb._m[0].dtype == "float16" and lamb._v[0].dtype == "float32"


def test_gradient_accumulation_sums_then_applies():
    ours, wrapper = applied(GradientAccumulationOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.5), 2), grads=GRADS[:4])
    theirs, _ = applied(keras.optimizers.SGD(0.1, momentum=0.5),
                        grads=[GRADS[0] + GRADS[1], GRADS[2] + GRADS[3]])
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert int(wrapper.inner_optimizer.iterations) == 2
    # Between updates nothing changes; the sum waits in the accumulator.
    middle, _ = applied(GradientAccumulationOptimizer(keras.optimizers.SGD(0.1), 3),
                        grads=GRADS[:2])
    np.testing.assert_array_equal(middle, W0)


def test_gradient_accumulation_graphcore_rules():
    sgd = keras.optimizers.SGD()
    assert GradientAccumulationOptimizer(sgd, 1) is sgd
    with pytest.raises(ValueError, match="num mini batches must be >= 1"):
        GradientAccumulationOptimizer(sgd, 0)
    wrapper = GradientAccumulationOptimizer(sgd, 2, dtype=lambda v: "float16")
    variable = keras.Variable(W0)
    wrapper.build([variable])
    assert wrapper.accumulators[0].dtype == "float16"


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def test_gradient_accumulation_in_fit_is_a_larger_batch():
    x = RNG.normal(size=(16, 3)).astype("float32")
    y = RNG.normal(size=(16, 1)).astype("float32")
    # Sum of 2 mini-batch gradients of a mean loss = 2 x the gradient of
    # the mean over both: SGD(lr) accumulated == SGD(2 lr) on batches of 8.
    accumulated = _model()
    accumulated.compile(optimizer=GradientAccumulationOptimizer(
        keras.optimizers.SGD(0.05), 2), loss="mse", steps_per_execution=2)
    accumulated.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    large = _model()
    large.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    large.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(accumulated.get_weights(), large.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", [
    lambda: AdamIpuOptimizer(0.01, amsgrad=True, m_dtype="float16"),
    lambda: LAMBIpuOptimizer(0.01, weight_decay_rate=0.01,
                             exclude_from_weight_decay=["bias"]),
    lambda: SGDIpuOptimizer(0.01, momentum=0.9, clipnorm=1.0),
    lambda: GradientAccumulationOptimizer(AdamIpuOptimizer(0.01), 2, dtype="float32"),
])
def test_fit_compiled_save_and_load(optimizer, tmp_path):
    x = RNG.normal(size=(8, 3)).astype("float32")
    model = _model()
    model.compile(optimizer=optimizer(), loss="mse")
    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
