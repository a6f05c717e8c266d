"""Float16 as on the IPU: stochastic rounding (esr) and floating-point
exceptions (inv, div0, oflo, nanoo) of floating_point_behaviour.

Reference values are computed here with NumPy (float16 neighbours, IEEE
results) or by hand; statistical checks use 6-sigma bounds from the exact
binomial variance, so they fail for a biased rounding, not by chance.
"""

import pickle

import keras
import numpy as np
import pytest

import keras_ipu
from keras_ipu import config as ipu_config
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.jit import jit
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.structure import reshape_p
from keras_ipu.device.simulator import numerics
from keras_ipu.device.simulator import stochastic_rounding as sr

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
ON = ipu_config.StochasticRoundingBehaviour.ON


@pytest.fixture(autouse=True)
def _fresh_system():
    ipu_config.reset_ipu_configuration()
    yield
    ipu_config.reset_ipu_configuration()


def configure(**flags):
    cfg = ipu_config.IPUConfig()
    for name, value in flags.items():
        setattr(cfg.floating_point_behaviour, name, value)
    cfg.configure_ipu_system()
    return cfg


def neighbours(x):
    """(lo, hi) float16 neighbours of float32 x (lo <= x <= hi), in float64."""
    x = np.float32(x)
    near = np.float16(x)
    if np.float32(near) == x:
        return float(near), float(near)
    other = np.nextafter(near, np.float16(np.inf if np.float32(near) < x else -np.inf))
    lo, hi = sorted((float(near), float(other)))
    return lo, hi


def assert_unbiased(samples, x, n):
    lo, hi = neighbours(x)
    values = np.asarray(samples, np.float64)
    assert set(np.unique(values)) <= {lo, hi}, (x, np.unique(values))
    p = (float(np.float32(x)) - lo) / (hi - lo)
    sigma = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert abs(values.mean() - float(np.float32(x))) <= 6 * sigma + 1e-12 * abs(x), (
        x, values.mean(), sigma)


# -- the kernel ------------------------------------------------------------------

MAGNITUDES = [
    1.0 + 2.0**-12,  # a quarter of an ULP above 1
    -3.14159,
    1234.567,
    60000.5,  # near the top of float16
    2.0e-5,  # float16 normal, small
    -3.0e-6,  # float16 subnormal
    7.0e-8,  # between 2**-24 and 2**-23
    2.0e-8,  # below the smallest subnormal: rounds to 0 or 2**-24
]


@pytest.mark.parametrize("x", MAGNITUDES)
def test_stochastic_rounding_is_unbiased(x):
    n = 200_000
    rng = np.random.default_rng(1)
    out = sr.round_to_float16(np.full(n, x, np.float32), rng)
    assert out.dtype == F16 and out.shape == (n,)
    assert_unbiased(out, x, n)


def test_probability_of_rounding_up_is_the_fraction():
    # x = lo + 0.3 * (hi - lo): P(up) = 0.3 exactly (binomial check).
    lo, hi = 1.0, 1.0 + 2.0**-10
    x = np.float32(lo + 0.25 * (hi - lo))
    n = 400_000
    out = sr.round_to_float16(np.full(n, x, np.float32), np.random.default_rng(7))
    up = np.mean(out == np.float16(hi))
    assert abs(up - 0.25) < 6 * np.sqrt(0.25 * 0.75 / n)


def test_results_are_float16_neighbours_across_the_range():
    rng = np.random.default_rng(5)
    n = 200_000
    x = (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-30, 17.5, n)).astype(np.float32)
    with np.errstate(over="ignore"):
        near = x.astype(np.float16)
    wide = near.astype(np.float32)
    toward = np.where(wide < x, np.float16(np.inf), np.float16(-np.inf)).astype(np.float16)
    with np.errstate(over="ignore"):
        other = np.where(wide == x, near, np.nextafter(near, toward))
    out = sr.round_to_float16(x, rng)
    ok = (out == near) | (out == other)
    assert ok.all(), (x[~ok][:5], out[~ok][:5], near[~ok][:5], other[~ok][:5])
    assert np.mean(out != near) > 0.2  # not rounding to nearest


