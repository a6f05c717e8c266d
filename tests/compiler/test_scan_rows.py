"""A scan whose rows never meet runs in blocks of rows on several threads
(compiler/scan_rows.py): each block's loop on its own thread, with the
bits of the whole loop; bodies whose rows meet, one thread and a busy
machine (such splits backing off) run the whole body."""

import pickle
import threading

import keras
import numpy as np
import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import control_flow
from keras_ipu.device.compiler import scan_rows
from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.jit import jit
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads
from keras_ipu.device.simulator.system import FPBehaviour

pytestmark = pytest.mark.skipif(
    product_pool.rule(np.float32) is None or not product_pool.rule(np.float32).rows,
    reason="no row rule for float32 products on this host (no C product pool)")

T, B, F, H = 5, 64, 128, 128  # a block's products: >= 28 x 128 x 512, above the small-matrix bound


@pytest.fixture
def cap(monkeypatch):
    # Not backing off at the start: an earlier test's late split (a busy
    # machine) would make the scans run whole.
    for name, value in (("_late", 0), ("_backoff", 0.0), ("_resume_at", 0.0),
                        ("_blocks_backoff", 0.0), ("_blocks_resume_at", 0.0)):
        monkeypatch.setattr(threads, name, value)

    def set_cap(n):
        monkeypatch.setattr(threads, "_cap", n)
        monkeypatch.setattr(threads, "_plans", {})

    return set_cap


@pytest.fixture
def splitting(monkeypatch):
    """No back-off during the test: a late split of a busy machine would
    make the scan run whole."""
    never = lambda: False  # noqa: E731
    monkeypatch.setattr(threads, "backing_off", never)
    monkeypatch.setattr(threads, "blocks_backing_off", never)
    monkeypatch.setattr(control_flow, "blocks_backing_off", never)


def _lstm(reverse=False, mix_rows=False, projected=False):
    """projected: the input projection before the loop, as Keras' LSTM
    has it (the step's one product: the rows by the recurrent weight)."""
    def fn(w, u, b, xs, h0, c0):
        if projected:
            xs = keras.ops.matmul(xs, w)

        def step(carry, x):
            h, c = carry
            z = (x if projected else keras.ops.matmul(x, w)) + keras.ops.matmul(h, u) + b
            if mix_rows:  # the batch mean: rows meet
                z = z - keras.ops.mean(z, axis=0)
            i, f, g, o = keras.ops.split(z, 4, axis=-1)
            c = keras.ops.sigmoid(f) * c + keras.ops.sigmoid(i) * keras.ops.tanh(g)
            h = keras.ops.sigmoid(o) * keras.ops.tanh(c)
            return (h, c), h

        (h, c), ys = keras.ops.scan(step, (h0, c0), xs, reverse=reverse)
        return h, c, ys

    return fn


def _args(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(F, 4 * H), (H, 4 * H), (4 * H,), (T, B, F), (B, H), (B, H)]
    return [(0.3 * rng.standard_normal(s)).astype(np.float32) for s in shapes]


def _scan_bodies(executable):
    return [sub for sub in executable.subprograms.values()]


def _compiled(fn, args):
    fast = jit(fn, cache=ExecutableCache(disk=False))
    return fast, fast.executable(*args)


