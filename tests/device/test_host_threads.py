"""The NumPy engine's thread policy (device/native/threads.py): caps from
the usual variables, small products on one thread, split products giving
np.matmul's values, the pool's errors reaching the caller."""

import numpy as np
import pytest

from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads


@pytest.fixture
def cap(monkeypatch):
    """Set the cap as the environment would (the cap is read once)."""

    def set_cap(value):
        for name in threads.CAP_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        if value is not None:
            monkeypatch.setenv("KERAS_IPU_HOST_THREADS", str(value))
        monkeypatch.setattr(threads, "_cap", None)
        monkeypatch.setattr(threads, "_plans", {})

    return set_cap


def test_the_smallest_user_variable_caps_threads(cap, monkeypatch):
    cap(None)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert threads.max_threads() == 2


def test_without_variables_the_cap_is_the_cores_we_may_use(cap):
    cap(None)
    assert threads.max_threads() == len(__import__("os").sched_getaffinity(0))


def test_a_blas_variable_caps_the_policy_and_openblas_stays_on_one_thread(cap, monkeypatch):
    # OpenBLAS keeping OPENBLAS_NUM_THREADS=N would run each of our blocks
    # on N spinning threads of its own (N x N threads in all).
    threadpoolctl = pytest.importorskip("threadpoolctl")
    cap(None)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr(threads, "_configured", False)
    # The context restores the process's BLAS threads afterwards.
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        threads.configure()
        blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas), blas
    assert threads.max_threads() == 2


def test_a_bad_variable_names_itself(cap, monkeypatch):
    cap(None)
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='many'.*positive integer"):
        threads.max_threads()


class _Setter:
    """Stands for OpenBLAS' openblas_set_num_threads: records the counts."""

    def __init__(self):
        self.counts = []

    def __call__(self, n):
        self.counts.append(n)


@pytest.fixture(params=["pool", "openblas"])
def splitter(request, monkeypatch):
    """Products on our Python pool (no settable OpenBLAS) or on OpenBLAS'
    threads (the real setters where this process has them, else a
    recording one), the C pool turned off (test_product_pool.py)."""
    monkeypatch.setenv("KERAS_IPU_PRODUCT_POOL", "0")
    if request.param == "pool":
        monkeypatch.setattr(threads, "_blas_setters", ())
    elif not threads.blas_thread_setters():
        monkeypatch.setattr(threads, "_blas_setters", (_Setter(),))
    return request.param


def test_small_products_stay_on_one_thread(cap):
    cap(8)
    assert threads.threads_for(threads.FLOPS_PER_THREAD - 1) == 1
    assert threads.threads_for(3 * threads.FLOPS_PER_THREAD) == 3
    assert threads.threads_for(100 * threads.FLOPS_PER_THREAD) == 8
    cap(1)
    assert threads.threads_for(100 * threads.FLOPS_PER_THREAD) == 1
    assert threads.matmul_plan(0, 512, 512, 512, np.float32) is None