def test_every_float16_value_is_unchanged():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    values = values[~np.isnan(values)]
    out = sr.round_to_float16(values.astype(np.float32), np.random.default_rng(0))
    np.testing.assert_array_equal(out.view(np.uint16), values.view(np.uint16))


def test_random_words_decide_the_direction():
    x = np.array([1.0 + 2.0**-12, -(1.0 + 2.0**-12), 3.0e-6, -3.0e-6], np.float32)
    down = sr.round_to_float16(x, words=np.zeros(4, np.uint32))
    up = sr.round_to_float16(x, words=np.full(4, 0xFFFFFFFF, np.uint32))
    for i, value in enumerate(x):
        lo, hi = neighbours(value)
        toward_zero, away = (lo, hi) if value > 0 else (hi, lo)
        assert float(down[i]) == toward_zero
        assert float(up[i]) == away


def test_specials_and_overflow():
    rng = np.random.default_rng(3)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 70000.0, -1e6], np.float32)
    out = sr.round_to_float16(x, rng)
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])
    assert out[3] == 0 and not np.signbit(out[3]) and np.signbit(out[4])
    assert out[5] == np.inf and out[6] == -np.inf  # the caller applies nanoo
    # Between 65504 and 65536 (the next step): up to inf with probability
    # (x - 65504) / 32.
    n = 100_000
    out = sr.round_to_float16(np.full(n, 65512.0, np.float32), rng)
    assert set(np.unique(out).tolist()) == {65504.0, np.inf}
    p = np.mean(np.isinf(out))
    assert abs(p - 0.25) < 6 * np.sqrt(0.25 * 0.75 / n)


def test_zero_dimensional_and_float64_inputs():
    rng = np.random.default_rng(0)
    out = sr.round_to_float16(np.float32(1.5), rng)
    assert out.shape == () and out.dtype == F16 and out == 1.5
    out = sr.round_to_float16(np.float32(3e-6), rng)  # 0-d subnormal
    assert out.shape == () and float(out) in neighbours(3e-6)
    strided = np.full((4, 6), 3e-6, np.float32)[:, ::2]
    out = sr.round_to_float16(strided, rng)
    assert out.shape == (4, 3) and set(np.unique(out).tolist()) <= set(neighbours(3e-6))
    out = sr.round_to_float16(np.full(1000, 0.1, np.float64), rng)
    assert set(np.unique(out).tolist()) <= set(neighbours(0.1))


# -- the configured behaviour ----------------------------------------------------


def test_behaviour_defaults_and_configured_values():
    assert numerics.current_fp_behaviour() == numerics.FPBehaviour()
    assert not numerics.current_fp_behaviour().active
    configure(esr=ON, div0=True)
    b = numerics.current_fp_behaviour()
    assert b == numerics.FPBehaviour(div0=True, esr="ON")
    assert b.traps and b.stochastic_rounding and b.active
    assert pickle.loads(pickle.dumps(b)) == b and hash(b) == hash(pickle.loads(pickle.dumps(b)))
    configure(set_all=True)
    assert numerics.current_fp_behaviour() == numerics.FPBehaviour(True, True, True, "ON", True)
    configure(esr=ipu_config.StochasticRoundingBehaviour.REPLICA_IDENTICAL_ONLY)
    assert numerics.current_fp_behaviour().stochastic_rounding


def test_behaviour_is_part_of_the_cache_key():
    f = jit(lambda x: x * 2)
    x = np.ones(3, np.float16)
    configure()
    off = f.executable(x)
    configure(esr=ON)
    on = jit(lambda x: x * 2).executable(x)
    assert off is not on
    assert on.fp_behaviour == numerics.FPBehaviour(esr="ON")


# -- wrap_kernel: what gets wrapped ----------------------------------------------


