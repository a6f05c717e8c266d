"""The run loop as straight-line code (compiler/straight_line.py): the
generated function runs the steps' kernels in their order on the same
operands as the loop over the steps (Executable.run_steps), giving the
same arrays; it drops each value where the loop cleared it; returned
constants and values returned twice are copies; a program too long to
write out runs through the loop; an unpickled program gets its function
again."""

import pickle
import weakref

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import straight_line
from keras_ipu.device.compiler.executable import Executable

RNG = np.random.default_rng(5)
MATMUL = (((1,), (0,)), ((), ()))


def _step_graph():
    """A Dense layer's forward and an SGD-like update, with a constant
    returned, a value returned twice and a multiple-result node (split)."""
    scale = lit(np.float32(0.5))

    def body(b, x, w, bias):
        y = b.op("dot_general", x, w, dimension_numbers=MATMUL)
        h = b.op("max", b.op("add", y, b.op("broadcast_to", bias, shape=(8, 16))),
                 lit(np.float32(0)))
        top, right = b.op("top_k", h, k=3)
        s = b.op("reduce_sum", top, axes=(0, 1))
        w2 = b.op("sub", w, b.op("mul", scale, b.op("dot_general", x, h,
                                                    dimension_numbers=(((0,), (0,)), ((), ())))))
        return [s, w2, right, right, scale, x]

    return build([aval((8, 4)), aval((4, 16)), aval((16,))], body)


def _inputs():
    return [RNG.standard_normal(s).astype(np.float32) for s in ((8, 4), (4, 16), (16,))]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True)


def test_same_arrays_as_the_loop_over_the_steps():
    exe = compile_graph(_step_graph())
    assert exe._run_straight is not None
    inputs = _inputs()
    want = exe.run_steps(exe._run_program, list(inputs))
    got = exe.run_unchecked(list(inputs))
    _same(got, want)
    # The returned constant and the value returned twice are copies: the
    # caller owns each result (as the loop's output plan made them).
    constant = next(i for i, (s, copy) in enumerate(exe._output_plan)
                    if s in exe.constants)
    assert not np.shares_memory(got[constant], exe.constants[exe.output_slots[constant]])
    assert not np.shares_memory(got[2], got[3])
    # A returned input is the caller's array itself, as the loop gives it.
    assert got[-1] is inputs[0]


def test_the_source_is_the_steps_written_out():
    exe = compile_graph(_step_graph())
    source = exe._run_straight.source
    assert source.startswith("def run(arrays):\n    s0, s1, s2, = arrays\n")
    # One line per step, one call to its kernel, in the program's order.
    calls = [ln for ln in source.splitlines() if "= k" in ln]
    assert [int(ln.split("= k")[1].split("(")[0]) for ln in calls] == list(
        range(len(exe._run_program)))
    assert "*_, = k" in source  # top_k's two results


def _recording_steps():
    """Hand-made steps: k0 makes a temporary, k1 reads it and it dies
    there, k2 checks (through a weak reference) that it is gone."""
    seen = {}

    def k0(x):
        out = x * 2
        seen["temporary"] = weakref.ref(out)
        return out

    def k1(t):
        return t + 1, t - 1

    def k2(a, c):
        seen["alive at k2"] = seen["temporary"]() is not None
        return a + c

    constant = np.ones(3, np.float32)
    steps = (
        (k0, (0,), 2, False, (0,)),
        (k1, (2,), (3, 4), True, (2,)),
        (k2, (3, 1), 5, False, (3, 1)),
    )
    return steps, {1: constant}, seen


def test_a_value_is_dropped_where_the_loop_clears_it():
    steps, constants, seen = _recording_steps()
    plan = ((5, False), (4, False), (1, True))
    run = straight_line.straight_line(steps, 1, constants, plan)
    x = np.arange(3, dtype=np.float32)
    out = run([x])
    assert seen["alive at k2"] is False
    assert np.array_equal(out[0], (x * 2 + 1) + 1)
    assert np.array_equal(out[1], x * 2 - 1)
    assert np.array_equal(out[2], constants[1]) and out[2] is not constants[1]
    # The constant's slot is a global, never deleted as a local.
    deletes = [ln.strip() for ln in run.source.splitlines() if ln.strip().startswith("del")]
    assert deletes == ["del s0", "del s2", "del s3"]


@pytest.mark.parametrize("n", [3, 255, 256, 400])
def test_a_kernel_with_hundreds_of_results(n):
    """A loop with hundreds of carries: more targets than Python unpacks
    before a starred one (the EfficientNet-B0 predict loop has 324)."""
    steps = ((lambda *xs: tuple(x + 1 for x in xs), tuple(range(n)),
              tuple(range(n, 2 * n)), True, ()),)
    plan = tuple((s, False) for s in range(n, 2 * n))
    run = straight_line.straight_line(steps, n, {}, plan)
    xs = [np.float32(i) for i in range(n)]
    assert [float(v) for v in run(xs)] == [i + 1.0 for i in range(n)]


def test_a_long_program_runs_through_the_loop(monkeypatch):
    monkeypatch.setattr(straight_line, "MAX_STEPS", 1)
    exe = compile_graph(_step_graph())
    assert exe._run_straight is None
    monkeypatch.undo()
    inputs = _inputs()
    _same(exe.run_unchecked(list(inputs)), compile_graph(_step_graph()).run_unchecked(inputs))


def test_a_dropped_program_goes_without_the_garbage_collector():
    import gc

    exe = compile_graph(_step_graph())
    ref = weakref.ref(exe._run_straight)
    gc.disable()
    try:
        del exe
        assert ref() is None
    finally:
        gc.enable()


def test_a_kernel_error_names_the_generated_code():
    steps = ((lambda x: 1 / 0, (0,), 1, False, ()),)
    run = straight_line.straight_line(steps, 1, {}, ((1, False),), name="broken_step")
    with pytest.raises(ZeroDivisionError) as info:
        run([np.zeros(1)])
    assert any("<run loop of broken_step>" in str(entry.path) for entry in info.traceback)


def test_unpickled_program_runs_straight_line():
    exe = compile_graph(_step_graph())
    again = pickle.loads(pickle.dumps(exe))
    assert isinstance(again, Executable) and again._run_straight is not None
    inputs = _inputs()
    _same(again.run_unchecked(list(inputs)), exe.run_unchecked(list(inputs)))
