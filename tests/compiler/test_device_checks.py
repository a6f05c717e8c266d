"""The compiler asks the simulator about every program it compiles
(device_checks.py): memory and cycles on the configured IPU, the
out-of-memory error at compile time, the profile report, --log_cycle_count,
the progress bar, device_connection.type at run time and the
floating-point behaviour hook."""

import dataclasses
import logging
import os

import keras
import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler import progress
from keras_ipu.device.compiler.cache import SUFFIX
from keras_ipu.device.compiler.cache import cache_key
from keras_ipu.device.compiler.executable import DeviceNotAttachedError
from keras_ipu.device.config import DeviceConnectionType
from keras_ipu.device.config import IPUConfig
from keras_ipu.device.config import configure_ipu_system
from keras_ipu.device.jit import jit
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import targets
from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError
from keras_ipu.device.simulator.memory_model import MemoryReport
from keras_ipu.device.simulator.prediction import Prediction


@pytest.fixture(autouse=True)
def fresh_system(monkeypatch):
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    system_config.reset_ipu_configuration()
    yield
    system_config.reset_ipu_configuration()


def _configure(monkeypatch=None, flags=None, **attrs):
    if flags is not None:
        monkeypatch.setenv("TF_POPLAR_FLAGS", flags)
    config = IPUConfig()
    for path, value in attrs.items():
        obj = config
        *parents, last = path.split("__")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return configure_ipu_system(config)


def _matmul_graph(source=None, n=64):
    def body(b, x, w):
        y = b.op("dot_general", x, w,
                 dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=None)
        return b.op("exp", y)

    graph = build([aval((n, 784)), aval((784, 512))], body)
    graph.nodes[0].source = source
    return graph


def _mlp(name="mlp"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(512, name="wide_dense"),
         keras.layers.Dense(10, name="head")], name=name)
    model.compile("sgd", "mse")
    return model


# -- memory and cycles on every compiled executable --------------------------------
def test_executable_knows_its_memory_and_cycles_on_the_default_target():
    exe = compile_graph(_matmul_graph())
    assert exe.target == targets.get_target("ipu2")
    assert isinstance(exe.memory, MemoryReport) and exe.memory.fits
    # The weights (784 x 512 float32) are always live; the (64, 512)
    # activations are the not-always-live peak.
    assert exe.memory.input_bytes == (64 * 784 + 784 * 512) * 4
    assert exe.memory.not_always_live_bytes >= 64 * 512 * 4
    pred = exe.prediction
    assert isinstance(pred, Prediction) and pred.cycles > 0
    assert pred.samples_per_second is None  # no batch size known here
    again = exe.predict(batch_size=64, steps_per_run=4)
    assert again.cycles == pred.cycles and again.steps_per_run == 4
    assert again.samples_per_second == pytest.approx(64 / again.step_seconds)
    assert exe.prediction is again  # kept for reports
    # Compiling made no system: a script may still configure or set flags.
    assert system_config.configured_system() is None


def test_explicit_target_and_configured_target():
    exe = compile_graph(_matmul_graph(), CompileOptions(target="ipu21"))
    assert exe.target.name == "ipu21" and exe.memory.target.name == "ipu21"
    _configure(ipu_model__version="ipu1", monkeypatch=None)
    # ipu_model.* applies to the IPU Model only: without --use_ipu_model a
    # configured system is the (simulated) hardware of device_connection.
    assert compile_graph(_matmul_graph()).target.name == "ipu2"


def test_memory_and_prediction_survive_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={tmp_path}")
    first = ExecutableCache().get(_matmul_graph())
    cycles = first.prediction.cycles
    second_cache = ExecutableCache()
    loaded = second_cache.get(_matmul_graph())
    assert second_cache.stats["disk_hits"] == 1 and loaded is not first
    assert loaded.target == first.target
    assert loaded.memory.tile_bytes == first.memory.tile_bytes
    assert loaded.prediction.cycles == cycles