@pytest.mark.parametrize("reverse", [False, True])
def test_row_blocks_give_the_whole_loops_bits(cap, splitting, reverse):
    args = _args()
    cap(1)
    one, exe_one = _compiled(_lstm(reverse), args)
    want = one(*args)
    assert not any(isinstance(s, scan_rows.RowBlocks) for s in _scan_bodies(exe_one))
    cap(2)
    two, exe_two = _compiled(_lstm(reverse), args)
    (split,) = [s for s in _scan_bodies(exe_two) if isinstance(s, scan_rows.RowBlocks)]
    edges = [(lo, hi) for lo, hi, _ in split.blocks]
    assert edges[0][0] == 0 and edges[-1][1] == B and len(edges) == 2
    assert all(lo % product_pool.rule(np.float32).rows == 0 for lo, _ in edges)
    assert all(exe.thread_cap == 1 for _, _, exe in split.blocks)
    ran = []
    original = scan_rows.block_runner

    def spying(*a, **k):
        run = original(*a, **k)

        def spied(*operands):
            ran.append(threading.get_ident())
            return run(*operands)

        return spied

    scan_rows.block_runner = spying
    try:
        # Lowered again (pickled and back), the spy sees the block runner.
        exe_two = pickle.loads(pickle.dumps(exe_two))
    finally:
        scan_rows.block_runner = original
    got = exe_two.run(*args)
    assert ran, "the scan did not run in row blocks"
    for a, e in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_a_block_runs_on_a_pool_thread(cap, splitting, monkeypatch):
    """The first block's loop is launched on the pool, the last runs on the
    caller; the values are the one-thread run's."""
    args = _args(1)
    cap(1)
    want = _compiled(_lstm(), args)[0](*args)
    cap(2)
    fast, exe = _compiled(_lstm(), args)
    ran_on = []
    launch = threads.launch_block

    def launch_taken(fn, a):
        taken = threading.Event()

        def block(*b):
            taken.set()
            ran_on.append(threading.get_ident())
            return fn(*b)

        job = launch(block, a)
        assert taken.wait(10), "no pool thread took the block"
        return job

    monkeypatch.setattr(threads, "launch_block", launch_taken)
    exe = pickle.loads(pickle.dumps(exe))  # lowered again: the patched launch
    got = exe.run(*args)
    assert len(ran_on) == 1  # two blocks: the first launched
    assert threading.get_ident() not in ran_on
    for a, e in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_rows_that_meet_run_whole(cap):
    """A batch mean inside the step mixes the rows: no blocks."""
    cap(2)
    args = _args()
    _, exe = _compiled(_lstm(mix_rows=True), args)
    assert _scan_bodies(exe)
    assert not any(isinstance(s, scan_rows.RowBlocks) for s in _scan_bodies(exe))


def test_a_floating_point_behaviour_runs_whole(cap):
    cap(2)
    args = _args()
    fast = jit(_lstm(), cache=ExecutableCache(disk=False),
               options=CompileOptions(fp_behaviour=FPBehaviour(inv=True)))
    exe = fast.executable(*args)
    assert _scan_bodies(exe)
    assert not any(isinstance(s, scan_rows.RowBlocks) for s in _scan_bodies(exe))


def test_while_backing_off_the_whole_body_runs(cap, monkeypatch):
    args = _args(2)
    cap(1)
    want = _compiled(_lstm(), args)[0](*args)
    cap(2)
    _, exe = _compiled(_lstm(), args)
    monkeypatch.setattr(scan_rows, "block_runner", _refused)
    monkeypatch.setattr(threads, "blocks_backing_off", lambda: True)
    monkeypatch.setattr(control_flow, "blocks_backing_off", lambda: True)
    exe = pickle.loads(pickle.dumps(exe))
    got = exe.run(*args)
    for a, e in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def _refused(*a, **k):
    def run(*operands):
        raise AssertionError("the blocks ran while backing off")

    return run


def test_capped_lowers_for_fewer_threads(cap):
    cap(4)
    assert threads.max_threads() == 4
    with threads.capped(1):
        assert threads.max_threads() == 1
        with threads.capped(None):
            assert threads.max_threads() == 1
        with threads.capped(3):  # an inner cap never raises the outer one
            assert threads.max_threads() == 1
        assert threads.max_threads() == 1
    with threads.capped(8):  # nor the process's
        assert threads.max_threads() == 4
    assert threads.max_threads() == 4
    seen = []
    other = threading.Thread(target=lambda: seen.append(threads.max_threads()))
    with threads.capped(2):
        other.start()
        other.join()
    assert seen == [4]  # a cap of this thread only


def test_blocks_that_did_not_run_at_once_start_the_back_off(cap, monkeypatch, long_backoff):
    """Both blocks on the caller (no pool thread got a core): the split's wall
    time is its threads' CPU time together, a late split. It starts the
    blocks' back-off and the shared one."""
    args = _args(3)
    cap(2)
    _, exe = _compiled(_lstm(), args)
    monkeypatch.setattr(threads, "launch_block", lambda fn, a: threads._Ran(fn(*a)))
    exe = pickle.loads(pickle.dumps(exe))  # lowered again: the patched launch
    assert not threads.blocks_backing_off() and not threads.backing_off()
    exe.run(*args)
    assert threads.blocks_backing_off() and threads.backing_off()