def test_openblas_threads_only_for_products_that_split_on_many_cores(cap, monkeypatch):
    monkeypatch.setattr(threads, "_blas_setters", (_Setter(),))
    split = 2 * threads.FLOPS_PER_THREAD  # the smallest product that splits
    cap(threads.BLAS_MIN_CAP)
    assert threads.blas_threads_for(split - 1) == 0  # stays on one thread
    assert threads.blas_threads_for(split) == min(
        threads.BLAS_MIN_CAP, max(2, split // threads.BLAS_FLOPS_PER_THREAD))
    cap(16)
    assert threads.blas_threads_for(10 * threads.BLAS_FLOPS_PER_THREAD) == 10
    assert threads.blas_threads_for(100 * threads.BLAS_FLOPS_PER_THREAD) == 16
    cap(threads.BLAS_MIN_CAP - 1)  # a small machine: our pool
    assert threads.blas_threads_for(100 * split) == 0
    cap(16)
    monkeypatch.setattr(threads, "_blas_setters", ())  # not settable here
    assert threads.blas_threads_for(100 * split) == 0


def test_openblas_threads_are_set_for_the_call_only(monkeypatch):
    setter = _Setter()
    monkeypatch.setattr(threads, "_blas_setters", (setter,))
    monkeypatch.setattr(threads, "_backoff", 0.0)
    plan = threads.blas_matmul_plan(4)
    x, y = np.ones((3, 5), np.float32), np.ones((5, 2), np.float32)
    np.testing.assert_array_equal(plan(x, y), np.matmul(x, y))
    assert setter.counts == [4, 1]
    # Another threaded product in flight (the count is process-wide): this
    # one runs on its own thread and leaves the count alone.
    with threads._blas_busy:
        np.testing.assert_array_equal(plan(x, y), np.matmul(x, y))
    assert setter.counts == [4, 1]
    # A busy machine (the pool backing off): one thread.
    monkeypatch.setattr(threads, "_backoff", 1.0)
    monkeypatch.setattr(threads, "_resume_at", threads.time.perf_counter() + 60)
    plan(x, y)
    assert setter.counts == [4, 1]
    assert threads.blas_matmul_plan(1) is None


def test_a_split_2d_product_goes_to_openblas_where_it_can_be_set(cap, monkeypatch):
    cap(threads.BLAS_MIN_CAP)
    monkeypatch.setattr(threads, "_blas_setters", (_Setter(),))
    if threads.product_pool.available():  # the C pool takes float32 products
        assert threads.matmul_plan(0, 512, 512, 512, np.float32).__name__ == (
            "native_split_matmul")
        # float64 too, where its bits check passed (row blocks: product_pool.py)
        assert threads.matmul_plan(0, 512, 512, 512, np.float64).__name__ == (
            "native_split_matmul" if threads.product_pool.available(np.float64)
            else "blas_matmul")
    monkeypatch.setenv("KERAS_IPU_PRODUCT_POOL", "0")
    assert threads.matmul_plan(0, 512, 512, 512, np.float32).__name__ == "blas_matmul"
    # Batched: numpy loops over the small products; our pool splits the batch.
    assert threads.matmul_plan(64, 128, 128, 128, np.float32).__name__ == "split_matmul"
    monkeypatch.setattr(threads, "_blas_setters", ())
    assert threads.matmul_plan(0, 512, 512, 512, np.float32).__name__ == "split_matmul"


@pytest.mark.parametrize("shapes", [
    ((256, 300), (300, 64)),     # rows
    ((64, 300), (300, 256)),     # columns
    ((8, 64, 100), (8, 100, 96)),  # batches
    ((1, 256, 200), (1, 200, 64)),  # one batch: its rows
])
def test_split_products_equal_numpy(cap, shapes, monkeypatch, splitter):
    cap(4)
    monkeypatch.setattr(threads, "FLOPS_PER_THREAD", 1000)
    monkeypatch.setattr(threads, "BLAS_FLOPS_PER_THREAD", 1000)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shapes[0]).astype(np.float32)
    y = rng.standard_normal(shapes[1]).astype(np.float32)
    b = x.shape[0] if x.ndim == 3 else 0
    plan = threads.matmul_plan(b, x.shape[-2], y.shape[-1], x.shape[-1], np.float32)
    assert plan.__name__ == ("blas_matmul" if splitter == "openblas" and not b
                             else "split_matmul")
    np.testing.assert_allclose(plan(x, y), np.matmul(x, y), rtol=1e-5, atol=1e-4)
    want = threads.matmul(x, y)
    np.testing.assert_allclose(want, np.matmul(x, y), rtol=1e-5, atol=1e-4)
    # out=: the plan's blocks write into a view, with the plan's bits; one
    # thread, the whole product's own out (np.matmul's or our kernel's).
    first, second = np.full((2,) + want.shape, np.nan, np.float32)
    assert threads.matmul(x, y, out=second) is second
    assert second.tobytes() == want.tobytes() and np.isnan(first).all()
    cap(1)
    assert threads.matmul(x, y, out=first) is first
    assert first.tobytes() == product_pool.matmul(x, y).tobytes()


def test_parallel_for_runs_every_block_once_and_reraises():
    seen = []
    threads.parallel_for(seen.append, 10, 3)
    assert sorted(seen) == list(range(10))

    def fail(i):
        if i == 5:
            raise KeyError(i)

    with pytest.raises(KeyError):
        threads.parallel_for(fail, 8, 2)


def test_background_priority_lowers_the_calling_thread_only():
    import os
    import threading

    seen = []

    def background():
        threads.background_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=background)
    t.start()
    t.join()
    assert seen == [19]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_splits_back_off_while_the_helpers_get_no_core(monkeypatch):
    import types

    clock = [100.0]
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    for name, value in (("_late", 0), ("_backoff", 0.0), ("_resume_at", 0.0)):
        monkeypatch.setattr(threads, name, value)
    monkeypatch.setattr(threads, "_ensure_workers", lambda n: None)
    handed = []
    # Helpers that never get a core: the job is handed out, nobody takes it.
    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=handed.append))
    ran = []

    def split():
        threads.parallel_for(ran.append, 4, 2)

    for _ in range(threads.LATE_SPLITS):
        split()
    assert len(handed) == threads.LATE_SPLITS and threads.backing_off()
    split()  # backing off: the caller alone, no hand-off
    assert len(handed) == threads.LATE_SPLITS
    assert ran == [0, 1, 2, 3] * (threads.LATE_SPLITS + 1)  # every block, in order
    clock[0] += threads.BACKOFF_SECONDS
    split()  # the probe: late again, so twice as long
    assert len(handed) == threads.LATE_SPLITS + 1
    assert threads._backoff == 2 * threads.BACKOFF_SECONDS and threads.backing_off()
    clock[0] += 2 * threads.BACKOFF_SECONDS
    # A helper that gets a core at once takes the blocks: the probe ends it.
    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=lambda job: job.work()))
    split()
    assert not threads.backing_off() and threads._late == 0


