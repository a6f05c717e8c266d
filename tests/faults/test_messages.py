"""Messages that point the right way: the variable, the value and the fix."""

import keras
import numpy as np
import pytest

from keras_ipu.config import IPUConfig
from keras_ipu.device import flags
from keras_ipu.device.simulator.numerics import IPUInvalidOperationError
from keras_ipu.device.simulator.numerics import IPUOverflowError


@pytest.mark.parametrize("raw, expected", [
    ("0", False), ("off", False), ("False", False), ("no", False),
    ("1", True), ("ON", True), ("", True), (None, True),
])
def test_on_off_environment_variables(raw, expected):
    environ = {} if raw is None else {"KERAS_IPU_NATIVE": raw}
    assert flags.env_switch("KERAS_IPU_NATIVE", environ=environ) is expected


def test_a_misspelt_switch_is_an_error_not_on():
    with pytest.raises(ValueError, match=r"KERAS_IPU_HOST_MALLOC='of' is neither on nor off"):
        flags.env_switch("KERAS_IPU_HOST_MALLOC", environ={"KERAS_IPU_HOST_MALLOC": "of"})


def test_an_unterminated_quote_in_tf_poplar_flags():
    text = '--executable_cache_path="/tmp/my cache'
    with pytest.raises(ValueError) as info:
        flags.parse_flags(text)
    message = str(info.value)
    assert message.startswith(f"TF_POPLAR_FLAGS={text!r} cannot be read: no closing quotation")
    assert "close the quote" in message


@pytest.mark.parametrize("text, found", [
    ('{"auto_select_ipus": 2,', "line 1, column 24"),
    ("ipu_config.json", "looks like a file name"),
])
def test_ipu_config_from_json_with_bad_json(text, found):
    with pytest.raises(ValueError) as info:
        IPUConfig().from_json(text)
    message = str(info.value)
    assert f"IPUConfig.from_json: {text!r} is not valid JSON" in message
    assert found in message and "to_json()" in message


def test_ipu_config_from_json_with_no_string():
    with pytest.raises(TypeError, match="takes a JSON string .* got dict"):
        IPUConfig().from_json({"auto_select_ipus": 1})


@pytest.mark.parametrize("value, found", [
    (100, "auto_select_ipus = 100 asks for a device of 100 IPUs, but the system has 16"),
    (0, "auto_select_ipus = 0: a device has at least 1 IPU"),
    (3, "auto_select_ipus = 3: a device has 1, 2, 4, 8, ... IPUs (a power of two); round it up to 4"),
    ([1, 12], "auto_select_ipus[1] = 12: a device has 1, 2, 4, 8, ... IPUs (a power of two); round it up to 16"),
])
def test_auto_select_ipus_out_of_range(value, found):
    config = IPUConfig()
    config.auto_select_ipus = value
    with pytest.raises(ValueError) as info:
        config.configure_ipu_system()
    assert found in str(info.value)


# -- floating-point traps during training ----------------------------------------
@pytest.fixture
def float16_policy():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


def _configure_traps(**flags_on):
    config = IPUConfig()
    for name in flags_on:
        setattr(config.floating_point_behaviour, name, True)
    config.configure_ipu_system()


def _regression(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4),
    ])
    model.compile(optimizer, "mse")
    return model


def _regression_data():
    rng = np.random.RandomState(0)
    return rng.rand(128, 16).astype("float32"), 50 * rng.rand(128, 4).astype("float32")


def test_an_overflow_of_the_loss_scaled_backward_pass_says_so(float16_policy):
    _configure_traps(oflo=True)
    x, y = _regression_data()
    model = _regression("sgd")  # mixed_float16: Keras adds a LossScaleOptimizer
    with pytest.raises(IPUOverflowError) as info:
        model.fit(x, y, batch_size=64, verbose=0)
    message = str(info.value)
    assert "of the backward pass (the gradients) of layer" in message
    assert "This is the loss-scaled backward pass" in message
    assert "scale now 32768" in message and "initial_scale=128" in message
    assert "floating_point_behaviour.oflo = False" in message
    assert "use loss scaling" not in message  # the old advice, backwards here
    # The suggested scale trains without an overflow.
    fixed = _regression(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=128))
    fixed.fit(x, y, batch_size=64, verbose=0)


def test_a_forward_overflow_is_not_blamed_on_the_loss_scale(float16_policy):
    _configure_traps(oflo=True)
    model = _regression("sgd")
    x, y = _regression_data()
    with pytest.raises(IPUOverflowError) as info:
        model.fit(x * 1e5, y, batch_size=64, verbose=0)
    message = str(info.value)
    assert "backward pass" not in message and "loss-scaled" not in message


def test_a_trap_midway_leaves_the_model_at_the_last_completed_execution():
    _configure_traps(inv=True)

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)),
                              keras.layers.Lambda(lambda t: keras.ops.sqrt(t)),
                              keras.layers.Dense(3)])
        m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse", steps_per_execution=4)
        return m

    x, y = np.ones((64, 4), "float32"), np.ones((64, 3), "float32")
    x[4 * 10 + 2] = -1.0  # the 3rd step of the 3rd execution makes a NaN
    trapped = model()
    with pytest.raises(IPUInvalidOperationError):
        trapped.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    reference = model()
    reference.fit(x[:32], y[:32], batch_size=4, shuffle=False, verbose=0)
    for a, b in zip(trapped.variables + trapped.optimizer.variables,
                    reference.variables + reference.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)


@pytest.mark.numpy_engine  # the error is injected in the NumPy engine's loop
def test_an_error_inside_an_in_place_step_says_the_model_may_be_torn(monkeypatch):
    from keras_ipu.device.compiler import executable as executable_module

    original = executable_module.Executable.run_unchecked
    calls = [0]

    def failing(self, arrays):
        calls[0] += 1
        if calls[0] == 3:
            raise MemoryError("host out of memory")
        return original(self, arrays)

    monkeypatch.setattr(executable_module.Executable, "run_unchecked", failing)
    model = _regression("sgd")
    model.compile("sgd", "mse", steps_per_execution=4)
    x, y = _regression_data()
    with pytest.raises(MemoryError) as info:
        model.fit(x, y, batch_size=8, verbose=0)
    assert any("may be partly updated" in note for note in info.value.__notes__)
