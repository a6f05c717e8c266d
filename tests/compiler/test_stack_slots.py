"""A scan body's kernels write its stacked outputs into their slots
(compiler/stack_slots.py): the same bits as the loop copying them, a
result the C kernel would not write into its slot copied, and a carry or
an output returned twice never placed."""

import keras
import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import stack_slots
from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.jit import jit
from keras_ipu.device.native import threads
from keras_ipu.device.simulator.system import FPBehaviour

pytestmark = pytest.mark.skipif(native.elementwise is None,
                                reason="no C elementwise kernels (KERAS_IPU_NATIVE=0)")

T, B, F, H = 6, 16, 8, 32


@pytest.fixture
def one_thread(monkeypatch):
    # The whole body (no row blocks: scan_rows.py), whose runner this tests.
    monkeypatch.setattr(threads, "_cap", 1)
    monkeypatch.setattr(threads, "_plans", {})


def _lstm(reverse=False, concatenated=False, stacked_in=False):
    def fn(w, u, b, xs, h0, c0):
        def step(carry, x):
            h, c = carry
            h_in, c_in = h, c
            z = keras.ops.matmul(x, w) + keras.ops.matmul(h, u) + b
            i, f, g, o = keras.ops.split(z, 4, axis=-1)
            gate = keras.ops.tanh(g)
            c = keras.ops.sigmoid(f) * c + keras.ops.sigmoid(i) * gate
            h = keras.ops.sigmoid(o) * keras.ops.tanh(c)
            if stacked_in:  # as Keras' LSTM stacks them for its backward pass
                return (h, c), (h_in, c_in, keras.ops.sigmoid(o) * gate)
            if concatenated:
                return (h, c), (h, keras.ops.concatenate([gate, keras.ops.sigmoid(i)], axis=-1))
            # h: a carry too; gate: a chain's result the body returns once.
            return (h, c), (h, gate, keras.ops.sigmoid(o) * gate)

        (h, c), ys = keras.ops.scan(step, (h0, c0), xs, reverse=reverse)
        return (h, c, *ys)

    return fn


def _args(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(F, 4 * H), (H, 4 * H), (4 * H,), (T, B, F), (B, H), (B, H)]
    return [(0.5 * rng.standard_normal(s)).astype(np.float32) for s in shapes]


def _run(fn, args):
    fast = jit(fn, cache=ExecutableCache(disk=False))
    exe = fast.executable(*args)
    (body,) = exe.subprograms.values()
    return [np.asarray(v) for v in fast(*args)], body


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", ["chain", "concatenated", "stacked_in"])
def test_placed_outputs_give_the_copied_loops_bits(one_thread, monkeypatch, reverse, kind):
    args = _args()
    fn = _lstm(reverse, kind == "concatenated", kind == "stacked_in")
    got, body = _run(fn, args)
    stacked = stack_slots.stacked_body(body, 2)
    assert stacked is not None
    # What only the body's chains (with buffers of their own, not a
    # donated operand's) or its concatenate return is written in place;
    # h returned as a carry and stacked is copied.
    assert not stacked.placed[0] and stacked.placed[-1]
    if kind == "stacked_in":
        # The carries coming in, stacked: the step before wrote h (the
        # gate chain's fresh result) into this step's slot.
        assert stacked.forwarded[0] == 0
    else:
        assert stacked.forwarded[0] is None
    monkeypatch.setattr(stack_slots, "stacked_body", lambda body, n_carry: None)
    want, _ = _run(fn, args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def test_the_slots_are_written_by_the_kernels(one_thread):
    _, body = _run(_lstm(), _args(1))
    stacked = stack_slots.stacked_body(body, 2)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(a.shape).astype(a.dtype) for a in body.in_avals]
    placed = [j for j, p in enumerate(stacked.placed) if p]
    slots = [np.full((B, H), np.nan, np.float32) for _ in placed]
    # The body may write into its carries: each run gets copies.
    outs = stacked.run_last([a.copy() for a in inputs] + slots)
    plain = body.run_unchecked([a.copy() for a in inputs])
    assert placed and all(outs[2 + j] is slot for j, slot in zip(placed, slots))
    for g, w in zip(outs, plain):
        assert np.asarray(g).tobytes() == np.asarray(w).tobytes()


def test_a_slot_the_c_kernel_refuses_gets_a_new_array(one_thread):
    _, body = _run(_lstm(), _args())
    chains = [k for k in body._kernels if getattr(k, "placed", None) is not None]
    assert chains
    kernel = chains[-1]  # the gate chain
    position = max(kernel.placeable)
    rng = np.random.default_rng(2)
    node = body.graph.nodes[list(body._kernels).index(kernel)]
    xs = [rng.standard_normal(v.aval.shape).astype(v.aval.dtype) for v in node.inputs]
    want = kernel(*[x.copy() for x in xs])
    placing = kernel.placed((position,))
    strided = np.zeros(want[position].shape[::-1], want[position].dtype).T
    assert not strided.flags.c_contiguous
    got = placing(*[x.copy() for x in xs], strided)
    assert got[position] is not strided and not strided.any()
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    dest = np.empty_like(want[position])
    got = placing(*[x.copy() for x in xs], dest)
    assert got[position] is dest
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def test_a_result_sharing_its_buffer_is_not_placed(one_thread):
    _, body = _run(_lstm(), _args())
    kernel = [k for k in body._kernels if getattr(k, "placed", None) is not None][-1]
    position = max(kernel.placeable)
    assert kernel.placed((position, position)) is None
    donated = [p for p in range(4) if p not in kernel.placeable]
    assert donated  # c: written into the donated carry's buffer
    assert kernel.placed((donated[0],)) is None