def _no_backoff(monkeypatch):
    for name, value in (("_late", 0), ("_backoff", 0.0), ("_resume_at", 0.0)):
        monkeypatch.setattr(threads, name, value)


# (tasks the caller ran, tasks, its own seconds, its wait, threads): late
# where the split ended later than the caller alone would have, never
# stricter than "waited longer than it worked" nor laxer than the helpers'
# count allows (two threads: that rule exactly).
@pytest.mark.parametrize("ran,count,own,wait,threads_,late", [
    (1, 16, 1.0, 5.0, 16, False),  # alone: 15 more tasks' time; "wait > own" called it late
    (1, 16, 1.0, 5.0, None, False),
    (1, 16, 1.0, 15.5, 16, True),
    (2, 32, 1.0, 14.0, 16, False),
    (4, 32, 1.0, 8.0, 16, True),  # alone: 7x more
    (1, 32, 1.0, 20.0, 16, True),  # under its share: at most the 15 helpers' factor
    (1, 4, 1.0, 2.5, 4, False),
    (1, 2, 1.0, 1.5, 2, True),  # two threads: as before
    (1, 2, 1.0, 0.9, 2, False),
    (2, 4, 1.0, 1.1, 2, True),
    (3, 4, 1.0, 1.1, 2, True),
    (3, 4, 1.0, 0.9, 2, False),
    (1, 4, 1.0, 1.5, 2, True),  # 1 of 4 on two threads: the caller was slow, as before
    (0, 2, 1e-6, 1e-3, 2, True),  # the caller ran nothing: no time per task, as before
    (0, 16, 1e-6, 1e-3, 16, True),
])
def test_a_split_is_late_where_the_caller_alone_would_have_ended_first(ran, count, own, wait,
                                                                        threads_, late):
    assert threads.split_late(ran, count, own, wait, threads_) is late


def test_a_c_pool_split_on_many_threads_is_judged_by_its_tasks(monkeypatch):
    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_late", threads.LATE_SPLITS - 1)
    # 1 of 16 tasks in 0.1 ms, 0.5 ms waiting for 15 helpers: on time (the
    # caller alone: 1.5 ms more), which ends the run of late splits.
    threads.note_pool_split((1, 1e-4, 5e-4), 16, 16)
    assert threads._late == 0 and not threads.backing_off()
    threads.note_pool_split((1, 1e-4, 1.5e-4), 2, 2)  # two threads: late, as before
    assert threads._late == 1
    threads.note_pool_split((1, 1e-4, 1.5e-4), 4, 2)  # 1 of 4 on two threads: as before
    assert threads._late == 2


def test_parallel_for_judges_a_split_by_the_blocks_its_helpers_ran(monkeypatch):
    import types

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_ensure_workers", lambda n: None)

    def helper_runs_one_block(job):
        with job.lock:
            i, job.next = job.next, job.next + 1
        job.fn(i)
        with job.lock:
            job.left -= 1
            if job.left == 0:
                job.done.set()

    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=helper_runs_one_block))

    def split(count, threads_, clock):
        # perf_counter at the start, after the caller's blocks, at the end
        ticks = iter(clock)
        monkeypatch.setattr(threads, "time",
                            types.SimpleNamespace(perf_counter=lambda: next(ticks)))
        ran = []
        threads.parallel_for(ran.append, count, threads_)
        assert sorted(ran) == list(range(count))

    monkeypatch.setattr(threads, "_late", threads.LATE_SPLITS - 1)
    split(16, 16, [0.0, 1.0, 6.0])  # 1 of 16 blocks, a wait of 5x its own: on time
    assert threads._late == 0
    split(2, 2, [0.0, 1.0, 2.5])  # 1 of 2, a wait of 1.5x: late
    assert threads._late == 1


