"""Whether TensorFlow's engines could pay for a program, predicted from the
program before `auto` imports TensorFlow (tiered_runner.TieredRunner).

TensorFlow's import and the graph runtime's preparation cost about 5 s of
CPU, and on two cores they slow the training beside them 3-5x while they
run, nice 19 or not: the import is Python holding the interpreter lock,
which the run loop waits for after every kernel (issue 16, twelfth pass,
the lead's idle measurement: the MLP at 40 CPU ms per step against 8 while
TensorFlow was imported, the LSTM 206 against 69). `auto` paid that on
every model and then kept NumPy on the MLP, LSTM and demo_functional,
where the graph runtime is slower than the NumPy engine. So the program
is read first: the graph runtime's oneDNN convolutions are where it was
measured faster than our kernels; on products, elementwise chains,
reductions and scans it was measured slower or even (fit_throughput.py at
2 threads, idle, median of 3 rounds: time per step graph runtime / NumPy
engine CNN 0.82, transformer 0.94, MLP 1.45, LSTM 1.52, demo_functional
1.77).

The prediction: the share `s` of the program's multiply-accumulates that
are convolutions (scan and loop bodies counted as often as they run: the
cost rules' parts), and a step time on the graph runtime of
`s * convolution_ratio() + (1 - s) * OTHER_RATIO` of the NumPy engine's (the
rest of the multiply-accumulates are products'), times the BLAS kernels'
factor below, plus the cost of the ops the graph runtime runs beyond the
NumPy engine's kernels (below). The ratios are measured: a CNN's work is
almost all convolutions (0.82 in the twelfth pass; 1.11 once the NumPy
engine's convolutions and pools got faster in the thirteenth); the
products at a tie (OTHER_RATIO), the best the graph runtime did on
models without convolutions (the transformer's 0.94 is its inter-op pool
running independent kernels at once on an idle machine, with 10% more
CPU per step than the NumPy engine: gone as soon as the machine is
busy). Multiply-accumulates rather than measured kernel times: a program's
kernels cannot all be timed apart (scan bodies run as one kernel, on row
blocks, or as one placed function; launched kernels overlap), and a
convolution's share of the time is higher than its share of the work (our
convolutions run at about a third of a product's rate), so the share
errs towards NumPy, the engine that costs nothing to keep.

The products' tie holds where NumPy's OpenBLAS runs the best kernels the
CPU has, as on the AVX2 host where it was measured. An environment can
pin older ones (`OPENBLAS_CORETYPE=Haswell` on an AVX-512 CPU: the
seventeenth pass's AMD EPYC, family 26), which TensorFlow's oneDNN and
Eigen kernels do not read: there NumPy's products run at about half
their rate and the graph runtime's at full, so the products' ratio is
PINNED_PRODUCT_RATIO (product_ratio, read once per process from
threadpoolctl's architecture and /proc/cpuinfo's flags, without
TensorFlow). Not where the NumPy engine's float32 products run our own
AVX-512 kernel (product_pool.native_gemm; issue 16, twenty-first pass,
s21gemm): there they run at the CPU's rate, and the MLP ran at 2.2 CPU ms
per step on the NumPy engine against 3.8 on the graph runtime and 3.1 on
XLA (fit_throughput --threads 2, 2 rounds, load 1.2-2.4), so the
products' ratio is the tie again, which keeps such programs on NumPy.
Our convolutions are products too (their patches, then NumPy's sgemm, or
our kernel where it runs: primitives/conv.py), on the same kernels, so
the pinned kernels' factor (product_ratio() / OTHER_RATIO) scales the
convolutions' ratio as it does the products': the CNN there ran at 58.3
CPU ms per step on the graph runtime against 91.0 on the NumPy engine
(0.64; fit_throughput --threads 2, idle, 3 rounds, the lead's run), which
CONVOLUTION_RATIO alone called an 11% loss.

The convolutions' ratio is the CPU class's (convolution_ratio, from the
same flags): CONVOLUTION_RATIO was measured on an AVX2 CPU; where the
CPU has AVX-512, oneDNN's convolutions use it and the graph runtime ran
the CNN at AVX512_CONVOLUTION_RATIO of the NumPy engine even on
OpenBLAS' own kernels.

What the shares cannot see (the seventeenth pass: demo_functional at
batch 32 with Adam predicted a 17% gain on the pinned kernels, run at
11.0 against 6.1 CPU ms per step): the NumPy engine runs a fused chain
of elementwise operations (fusion.py) as one kernel, one pass over
memory in cache-sized blocks, where the graph runtime runs each member
as an op of its own, with its dispatch and its own pass. Those ops
(Work.chained: a chain's members after its first, bodies counted as
often as they run) are charged GRAPH_OP_MACS each, in the NumPy engine's
product multiply-accumulates, against the program's: long chains on
small products (batch 32; Adam's update of every weight) lose, the same
chains on large products do not. Not charged: the chains of a recurrent
layer's time steps (a scan inside the loop over steps), where the NumPy
engine's own per-kernel cost, which the multiply-accumulates do not
count either, is of the same size (UNCHARGED_SCAN_DEPTH).

XLA (predicted_gains' second value): its step against the NumPy engine's
from the same reading, from which `auto` prices XLA's rent and imports
TensorFlow where only XLA is predicted to pay
(tiered_runner.XLA_BEST_SHARE). Its products run at the CPU's own rate
(YNNPACK, which OPENBLAS_CORETYPE does not pin: XLA_PRODUCT_RATIO), its
convolutions slower than our patches on this CPU (XLA_CONVOLUTION_RATIO),
and it fuses elementwise chains into loops, so no op is charged per chain
member. What it pays beyond: the bytes its products read
(XLA_PRODUCT_BYTE_MACS: small products lose) and the program's results,
written to new buffers every run where the NumPy engine updates the state
in place (XLA_OUTPUT_BYTE_MACS). What it saves beyond: a recurrent layer's
time steps run as one while loop, without the NumPy engine's per-kernel
cost there (SCAN_KERNEL_MACS). Its ratios are the host class's
(xla_ratios): measured where NumPy's products run on kernels below the
CPU's (the pinned AVX-512 host, two threads), and where the NumPy
engine's float32 products run our own AVX-512 kernel, at one host thread
(NATIVE_XLA): there XLA's products are slower than ours, and what it
saves is the NumPy engine's cost per kernel of a recurrent layer's time
steps. At two threads on that class the NumPy engine ran the MLP,
demo_functional and the LSTM fastest (its products on both cores, XLA's
steps slower in wall time), and there is no XLA prediction, nor on other
hosts.
"""