def test_a_floating_point_behaviour_copies(one_thread):
    # Its checks wrap each kernel: a concatenate placed would skip them.
    fast = jit(_lstm(concatenated=True), cache=ExecutableCache(disk=False),
               options=CompileOptions(fp_behaviour=FPBehaviour(inv=True)))
    (body,) = fast.executable(*_args()).subprograms.values()
    assert stack_slots.stacked_body(body, 2) is None


def test_a_scalar_per_step_is_copied(one_thread):
    def fn(xs, h0):
        def step(h, x):
            h = keras.ops.tanh(x + h)
            # A 0-d chain result (of the sum) and a (B, H) one.
            return h, (keras.ops.tanh(keras.ops.sum(h)) * 2.0 + 1.0, keras.ops.sigmoid(h))

        return keras.ops.scan(step, h0, xs)

    rng = np.random.default_rng(3)
    args = [rng.standard_normal((T, B, H)).astype(np.float32),
            rng.standard_normal((B, H)).astype(np.float32)]
    fast = jit(fn, cache=ExecutableCache(disk=False))
    (body,) = fast.executable(*args).subprograms.values()
    stacked = stack_slots.stacked_body(body, 1)
    assert stacked is not None and stacked.placed == (False, True)
    h, (sums, gates) = fast(*args)
    want_h = args[1]
    for t in range(T):
        want_h = np.tanh(args[0][t] + want_h)
        np.testing.assert_allclose(sums[t], np.tanh(want_h.sum()) * 2 + 1, rtol=1e-5)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)


def _concatenates(monkeypatch):
    """The calls of np.concatenate from now on."""
    calls = []
    concatenate = np.concatenate

    def counted(*a, **k):
        calls.append(a)
        return concatenate(*a, **k)

    monkeypatch.setattr(np, "concatenate", counted)
    return calls


def test_a_chains_results_go_into_their_concatenates_columns(one_thread, monkeypatch):
    """The gate chain's two results only the concatenate reads are written
    into its slot's column blocks by the C kernel: no concatenate runs, and
    the bits are the copied loop's."""
    args = _args(4)
    fn = _lstm(concatenated=True)
    _, body = _run(fn, args)
    columns = stack_slots._columns(body, {i: {0: 1} for i, node in enumerate(body.graph.nodes)
                                          if node.primitive.name == "concatenate"}, 2)
    assert len(columns) == 1
    calls = _concatenates(monkeypatch)
    got, _ = _run(fn, args)
    assert not calls
    monkeypatch.setattr(stack_slots, "stacked_body", lambda body, n_carry: None)
    want, _ = _run(fn, args)
    assert calls  # the copied loop's concatenate
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def test_results_the_c_kernel_did_not_place_are_concatenated(monkeypatch):
    """Where NumPy's kernel ran (an operand the C kernel refused), its new
    arrays are concatenated into the slot."""
    xs = (np.arange(6, dtype=np.float32).reshape(2, 3),)

    def placing(x, *views):  # as NumPy's kernel: new arrays, not the views
        return (x * 2, x + 1, x - 1)

    kernel = stack_slots._chain_into_columns(placing, 1, (2, 0), (0, 3, 6))
    dest = np.zeros((2, 6), np.float32)
    calls = _concatenates(monkeypatch)
    results = kernel(*xs, dest)
    assert len(calls) == 1
    np.testing.assert_array_equal(dest, np.concatenate([xs[0] - 1, xs[0] * 2], axis=1))
    assert len(results) == 3


def test_a_concatenate_whose_operands_are_read_elsewhere_stays(one_thread):
    """An operand another step reads (or the body returns) keeps its own
    buffer: the concatenate is placed as before, its chain untouched."""
    def fn(xs, h0):
        def step(h, x):
            a, b = keras.ops.tanh(x + h), keras.ops.sigmoid(x * h)
            return a, (keras.ops.concatenate([a, b], axis=-1), b)

        return keras.ops.scan(step, h0, xs)

    rng = np.random.default_rng(5)
    args = [rng.standard_normal((T, B, H)).astype(np.float32),
            rng.standard_normal((B, H)).astype(np.float32)]
    fast = jit(fn, cache=ExecutableCache(disk=False))
    (body,) = fast.executable(*args).subprograms.values()
    targets = {i: {0: 0} for i, node in enumerate(body.graph.nodes)
               if node.primitive.name == "concatenate"}
    assert targets and stack_slots._columns(body, targets, 2) == {}
    h, (joined, b) = fast(*args)
    want_h = args[1]
    for t in range(T):
        a, bt = np.tanh(args[0][t] + want_h), 1 / (1 + np.exp(-(args[0][t] * want_h)))
        np.testing.assert_allclose(joined[t], np.concatenate([a, bt], axis=1), rtol=1e-5)
        np.testing.assert_allclose(b[t], bt, rtol=1e-5)
        want_h = a