def test_a_launched_call_runs_on_a_pool_thread_and_joins_its_result(monkeypatch):
    import threading

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_cap", 2)
    started, release = threading.Event(), threading.Event()

    def work(a, b):
        started.set()
        release.wait(10)
        return a + b, threading.get_ident()

    job = threads.launch(work, (2, 3))
    assert started.wait(10)  # a pool thread took it while the caller goes on
    release.set()
    total, ident = threads.join(job)
    assert total == 5 and ident != threading.get_ident()


def test_join_runs_a_launched_call_no_pool_thread_took_and_reraises(monkeypatch):
    import threading
    import types

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_ensure_workers", lambda n: None)
    handed = []
    # No pool thread gets a core: the caller runs it at the join.
    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=handed.append))
    job = threads.launch(lambda: threading.get_ident(), ())
    assert len(handed) == 1 and threads.join(job) == threading.get_ident()
    assert handed[0].work() == 0  # a pool thread coming late finds it taken

    def fail():
        raise KeyError("launched")

    with pytest.raises(KeyError):
        threads.join(threads.launch(fail, ()))


def test_a_launched_call_runs_at_once_while_backing_off(monkeypatch):
    import types

    monkeypatch.setattr(threads, "backing_off", lambda: True)
    handed, ran = [], []
    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=handed.append))
    job = threads.launch(lambda x: ran.append(x) or x * 2, (21,))
    assert ran == [21] and not handed  # run now, in the caller: no hand-off
    assert threads.join(job) == 42


def test_a_join_held_up_past_the_kernels_cpu_time_is_a_late_split(monkeypatch, long_backoff):
    import threading

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_cap", 2)
    taken, release = threading.Event(), threading.Event()

    def kernel():
        # A pool thread that loses its core mid-kernel: wall time passes,
        # almost no CPU time.
        taken.set()
        release.wait(10)

    job = threads.launch(kernel, ())
    assert taken.wait(10)
    threading.Timer(0.05, release.set).start()
    threads.join(job)  # waits ~50 ms for a kernel of ~0 ms of CPU
    # One such join starts the back-off (a split needs LATE_SPLITS in a row).
    assert threads._late == 1 and threads.backing_off()
    # A kernel that kept its core: the join waited less than its CPU time.
    import types

    _no_backoff(monkeypatch)
    wall = iter((100.0, 100.004))  # the join's start and end: 4 ms
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(
        perf_counter=lambda: next(wall), thread_time=lambda: 10.0))
    job = threads._Job(None, 1)
    job.next, job.result = 1, "done"
    job.launched_at, job.caller_cpu, job.cpu = 99.9999, 10.0, 0.010  # 10 ms of CPU
    job.done.set()
    assert threads.join(job) == "done"
    assert threads._late == 0 and not threads.backing_off()


def test_a_caller_off_its_core_between_launch_and_join_is_a_late_split(monkeypatch):
    import types

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_ensure_workers", lambda n: None)
    monkeypatch.setattr(threads, "_queue", types.SimpleNamespace(put=lambda job: None))
    clock = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(
        perf_counter=lambda: clock["wall"], thread_time=lambda: clock["cpu"]))
    job = threads.launch(lambda: "ran", ())
    # 1 ms of the caller's CPU in 2 ms of wall time: it kept its core.
    clock["wall"] += 0.002
    clock["cpu"] += 0.001
    assert threads.join(job) == "ran" and threads._late == 0
    job = threads.launch(lambda: "ran", ())
    # 1 ms of CPU in 10 ms: the caller lost its core (a busy machine).
    clock["wall"] += 0.010
    clock["cpu"] += 0.001
    assert threads.join(job) == "ran"  # no pool thread took it: the caller ran it
    assert threads._late == 1 and threads._backoff == threads.BACKOFF_SECONDS


@pytest.mark.parametrize("at_once", [True, False])
def test_a_c_pool_job_run_by_the_caller_behind_its_earlier_jobs_is_not_late(monkeypatch,
                                                                           long_backoff,
                                                                           at_once):
    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_cap", 2)  # two threads: a job the caller ran is late

    def joined(caller_ran, wait=0.0, cpu=0.001):
        finish = lambda handle: ("result", (caller_ran, wait, cpu))
        return threads.join(threads._OnCPool((None, finish), at_once))

    # The helper on earlier launched jobs: busy, not late; nothing noted.
    for _ in range(threads.LATE_SPLITS + 1):
        assert joined(threads.C_POOL_CALLER_RAN_BEHIND) == "result"
    assert threads._late == 0 and not threads.backing_off()
    # No helper took it with none ahead of it: late (at once, or counted).
    assert joined(1) == "result"
    assert threads._late == 1 and threads.backing_off() == at_once
    # ... and a busy helper's job does not end the count as one on time does.
    joined(threads.C_POOL_CALLER_RAN_BEHIND)
    assert threads._late == 1
    joined(0)
    assert threads._late == 0 and not threads.backing_off()