import collections
import functools

from keras_ipu.device.cpuinfo import first_cpu
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives import cost_util

# Primitives whose TensorFlow kernels (oneDNN's, in the graph runtime) were
# measured faster than the NumPy engine's.
CONVOLUTIONS = frozenset({"conv_general_dilated"})
# Time per step on the graph runtime / on the NumPy engine, for the
# convolutions' share of the work and for the rest (module doc).
# Convolutions: 0.82 in the twelfth pass's idle run (ipu-numpy 715,
# ipu-tensorflow 867 samples/s); 1.11 after the thirteenth pass's NumPy
# convolutions and pools (ipu-numpy 900, ipu-tensorflow 808, 2 threads, load
# 2-5, s13auto): on that AVX2 host the graph runtime no longer paid even there.
CONVOLUTION_RATIO = 1.11
# Convolutions where the CPU has AVX-512 (oneDNN's AVX-512 kernels against
# our patches and NumPy's sgemm on OpenBLAS' own kernels, no pin): the
# CNN's train program on the graph runtime / the NumPy engine, 0.73, 0.78,
# 0.72 (wall minimum) and 0.77, 0.78, 0.84 (CPU per run) in three
# processes, runs alternated, 2 threads, load 6-7 (issue 16, eighteenth
# pass, s18auto, the seventeenth pass's AMD EPYC family 26); the lead's
# fit_throughput there, TensorFlow's Keras backend against ipu-numpy,
# 64 against 80 CPU ms per step (0.80). Pinned, the product factor below
# scales it (0.66 predicted; 0.50-0.62 measured the same way).
AVX512_CONVOLUTION_RATIO = 0.80
OTHER_RATIO = 1.0
# OpenBLAS' AVX2 kernels (threadpoolctl's architecture; its x86_64 core
# names) and the CPU flag that says the CPU has better ones.
AVX2_KERNELS = frozenset({"haswell", "zen"})
AVX512_FLAG = "avx512f"
# The products' ratio where NumPy's OpenBLAS runs AVX2 kernels on an
# AVX-512 CPU: the MLP (b128, SGD; its MACs all products) at 3.3 CPU ms
# per step on the graph runtime against 4.0 on the NumPy engine
# (fit_throughput.py --threads 2 --rounds 2, load 2.3-2.9, the seventeenth
# pass's AMD EPYC family 26 under OPENBLAS_CORETYPE=Haswell; samples/s
# 38,623 against 25,319); its four large products alone, one thread, 1.86
# ms on TensorFlow against 2.72 on np.matmul (0.68; on OpenBLAS' own
# SkylakeX kernels 1.33, the tie's side).
PINNED_PRODUCT_RATIO = 0.83
# The fused chain, whose members the graph runtime runs one op each.
FUSED_CHAIN = "fused_elementwise"
# What each of those ops (Work.chained) costs the graph runtime beyond its
# work, in multiply-accumulates of the NumPy engine's products on the pinned
# kernels (about 2.5 us at their 127 GMAC/s on two threads; a per-op cost
# in seconds would need the step's time, which the prediction does not
# have). Measured on the seventeenth pass's AMD EPYC under
# OPENBLAS_CORETYPE=Haswell (issue 16, eighteenth pass, s18auto: the train
# program's runs alternated in one process, 2 threads, load 3-5, wall
# minimum graph runtime / NumPy engine, its chain ops, its MACs):
# MLP b128 SGD 0.84, 44 ops, 205M; transformer 0.77, 129, 1,007M; CNN
# 0.51, 108, 2,054M (convolutions); demo_functional b128 Adam 0.95, 294,
# 822M; MLP b128 Adam 1.08, 100, 205M; demo_functional b32 SGD 1.38, 126,
# 205M; MLP b32 SGD 1.45, 44, 51M; demo_functional b32 Adam 1.73 (and
# 1.65), 294, 205M. The cost sorts them all: predicted gains 0.11, 0.13,
# 0.32, 0.06 (XLA there 0.74), then 0.02, -0.01, -0.09, -0.26. The LSTM
# (0.75) only once its scans' chains are left out (UNCHARGED_SCAN_DEPTH).
GRAPH_OP_MACS = 300_000
SCAN = "scan"
# Chains in the body of a scan inside a scan's body (a recurrent layer's
# loop over time inside the program's loop over steps_per_execution) are
# not charged: there the NumPy engine runs its small kernels one at a time
# per time step (scan_rows.run_steps; on two threads each row block its
# own loop, their Python turns one at a time under the interpreter lock),
# and that per-kernel cost, which the multiply-accumulates do not count,
# is of the size of the graph runtime's extra ops. Measured on the
# seventeenth pass's AMD EPYC, 2 threads (issue 16, eighteenth pass,
# s18pred): the LSTM's time-step bodies on the NumPy engine, 195 and 177
# us per step for all 128 rows, 102/90 for 60 and 115/102 for 68, so
# 2.8-3.7 us per kernel (7 and 3 of them) beyond their rows' work; the
# graph runtime, one more elementwise op in a 32-trip while body, 0.63 us
# on (8, 512), 2.7 on (64, 512), 4.9 on (128, 512) (the same as
# straight-line). The LSTM's 992 such chain ops (of 1,026) charged as
# above predicted -9%; uncharged, +16%, where fit_throughput.py (2
# rounds, load 1.5) ran it on the graph runtime at 24.7 against 30.0 CPU
# ms per step (0.82; wall 0.97, at load 4-5 about 0.5, the NumPy
# engine's row blocks backing off), on XLA at 23.0, and at one thread at
# 17.5 against 26.9 (wall 0.65). A program whose outermost scan is a
# recurrent layer's (not the loop over steps) is charged, which errs
# towards NumPy.
UNCHARGED_SCAN_DEPTH = 2
# The primitives whose operands XLA's products read (XLA_PRODUCT_BYTE_MACS).
PRODUCTS = frozenset({"dot_general"})

