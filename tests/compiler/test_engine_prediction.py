"""auto reads a hot program before paying for TensorFlow's import
(compiler/engine_prediction.py): only a program whose work is mostly
convolutions, where TensorFlow's graph runtime was measured faster, is
prepared for TensorFlow's engines; any other stays on NumPy."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import engine_prediction
from keras_ipu.device.compiler import tensorflow_runtime
from keras_ipu.device.compiler import tiered_runner
from keras_ipu.device.native import product_pool

DOT = dict(dimension_numbers=(((1,), (0,)), ((), ())))
CONV = dict(window_strides=(1, 1), padding=((1, 1), (1, 1)), lhs_dilation=(1, 1),
            rhs_dilation=(1, 1), dimension_numbers=((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
            feature_group_count=1)
# (2, 6, 6, 3) * (3, 3, 3, 4) -> (2, 6, 6, 4): 27 multiply-accumulates per output.
CONV_MACS = 2 * 6 * 6 * 4 * 27
DOT_MACS = 8 * 5 * 6  # (8, 6) @ (6, 5)


def _products(with_conv):
    def body(b, x, w, image, kernel):
        out = [b.op("dot_general", x, w, **DOT)]
        if with_conv:
            out.append(b.op("conv_general_dilated", image, kernel, **CONV))
        return out

    return build([aval((8, 6)), aval((6, 5)), aval((2, 6, 6, 3)), aval((3, 3, 3, 4))], body)


def _inputs(exe):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(a.shape).astype(a.dtype) for a in exe.in_avals]


PAYING_RATIO = 0.5  # a host where the graph runtime's convolutions pay


@pytest.fixture
def avx2_host(monkeypatch):
    """A CPU without AVX-512: convolution_ratio() is CONVOLUTION_RATIO,
    which the tests may set, whatever this host's flags."""
    monkeypatch.setattr(engine_prediction, "cpu_flags", lambda: frozenset({"avx2"}))
    engine_prediction.convolution_ratio.cache_clear()
    yield
    engine_prediction.convolution_ratio.cache_clear()


@pytest.fixture
def products_at_a_tie(monkeypatch):
    """Products as fast on both engines, whatever this host's BLAS runs
    (product_ratio: an AVX-512 host pinned to AVX2 kernels predicts them
    faster on TensorFlow)."""
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.OTHER_RATIO)


def test_the_share_is_the_convolutions_multiply_accumulates(monkeypatch, products_at_a_tie,
                                                            avx2_host):
    monkeypatch.setattr(engine_prediction, "CONVOLUTION_RATIO", PAYING_RATIO)
    graph = compile_graph(_products(with_conv=True)).running_graph
    share = CONV_MACS / (CONV_MACS + DOT_MACS)
    work = engine_prediction._work(graph)
    assert (work.conv, work.total) == (CONV_MACS, CONV_MACS + DOT_MACS)
    gain, _ = engine_prediction.predicted_gains(graph)
    assert gain == pytest.approx(
        1 - (share * engine_prediction.CONVOLUTION_RATIO
             + (1 - share) * engine_prediction.OTHER_RATIO))
    assert gain >= tiered_runner.MIN_PREDICTED_GAIN


def test_a_program_without_convolutions_is_predicted_to_gain_nothing(products_at_a_tie):
    graph = compile_graph(_products(with_conv=False)).running_graph
    assert engine_prediction._work(graph).conv == 0
    assert engine_prediction.predicted_gains(graph)[0] < tiered_runner.MIN_PREDICTED_GAIN


def test_pinned_blas_kernels_scale_the_convolutions_ratio_too(monkeypatch, avx2_host):
    """Our convolutions run on NumPy's sgemm: where its kernels are the
    pinned AVX2 ones on an AVX-512 CPU, a program of convolutions (the
    measured CONVOLUTION_RATIO, a loss at the tie) is predicted to pay."""
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    graph = compile_graph(_products(with_conv=True)).running_graph
    share = CONV_MACS / (CONV_MACS + DOT_MACS)
    factor = engine_prediction.PINNED_PRODUCT_RATIO / engine_prediction.OTHER_RATIO
    assert engine_prediction.predicted_gains(graph)[0] == pytest.approx(
        1 - factor * (share * engine_prediction.CONVOLUTION_RATIO
                      + (1 - share) * engine_prediction.OTHER_RATIO))
    # All convolutions: at the tie a loss, on the pinned kernels a gain.
    assert 1 - engine_prediction.CONVOLUTION_RATIO < tiered_runner.MIN_PREDICTED_GAIN
    assert 1 - factor * engine_prediction.CONVOLUTION_RATIO >= tiered_runner.MIN_PREDICTED_GAIN


def test_a_loop_body_counts_as_often_as_it_runs():
    # A product carried through 4 steps of a scan (it cannot leave the
    # loop) beside one convolution: the product's work counts 4 times.
    def step(b, c, w):
        return [b.op("dot_general", c, w, **DOT)]

    body = build([aval((6, 6)), aval((6, 6))], step)

    def outer(b, c, w, image, kernel):
        (y,) = b.op("scan", c, w, body=body, length=4, reverse=False, n_carry=1, n_xs=0,
                    unroll=1)
        return [y, b.op("conv_general_dilated", image, kernel, **CONV)]

    graph = compile_graph(build(
        [aval((6, 6)), aval((6, 6)), aval((2, 6, 6, 3)), aval((3, 3, 3, 4))], outer)).running_graph
    loop_macs = 4 * 6 * 6 * 6
    work = engine_prediction._work(graph)
    assert (work.conv, work.total) == (CONV_MACS, CONV_MACS + loop_macs)