def test_a_c_pool_job_joined_before_a_helper_could_wake_is_not_late(monkeypatch, long_backoff):
    import types

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_cap", 2)
    clock = {"now": 100.0}
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(
        perf_counter=lambda: clock["now"], thread_time=lambda: 0.0))

    def joined(caller_ran, after):
        finish = lambda handle: ("result", (caller_ran, 0.0, 0.001))
        job = threads._OnCPool((None, finish), True, clock["now"])
        clock["now"] += after
        return threads.join(job)

    # The caller ran it, joined right after the launch: no helper could
    # have woken; the hand-off was all it cost. Nothing noted.
    for _ in range(threads.LATE_SPLITS + 1):
        assert joined(1, threads.LATE_WAIT_SECONDS / 2) == "result"
    assert threads._late == 0 and not threads.backing_off()
    # Joined long after the launch with no helper having taken it: late.
    assert joined(1, 10 * threads.LATE_WAIT_SECONDS) == "result"
    assert threads._late == 1 and threads.backing_off()


@pytest.mark.parametrize("cap, kind", [(1, threads.TWO_THREADS), (2, threads.TWO_THREADS),
                                       (3, threads.FEW_THREADS), (4, threads.WIDE),
                                       (16, threads.WIDE)])
def test_the_host_is_known_by_its_thread_cap(monkeypatch, cap, kind):
    # One place says it (threads.host_kind); the join and scan block rules
    # and wide splits read it.
    monkeypatch.delenv("KERAS_IPU_WIDE_SPLITS", raising=False)
    monkeypatch.setattr(threads, "_cap", cap)
    assert threads.host_kind() == kind == threads.host_kind(cap)
    assert threads._on_two_threads() == (kind == threads.TWO_THREADS)
    assert threads.wide_splits() == (kind == threads.WIDE)


def test_a_c_pool_job_the_caller_ran_is_late_on_two_threads_only(monkeypatch, long_backoff):
    import types

    clock = {"now": 100.0}
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(
        perf_counter=lambda: clock["now"], thread_time=lambda: 0.0))

    def joined(caller_ran, wait=0.0, cpu=0.001):
        finish = lambda handle: ("result", (caller_ran, wait, cpu))
        job = threads._OnCPool((None, finish), True, clock["now"])
        clock["now"] += 10 * threads.LATE_WAIT_SECONDS  # long after its launch
        return threads.join(job)

    for cap, late in ((2, True), (3, False), (4, False), (16, False)):
        _no_backoff(monkeypatch)
        monkeypatch.setattr(threads, "_cap", cap)
        monkeypatch.setattr(threads, "_late", 1)
        # No helper took it: on many threads only the hand-off was lost;
        # nothing noted (neither late nor on time: the count stands).
        assert joined(1) == "result"
        assert threads._late == (2 if late else 1) and threads.backing_off() == late
        # A helper took it and lost its core: late on any host.
        _no_backoff(monkeypatch)
        assert joined(0, wait=0.01, cpu=0.001) == "result"
        assert threads._late == 1 and threads.backing_off()


def test_a_launched_job_standing_for_a_split_backs_off_as_the_split_does(monkeypatch,
                                                                      long_backoff):
    import threading

    _no_backoff(monkeypatch)
    monkeypatch.setattr(threads, "_cap", 2)

    def held_up():
        taken, release = threading.Event(), threading.Event()

        def kernel():
            # A pool thread that loses its core mid-kernel.
            taken.set()
            release.wait(10)

        kernel.stands_for_a_split = True  # concurrent_steps.splits_in_two's pair
        job = threads.launch(kernel, ())
        assert taken.wait(10)
        threading.Timer(0.05, release.set).start()
        threads.join(job)

    # Late joins count as late splits: LATE_SPLITS in a row start the
    # back-off, not the first.
    for late in range(1, threads.LATE_SPLITS):
        held_up()
        assert threads._late == late and not threads.backing_off()
    held_up()
    assert threads._late == threads.LATE_SPLITS and threads.backing_off()