# XLA against the NumPy engine (predicted_gains; module doc, "XLA"), on
# the seventeenth pass's AMD EPYC family 26 under OPENBLAS_CORETYPE=Haswell,
# 2 threads: XLA's step / the NumPy engine's, in the NumPy engine's product
# multiply-accumulates. Convolutions: the CNN (its work 99% convolutions)
# at 122.2 against 92.3 CPU ms per step (fit_throughput --threads 2
# --rounds 3, the lead's idle run, issue 16 eighteenth pass; wall 1.28;
# s18auto's alternated train programs 1.31).
XLA_CONVOLUTION_RATIO = 1.32
# The rest, fitted (least squares, issue 16 nineteenth pass, s19auto) to
# the XLA / NumPy engine ratios of eight train programs with
# SCAN_KERNEL_MACS fixed: MLP b128 SGD 0.70 (3.0 / 4.3 CPU ms, the lead's
# idle run), transformer 0.73 (28.3 / 38.9, same run), LSTM 0.68 (21.8 /
# 32.0, same run), demo_functional b32 Adam 1.04 (7.2 / 6.9, same run),
# and s18auto's alternated runs of the train programs (wall minimum, load
# 3-5): MLP b32 SGD 0.98 (1.05, 0.91), demo_functional b32 SGD 0.89,
# demo_functional b128 Adam 0.74, MLP b128 Adam 0.77. Predicted: 0.74,
# 0.75, 0.59, 1.01, 0.96, 0.92, 0.76, 0.77.
# Products: XLA's own (YNNPACK's and Eigen's, at the CPU's AVX-512 rate,
# which the pin does not reach) against NumPy's OpenBLAS on the pinned
# AVX2 kernels.
XLA_PRODUCT_RATIO = 0.66
# Per byte a product reads: YNNPACK's packing and transposing of its
# operands (in TensorFlow's build, an AVX2 kernel: 11% of demo_functional's
# XLA executable, perf, issue 16 eighteenth pass, s18xla), the layout copies
# XLA makes for products of several contracting axes (s18scan); small
# products (batch 32) read more bytes per multiply-accumulate.
XLA_PRODUCT_BYTE_MACS = 0.8
# Per byte of the program's results: XLA writes each into a buffer of its
# own every run, where the NumPy engine updates donated weights and
# optimizer slots in place (donation.py); Adam's three buffers per weight
# on small products (demo_functional at batch 32) cost XLA the gain its
# products make.
XLA_OUTPUT_BYTE_MACS = 2.2
# What the NumPy engine pays per kernel of a recurrent layer's time step
# (scan_kernels) beyond the kernel's work, which XLA's while loop, its
# chains fused into its body, does not: 2.8-3.7 us per kernel per time
# step (the LSTM's bodies, issue 16 eighteenth pass, s18pred; see
# UNCHARGED_SCAN_DEPTH), at the pinned kernels' 127 GMAC/s on two threads
# (GRAPH_OP_MACS) 360k-470k multiply-accumulates.
SCAN_KERNEL_MACS = 400_000
# XLA against the NumPy engine where its float32 products run our own
# AVX-512 kernel (product_pool.native_gemm), at one host thread, on this
# pass's AMD EPYC family 26 (issue 16, twenty-first pass, s21pred):
# fit_throughput --threads 1 --rounds 2, CPU ms per step, XLA / NumPy
# engine: MLP b128 SGD 2.8 / 1.9 (1.47; s21gemm, load 2.8-3.1),
# demo_functional b32 Adam 6.6 / 4.3 (1.53), transformer 24.9 / 27.8
# (0.90), LSTM 17.2 / 20.3 (0.85; s21gemm 17.6 / 20.7), load 2.8-5.0.
# Our kernel runs these products at 245-254 GFLOP/s on one core, the
# pinned kernels' rate on two (127 GMAC/s, GRAPH_OP_MACS), so the costs
# counted in the NumPy engine's product multiply-accumulates per byte
# (XLA_PRODUCT_BYTE_MACS, XLA_OUTPUT_BYTE_MACS) are the pinned class's
# in time and kept; the products' ratio and the scan kernels' cost are
# fitted (least squares): products 1.13, XLA's YNNPACK and Eigen kernels
# slower than ours; a time-step kernel 1.2M multiply-accumulates (9.5 us
# at 127 GMAC/s: the gates' elementwise passes XLA fuses into its while
# body, beyond the 2.8-3.7 us dispatch measured at two threads). Predicted:
# MLP 1.21, demo_functional 1.48, transformer 1.22, LSTM 0.85; the
# transformer's 0.90 is not reached (no term of the reading separates it
# from the MLP with a positive per-byte cost), which errs towards NumPy,
# its engine before this class had a prediction.
NATIVE_XLA_PRODUCT_RATIO = 1.13
NATIVE_SCAN_KERNEL_MACS = 1_200_000
# Convolutions there (our patches' products on our kernel too): the CNN,
# its work 99% convolutions, at 105.4 against 60.9 CPU ms per step (the
# same runs, load 3.5).
NATIVE_XLA_CONVOLUTION_RATIO = 1.73