def _hot_runner(monkeypatch, with_conv, host_threads=2):
    """A TieredRunner of _products whose second run is hot, with the compile's
    start recorded instead of run; (runner, its results, NumPy's, starts)."""
    monkeypatch.setattr(tiered_runner, "HOT_SECONDS", 0.0)
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", host_threads)
    starts = []

    def start(self, arrays):
        starts.append(self)
        self.engine = "compiling"  # as the real start: the runs after go on on NumPy

    monkeypatch.setattr(tiered_runner.TieredRunner, "_start_compile", start)
    exe = compile_graph(_products(with_conv))
    arrays = _inputs(exe)
    want = exe.run_unchecked(list(arrays))
    runner = tiered_runner.TieredRunner(exe)
    outs = [runner(list(arrays)) for _ in range(3)]
    return runner, outs, want, starts


@pytest.mark.parametrize("host_threads, xla", [
    (1, None),  # one host thread: no trial (no background there)
    (2, "pinned"),  # XLA's own prediction answers (and says it loses)
])
def test_a_hot_program_predicted_to_gain_nothing_stays_on_numpy(monkeypatch,
                                                                   products_at_a_tie,
                                                                   host_threads, xla):
    ratios = engine_prediction.PINNED_XLA if xla else None
    monkeypatch.setattr(engine_prediction, "xla_ratios", lambda: ratios)
    runner, outs, want, starts = _hot_runner(monkeypatch, with_conv=False,
                                             host_threads=host_threads)
    assert starts == [] and runner.thread is None and runner.trial_rent is None
    assert runner.engine == "final" and runner.current_name == "numpy"
    assert any("stays on numpy" in what for _, what in runner.events)
    for out in outs:
        for got, w in zip(out, want):
            np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("host_threads", [2, tiered_runner.PREDICTION_MAX_THREADS])
def test_a_hot_program_no_prediction_answers_for_gets_a_timed_trial_of_xla(
        monkeypatch, products_at_a_tie, host_threads):
    # The graph runtime predicted to gain nothing, XLA without a prediction
    # (our own gemm at two threads, an AVX2 host): NumPy, until the program
    # has run its rent (the trial's price over TRIAL_SHARE); then XLA alone
    # is prepared in the background, and the graph runtime stays out.
    monkeypatch.setattr(engine_prediction, "xla_ratios", lambda: None)
    runner, outs, want, starts = _hot_runner(monkeypatch, with_conv=False,
                                             host_threads=host_threads)
    assert starts == [] and runner.engine == "trial" and runner.candidates == ("xla",)
    assert runner.trial_rent == pytest.approx(tiered_runner.trial_rent())
    assert runner.trial_rent > tiered_runner.HOT_SECONDS
    assert runner.events[-1][1].startswith("hot: a timed trial of xla after")
    runner.program_seconds = 0.99 * runner.trial_rent
    outs.append(runner(_inputs(runner.executable)))
    assert starts == [] and runner.last_engine == "numpy"
    runner.program_seconds = runner.trial_rent
    outs.append(runner(_inputs(runner.executable)))
    assert starts == [runner] and runner.engine == "compiling"
    for out in outs:
        for got, w in zip(out, want):
            np.testing.assert_array_equal(got, w)


def test_the_trials_rent_is_its_price_over_its_share(monkeypatch):
    # TensorFlow's import counted only where nothing imported it yet.
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 1.0)
    compile_only = tiered_runner.TRIAL_XLA_SECONDS / tiered_runner.TRIAL_SHARE
    assert tiered_runner.trial_rent({"tensorflow": None}) == pytest.approx(compile_only)
    assert tiered_runner.trial_rent({}) == pytest.approx(
        compile_only + tiered_runner.TRIAL_IMPORT_SECONDS / tiered_runner.TRIAL_SHARE)
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 0.0)
    assert tiered_runner.trial_rent({}) == 0.0


def test_a_hot_program_of_convolutions_is_prepared_for_tensorflow(monkeypatch, avx2_host):
    monkeypatch.setattr(engine_prediction, "CONVOLUTION_RATIO", PAYING_RATIO)
    runner, _, _, starts = _hot_runner(monkeypatch, with_conv=True)
    assert starts == [runner]
    assert not any("stays on numpy" in what for _, what in runner.events)


def test_a_program_the_prediction_cannot_read_is_tried(monkeypatch):
    def unreadable(graph):
        raise LookupError("no cost rule (test)")

    monkeypatch.setattr(engine_prediction, "predicted_gains", unreadable)
    runner, _, _, starts = _hot_runner(monkeypatch, with_conv=False)
    assert starts == [runner]