# -- out of memory at compile time -----------------------------------------------
def test_out_of_memory_is_a_compile_error_naming_ipu_tile_and_layer():
    one_tile = targets.get_target("ipu2").with_tiles(1)
    with pytest.raises(IPUOutOfMemoryError) as info:
        compile_graph(_matmul_graph(source="model/wide_dense"),
                      CompileOptions(target=one_tile))
    text = str(info.value)
    assert "IPU 0, tile 0" in text
    assert "model/wide_dense" in text  # the layer that made a live tensor
    assert "f32[784,512]" in text  # the weights, the largest tensor
    # The weights alone overflow the tile: no batch advice.
    assert "always-live memory alone" in text and "smaller batch size" not in text
    assert info.value.report.tiles == 1
    assert not info.value.report.fits


def test_out_of_memory_from_jit_before_anything_runs(monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--ipu_model_tiles=1")  # default system
    calls = []

    def f(x, w):
        calls.append(1)  # traced once; a run would not call it again
        return keras.ops.relu(keras.ops.matmul(x, w))

    cache = ExecutableCache()
    fast = jit(f, cache=cache)
    x = np.ones((64, 784), np.float32)
    w = np.ones((784, 512), np.float32)
    with pytest.raises(IPUOutOfMemoryError, match=r"IPU 0, tile 0.*ipu2 tile has 624\.0 KiB"):
        fast(x, w)
    assert cache.stats["compiles"] == 0 and not cache._memory  # nothing kept
    # The same program fits the full IPU: the target is part of the key.
    monkeypatch.setenv("TF_POPLAR_FLAGS", "")
    out = fast(x, w)
    np.testing.assert_allclose(out, np.maximum(x @ w, 0))


def test_out_of_memory_from_fit_before_any_step(monkeypatch):
    model = _mlp()
    before = [v.numpy().copy() for v in model.trainable_variables]
    _configure(monkeypatch, flags="--use_ipu_model", ipu_model__tiles_per_ipu=1)
    x = np.ones((32, 784), np.float32)
    y = np.ones((32, 10), np.float32)
    with pytest.raises(IPUOutOfMemoryError) as info:
        model.fit(x, y, batch_size=32, verbose=0)
    assert "IPU 0, tile 0" in str(info.value)
    assert "f32[784,512]" in str(info.value)  # wide_dense's kernel
    for v, old in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(v.numpy(), old)  # no step ran


def test_out_of_memory_from_jit_names_the_keras_layer(monkeypatch):
    # The tracer records the Keras layer path of each node (trace.py).
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--ipu_model_tiles=1")
    model = _mlp()
    with pytest.raises(IPUOutOfMemoryError, match="wide_dense"):
        jit(lambda x: model(x), cache=ExecutableCache())(np.ones((64, 784), np.float32))


def test_out_of_memory_from_fit_names_the_layer(monkeypatch):
    model = _mlp()
    _configure(monkeypatch, flags="--use_ipu_model", ipu_model__tiles_per_ipu=1)
    with pytest.raises(IPUOutOfMemoryError, match="wide_dense"):
        model.fit(np.ones((32, 784), np.float32), np.ones((32, 10), np.float32),
                  batch_size=32, verbose=0)


@pytest.fixture
def report_calls(monkeypatch):
    """profile.report_options / write_executable_report replaced by a
    recorder."""
    calls = []

    def write(exe, options=None, name=None):
        calls.append((exe, exe.memory, options, name))
        return "report.json"

    from keras_ipu.device.simulator import profile

    monkeypatch.setattr(profile, "report_options", lambda *a, **k: "OPTIONS", raising=False)
    monkeypatch.setattr(profile, "write_executable_report", write, raising=False)
    return calls


def test_report_is_written_before_the_out_of_memory_error(monkeypatch, report_calls):
    _configure(monkeypatch, flags="--use_ipu_model", ipu_model__tiles_per_ipu=1)
    fast = jit(lambda x, w: keras.ops.matmul(x, w), cache=ExecutableCache())
    fast.__name__ = "big_matmul"
    with pytest.raises(IPUOutOfMemoryError):
        fast(np.ones((64, 784), np.float32), np.ones((784, 512), np.float32))
    assert len(report_calls) == 1
    exe, memory, options, name = report_calls[0]
    assert not memory.fits and memory.tiles == 1
    assert options == "OPTIONS" and name == "big_matmul"


def test_report_is_written_once_per_compile(report_calls):
    fast = jit(lambda x: x * 2.0, cache=ExecutableCache())
    fast(np.ones(3, np.float32))
    fast(np.ones(3, np.float32))
    assert len(report_calls) == 1 and report_calls[0][1].fits
    fast(np.ones(4, np.float32))
    assert len(report_calls) == 2


# -- the target in the cache key -------------------------------------------------
def test_cache_key_differs_by_target_and_tiles():
    graph = _matmul_graph()
    ipu2 = targets.get_target("ipu2")
    keys = {
        cache_key(graph, device_checks.resolve_options(CompileOptions(target=t)))
        for t in (ipu2, ipu2.with_tiles(4), targets.get_target("ipu21"),
                  targets.get_target("ipu1"))
    }
    assert len(keys) == 4
    same = cache_key(graph, device_checks.resolve_options(CompileOptions(target="ipu2")))
    assert same == cache_key(graph, device_checks.resolve_options(CompileOptions()))


def test_reconfigured_system_recompiles(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={tmp_path}")
    cache = ExecutableCache()
    fast = jit(lambda x: keras.ops.exp(x), cache=cache)
    x = np.ones(3, np.float32)
    fast(x)
    _configure(device_connection__version="ipu21")
    assert fast.executable(x).target.name == "ipu21"
    _configure(flags=f"--use_ipu_model --ipu_model_tiles=8 --executable_cache_path={tmp_path}",
               monkeypatch=monkeypatch)
    assert fast.executable(x).target.tiles_per_ipu == 8
    assert cache.stats["compiles"] == 3 and len(os.listdir(tmp_path)) == 3
    _configure(flags=f"--executable_cache_path={tmp_path}", monkeypatch=monkeypatch)
    assert fast.executable(x).target.name == "ipu2"
    assert cache.stats["compiles"] == 3 and fast.trace_count == 3  # reused


# -- device_connection.type at run time --------------------------------------------
def test_pre_compile_fills_the_disk_cache_and_returns_zeros(monkeypatch, tmp_path, caplog):
    _configure(monkeypatch, flags=f"--executable_cache_path={tmp_path}",
               device_connection__type=DeviceConnectionType.PRE_COMPILE,
               device_connection__version="ipu2")
    cache = ExecutableCache()
    fast = jit(lambda x: (keras.ops.exp(x) + 1.0, keras.ops.argmax(x)), cache=cache)
    x = np.array([1.0, 3.0, 2.0], np.float32)
    with caplog.at_level(logging.WARNING, logger="keras_ipu.device"):
        values, index = fast(x)
        fast(x)
    np.testing.assert_array_equal(values, np.zeros(3, np.float32))
    assert values.dtype == np.float32 and index.shape == () and index == 0
    assert index.dtype == np.int32
    assert [f for f in os.listdir(tmp_path) if f.endswith(SUFFIX)]
    notes = [r for r in caplog.records if "PRE_COMPILE" in r.getMessage()]
    assert len(notes) == 1  # logged once
    # Another process (a fresh cache) with a device runs the cached program.
    _configure(monkeypatch, flags=f"--executable_cache_path={tmp_path}",
               device_connection__version="ipu2")
    second = ExecutableCache()
    values, index = jit(lambda x: (keras.ops.exp(x) + 1.0, keras.ops.argmax(x)),
                        cache=second)(x)
    assert second.stats["disk_hits"] == 1 and second.stats["compiles"] == 0
    np.testing.assert_allclose(values, np.exp(x) + 1.0, rtol=1e-6)
    assert index == 1


def test_pre_compile_predict_of_a_model_returns_zeros(monkeypatch, tmp_path):
    model = _mlp()
    _configure(monkeypatch, flags=f"--executable_cache_path={tmp_path}",
               device_connection__type=DeviceConnectionType.PRE_COMPILE,
               device_connection__version="ipu2")
    out = model.predict(np.ones((8, 784), np.float32), batch_size=8, verbose=0)
    assert out.shape == (8, 10) and not out.any()
    assert os.listdir(tmp_path)


def test_never_compiles_but_running_says_why(monkeypatch, tmp_path):
    _configure(monkeypatch, flags=f"--executable_cache_path={tmp_path}",
               device_connection__type=DeviceConnectionType.NEVER,
               device_connection__version="ipu21")
    fast = jit(lambda x: x + 1.0, cache=ExecutableCache())
    x = np.ones(3, np.float32)
    exe = fast.executable(x)  # compiling is fine
    assert exe.target.name == "ipu21" and os.listdir(tmp_path)
    with pytest.raises(DeviceNotAttachedError) as info:
        fast(x)
    text = str(info.value)
    assert "no IPU device is attached" in text
    assert "device_connection.type = DeviceConnectionType.NEVER" in text
    assert "ALWAYS" in text and "configure_ipu_system" in text


def test_never_fails_fit_with_the_reason():
    model = _mlp()
    _configure(device_connection__type=DeviceConnectionType.NEVER,
               device_connection__version="ipu2")
    with pytest.raises(DeviceNotAttachedError, match="NEVER"):
        model.fit(np.ones((8, 784), np.float32), np.ones((8, 10), np.float32), verbose=0)


def test_on_demand_attaches_at_the_first_run():
    system = _configure(device_connection__type=DeviceConnectionType.ON_DEMAND)
    fast = jit(lambda x: x * 3.0, cache=ExecutableCache())
    x = np.ones(2, np.float32)
    fast.executable(x)
    assert not system.attached  # compiling does not attach
    np.testing.assert_array_equal(fast(x), 3 * x)
    assert system.attached


# -- --log_cycle_count -------------------------------------------------------------
def test_log_cycle_count_logs_once_per_compile(monkeypatch, caplog):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--log_cycle_count=0")
    fast = jit(lambda x: keras.ops.tanh(x) * 2.0, cache=ExecutableCache())
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        fast(np.ones(8, np.float32))
        fast(np.ones(8, np.float32))  # cached: no new log
        exe = fast.executable(np.ones(8, np.float32))
        exe.prediction  # already made at compile: not predicted (logged) again
    lines = [r.getMessage() for r in caplog.records if r.name == "keras_ipu.cycles"]
    assert len(lines) == 1 and "cycles per step" in lines[0] and "ipu2" in lines[0]
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        fast(np.ones(16, np.float32))  # a new signature compiles again
    lines = [r for r in caplog.records if r.name == "keras_ipu.cycles"]
    assert len(lines) == 2


def test_no_cycle_log_without_the_flag(caplog):
    fast = jit(lambda x: x + 1.0, cache=ExecutableCache())
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        fast(np.ones(8, np.float32)).sum()
        fast.executable(np.ones(8, np.float32)).prediction
    assert not [r for r in caplog.records if r.name == "keras_ipu.cycles"]


# -- the progress bar ---------------------------------------------------------------
class Terminal:
    """A terminal of `columns` columns (0: one that reports no width)."""

    def __init__(self, columns=100, tty=True):
        self.text, self.columns, self.tty = [], columns, tty

    def isatty(self):
        return self.tty

    def fileno(self):
        raise OSError("not a real terminal")

    def write(self, s):
        self.text.append(s)

    def flush(self):
        pass


def _chain(n):
    def body(b, x):
        for _ in range(n):
            x = b.op("exp", x)
        return x
    return build([aval((2,))], body)


@pytest.mark.parametrize("mode", ["true", "false", "auto"])
def test_progress_bar(monkeypatch, capsys, mode):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--show_progress_bar={mode}")
    fast = jit(lambda x: keras.ops.exp(x) - 1.0, cache=ExecutableCache())
    fast.__name__ = "tiny_program"
    fast(np.ones(4, np.float32))
    err = capsys.readouterr().err
    if mode == "true":
        # Not a terminal here: one plain line per stage, tracing first, the
        # stage that runs next named, and the end.
        stages = len(progress.STAGES)
        lines = [x for x in err.splitlines() if x.startswith("Compiling tiny_program")]
        assert lines[0] == "Compiling tiny_program: running: tracing"
        assert f"[1/{stages}] running: static shapes (" in lines[1] and "nodes so far)" in lines[1]
        assert f"[{stages}/{stages}] done" in lines[-2] and lines[-1].endswith(" s")
        assert "\r" not in err
    else:  # auto: not a terminal here (and a small program)
        assert "Compiling" not in err


def test_progress_bar_auto_on_a_terminal_for_large_programs(monkeypatch):
    from keras_ipu.device.compiler import progress

    term = Terminal()
    bar = progress.start("auto", _chain(progress.PROGRAM_NODES), 3, "big", file=term)
    bar.done("stage 1")
    bar.close()
    assert "Compiling big" in "".join(term.text)
    term = Terminal()
    # A small program's bar waits AUTO_DELAY_S (1 s) for a compile to last:
    # a minute here, so that a busy machine pausing this test between the
    # two calls cannot show it.
    monkeypatch.setattr(progress, "AUTO_DELAY_S", 60.0)
    bar = progress.start("auto", _chain(10), 3, "small", file=term)
    bar.done("stage 1")
    bar.close()
    assert "Compiling" not in "".join(term.text)


def test_progress_bar_names_the_running_stage_and_counts_sub_graph_nodes():
    from keras_ipu.device.compiler import progress

    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.trace import trace_flat

    graph, _ = trace_flat(
        lambda x: [keras.ops.fori_loop(0, 3, lambda i, c: keras.ops.exp(c) * 2.0, x)],
        [ShapedArray((2,), "float32")])
    term = Terminal()
    bar = progress.start("true", graph, ("tracing", "cse", "lowering"), "p", file=term)
    bar.done("tracing", progress.count_nodes(graph))
    text = "".join(term.text)
    assert "running: cse" in text and f"{progress.count_nodes(graph):,} nodes" in text
    bar.close()
    sub = sum(len(n.params[k].nodes) for n in graph.nodes for k in n.params
              if hasattr(n.params[k], "nodes"))
    assert sub >= 2 and progress.count_nodes(graph) >= len(graph.nodes) + sub


@pytest.mark.parametrize("columns", [0, 20])
def test_progress_bar_on_a_terminal_without_width_prints_lines(monkeypatch, columns):
    from keras_ipu.device.compiler import progress

    monkeypatch.setattr(progress, "_columns", lambda file: columns)
    term = Terminal(columns)
    bar = progress.start("true", _chain(3), ("tracing", "cse"), "narrow", file=term)
    bar.done("tracing", 3)
    bar.done("cse", 3)
    bar.close()
    text = "".join(term.text)
    if columns == 0:  # tqdm with a fixed width instead of a zero-column bar
        assert "Compiling narrow" in text and "2/2" in text
    else:  # too narrow for a bar: lines
        assert "Compiling narrow: [2/2] done (3 nodes)" in text
        assert "\r" not in text


def test_progress_bar_from_jit_covers_tracing_and_a_cache_hit(monkeypatch):
    from keras_ipu.device.compiler import progress

    monkeypatch.setenv("TF_POPLAR_FLAGS", "--show_progress_bar=true")
    term = Terminal(tty=False)
    real_start = progress.start
    monkeypatch.setattr(progress, "start",
                        lambda *a, **k: real_start(*a[:4], file=term))
    cache = ExecutableCache()
    first = jit(lambda x: keras.ops.exp(x) * 2.0, cache=cache)
    first.__name__ = "cached"
    first(np.ones(3, np.float32))
    second = jit(lambda x: keras.ops.exp(x) * 2.0, cache=cache)
    second.__name__ = "cached"
    second(np.ones(3, np.float32))
    text = "".join(term.text)
    assert text.count("Compiling cached: running: tracing") == 2
    assert "loaded from the executable cache" in text


# -- the floating-point behaviour in the kernels --------------------------------------
@pytest.fixture
def wrapped(monkeypatch):
    """The (primitive name, behaviour) of every kernel numerics wraps."""
    from keras_ipu.device.simulator import numerics

    seen = []
    real = numerics.wrap_kernel

    def recording(kernel, primitive, params, in_avals, out_avals, source, behaviour,
                  context=""):
        seen.append((primitive.name, behaviour))
        return real(kernel, primitive, params, in_avals, out_avals, source, behaviour,
                    context)

    monkeypatch.setattr(numerics, "wrap_kernel", recording)
    return seen


def test_kernels_run_unwrapped_when_every_behaviour_is_off(wrapped):
    _configure()
    fast = jit(lambda x: x / 0.0, cache=ExecutableCache())
    assert np.isinf(fast(np.ones(2, np.float32))).all()
    assert wrapped == []
    assert fast.executable(np.ones(2, np.float32)).fp_behaviour is None  # all off


def test_kernels_are_wrapped_with_the_compile_time_behaviour(wrapped):
    from keras_ipu.device.simulator.numerics import IPUDivideByZeroError

    _configure(floating_point_behaviour__div0=True)
    cache = ExecutableCache()

    def f(x):
        def body(carry, xs):
            return carry + xs, carry / xs

        return keras.ops.scan(body, x[0], x)

    fast = jit(f, cache=cache)
    x = np.array([1.0, 0.0, 2.0], np.float32)
    with pytest.raises(IPUDivideByZeroError, match="`div`"):
        fast(x)
    names = [name for name, _ in wrapped]
    assert "div" in names  # the loop body's kernels too
    assert all(b.div0 for _, b in wrapped)
    # The behaviour is part of the key: turning it off compiles again.
    _configure()
    carry, ys = fast(x)
    assert np.isinf(ys[1]) and carry == 4.0
    assert cache.stats["compiles"] == 2


def test_runs_are_told_to_the_profile_listeners():
    profile = pytest.importorskip("keras_ipu.device.simulator.profile")
    seen = []

    def listener(exe, start, end):
        seen.append((exe, end - start))

    fast = jit(lambda x: x + 1.0, cache=ExecutableCache())
    x = np.ones(3, np.float32)
    fast(x)  # no listener: nothing noted
    profile.add_run_listener(listener)
    try:
        fast(x)
        fast(x)
    finally:
        profile.remove_run_listener(listener)
    fast(x)
    exe = fast.executable(x)
    assert [e for e, _ in seen] == [exe, exe]
    assert all(t >= 0 for _, t in seen)


def test_a_failing_cycle_prediction_does_not_stop_the_compile(monkeypatch, caplog):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--log_cycle_count=0")

    def broken(exe, log=False, **workload):
        raise LookupError("Primitive 'mystery' has no cost rule")

    monkeypatch.setattr(device_checks, "predict", broken)
    fast = jit(lambda x: x * 2.0, cache=ExecutableCache())
    with caplog.at_level(logging.WARNING, logger="keras_ipu.compiler"):
        np.testing.assert_array_equal(fast(np.ones(2, np.float32)), [2.0, 2.0])
    assert any("no cycle prediction" in r.getMessage() and "mystery" in r.getMessage()
               for r in caplog.records)


def test_predict_for_a_workload_with_resident_weights():
    exe = compile_graph(_matmul_graph(n=64))
    full = exe.prediction
    x_bytes, w_bytes, y_bytes = 64 * 784 * 4, 784 * 512 * 4, 64 * 512 * 4
    assert (full.host_bytes_in, full.host_bytes_out) == (x_bytes + w_bytes, y_bytes)
    pred = exe.predict(batch_size=64, steps_per_run=4, resident_inputs=(1,))
    assert (pred.host_bytes_in, pred.host_bytes_out) == (x_bytes, y_bytes)
    assert pred.host_seconds < full.host_seconds
    assert pred.batch_size == 64 and pred.steps_per_run == 4
    assert pred.cycles == full.cycles  # no step costed again
    assert exe.prediction is pred


def test_fit_predicts_its_device_loop_workload(monkeypatch, caplog):
    """The trainer tells the compiler how its loop runs: the prediction has
    the batch size, the steps per run, and no host traffic for the weights
    and optimizer state (they stay on the IPU)."""
    from keras_ipu.device.simulator import profile

    _configure(monkeypatch, flags="--log_cycle_count=0")
    ran = []
    listener = lambda exe, start, end: ran.append(exe)  # noqa: E731
    profile.add_run_listener(listener)
    try:
        model = _mlp("workload_mlp")
        model.compile("sgd", "mse", steps_per_execution=4)
        with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
            model.fit(np.ones((64, 784), np.float32), np.ones((64, 10), np.float32),
                      batch_size=16, verbose=0)
    finally:
        profile.remove_run_listener(listener)
    exe = ran[0]
    pred = exe.prediction
    assert pred.batch_size == 16 and pred.steps_per_run == 4
    # In: 4 steps of x f32[16,784] and y f32[16,10]; the state stays.
    assert pred.host_bytes_in == 4 * 16 * (784 + 10) * 4
    assert pred.samples_per_second > 0
    assert sum("Predicted cycles" in r.getMessage() for r in caplog.records) == 1


# -- programs that do not fit: debug.allowOutOfMemory ---------------------------------
def _too_big():
    """exp of 16 MiB on an ipu2 whose tiles hold 8 KiB: about 11 KiB of it
    (computed in place) and about 1 KiB of code on each tile."""
    small = dataclasses.replace(targets.get_target("ipu2"), sram_bytes_per_tile=8 * 1024)
    graph = build([aval((4 * 1024 * 1024,))], lambda b, x: b.op("exp", x, source="big/act"))
    return graph, CompileOptions(target=small)


def test_out_of_memory_error_names_allow_out_of_memory(monkeypatch):
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    graph, options = _too_big()
    with pytest.raises(IPUOutOfMemoryError) as info:
        compile_graph(graph, options)
    text = str(info.value)
    assert "To fit:" in text
    assert "POPLAR_ENGINE_OPTIONS='{\"debug.allowOutOfMemory\": \"true\"}'" in text


def test_allow_out_of_memory_compiles_reports_and_runs_with_a_warning(monkeypatch):
    from keras_ipu.device.simulator import profile
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryWarning

    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"debug.allowOutOfMemory": "true"}')
    graph, options = _too_big()
    with pytest.warns(IPUOutOfMemoryWarning) as record:
        exe = compile_graph(graph, options, name="too_big")
    text = str(record[0].message)
    assert "too_big does not fit on IPU 0" in text and "a real IPU could not run it" in text
    assert "1472 tiles" in text or " tiles are over" in text
    assert isinstance(exe.out_of_memory, IPUOutOfMemoryError)
    x = np.linspace(-1, 1, 4 * 1024 * 1024, dtype=np.float32)
    (y,) = exe.run(x)
    np.testing.assert_allclose(y[::4096], np.exp(x[::4096]), rtol=1e-6)

    report = profile.build_report(exe, name="too_big")
    (ipu,) = report["memory"]["ipus"]
    (tiles,) = report["memory"]["tiles"]
    capacity = 8 * 1024
    assert not ipu["fits"] and tiles["capacity"] == capacity
    over = [t for t in tiles["total"] if t > capacity]
    assert ipu["tiles_over_capacity"] == len(over) > 0
    assert ipu["most_over_bytes"] == max(over) - capacity == exe.memory.tile_bytes - capacity
    assert report["options"]["allow_out_of_memory"] is True


@pytest.mark.parametrize("value, expected", [('"true"', True), ('"false"', False),
                                             ("true", True)])
def test_allow_out_of_memory_option_values(value, expected):
    from keras_ipu.device.simulator import profile

    env = {"POPLAR_ENGINE_OPTIONS": '{"debug.allowOutOfMemory": %s}' % value}
    assert profile.allow_out_of_memory(env, config=object()) is expected
    with pytest.raises(profile.ProfileOptionsError, match="debug.allowOutOfMemory"):
        profile.allow_out_of_memory(
            {"POPLAR_ENGINE_OPTIONS": '{"debug.allowOutOfMemory": "yes"}'}, config=object())