# What the predictions read from a program, bodies counted as often as they
# run: the convolutions' multiply-accumulates, all of them, the operations
# the graph runtime runs beyond the NumPy engine's kernels (chained: each
# fused chain's members after its first, which TensorFlow runs as ops of
# their own, each with its own pass over memory, where our engine runs the
# chain as one kernel; not in the body of a scan inside a scan's body,
# UNCHARGED_SCAN_DEPTH), the bytes the products read (PRODUCTS' operands)
# and the kernels the NumPy engine runs in a recurrent layer's time steps
# (the body of a scan inside a scan's body: scan_kernels).
Work = collections.namedtuple("Work", "conv total chained product_bytes scan_kernels")

# XLA's ratios on a host class (xla_ratios; module doc, "XLA").
XlaRatios = collections.namedtuple(
    "XlaRatios", "product convolution product_byte_macs output_byte_macs scan_kernel_macs")
PINNED_XLA = XlaRatios(XLA_PRODUCT_RATIO, XLA_CONVOLUTION_RATIO, XLA_PRODUCT_BYTE_MACS,
                       XLA_OUTPUT_BYTE_MACS, SCAN_KERNEL_MACS)
NATIVE_XLA = XlaRatios(NATIVE_XLA_PRODUCT_RATIO, NATIVE_XLA_CONVOLUTION_RATIO,
                       XLA_PRODUCT_BYTE_MACS, XLA_OUTPUT_BYTE_MACS, NATIVE_SCAN_KERNEL_MACS)