def test_a_hot_programs_work_is_walked_once(monkeypatch):
    # Both engines' predictions read the same walk of the program.
    walks = []
    walk = engine_prediction._work
    monkeypatch.setattr(engine_prediction, "_work", lambda graph: walks.append(graph) or walk(graph))
    monkeypatch.setattr(engine_prediction, "product_ratio", lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    runner, _, _, _ = _hot_runner(monkeypatch, with_conv=True)
    assert "XLA" in (runner.predicted or "") or any("XLA" in what for _, what in runner.events)
    assert len(walks) == 1


def test_on_a_large_host_every_hot_program_is_tried(monkeypatch):
    # Ratios measured at 2 threads do not decide for 16 cores, where the
    # NumPy engine left most of the machine to XLA.
    runner, _, _, starts = _hot_runner(
        monkeypatch, with_conv=False, host_threads=tiered_runner.PREDICTION_MAX_THREADS + 1)
    assert starts == [runner]


WHEELS_BLAS = "/venv/lib/python3.11/site-packages/numpy.libs/libscipy_openblas64_-x.so"


def _blas(architecture, filepath=WHEELS_BLAS):
    return {"user_api": "blas", "internal_api": "openblas", "filepath": filepath,
            "architecture": architecture}


@pytest.mark.parametrize("architecture, flags, below", [
    ("Haswell", {"avx2", "avx512f"}, True),   # OPENBLAS_CORETYPE=Haswell on Zen 5
    ("Zen", {"avx2", "avx512f"}, True),
    ("SkylakeX", {"avx2", "avx512f"}, False),  # OpenBLAS' own pick there
    ("Cooperlake", {"avx2", "avx512f"}, False),
    ("Haswell", {"avx2"}, False),             # an AVX2 host: its best kernels
    ("Haswell", set(), False),                # no cpuinfo
])
def test_blas_below_cpu_reads_the_kernels_against_the_flags(architecture, flags, below):
    assert engine_prediction.blas_below_cpu([_blas(architecture)], frozenset(flags)) is below


def test_blas_below_cpu_reads_numpys_openblas():
    flags = frozenset({"avx512f"})
    other = _blas("SkylakeX", "/usr/lib/libopenblas.so.0")
    mkl = {"user_api": "blas", "internal_api": "mkl", "filepath": "/opt/libmkl_rt.so"}
    assert engine_prediction.blas_below_cpu([other, _blas("Haswell"), mkl], flags)
    assert not engine_prediction.blas_below_cpu([_blas("SkylakeX"), other], flags)
    # Not the wheels': the only OpenBLAS loaded, else none decides.
    assert engine_prediction.blas_below_cpu([_blas("Haswell", "/usr/lib/libopenblas.so")], flags)
    assert not engine_prediction.blas_below_cpu(
        [_blas("Haswell", "/usr/lib/a.so"), _blas("Haswell", "/usr/lib/b.so")], flags)
    assert not engine_prediction.blas_below_cpu([mkl], flags)
    assert not engine_prediction.blas_below_cpu([], flags)
    assert not engine_prediction.blas_below_cpu([{"internal_api": "openblas"}], flags)


def test_cpu_flags_reads_the_first_cpu_and_survives_a_missing_file(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert engine_prediction.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512f"}
    assert engine_prediction.cpu_flags(str(tmp_path / "none")) == frozenset()


def _product_ratio(monkeypatch, info, flags, ours=False):
    """product_ratio() read afresh with threadpool_info() giving `info` (an
    exception: raised), cpu_flags() giving `flags` and float32 products on
    our own kernel or not (`ours`: product_pool.native_gemm)."""
    import threadpoolctl

    def threadpool_info():
        if isinstance(info, Exception):
            raise info
        return info

    monkeypatch.setattr(threadpoolctl, "threadpool_info", threadpool_info)
    monkeypatch.setattr(engine_prediction, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(product_pool, "native_gemm", lambda: ours)
    engine_prediction.product_ratio.cache_clear()
    try:
        return engine_prediction.product_ratio()
    finally:
        engine_prediction.product_ratio.cache_clear()


def test_product_ratio_is_the_pinned_one_only_for_avx2_kernels_on_avx512(monkeypatch):
    assert (_product_ratio(monkeypatch, [_blas("Haswell")], {"avx512f"})
            == engine_prediction.PINNED_PRODUCT_RATIO)
    assert engine_prediction.PINNED_PRODUCT_RATIO < 1 - tiered_runner.MIN_PREDICTED_GAIN
    assert (_product_ratio(monkeypatch, [_blas("SkylakeX")], {"avx512f"})
            == engine_prediction.OTHER_RATIO)
    assert (_product_ratio(monkeypatch, [_blas("Haswell")], {"avx2"})
            == engine_prediction.OTHER_RATIO)
    assert (_product_ratio(monkeypatch, ImportError("no threadpoolctl (test)"), {"avx512f"})
            == engine_prediction.OTHER_RATIO)


def test_products_on_our_own_kernel_are_not_pinned(monkeypatch):
    """Where float32 products run our AVX-512 kernel (product_pool.native_gemm)
    the pin does not reach them: the tie, and a program of products stays
    on NumPy (the MLP ran there at 0.58 of the graph runtime's CPU per
    step: module doc)."""
    assert (_product_ratio(monkeypatch, [_blas("Haswell")], {"avx512f"}, ours=True)
            == engine_prediction.OTHER_RATIO)
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.OTHER_RATIO)
    graph = compile_graph(_products(with_conv=False)).running_graph
    gain, xla = engine_prediction.predicted_gains(graph)
    assert gain < tiered_runner.MIN_PREDICTED_GAIN and xla is None


def test_product_ratio_is_read_once_per_process(monkeypatch):
    import threadpoolctl

    calls = []
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: calls.append(1) or [])
    monkeypatch.setattr(product_pool, "native_gemm", lambda: False)  # OpenBLAS' kernels
    engine_prediction.product_ratio.cache_clear()
    try:
        for _ in range(3):
            assert engine_prediction.product_ratio() == engine_prediction.OTHER_RATIO
    finally:
        engine_prediction.product_ratio.cache_clear()
    assert calls == [1]


def test_products_on_pinned_kernels_make_a_program_without_convolutions_hot(monkeypatch):
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    graph = compile_graph(_products(with_conv=False)).running_graph
    assert engine_prediction.predicted_gains(graph)[0] == pytest.approx(
        1 - engine_prediction.PINNED_PRODUCT_RATIO)
    runner, _, _, starts = _hot_runner(monkeypatch, with_conv=False)
    assert starts == [runner]


@pytest.mark.parametrize("flags, ratio", [
    ({"avx2", "avx512f"}, "AVX512_CONVOLUTION_RATIO"),  # oneDNN's AVX-512 convolutions
    ({"avx2"}, "CONVOLUTION_RATIO"),                    # the AVX2 host it was measured on
    (set(), "CONVOLUTION_RATIO"),                       # no cpuinfo
])
def test_the_convolutions_ratio_is_the_cpu_classs(monkeypatch, flags, ratio):
    reads = []
    monkeypatch.setattr(engine_prediction, "cpu_flags",
                        lambda: reads.append(1) or frozenset(flags))
    engine_prediction.convolution_ratio.cache_clear()
    try:
        for _ in range(3):
            assert engine_prediction.convolution_ratio() == getattr(engine_prediction, ratio)
    finally:
        engine_prediction.convolution_ratio.cache_clear()
    assert reads == [1]  # once per process


def test_avx512_convolutions_pay_on_either_blas_and_avx2_ones_only_pinned():
    # The measured ratios against MIN_PREDICTED_GAIN, a program of
    # convolutions only: the decision each CPU class gets.
    pinned = engine_prediction.PINNED_PRODUCT_RATIO / engine_prediction.OTHER_RATIO
    assert 1 - engine_prediction.AVX512_CONVOLUTION_RATIO >= tiered_runner.MIN_PREDICTED_GAIN
    assert 1 - pinned * engine_prediction.AVX512_CONVOLUTION_RATIO >= tiered_runner.MIN_PREDICTED_GAIN
    assert 1 - engine_prediction.CONVOLUTION_RATIO < tiered_runner.MIN_PREDICTED_GAIN


def _dense(batch, chain):
    """A product (batch, 512) @ (512, 512) feeding a chain of `chain`
    elementwise ops (the compiler fuses them into one node)."""
    def body(b, x, w, bias):
        y = b.op("dot_general", x, w, **DOT)
        for k in range(chain):
            y = b.op("add", y, bias) if k % 2 == 0 else b.op("mul", y, lit(0.5, "float32"))
        return [y]

    return build([aval((batch, 512)), aval((512, 512)), aval((512,))], body)


def test_chain_ops_are_the_fused_members_after_the_first():
    graph = compile_graph(_dense(32, chain=6)).running_graph
    assert [n.primitive.name for n in graph.nodes] == ["dot_general", "fused_elementwise"]
    assert engine_prediction._work(graph).chained == 5
    # A lone elementwise op is one op on either engine.
    assert engine_prediction._work(compile_graph(_dense(32, chain=1)).running_graph).chained == 0


def test_a_loop_bodys_chain_ops_count_as_often_as_it_runs():
    def step(b, c, bias):
        return [b.op("mul", b.op("add", b.op("add", c, bias), bias), lit(0.5, "float32"))]

    body = build([aval((6, 6)), aval((6,))], step)

    def outer(b, c, bias):
        return b.op("scan", c, bias, body=body, length=4, reverse=False, n_carry=1, n_xs=0,
                    unroll=1)

    graph = compile_graph(build([aval((6, 6)), aval((6,))], outer)).running_graph
    assert engine_prediction._work(graph).chained == 4 * 2


def _steps(inner, avals, length=4):
    """`inner` (a Graph) as the body of a scan over `length` steps, as the
    program's loop over steps_per_execution runs a train step."""
    def outer(b, *args):
        return b.op("scan", *args, body=inner, length=length, reverse=False, n_carry=1,
                    n_xs=0, unroll=1)

    return build(avals, outer)


def _recurrent(chain, length=32):
    """A step whose work is a recurrent layer's scan over `length` time
    steps: the carried (128, 128) rows times a (128, 128) weight, through a
    chain of `chain` elementwise ops."""
    def cell(b, h, w, bias):
        y = b.op("dot_general", h, w, **DOT)
        for k in range(chain):
            y = b.op("add", y, bias) if k % 2 == 0 else b.op("mul", y, lit(0.5, "float32"))
        return [y]

    avals = [aval((128, 128)), aval((128, 128)), aval((128,))]
    body = build(avals, cell)

    def step(b, h, w, bias):
        return b.op("scan", h, w, bias, body=body, length=length, reverse=False, n_carry=1,
                    n_xs=0, unroll=1)

    return _steps(build(avals, step), avals)


def test_a_recurrent_scans_chains_are_not_charged_but_the_steps_loops_are(monkeypatch):
    graph = compile_graph(_recurrent(chain=20)).running_graph
    assert engine_prediction._work(graph).chained == 0
    # They are there, fused: one scan deeper they would be charged.
    monkeypatch.setattr(engine_prediction, "UNCHARGED_SCAN_DEPTH", 3)
    assert engine_prediction._work(graph).chained == 4 * 32 * 19
    monkeypatch.undo()
    dense = _dense(32, chain=6)
    stepped = compile_graph(_steps(dense, [v.aval for v in dense.inputs])).running_graph
    assert engine_prediction._work(stepped).chained == 4 * 5


def test_on_pinned_kernels_a_recurrent_layers_chains_go_and_straight_line_ones_stay(
        monkeypatch, avx2_host):
    # The LSTM's scan bodies against demo_functional at batch 32 with
    # Adam (UNCHARGED_SCAN_DEPTH): the same chain, 20 ops, on a product of
    # about the same size, both inside the loop over steps.
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    recurrent = compile_graph(_recurrent(chain=20)).running_graph
    assert engine_prediction.predicted_gains(recurrent)[0] >= tiered_runner.MIN_PREDICTED_GAIN
    dense = _dense(32, chain=20)
    stepped = compile_graph(_steps(dense, [v.aval for v in dense.inputs])).running_graph
    assert engine_prediction.predicted_gains(stepped)[0] < tiered_runner.MIN_PREDICTED_GAIN


def test_chain_ops_cost_their_dispatch_against_the_work(monkeypatch, avx2_host):
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    graph = compile_graph(_dense(32, chain=6)).running_graph
    macs = 32 * 512 * 512
    assert engine_prediction.predicted_gains(graph)[0] == pytest.approx(
        1 - engine_prediction.PINNED_PRODUCT_RATIO
        - 5 * engine_prediction.GRAPH_OP_MACS / macs)


@pytest.mark.parametrize("batch, chain, pays", [
    (128, 6, True),    # a large product, a short chain
    (32, 6, False),    # the same ops on a quarter of the work (batch 32)
    (128, 20, False),  # a long chain on the large product
])
def test_on_pinned_kernels_small_products_and_long_chains_stay_on_numpy(
        monkeypatch, avx2_host, batch, chain, pays):
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    gain = engine_prediction.predicted_gains(compile_graph(_dense(batch, chain)).running_graph)[0]
    assert (gain >= tiered_runner.MIN_PREDICTED_GAIN) is pays


def test_a_program_without_products_is_predicted_to_gain_nothing(monkeypatch):
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    graph = compile_graph(build([aval((8, 8))], lambda b, x: [b.op("exp", x)])).running_graph
    assert engine_prediction.predicted_gains(graph)[0] == 0.0


# -- XLA's answer (predicted_gains' second) and the order of auto's candidates


@pytest.fixture
def pinned_blas(monkeypatch):
    """NumPy's products on kernels below the CPU's (OPENBLAS_CORETYPE=Haswell
    on an AVX-512 CPU), the host class the XLA ratios were measured on,
    whatever this host's BLAS runs."""
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)