def _avals(*pairs):
    return tuple(ShapedArray(shape, np.dtype(dtype)) for shape, dtype in pairs)


def test_nothing_wrapped_when_nothing_asked():
    esr = numerics.FPBehaviour(esr="ON")

    def kernel(x, y):
        return x + y

    f32 = _avals(((3,), F32), ((3,), F32))
    # float32 arithmetic: esr changes nothing, no traps on.
    assert numerics.wrap_kernel(kernel, ew.add_p, {}, f32, f32[:1], None, esr) is kernel
    # data movement and exact ops never round.
    f16 = _avals(((3,), F16))
    assert numerics.wrap_kernel(kernel, reshape_p, {}, f16, f16, None, esr) is kernel
    assert numerics.wrap_kernel(kernel, ew.max_p, {}, f16 * 2, f16, None, esr) is kernel
    # widening conversions are exact.
    assert numerics.wrap_kernel(
        kernel, convert_element_type_p, {"dtype": F32}, f16, _avals(((3,), F32)), None, esr
    ) is kernel
    # float16 arithmetic is wrapped.
    assert numerics.wrap_kernel(kernel, ew.add_p, {}, f16 * 2, f16, None, esr) is not kernel


# -- esr in compiled programs ----------------------------------------------------

CASES = {
    # name: (function, inputs, float32 reference of the unrounded result)
    "convert": (
        lambda x: keras.ops.cast(x, "float16"),
        lambda n: (np.full(n, 1.0 + 2.0**-12, np.float32),),
        lambda x: x,
    ),
    "add": (  # 1 + 2**-12 is rounded away to nearest in float16
        lambda x, y: x + y,
        lambda n: (np.ones(n, np.float16), np.full(n, 2.0**-12, np.float16)),
        lambda x, y: x.astype(np.float32) + y.astype(np.float32),
    ),
    "matmul": (  # float32 accumulation, rounded once
        lambda a, b: a @ b,
        lambda n: (np.full((n // 64, 3), 0.1, np.float16), np.full((3, 64), 0.7, np.float16)),
        lambda a, b: a.astype(np.float32) @ b.astype(np.float32),
    ),
    "conv": (
        lambda x, w: keras.ops.conv(x, w, padding="valid"),
        lambda n: (np.full((n // 64, 3, 2), 0.1, np.float16), np.full((2, 2, 64), 0.3, np.float16)),
        # every output sums 2 taps x 2 channels of float16(0.1) * float16(0.3)
        lambda x, w: np.full(
            (x.shape[0], 2, 64),
            4 * np.float32(np.float16(0.1)) * np.float32(np.float16(0.3)),
            np.float32,
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_esr_on_rounds_compiled_ops_stochastically(case):
    fn, make, reference = CASES[case]
    n = 64 * 1024
    inputs = make(n)
    exact = reference(*inputs).astype(np.float32)
    configure()
    nearest = np.asarray(jit(fn)(*inputs))
    assert nearest.dtype == F16
    np.testing.assert_array_equal(nearest, exact.astype(np.float16))  # esr OFF: to nearest
    configure(esr=ON)
    out = np.asarray(jit(fn)(*inputs))
    assert out.dtype == F16 and out.shape == nearest.shape
    assert not np.array_equal(out, nearest)
    value = float(exact.flat[0])
    assert np.all(exact == np.float32(value))
    assert_unbiased(out.ravel(), value, out.size)


def test_esr_reproducible_after_reset_ipu_seed():
    configure(esr=ON)
    f = jit(lambda x: keras.ops.cast(x, "float16"))
    x = np.full(10_000, 1.0 + 2.0**-12, np.float32)
    keras_ipu.utils.reset_ipu_seed(42)
    a = f(x)
    b = f(x)  # the stream goes on: another rounding
    keras_ipu.utils.reset_ipu_seed(42)
    c = f(x)
    keras_ipu.utils.reset_ipu_seed(43)
    d = f(x)
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b) and not np.array_equal(a, d)


def test_replica_identical_only_rounds_like_on_and_survives_pickling():
    configure(esr=ipu_config.StochasticRoundingBehaviour.REPLICA_IDENTICAL_ONLY)
    x = np.full(20_000, 1.0 + 2.0**-12, np.float32)
    exe = jit(lambda x: keras.ops.cast(x, "float16")).executable(x)
    loaded = pickle.loads(pickle.dumps(exe))  # the disk cache's round trip
    assert loaded.fp_behaviour == exe.fp_behaviour
    for program in (exe, loaded):
        out = program.run(x)[0]
        assert_unbiased(out, x[0], x.size)


def test_overflow_modes_leave_incoming_inf_alone():
    configure(esr=ON)
    out = jit(lambda x: x * 2)(np.array([np.inf, -np.inf, 40000.0], np.float16))
    assert out[0] == np.inf and out[1] == -np.inf and out[2] == 65504  # clipped


# -- exceptions --------------------------------------------------------------------


def _raises(flag, fn, *args):
    error = {"inv": numerics.IPUInvalidOperationError,
             "div0": numerics.IPUDivideByZeroError,
             "oflo": numerics.IPUOverflowError}[flag]
    with pytest.raises(error) as info:
        jit(fn)(*args)
    assert isinstance(info.value, numerics.IPUFloatingPointError)
    assert isinstance(info.value, ArithmeticError)
    message = str(info.value)
    assert f"floating_point_behaviour.{flag} = False" in message
    return info.value


def test_div0_names_the_op_and_the_fix():
    configure(div0=True)
    y = np.array([1, 0, 2, 4], np.float32)
    err = _raises("div0", lambda x, y: x / y, np.ones(4, np.float32), y)
    assert err.primitive == "div" and err.count == 1
    assert "`div`" in str(err) and "index (1,)" in str(err) and "epsilon" in str(err)


def test_oflo_in_float32_and_float16():
    configure(oflo=True)
    err = _raises("oflo", lambda x: keras.ops.exp(x), np.array([1.0, 100.0], np.float32))
    assert err.primitive == "exp" and "float32" in str(err) and "loss scaling" in str(err)
    a, b = np.full((2, 4), 200, np.float16), np.full((4, 2), 200, np.float16)
    err = _raises("oflo", lambda a, b: a @ b, a, b)  # 4 * 200 * 200 > 65504
    assert err.primitive == "dot_general" and err.count == 4
    err = _raises("oflo", lambda x: keras.ops.cast(x, "float16"), np.array([1e5], np.float32))
    assert err.primitive == "convert_element_type"


def test_inv_only_for_new_nans():
    configure(inv=True)
    err = _raises("inv", lambda x: keras.ops.sqrt(x), np.array([4.0, -1.0], np.float32))
    assert err.primitive == "sqrt"
    _raises("inv", lambda x, y: x / y, np.zeros(2, np.float32), np.zeros(2, np.float32))  # 0/0
    # NaN and inf coming in are not new exceptions; nor is x/0 without div0.
    out = jit(lambda x, y: x * 2 + x / y)(
        np.array([np.nan, np.inf, 1.0], np.float32), np.array([1.0, 1.0, 0.0], np.float32))
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == np.inf


def test_traps_off_by_default_ieee_results():
    out = jit(lambda x, y: x / y)(np.array([1.0, 0.0], np.float32), np.zeros(2, np.float32))
    assert out[0] == np.inf and np.isnan(out[1])
    out = jit(lambda x: x * 1000)(np.array([100.0], np.float16))
    assert out[0] == np.inf  # nothing configured: IEEE, as the other backends


def test_nanoo_selects_nan_or_clipping_for_float16_overflow():
    x = np.array([1.0, 100.0, -100.0], np.float16)

    def f(x):
        return x * x * x

    configure(nanoo=True)
    out = jit(f)(x)
    assert out[0] == 1 and np.isnan(out[1]) and np.isnan(out[2])
    configure(esr=ON)  # nanoo off: clip to the largest float16
    out = jit(f)(x)
    assert out[0] == 1 and out[1] == 65504 and out[2] == -65504
    # float32 overflow stays IEEE; division by zero is not an overflow.
    configure(nanoo=True)
    out = jit(lambda x: x * x)(np.array([1e30], np.float32))
    assert out[0] == np.inf
    out = jit(lambda x, y: x / y)(np.ones(1, np.float16), np.zeros(1, np.float16))
    assert out[0] == np.inf


def test_nanoo_overflow_is_an_invalid_operation():
    configure(nanoo=True, inv=True)
    err = _raises("inv", lambda x: x * x, np.array([300.0], np.float16))
    assert err.primitive == "mul" and "nanoo" in str(err)


def test_op_inside_a_fused_chain_is_named():
    configure(div0=True)
    err = _raises("div0", lambda x: keras.ops.log(x * 2 + 1) - 1, np.array([0.0, -0.5], np.float32))
    assert err.primitive == "log" and "fused elementwise chain" in str(err)


# -- model.fit ---------------------------------------------------------------------


def _train_half_model(units=1000, epochs=20):
    """A float16 Dense whose SGD updates (0.1 * 1/units = 1e-4) are below
    half an ULP of its weights (1.0): to nearest they vanish."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((1,), dtype="float16"),
        keras.layers.Dense(units, use_bias=False, kernel_initializer="ones", dtype="float16"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=lambda y, p: keras.ops.mean(p))
    model.fit(np.ones((8, 1), np.float16), np.zeros((8, units), np.float16),
              batch_size=8, epochs=epochs, verbose=0)
    return np.asarray(model.layers[0].kernel.numpy(), np.float64)


def test_fit_with_stochastic_rounding_keeps_small_updates():
    configure()
    np.testing.assert_array_equal(_train_half_model(), 1.0)  # swallowed
    configure(esr=ON)
    keras_ipu.utils.reset_ipu_seed(1)
    w = _train_half_model()
    step = float(np.float16(0.1)) * float(np.float16(1e-3))
    expected = 1.0 - 20 * step
    assert len(np.unique(w)) > 1
    assert abs(w.mean() - expected) < 6 * w.std() / np.sqrt(w.size), (w.mean(), expected)
    keras_ipu.utils.reset_ipu_seed(1)
    np.testing.assert_array_equal(_train_half_model(), w)


class _Normalise(keras.layers.Layer):
    def call(self, x):
        return x / keras.ops.sum(x, axis=-1, keepdims=True)


def _normalising_model():
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(3, kernel_initializer="zeros", name="features"),
        _Normalise(name="normalise"),
        keras.layers.Dense(1, name="head"),
    ])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_fit_division_by_zero_raises():
    configure()
    model = _normalising_model()
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)  # NaN loss, no error
    configure(div0=True)
    model = _normalising_model()
    with pytest.raises(numerics.IPUDivideByZeroError) as info:
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    assert info.value.primitive in ("div", "reciprocal")


def test_fit_division_by_zero_names_the_layer():
    configure(div0=True)
    model = _normalising_model()
    with pytest.raises(numerics.IPUDivideByZeroError) as info:
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    assert "normalise" in (info.value.source or "")
    assert "normalise" in str(info.value)


def test_fit_float16_overflow_names_the_layer():
    configure(oflo=True)
    model = keras.Sequential([
        keras.Input((300,), dtype="float16"),
        keras.layers.Dense(2, kernel_initializer="ones", dtype="float16", name="wide_sum"),
    ])
    model.compile(optimizer="sgd", loss="mse")
    x = np.full((4, 300), 300.0, np.float16)  # 300 * 300 * 1 = 90000 > 65504
    with pytest.raises(numerics.IPUOverflowError) as info:
        model.fit(x, np.zeros((4, 2), np.float16), verbose=0)
    assert info.value.primitive == "dot_general"
    assert "wide_sum" in str(info.value) and "float16" in str(info.value)