def _work(graph):
    return Work(*_count(graph.nodes, [cost_util.node_cost(n) for n in graph.nodes], 1, 0))


def _count(nodes, costs, repeat, scans):
    """`scans`: how many scans' bodies hold `nodes`."""
    counts = [0] * len(Work._fields)
    conv, total, chained, product_bytes, scan_kernels = range(len(Work._fields))
    for node, cost in zip(nodes, costs):
        name = node.primitive.name
        counts[total] += repeat * cost.macs
        if name in CONVOLUTIONS:
            counts[conv] += repeat * cost.macs
        if name in PRODUCTS:
            counts[product_bytes] += repeat * cost.bytes_in
        if scans >= UNCHARGED_SCAN_DEPTH:
            counts[scan_kernels] += repeat
        elif name == FUSED_CHAIN:
            counts[chained] += repeat * (len(node.params["chain"]) - 1)
        inner = scans + (name == SCAN)
        for part in cost.parts:
            for k, n in enumerate(_count(part.graph.nodes, part.costs, repeat * part.repeat, inner)):
                counts[k] += n
    return counts


def blas_below_cpu(info, flags):
    """Whether NumPy's OpenBLAS, in threadpoolctl's `info`
    (threadpool_info()), runs AVX2 kernels on a CPU whose `flags` (the
    words of /proc/cpuinfo's flags line) include AVX-512. NumPy's is the
    wheels' (product_pool.numpy_wheels_library), else the only OpenBLAS
    loaded."""
    blas = [lib for lib in info if lib.get("internal_api") == "openblas"]
    wheels = [lib for lib in blas if product_pool.numpy_wheels_library(lib.get("filepath"))]
    blas = wheels or blas
    return (len(blas) == 1 and AVX512_FLAG in flags
            and str(blas[0].get("architecture")).lower() in AVX2_KERNELS)


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The first CPU's flags (a set of words); empty where there is no
    cpuinfo."""
    return frozenset(first_cpu(cpuinfo).get("flags", "").split())


@functools.cache
def product_ratio():
    """The graph runtime's step / the NumPy engine's on products, on this
    process's BLAS and CPU (module doc); OTHER_RATIO where either cannot be
    read, or where the NumPy engine's float32 products run our own AVX-512
    kernel (product_pool.native_gemm), which the pin does not reach."""
    if product_pool.native_gemm():
        return OTHER_RATIO
    try:
        from threadpoolctl import threadpool_info

        info = threadpool_info()
    except Exception:  # noqa: BLE001 - no threadpoolctl: the measured tie
        return OTHER_RATIO
    return PINNED_PRODUCT_RATIO if blas_below_cpu(info, cpu_flags()) else OTHER_RATIO


@functools.cache
def convolution_ratio():
    """The graph runtime's step / the NumPy engine's on convolutions, on
    this CPU's class (module doc): AVX512_CONVOLUTION_RATIO where the
    CPU has AVX-512, else CONVOLUTION_RATIO."""
    return AVX512_CONVOLUTION_RATIO if AVX512_FLAG in cpu_flags() else CONVOLUTION_RATIO


def xla_ratios():
    """XLA's ratios on this host (module doc, "XLA"): PINNED_XLA where
    NumPy's products run on kernels below the CPU's (product_ratio()),
    NATIVE_XLA where they run our own kernel and the NumPy engine has one
    host thread; None on any other host, a class they were not measured on."""
    if product_ratio() < OTHER_RATIO:
        return PINNED_XLA
    if product_pool.native_gemm() and host_threads.max_threads() == 1:
        return NATIVE_XLA
    return None


def predicted_gains(graph):
    """(graph runtime, XLA): the share of a step each is predicted to save
    against the NumPy engine (negative: to lose; module doc), from one walk
    of the program's work (`auto` reads both of a hot program). XLA's is
    None where xla_ratios() has none."""
    work = _work(graph)
    xla = xla_ratios()
    if not work.total:
        # No products nor convolutions: nothing measured faster there.
        return 0.0, (None if xla is None else 0.0)
    share = work.conv / work.total
    blas = product_ratio() / OTHER_RATIO
    dispatch = GRAPH_OP_MACS * work.chained / work.total
    gain = 1.0 - blas * (share * convolution_ratio() + (1.0 - share) * OTHER_RATIO) - dispatch
    if xla is None:
        return gain, None
    beyond = (xla.product_byte_macs * work.product_bytes
              + xla.output_byte_macs * sum(v.aval.nbytes for v in graph.outputs)
              - xla.scan_kernel_macs * work.scan_kernels)
    return gain, (1.0 - share * xla.convolution - (1.0 - share) * xla.product
                  - beyond / work.total)