def _xla_by_hand(macs, product_bytes, out_bytes, scan_kernels=0, conv_macs=0):
    ep = engine_prediction
    share = conv_macs / macs
    return (1 - share * ep.XLA_CONVOLUTION_RATIO - (1 - share) * ep.XLA_PRODUCT_RATIO
            - (ep.XLA_PRODUCT_BYTE_MACS * product_bytes + ep.XLA_OUTPUT_BYTE_MACS * out_bytes
               - ep.SCAN_KERNEL_MACS * scan_kernels) / macs)


def test_xla_gain_is_its_products_ratio_less_the_bytes_read_and_written(pinned_blas):
    graph = compile_graph(_dense(128, chain=6)).running_graph
    macs = 128 * 512 * 512
    read = 4 * (128 * 512 + 512 * 512)  # the product's operands
    written = 4 * 128 * 512  # the program's result
    assert engine_prediction.predicted_gains(graph)[1] == pytest.approx(
        _xla_by_hand(macs, read, written))


def test_xla_charges_no_op_per_chain_member(pinned_blas):
    # The graph runtime runs each member as an op; XLA fuses the chain.
    short, long = (compile_graph(_dense(128, chain)).running_graph for chain in (6, 20))
    assert engine_prediction._work(long).chained > engine_prediction._work(short).chained
    (gain_long, xla_long), (gain_short, xla_short) = (
        engine_prediction.predicted_gains(graph) for graph in (long, short))
    assert gain_long < gain_short
    assert xla_long == pytest.approx(xla_short)