def test_the_shared_back_off_alone_does_not_stop_the_blocks(cap, monkeypatch, long_backoff):
    """A late join elsewhere (one kernel's hand-off) backs the kernels' splits
    off, not a scan's row blocks: they still run, with the whole loop's bits."""
    args = _args(4)
    cap(1)
    want = _compiled(_lstm(), args)[0](*args)
    cap(2)
    _, exe = _compiled(_lstm(), args)
    blocks = []
    launch = threads.launch_block

    def counted(fn, a):
        blocks.append(fn)
        return launch(fn, a)

    monkeypatch.setattr(threads, "launch_block", counted)
    monkeypatch.setattr(threads, "note_blocks", lambda wall, cpu: None)  # a busy test machine
    exe = pickle.loads(pickle.dumps(exe))
    threads._note_split(True, threads.time.perf_counter(), at_once=True)
    assert threads.backing_off() and not threads.blocks_backing_off()
    got = exe.run(*args)
    assert len(blocks) == 1  # the first of two blocks launched
    for a, e in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


# 0.8: a split 1.25x as fast as its blocks in turn still pays (the blocks'
# own extra work is 7-13% of the whole body's: threads.BLOCKS_LATE_SHARE).
@pytest.mark.parametrize("wall, late", [(1.0, True), (0.9, True), (0.8, False), (0.6, False)])
def test_note_blocks(cap, wall, late, long_backoff):
    cap(2)
    threads.note_blocks(wall, 1.0)  # two threads' CPU: 1 s together
    assert threads.blocks_backing_off() is late
    assert threads.backing_off() is late


def test_a_late_block_split_on_many_threads_backs_off_the_blocks_alone(cap, long_backoff):
    # Many blocks run late where they take turns on the GIL: the split does
    # not pay, which says nothing of the machine.
    cap(16)
    threads.note_blocks(1.0, 1.0)
    assert threads.blocks_backing_off()
    assert not threads.backing_off() and threads._late == 0


def test_blocks_back_off_doubles_and_a_split_on_time_ends_it(cap, monkeypatch, long_backoff):
    """A late probe doubles the blocks' back-off; one on time ends it and
    leaves the shared back-off to the kernels' own splits."""
    cap(2)
    monkeypatch.setattr(threads, "MAX_BACKOFF_SECONDS", 1000.0)
    threads.note_blocks(1.0, 1.0)
    threads.note_blocks(1.0, 1.0)
    assert threads._blocks_backoff == 2 * threads.BACKOFF_SECONDS
    assert threads.blocks_backing_off()
    threads.note_blocks(0.5, 1.0)
    assert not threads.blocks_backing_off() and threads._blocks_backoff == 0.0
    assert threads.backing_off()  # started by the late ones, not ended here


@pytest.mark.parametrize("cap_to, sizes", [
    (2, [64, 64]), (4, [32] * 4), (8, [26, 25, 26, 25, 26]), (16, [26, 25, 26, 25, 26])])
def test_many_threads_cut_the_benchmarks_lstm_into_few_blocks(cap, splitting, cap_to, sizes):
    """Batch 128, 128 units (65,536 multiply-adds per row, about 17 blocks'
    per-step overhead of work): two threads keep two blocks, four take
    four, and 8 or 16 threads five of 25-26 rows, not the eight of 16 rows
    that MIN_BLOCK allows, whose Python would take turns on the GIL longer
    than a block works (scan_rows.block_count). The values are the
    one-thread run's."""
    rng = np.random.default_rng(3)
    args = [(0.3 * rng.standard_normal(s)).astype(np.float32)
            for s in [(32, 512), (128, 512), (512,), (4, 128, 32), (128, 128), (128, 128)]]
    cap(1)
    want = _compiled(_lstm(projected=True), args)[0](*args)
    cap(cap_to)
    fast, exe = _compiled(_lstm(projected=True), args)
    (split,) = [s for s in _scan_bodies(exe) if isinstance(s, scan_rows.RowBlocks)]
    assert [hi - lo for lo, hi, _ in split.blocks] == sizes
    for a, e in zip(fast(*args), want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_block_count_weighs_the_blocks_turns_on_the_gil_against_their_work():
    step = scan_rows.BLOCK_STEP_MACS
    count = scan_rows.block_count
    # Two threads: two blocks, however little the work.
    assert count(16, 1, 2) == 2 and count(4096, 10 ** 6, 2) == 2
    # Work W of 16 blocks' overhead o: max(B o, o + W / B) is 6.3 o at
    # three blocks, 5 o at four and five (a tie: the fewer), 6 o at six.
    assert [count(16, step, t) for t in (3, 4, 5, 16)] == [3, 4, 4, 4]
    # Little work: two blocks at any cap; more work per row, more blocks.
    assert count(2, step, 16) == 2
    assert count(128, 512 * 2048, 16) == 16 and count(128, 128 * 512, 16) == 5