def test_xla_convolutions_take_their_own_ratio(pinned_blas):
    graph = compile_graph(_products(with_conv=True)).running_graph
    read = 4 * (8 * 6 + 6 * 5)
    written = 4 * (8 * 5 + 2 * 6 * 6 * 4)
    assert engine_prediction.predicted_gains(graph)[1] == pytest.approx(_xla_by_hand(
        CONV_MACS + DOT_MACS, read, written, conv_macs=CONV_MACS))
    assert engine_prediction.XLA_CONVOLUTION_RATIO > 1  # slower than ours on that host


def test_a_recurrent_layers_time_steps_are_xlas_saving(pinned_blas):
    # 4 steps of a 32-step scan whose body is a product and its chain: two
    # kernels per time step, the NumPy engine's cost XLA's while loop saves.
    graph = compile_graph(_recurrent(chain=20)).running_graph
    trips = 4 * 32
    assert engine_prediction._work(graph).scan_kernels == trips * 2
    assert engine_prediction.predicted_gains(graph)[1] == pytest.approx(_xla_by_hand(
        trips * 128 * 128 * 128, trips * 4 * 2 * 128 * 128, 4 * 128 * 128,
        scan_kernels=trips * 2))


def test_no_xla_answer_where_numpy_runs_the_cpus_own_kernels(monkeypatch, products_at_a_tie):
    graph = compile_graph(_dense(128, chain=6)).running_graph
    monkeypatch.setattr(product_pool, "native_gemm", lambda: False)  # OpenBLAS' own kernels
    for threads in (1, 2):
        monkeypatch.setattr(tiered_runner.host_threads, "_cap", threads)
        assert engine_prediction.xla_ratios() is None
        assert engine_prediction.predicted_gains(graph)[1] is None


@pytest.fixture
def our_kernel(monkeypatch):
    """NumPy's float32 products on our own AVX-512 kernel
    (product_pool.native_gemm), whatever this host's CPU has: the products'
    tie for the graph runtime; a function setting the host threads."""
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.OTHER_RATIO)
    monkeypatch.setattr(product_pool, "native_gemm", lambda: True)
    return lambda threads: monkeypatch.setattr(tiered_runner.host_threads, "_cap", threads)


def test_xlas_ratios_are_the_host_classs(monkeypatch, our_kernel):
    # Our kernel: measured at one host thread only (NumPy was fastest at two).
    our_kernel(1)
    assert engine_prediction.xla_ratios() is engine_prediction.NATIVE_XLA
    our_kernel(2)
    assert engine_prediction.xla_ratios() is None
    # The pinned kernels, at any thread count: the ratios fitted there.
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    for threads in (1, 2):
        our_kernel(threads)
        assert engine_prediction.xla_ratios() is engine_prediction.PINNED_XLA
    ep = engine_prediction
    assert ep.PINNED_XLA == (ep.XLA_PRODUCT_RATIO, ep.XLA_CONVOLUTION_RATIO,
                             ep.XLA_PRODUCT_BYTE_MACS, ep.XLA_OUTPUT_BYTE_MACS,
                             ep.SCAN_KERNEL_MACS)


def _xla_on(ratios, work, out_bytes):
    share = work.conv / work.total
    return (1 - share * ratios.convolution - (1 - share) * ratios.product
            - (ratios.product_byte_macs * work.product_bytes + ratios.output_byte_macs * out_bytes
               - ratios.scan_kernel_macs * work.scan_kernels) / work.total)


def test_on_our_kernel_at_one_thread_xla_takes_its_own_ratios(our_kernel):
    our_kernel(1)
    graph = compile_graph(_recurrent(chain=20)).running_graph
    work = engine_prediction._work(graph)
    assert engine_prediction.predicted_gains(graph)[1] == pytest.approx(
        _xla_on(engine_prediction.NATIVE_XLA, work, 4 * 128 * 128))
    graph = compile_graph(_products(with_conv=True)).running_graph
    assert engine_prediction.predicted_gains(graph)[1] == pytest.approx(_xla_on(
        engine_prediction.NATIVE_XLA, engine_prediction._work(graph),
        4 * (8 * 5 + 2 * 6 * 6 * 4)))


# The benchmark's kinds of program, each one's XLA prediction on the pinned
# kernels and on our own at one thread, against MIN_PREDICTED_GAIN: large
# products (the MLP), small ones writing Adam's state (demo_functional b32
# Adam), a recurrent layer's time steps (the LSTM), convolutions (the CNN).
@pytest.mark.parametrize("program, pinned, ours", [
    (lambda: _dense(128, chain=6), True, False),
    (lambda: _updating(32, slots=3), False, False),
    (lambda: _recurrent(chain=20), True, True),
    (lambda: _products(with_conv=True), False, False),
])
def test_xla_pays_on_our_kernel_only_for_a_recurrent_layers_time_steps(
        monkeypatch, our_kernel, program, pinned, ours):
    graph = compile_graph(program()).running_graph
    our_kernel(1)
    assert (engine_prediction.predicted_gains(graph)[1]
            >= tiered_runner.MIN_PREDICTED_GAIN) is ours
    our_kernel(2)
    assert engine_prediction.predicted_gains(graph)[1] is None
    monkeypatch.setattr(engine_prediction, "product_ratio",
                        lambda: engine_prediction.PINNED_PRODUCT_RATIO)
    assert (engine_prediction.predicted_gains(graph)[1]
            >= tiered_runner.MIN_PREDICTED_GAIN) is pinned


def test_on_our_kernel_at_one_thread_only_xla_is_prepared_for_the_time_steps(
        monkeypatch, our_kernel):
    # The graph runtime at the products' tie does not pay; XLA alone is
    # the candidate, predicted at one thread, at two a timed trial (no XLA
    # answer there).
    exe = compile_graph(_recurrent(chain=20))
    for threads, trial in ((1, False), (2, True)):
        our_kernel(threads)
        runner = tiered_runner.TieredRunner(exe)
        assert runner._could_pay()
        assert runner.candidates == ("xla",) and (runner.trial_rent is not None) is trial


def _updating(batch, slots):
    """A product (batch, 512) @ (512, 512) whose program also returns
    `slots` arrays of the weight's size, as a train step returns its
    weights and optimizer slots (Adam: 3)."""
    def body(b, x, w):
        return [b.op("dot_general", x, w, **DOT)] + [
            b.op("mul", w, lit(0.5 + k, "float32")) for k in range(slots)]

    return build([aval((batch, 512)), aval((512, 512))], body)


@pytest.mark.parametrize("batch, slots, pays", [
    (128, 3, True),   # demo_functional at batch 128 with Adam
    (32, 3, False),   # at batch 32: the state written outweighs the products' gain
    (32, 0, True),    # batch 32, no state written
])
def test_state_written_on_small_products_loses_xlas_gain(pinned_blas, batch, slots, pays):
    graph = compile_graph(_updating(batch, slots)).running_graph
    gain = engine_prediction.predicted_gains(graph)[1]
    assert gain == pytest.approx(_xla_by_hand(
        batch * 512 * 512, 4 * (batch * 512 + 512 * 512), 4 * (batch * 512 + slots * 512 * 512)))
    assert (gain >= tiered_runner.MIN_PREDICTED_GAIN) is pays


def _ordered_runner(monkeypatch, gain, xla):
    """A hot TieredRunner of _products whose predictions are `gain` (the
    graph runtime's) and `xla`; (runner, compile starts)."""
    monkeypatch.setattr(engine_prediction, "predicted_gains", lambda graph: (gain, xla))
    runner, _, _, starts = _hot_runner(monkeypatch, with_conv=False)
    return runner, starts


@pytest.mark.parametrize("gain, xla, candidates, priced", [
    (0.11, 0.26, ("tensorflow", "xla"), True),  # the MLP, pinned
    (0.16, 0.41, ("tensorflow", "xla"), True),  # the LSTM
    (0.13, 0.25, ("tensorflow", "xla"), False),  # the transformer: over half XLA's
    # The CNN: XLA predicted to lose, not tried.
    (0.32, -0.32, ("tensorflow",), False),
    (0.32, 0.04, ("tensorflow",), False),  # XLA under MIN_PREDICTED_GAIN
    (0.02, 0.23, ("xla",), True),  # MLP b128 Adam: the graph runtime does not pay
    (0.11, None, ("tensorflow", "xla"), False),  # no XLA answer on this host class
])
def test_xla_is_priced_by_its_prediction_where_the_graph_runtime_saves_under_half_its_gain(
        monkeypatch, gain, xla, candidates, priced):
    runner, starts = _ordered_runner(monkeypatch, gain, xla)
    assert starts == [runner] and runner.candidates == candidates
    assert (runner.xla_gain, runner.graph_gain) == ((xla, gain) if priced else (None, None))


@pytest.mark.parametrize("gain, xla", [
    (-0.26, -0.01),  # demo_functional, batch 32, Adam
    (-0.09, 0.04),   # MLP batch 32: XLA under MIN_PREDICTED_GAIN
])
def test_a_program_neither_engine_pays_for_stays_on_numpy(monkeypatch, gain, xla):
    runner, starts = _ordered_runner(monkeypatch, gain, xla)
    assert starts == [] and runner.engine == "final" and runner.current_name == "numpy"
    assert runner.candidates == ()
    assert any("stays on numpy" in what for _, what in runner.events)


@pytest.mark.parametrize("xla", [0.26, None])  # predicted to pay; no answer (no trial either)
def test_xla_alone_keeps_auto_candidates_without_it(monkeypatch, xla):
    monkeypatch.setattr(tiered_runner, "AUTO_CANDIDATES", ("tensorflow",))
    runner, starts = _ordered_runner(monkeypatch, 0.02, xla)
    assert starts == [] and runner.candidates == () and runner.trial_rent is None


def _rent_after_the_graph_runtime(monkeypatch, gain, xla, kept, since_hot):
    """XLA's rent (program CPU seconds) after the graph runtime took 0.2 s
    of CPU to prepare and `kept` keeps the program, `since_hot` program CPU
    seconds after it was found hot."""
    runner, _ = _ordered_runner(monkeypatch, gain, xla)
    runner.current_name = kept
    runner.hot_seconds, runner.program_seconds = 1.0, 1.0 + since_hot
    return runner._rent("xla", "tensorflow", 0.2)


@pytest.mark.parametrize("kept, forgone", [("tensorflow", 0.41 - 0.16), ("numpy", 0.41)])
def test_xlas_rent_is_its_predicted_gain_paid_since_the_program_was_hot(
        monkeypatch, kept, forgone):
    price = tiered_runner.XLA_PREPARATION_RATIO * 0.2
    assert _rent_after_the_graph_runtime(monkeypatch, 0.16, 0.41, kept, 0.0) == pytest.approx(
        price / forgone)
    assert _rent_after_the_graph_runtime(monkeypatch, 0.16, 0.41, kept, 1.0) == pytest.approx(
        price / forgone - 1.0)
    # The import's seconds on NumPy already paid for it: at once.
    assert _rent_after_the_graph_runtime(monkeypatch, 0.16, 0.41, kept, 10.0) == 0.0


def test_xlas_rent_without_its_prediction_is_the_expected_gain_from_now(monkeypatch):
    price = tiered_runner.XLA_PREPARATION_RATIO * 0.2
    for gain, xla in [(0.13, 0.25), (0.11, None)]:
        assert _rent_after_the_graph_runtime(monkeypatch, gain, xla, "tensorflow", 10.0) == (
            pytest.approx(price / tiered_runner.XLA_EXPECTED_GAIN))


class _Candidate:
    def __init__(self, engine):
        self.engine = engine

    def run(self, arrays):
        return arrays


def _compile_in_order(monkeypatch, gain, xla, kept, since_hot, ready_modes=None):
    """The compile thread's walk over the candidates, run here with
    TensorFlow left out: each candidate prepared at once (0.2 s of CPU)
    and its timed turns ending with `kept(name)` deciding whether it is
    kept, the program `since_hot` CPU seconds past hot; (names prepared,
    in order, the rents paid, the runner). `ready_modes` (a list) gets
    the emitter modes tensorflow_ready was given."""
    runner, _ = _ordered_runner(monkeypatch, gain, xla)
    runner.engine = "compiling"
    runner.program_seconds = runner.hot_seconds + since_hot
    ready_modes = [] if ready_modes is None else ready_modes
    monkeypatch.setattr(tensorflow_runtime, "tensorflow_ready",
                        lambda graph, modes, check: ready_modes.append(list(modes)))
    prepared, rents = [], []

    def prepare(name, *args):
        prepared.append(name)
        return _Candidate(name), 0.2

    monkeypatch.setattr(runner, "_prepare", prepare)
    monkeypatch.setattr(runner, "_prepared_by_caller", prepare)
    monkeypatch.setattr(runner, "_pay_rent", rents.append)

    def timed_turns():
        # Stands for the runs that time the candidate (_timed_run).
        if runner.engine == "timing":
            runner.candidate_times = [1.0 if kept(runner.candidate.engine) else 3.0]
            runner.current_times = [2.0]
            runner._keep_the_faster()

    monkeypatch.setattr(runner, "_check", timed_turns)
    runner._compile_stoppably(sample=None)
    return prepared, rents, runner


def test_xla_predicted_best_follows_the_graph_runtime_at_once(monkeypatch):
    prepared, rents, runner = _compile_in_order(monkeypatch, 0.16, 0.41,
                                                kept=lambda name: True, since_hot=10.0)
    assert prepared == ["tensorflow", "xla"] and rents == [0.0]
    assert runner.current_name == "xla" and runner.engine == "final"


def test_xla_not_predicted_best_waits_its_rent_after_the_graph_runtime(monkeypatch):
    prepared, rents, runner = _compile_in_order(monkeypatch, 0.13, 0.25,
                                                kept=lambda name: True, since_hot=10.0)
    assert prepared == ["tensorflow", "xla"]
    assert rents == [pytest.approx(tiered_runner.XLA_PREPARATION_RATIO * 0.2
                                   / tiered_runner.XLA_EXPECTED_GAIN)]


def test_xla_alone_where_the_graph_runtime_is_not_predicted_to_pay(monkeypatch):
    prepared, rents, runner = _compile_in_order(monkeypatch, 0.02, 0.23,
                                                kept=lambda name: True, since_hot=0.0)
    assert prepared == ["xla"] and rents == [] and runner.current_name == "xla"


@pytest.mark.parametrize("gain, xla, modes", [
    (0.32, -0.32, ["graph"]),  # the CNN: the graph runtime alone
    (0.02, 0.23, ["xla"]),  # XLA alone
    (0.16, 0.41, ["graph", "xla"]),
])
def test_tensorflows_runtime_is_awaited_for_the_programs_own_candidates(
        monkeypatch, gain, xla, modes):
    # tensorflow_ready waits for TensorFlow's runtime only where the
    # program can be emitted in one of these modes: a program only XLA's
    # rules cover, with the graph runtime its only candidate, builds
    # nothing, and so waits for nothing.
    ready_modes = []
    _compile_in_order(monkeypatch, gain, xla, kept=lambda name: True, since_hot=10.0,
                      ready_modes=ready_modes)
    assert ready_modes == [modes]
