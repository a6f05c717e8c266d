"""`auto`, KERAS_IPU_ENGINE's default (engine_choice.py): tiered, as JIT
compilers do, over the engines of engines.py. A program starts on NumPy
at once (no TensorFlow import, no XLA compile: first epochs stay
short). Once it has spent `HOT_SECONDS` of CPU time, the program is read
to predict whether TensorFlow's graph runtime could save at least
`MIN_PREDICTED_GAIN` of its step (engine_prediction.py: only where
convolutions carry the work, or, where XLA has its own prediction (the
pinned AVX-512 host; our own AVX-512 gemm at one host thread), where XLA
could; on hosts of up to `PREDICTION_MAX_THREADS`
threads, where the ratios it uses were measured); if not, it stays on NumPy for good and
TensorFlow is never imported for it (the import slows the training
beside it 3-5x on two cores, and on the MLP, LSTM and demo_functional
`auto` then kept NumPy anyway). If so, a background
thread imports TensorFlow and prepares it for each of `AUTO_CANDIDATES`
in turn (TensorFlow's graph runtime: a trace and the graph's
optimisation on its first run, done by one of the program's own runs,
CALLER_PREPARES; then XLA, in the background: a trace and XLA's compile;
not XLA where its own prediction says it would not pay)
while the program keeps running on the fastest engine so far; when a
candidate is ready, it runs `WARM_UP_RUNS` more runs untimed (its first
runs are slower than its settled ones), then the next runs alternate
between the fastest so far and it, `TIMED_RUNS` each (both timed under
the same load), and the faster keeps the program. After a candidate was timed, the next one
is prepared only once the program has run, on the engine it has, long
enough for that candidate to pay (rent-or-buy again, priced by
`TieredRunner._rent`): XLA, after the graph runtime, once the program's
CPU times the share of a step XLA is expected to save (at most about a
quarter, XLA_EXPECTED_GAIN) covers XLA's preparation (about four times
the graph runtime's, XLA_PREPARATION_RATIO), 5-20 s of program CPU on
the benchmark's models: XLA's compile, the costliest step, which slows
the training beside it on a small machine, never falls in the first
seconds after the graph runtime took over, and a program that stops
soon never pays for it. Where the prediction also answers for XLA (a
host its ratios were measured on: engine_prediction.predicted_gains)
and the graph runtime is predicted to save less than XLA_BEST_SHARE of
what XLA saves, XLA's rent is that predicted gain, paid since the
program was found hot, so that XLA follows the graph runtime's turns at
once on the benchmark's MLP and LSTM on the pinned AVX-512 host (the
graph runtime stays first there, as a stopgap ready within a second of
the import, where XLA's niced compile takes seconds), and where the
graph runtime is not predicted to pay, XLA is the only candidate; a
program predicted to gain on neither stays on NumPy, but where XLA has no
prediction (the graph runtime not predicted to pay, 2 to
PREDICTION_MAX_THREADS host threads) it gets a timed trial of XLA, in
the background, once it has run long enough that XLA's preparation costs
at most TRIAL_SHARE of its CPU so far, the timed turns deciding as
above. Programs that run briefly (most of a test
suite, `compute_output_spec`, a few predict calls) never load
TensorFlow. With one host thread (one core, or a cap of 1 from the
variables device/native/threads.py reads) there is no background:
a compile beside the program would take the core it runs on (measured
in issue 16: the one-thread MLP's CPU per step doubled for about 150
steps while TensorFlow was imported and the step compiled), and a niced
one would starve there. So a hot program the prediction says could pay
runs on NumPy until it has paid the rent of one_thread_rent() seconds of
program CPU (rent-or-buy on the stall), then one of its runs imports
TensorFlow and prepares the graph runtime (ONE_THREAD_CANDIDATE; not
XLA after it), or XLA where only XLA is predicted to pay (its rent
priced by its predicted gain), in the program's thread at its priority,
the program waiting for it (a few seconds: an INFO line on the
`keras_ipu.device` logger says so), and the timed turns against NumPy
decide as above.
The background compile runs at the lowest priority, TensorFlow's runtime
not (tensorflow_runtime.py's doc, "Priority"); the process's exit never
waits for it (the same doc).
"""

import logging
import sys
import threading
import time

import numpy as np

from keras_ipu.device.compiler import engine_prediction
from keras_ipu.device.compiler import engines
from keras_ipu.device.compiler import tensorflow_runtime
from keras_ipu.device.compiler.tensorflow_runtime import Abandoned
from keras_ipu.device.native import threads as host_threads

logger = logging.getLogger("keras_ipu.device")

# CPU seconds a program spends on NumPy (the process's, while it runs)
# before `auto` prepares it for TensorFlow's engines in the background. The rent-or-buy
# rule: pay for the compile once the program has spent about what the
# compile costs, so that a program
# that stops early never pays more than twice what the better choice
# would have cost in hindsight. Its cost is at least TensorFlow's import,
# taken from the training's cores and interpreter lock: 2.3 s of CPU (10 s
# of wall time) after Keras' own imports, measured on this 2-core machine
# at load 10 (issue 16, sixth pass), plus the trace and XLA's compile. At 0.3 s a
# 30-step epoch of a small model started the import, which then ran
# through the epochs after it.
HOT_SECONDS = 2.0
# Runs timed on each engine before `auto` keeps the faster one.
TIMED_RUNS = 3
# A candidate's runs after its first (the preparing one) that are not
# timed: TensorFlow's graph runtime runs its second and third runs of a
# program slower than the ones after (the transformer, 2-core AMD host:
# 508 and 520 ms, then 150-210; issue 16 tenth pass), and `auto` compared
# them with NumPy's settled runs and kept NumPy where the graph runtime
# was 25% faster. They still compute the program's steps.
WARM_UP_RUNS = 2
# Program CPU seconds before `auto` prepares its next candidate, per CPU
# second of rent that candidate asks (TieredRunner._rent): 1 is rent-or-buy;
# the tests set 0.
RENT_FACTOR = 1.0
# XLA after the graph runtime, as rent-or-buy prices it: its preparation
# (trace, compile, first run) costs about XLA_PREPARATION_RATIO times the
# graph runtime's (trace, first run) in CPU, and it saves at most about
# XLA_EXPECTED_GAIN of a step: the program's CPU foregone while it waits is
# that fraction of its CPU, so XLA is bought once the program has run
# preparation / gain more. Measured (issue 16, eighth and ninth passes,
# benchmarks/README.md): the ratio 3.0-6.4 on the benchmark's five models;
# the steady-state gain of XLA over the graph runtime 0-25% (transformer
# ~5%, LSTM ~0).
XLA_PREPARATION_RATIO = 4.0
XLA_EXPECTED_GAIN = 0.25
# The share of a step TensorFlow's graph runtime must be predicted to save
# (engine_prediction.py) before `auto` imports TensorFlow for a hot program:
# below it, the import (about 5 s of CPU, slowing the training beside it
# 3-5x while it runs on two cores) would not be won back within minutes,
# and a gain that small is within the noise of the timed turns that
# choose the engine. On the seventeenth pass's AVX-512 VM under its
# OPENBLAS_CORETYPE=Haswell the benchmark's models are predicted at: CNN
# 32%, LSTM 16%, transformer 13%, MLP 11%, demo_functional (batch 32, Adam)
# -26% (issue 16, eighteenth pass, s18auto and s18pred); on an AVX2 host, the products
# at a tie, only convolutions could pass it.
MIN_PREDICTED_GAIN = 0.05
# The prediction decides on hosts of up to this many threads
# (host_threads.max_threads()); on larger ones `auto` tries TensorFlow's
# engines for every hot program, as before there was a prediction. Its
# ratios were measured at 2 threads; on 16 cores the NumPy engine was
# 0.17-0.52 of JAX (whose compiler is XLA) on the benchmark's models
# (issue 16), and there the import takes a core the training leaves idle.
PREDICTION_MAX_THREADS = 4
# The engines `auto` tries for a hot program, in this order: TensorFlow's
# graph runtime first (ready sooner: no XLA compile, which takes minutes
# on large programs), then XLA. XLA is left out where its own prediction
# (engine_prediction.predicted_gains, on a host class where it answers)
# says it saves under MIN_PREDICTED_GAIN of a step: the CNN on the
# seventeenth pass's AMD EPYC, pinned, predicted -32%, measured 1.32 of
# the NumPy engine's CPU per step (the lead's idle run, nineteenth pass),
# where its niced compile (seconds of CPU on a busy 2-core machine) and
# its timed turns only cost.
AUTO_CANDIDATES = ("tensorflow", "xla")
# Where XLA is predicted to save at least twice what the graph runtime
# saves (the graph runtime's predicted gain under this share of XLA's:
# engine_prediction.predicted_gains, on a host where it has ratios),
# XLA's rent is priced with that prediction and counted from the moment
# the program was found hot (TieredRunner._rent), and where the graph
# runtime is not predicted to pay, XLA is the only candidate. Predicted on
# the seventeenth pass's AMD EPYC, pinned, graph runtime / XLA: MLP b128
# SGD 11% / 26% (0.41), LSTM 16% / 41% (0.40), transformer 13% / 25%
# (0.53), CNN 32% / -32%, demo_functional b32 Adam -26% / -1% (issue 16,
# nineteenth pass, s19auto); measured there (the lead's idle run, CPU per
# step against the NumPy engine's) MLP 0.92 / 0.70 (the graph runtime's
# turns kept NumPy), LSTM 0.77 / 0.68, transformer 0.69 / 0.73, CNN 0.69 /
# 1.32. The transformer is the nearest to the line: the graph runtime's
# gain there is twice its prediction. The graph runtime stays first
# where XLA is predicted best: it is ready 0.2-0.5 s after TensorFlow's
# import (prepared by the program's own run, CALLER_PREPARES), where XLA's
# compile at nice 19 took 4-13 s of wall time after the import at load
# 4-5 (0.2-0.5 s of its CPU; LSTM and MLP, s19auto), during which XLA
# tried first, the graph runtime skipped, left the program on NumPy. With
# the rent priced so, XLA's compile starts right after the graph runtime's
# turns on those programs, and at load 2 XLA was kept at 5.7 s (MLP) and
# 6.2-6.9 s (LSTM) after fit began, against 7.5 and 8.0 s with the rent
# of the other programs (fit_throughput --min-timed-seconds 40, s19auto).
XLA_BEST_SHARE = 0.5
# The candidates prepared (traced, then run once) in the program's own
# thread, in one of its runs, instead of the background: the graph runtime's
# preparation is short (0.3-1.3 s of CPU on the benchmark's models, issue 16
# ninth pass), and at nice 19 on a busy machine it took 46 s to never, so
# that `auto` stayed on NumPy where the graph runtime was 1.3-2.5x faster.
CALLER_PREPARES = ("tensorflow",)
# On one host thread (module doc): the candidate prepared, by a run of the
# program, in its thread. The graph runtime alone: XLA after it saved 0-6%
# at one thread (TensorFlow 2.21, the seventeenth pass's AMD EPYC, pinned;
# issue 16, nineteenth pass, s19one: MLP b128 SGD 2.5 against 2.4 CPU ms
# per step, LSTM 16.7 against 17.8), within the noise of the timed turns
# that would choose it, for another stall of the training of about four
# times the graph runtime's preparation (XLA_PREPARATION_RATIO): nothing
# runs the program meanwhile.
ONE_THREAD_CANDIDATE = "tensorflow"
# The program CPU seconds a hot program on one host thread runs on NumPy
# before that run (one_thread_rent): rent-or-buy, the price being the stall
# (TensorFlow's import, 2.3 s of CPU after Keras', where nothing in the
# process imported it yet, and the trace and the graph's first run)
# and the rent what the graph runtime would save meanwhile, about
# ONE_THREAD_EXPECTED_GAIN of the program's CPU. A program that stops just
# after it paid then took at most 1 + ONE_THREAD_EXPECTED_GAIN times its
# time on NumPy alone. Measured at one thread (s19one, as above): the graph
# runtime's step / the NumPy engine's MLP 0.59 (2.4 / 4.1 CPU ms), LSTM
# 0.63 (17.8 / 28.3), demo_functional b32 Adam 1.28 (7.3 / 5.7; predicted
# to lose, -26%, so never prepared); the 2-thread prediction says 11% and
# 16% for the first two: its sign holds, its size errs towards NumPy, so
# it decides whether and this measured gain when. With this rule
# (fit_throughput.py --threads 1 --min-timed-seconds 40, 2 rounds, load
# 3-4.8, s19auto1): the graph runtime's epochs / the NumPy engine's, CPU
# per step, MLP 0.66 and 0.74, LSTM 0.64 and 0.66; the stall 1.5-1.7 s of
# the program thread's CPU, 1.9-3.3 s of wall on the shared core (the
# import from a warm page cache); fit's default 5 s window never reached
# the rent (the MLP and LSTM unchanged there). The stall's parts: the trace
# and the graph's first run, 0.13-0.37 s of CPU where TensorFlow was
# imported before (fit_throughput.py --threads 1 --keras-seed, MLP and
# LSTM, load 7-8, issue 16 twentieth pass, s20engines), and the import, the
# rest of the 3 s price above: with TensorFlow imported the rent is then
# under HOT_SECONDS, and the program's first run after it was found hot
# prepares the graph runtime.
ONE_THREAD_IMPORT_SECONDS = 2.6
ONE_THREAD_TRACE_SECONDS = 0.4
ONE_THREAD_EXPECTED_GAIN = 0.35
# Where only XLA is predicted to pay (engine_prediction.predicted_gains;
# on this pass's AMD EPYC with NumPy's products on our own AVX-512 kernel,
# the LSTM at one thread: XLA 17.2-17.6 CPU ms per step against the NumPy
# engine's 20.3-20.7, the graph runtime 19.2; issue 16, twenty-first pass,
# s21pred), XLA is the candidate prepared in the program's run: its
# preparation is XLA_PREPARATION_RATIO times the graph runtime's trace and
# first run (the LSTM's first XLA epoch 3.5 s of wall against 0.55 for
# the next, load 3), and its rent is that stall over XLA's predicted gain.
# That prices XLA's stall at 4.2 s of CPU where TensorFlow is not imported
# yet; measured in the process's CPU (the rent's clock; TensorFlow's import
# 1.7-1.8 s of it; issue 16, twenty-second pass, s22tidy, load 2.4-3,
# one core): MLP 2.45, LSTM 2.78-3.03, transformer 4.05-4.23 (the graph
# runtime's, priced 3.0: LSTM 1.92, MLP 1.85). The program thread's own
# CPU, which the event reported before, was 1.9-2.6 s of those: XLA's
# compile runs partly on TensorFlow's threads. Priced within the measured
# range (at the LSTM's 2.9 s its rent would be 19 s of program CPU, not
# 28.5), so kept.
ONE_THREAD_XLA = "xla"
# A timed trial of XLA, as JIT tiers time a tier no rule predicts: on 2 to
# PREDICTION_MAX_THREADS host threads, where engine_prediction gives XLA no
# answer (xla_ratios() None: our own AVX-512 gemm at two threads, an AVX2
# host) and the graph runtime is not predicted to pay, a hot program is
# not left on NumPy for good: once it has run long enough that XLA's
# preparation costs at most TRIAL_SHARE of its CPU so far (trial_rent),
# XLA is prepared in the background (niced, as any compile there), and its
# timed turns against NumPy decide, for good. At two threads on our gemm
# XLA ran the transformer at 1.25-1.32x the NumPy engine's speed and the
# MLP at 0.63-0.73x, demo_functional 0.77x, the LSTM at a tie (issue 16,
# twenty-first and twenty-second passes), and no term of the program's
# counts told the transformer from the MLP honestly (s22tidy).
# The trial's price: XLA's preparation (trace, compile, first run) and
# TensorFlow's import before it (TRIAL_IMPORT_SECONDS, counted only where
# TensorFlow is not imported yet), in the process's CPU (the clock of the
# program's runs), at two host threads, the program waiting (issue 16,
# twenty-third pass, s23auto, load 1-1.5): with the import MLP 2.48 s,
# demo_functional b32 Adam 2.93, LSTM 3.19, transformer 3.95-4.30; after
# keras.utils.set_random_seed imported TensorFlow MLP 0.75, transformer
# 2.02. Priced at the transformer's, the costliest of the four.
TRIAL_IMPORT_SECONDS = 2.0
TRIAL_XLA_SECONDS = 2.0
# The most of the program's CPU so far that the trial's price may be: the
# program that keeps NumPy loses at most this share at the trial's start,
# less the longer it runs after.
TRIAL_SHARE = 0.03
# A trial's timed turns are a predicted candidate's (TIMED_RUNS, the faster
# keeps the program): on a busy 2-core machine the verdict (XLA's fastest run
# over NumPy's) spreads, but to NumPy's side. Measured (issue 16,
# twenty-third pass, s23auto; 30-48 alternated turns per program at load
# 1.3-6.7, every window of 3): MLP 1.15-2.23 (XLA 0.73x NumPy's speed in
# fit), demo_functional b32 Adam 1.14-2.03 (0.77x), never under 1; the
# transformer (1.32x in fit) under 1 in 82 of 104 windows, the LSTM (a tie
# in fit) in 10 of 16. A turn of XLA after NumPy's goes back to XLA's
# caches and threads, which fit's runs of XLA in a row do not. Windows of 5
# turns kept the transformer no more often (46 of 60), nor did the median
# of each turn's ratio over the fastest, so a trial is timed as the others.


def trial_rent(modules=sys.modules):
    """The program CPU seconds (since its first run) before a hot program
    no prediction answers for gets its trial of XLA: the trial's price,
    TensorFlow's import counted only where it is not imported yet, over
    TRIAL_SHARE."""
    price = TRIAL_XLA_SECONDS + (0.0 if "tensorflow" in modules else TRIAL_IMPORT_SECONDS)
    return RENT_FACTOR * price / TRIAL_SHARE


def one_thread_rent(modules=sys.modules, name=ONE_THREAD_CANDIDATE,
                    gain=ONE_THREAD_EXPECTED_GAIN):
    """The program CPU seconds before a hot program on one host thread
    prepares candidate `name` in its own run: the stall ahead over the
    share of a step `name` is expected to save (`gain`), the import counted
    only where TensorFlow is not imported yet (a user's tf.data pipeline,
    Keras' set_random_seed, an earlier program's switch)."""
    imported = "tensorflow" in modules
    preparation = ONE_THREAD_TRACE_SECONDS * (
        XLA_PREPARATION_RATIO if name == ONE_THREAD_XLA else 1.0)
    stall = preparation + (0.0 if imported else ONE_THREAD_IMPORT_SECONDS)
    return stall / gain


class TieredRunner:
    """Runs an Executable on NumPy; once it is hot, prepares it for each of
    AUTO_CANDIDATES in the background, times each against the fastest
    engine so far and keeps the fastest (see the module doc)."""

    def __init__(self, executable):
        self.executable = executable
        # numpy (not hot yet) | compiling | preparing (the next run
        # prepares a candidate: CALLER_PREPARES) | timing (a candidate) |
        # final; on one host thread foreground (the graph runtime is
        # prepared by a run once the program has paid its rent); trial (a
        # timed trial of XLA waits for its rent: TRIAL_SHARE).
        self.engine = "numpy"
        # Process CPU seconds spent in the program's runs (all engines).
        self.program_seconds = 0.0
        # The fastest engine so far, its name and its timed runs (beside
        # the candidate's).
        self.current = engines.numpy_runner(executable)
        self.current_name = "numpy"
        # Before a timed NumPy run: the copies it would make of read-only
        # state a TensorFlow run returned (a cost of alternating, which the
        # engine kept does not pay).
        self.writable = engines.writable_inputs(executable) or (lambda arrays: None)
        # Before a timed turn of a TensorFlow candidate: that state made its
        # tensors, untimed (TensorFlowProgram.hold), the same cost the other way.
        self.held = tuple(sorted(executable.written_inputs))
        # The engine that computed the last run (current_engine).
        self.last_engine = None
        # The program being timed, handed over by the compile thread, which
        # waits for `timed` before preparing the next: a compile beside the
        # timed runs would slow them. Its warm-up runs left, then its timed
        # runs and the engine so far's, in turn (the engine so far first:
        # the candidate has just run).
        self.candidate = None
        self.warm_up = 0
        self.candidate_times = []
        self.current_times = []
        self.timed = threading.Event()
        # The state once a candidate is timed: the compile thread goes on,
        # or, on one host thread (no compile thread), final.
        self.after_timing = "compiling"
        # The candidate the next run prepares, and (program or None, CPU
        # seconds) once it did (`prepared` set).
        self.to_prepare = None
        self.prepared_program = None
        self.prepared = threading.Event()
        self.thread = None
        # Set by the process's exit: the compile stops and its result is
        # never used.
        self.abandoned = threading.Event()
        # Set once the compile thread can no longer be stopped (inside
        # TensorFlow's C++: XLA's compile, the graph's first run) or has
        # ended: what the exit waits for.
        self.unstoppable = threading.Event()
        # (time.perf_counter(), what) of each step of the tiering, for
        # benchmarks that report when the program changed engines.
        self.events = []
        # The candidates worth trying, in the order they are tried (_could_pay).
        self.candidates = AUTO_CANDIDATES
        # XLA's predicted gain (a share of a step on NumPy) where XLA_BEST_SHARE
        # prices its rent by it, the graph runtime's beside it; and the
        # program's CPU seconds when it was found hot.
        self.xla_gain = self.graph_gain = None
        self.hot_seconds = 0.0
        # On one host thread, the candidate a run prepares and the program
        # CPU seconds before it does (one_thread_rent, read when the program
        # was hot).
        self.foreground_name = ONE_THREAD_CANDIDATE
        self.foreground_rent = None
        # What _could_pay predicted, for the events (None: no prediction).
        self.predicted = None
        # A timed trial of XLA (TRIAL_SHARE): the program CPU seconds before
        # it starts (None: no trial).
        self.trial_rent = None

    def _event(self, what):
        self.events.append((time.perf_counter(), what))

    def __call__(self, arrays):
        engine = self.engine
        if engine == "final":
            return self._current_run(arrays)
        if engine == "timing":
            return self._timed_run(arrays)
        if engine == "preparing":
            return self._prepare_here(arrays)
        if engine == "foreground" and self.program_seconds >= self.foreground_rent:
            return self._prepare_in_foreground(arrays)
        if engine == "trial" and self.program_seconds >= self.trial_rent:
            self._start_compile(arrays)
        if engine == "numpy" and self.program_seconds >= HOT_SECONDS:
            if not self._could_pay():
                self.engine = "final"
            elif self.trial_rent is not None:
                self.engine = "trial"
                self._event(f"hot: a timed trial of xla after {self.trial_rent:.1f} s of "
                            f"program CPU (no prediction for XLA; {self.predicted})")
            elif host_threads.max_threads() == 1:
                # One candidate is prepared there: the graph runtime, or XLA
                # where only XLA has a prediction that says it pays (_order
                # then priced it: xla_gain is set).
                if ONE_THREAD_CANDIDATE in self.candidates:
                    self.foreground_name = ONE_THREAD_CANDIDATE
                    self.foreground_rent = one_thread_rent()
                elif self.candidates == (ONE_THREAD_XLA,):
                    self.foreground_name = ONE_THREAD_XLA
                    self.foreground_rent = one_thread_rent(name=ONE_THREAD_XLA,
                                                           gain=self.xla_gain)
                else:
                    self.engine = "final"
                    self._event(f"hot: one host thread, stays on numpy ({self.predicted})")
                if self.engine != "final":
                    self.engine = "foreground"
                    self._event(f"hot: one host thread, {self.foreground_name} prepared after "
                                f"{self.foreground_rent:.1f} s of program CPU")
            else:
                self._start_compile(arrays)
        self.last_engine = self.current_name
        # CPU time, as the compile's cost is counted: on a busy machine
        # wall time would call a program hot after a few slow runs.
        cpu = time.process_time()
        out = self.current(arrays)
        self.program_seconds += time.process_time() - cpu
        return out

    def _could_pay(self):
        """Whether TensorFlow's graph runtime or XLA is predicted to save at
        least MIN_PREDICTED_GAIN of this program's step (engine_prediction.py),
        read from the program before paying for TensorFlow's import; sets
        the order of the candidates (_order). A program the prediction
        cannot read is tried, as before there was one; so is every program
        on a host of more than PREDICTION_MAX_THREADS threads."""
        if host_threads.max_threads() > PREDICTION_MAX_THREADS:
            return True
        graph = self.executable.running_graph
        try:
            gain, xla = engine_prediction.predicted_gains(graph)
        except Exception as error:  # noqa: BLE001 - a primitive without a cost rule
            logger.debug("%s: no prediction of TensorFlow's gain (%r): tries it",
                         self.executable.name, error)
            return True
        predicted = f"the graph runtime predicted to save {gain:.0%} of a step" + (
            "" if xla is None else f", XLA {xla:.0%}")
        if self._order(gain, xla):
            self.predicted = predicted
            return True
        self._event(f"hot: stays on numpy ({predicted})")
        logger.debug("%s stays on NumPy: %s", self.executable.name, predicted)
        return False

    def _order(self, gain, xla):
        """Sets the candidates worth trying for the predicted gains `gain`
        (the graph runtime's) and `xla` (None: no prediction): the graph
        runtime where it is predicted to pay, XLA after it unless it is
        predicted not to (AUTO_CANDIDATES); where XLA is predicted to
        pay and the graph runtime to save under XLA_BEST_SHARE of its gain,
        XLA's rent priced by the prediction (_rent), and XLA alone if the
        graph runtime is not predicted to pay. Whether any is worth trying."""
        graph_pays = gain >= MIN_PREDICTED_GAIN
        # Without a prediction of its own, XLA is tried where the graph
        # runtime is.
        xla_pays = graph_pays if xla is None else xla >= MIN_PREDICTED_GAIN
        pays = {"tensorflow": graph_pays, "xla": xla_pays}
        self.candidates = tuple(name for name in AUTO_CANDIDATES if pays[name])
        if xla is not None and xla_pays and (not graph_pays or gain < XLA_BEST_SHARE * xla):
            self.xla_gain, self.graph_gain = xla, gain
        if (not self.candidates and xla is None and "xla" in AUTO_CANDIDATES
                and host_threads.max_threads() > 1):
            self.candidates, self.trial_rent = ("xla",), trial_rent()
        return bool(self.candidates)

    def _start_compile(self, arrays):
        self.engine = "compiling"
        self.hot_seconds = self.program_seconds
        self._event(f"hot: preparing TensorFlow's engines ({' then '.join(self.candidates)}"
                    + (f"; {self.predicted})" if self.predicted else ")"))
        tensorflow_runtime.start_runtime_starter()  # from this thread: normal priority
        # The compile's first run needs inputs the NumPy runs will not
        # overwrite meanwhile (donated state): its own copies.
        sample = [np.array(a) for a in arrays]
        # A daemon, so that the interpreter's exit does not join it; the
        # exit handler (tensorflow_runtime._at_exit) makes ending it safe.
        self.thread = threading.Thread(
            target=self._compile, args=(sample,), daemon=True,
            name=f"keras_ipu TensorFlow compile of {self.executable.name}",
        )
        tensorflow_runtime.in_flight_add(self)
        self.thread.start()

    def _check(self):
        if self.abandoned.is_set():
            raise Abandoned()

    def _compile(self, sample):
        # Only CPU that training and other processes leave idle
        # (tensorflow_runtime.py's doc, "Priority").
        host_threads.background_priority()
        try:
            self._check()  # the exit began first: import nothing
            self._compile_stoppably(sample)
        except Exception as error:  # noqa: BLE001
            # Stopped at exit, or failed because the interpreter is going
            # down (an import then cannot register its exit handlers):
            # either way nothing is left to report to.
            if not (isinstance(error, Abandoned) or tensorflow_runtime.exit_began(self)):
                raise
            logger.debug("%s: TensorFlow compile abandoned at exit (%r)",
                         self.executable.name, error)
        finally:
            self.unstoppable.set()
            tensorflow_runtime.in_flight_discard(self)

    def _compile_stoppably(self, sample):
        try:
            # The program's own candidates: where none of their modes'
            # rules covers the program, nothing is built, and TensorFlow's
            # runtime is not waited for.
            tensorflow_runtime.tensorflow_ready(
                self.executable.graph, [engines.PROGRAMS[name].mode for name in self.candidates],
                self._check)
            self._event("TensorFlow imported")
        except ImportError as error:
            if tensorflow_runtime.exit_began(self):
                raise
            self._no_tensorflow(error)
            return
        timed = None  # the engine timed since the last rent, and its preparation's CPU
        for name in self.candidates:
            if timed is not None:
                self._pay_rent(self._rent(name, *timed))
                timed = None
            if name in CALLER_PREPARES:
                program, prepared = self._prepared_by_caller(name)
            else:
                program, prepared = self._prepare(name, sample)
            if program is None:
                continue
            if self.abandoned.is_set():
                return
            self.timed.clear()
            self._time_candidate(program, f"{name} ready ({prepared:.2f} s of CPU to prepare)")
            timed = (name, prepared)
            while not self.timed.wait(0.05):
                self._check()
        self._event(f"final: {self.current_name}")
        self.engine = "final"

    def _prepare(self, name, sample):
        """In the compile thread: candidate `name` traced and run once on
        `sample` (compiled / optimised on the first call); (program or
        None, this thread's CPU seconds)."""
        start = time.thread_time()
        program = engines.PROGRAMS[name].build(self.executable, check=self._check)
        if program is None:
            return None, 0.0
        self._check()
        self.unstoppable.set()
        if self._candidate_run(program, sample) is None:
            return None, 0.0
        return program, time.thread_time() - start

    def _prepared_by_caller(self, name):
        """In the compile thread: the program's next run prepares candidate
        `name` (_prepare_here); waits for it, stoppably."""
        self.prepared.clear()
        self.to_prepare = name
        self.engine = "preparing"
        while not self.prepared.wait(0.05):
            self._check()
        return self.prepared_program

    def _prepare_here(self, arrays):
        """A run that prepares the candidate the compile thread asked for,
        in the program's thread at its priority (CALLER_PREPARES): traced
        and run on this run's inputs, whose results it returns (TensorFlow
        writes into no input, so the engine so far runs them as they are
        if the candidate fails). Its CPU is not the program's."""
        name = self.to_prepare
        start = time.thread_time()
        program = engines.PROGRAMS[name].build(self.executable)
        out = None if program is None else self._candidate_run(program, arrays)
        if out is None:
            program = None
        self.prepared_program = (program, time.thread_time() - start)
        self.engine = "compiling"
        self.prepared.set()
        if out is None:
            return self._current_run(arrays)
        self.last_engine = name
        return out

    def _prepare_in_foreground(self, arrays):
        """On one host thread: this run imports TensorFlow and prepares its
        graph runtime, or XLA (foreground_name; _prepare_here), at the
        program's priority, then the runs after time it against NumPy
        (module doc)."""
        name = self.foreground_name
        self.engine = self.after_timing = "final"  # whatever happens below, once
        # The process's CPU, as one_thread_rent prices the stall: XLA's
        # compile runs partly on TensorFlow's own threads (ONE_THREAD_XLA).
        start = time.process_time()
        self._event(f"one host thread: preparing {name} in the program's thread")
        # Seconds without a step: said where a user looks for it, quietly
        # (INFO, as the choice after the timed runs).
        logger.info("%s: preparing TensorFlow's %s in this thread (one host thread): "
                    "TensorFlow's import and the %s, a few seconds", self.executable.name,
                    "XLA" if name == ONE_THREAD_XLA else "graph runtime",
                    "compile" if name == ONE_THREAD_XLA else "trace")
        try:
            tensorflow_runtime.import_tensorflow()
        except ImportError as error:
            self._no_tensorflow(error)
            return self._current_run(arrays)
        self.to_prepare = name
        out = self._prepare_here(arrays)
        program, _ = self.prepared_program
        self.engine = "final"  # not "compiling": no compile thread takes over
        if program is not None:
            self._time_candidate(program, f"{name} ready ({time.process_time() - start:.2f} s "
                                          "of CPU to import TensorFlow and prepare)")
        return out

    def _no_tensorflow(self, error):
        """TensorFlow's import failed with `error`: noted (once), and the
        program stays on NumPy for good."""
        engines.note(f"{self.executable.name or 'a program'} runs on NumPy: "
                     f"TensorFlow could not be imported ({error!r})")
        self.engine = "final"

    def _time_candidate(self, program, event):
        """The runs from the next on: `program`'s WARM_UP_RUNS, then its
        timed turns against the engine so far (_timed_run)."""
        self.candidate, self.warm_up = program, WARM_UP_RUNS
        self.candidate_times, self.current_times = [], []
        self._event(event)
        self.engine = "timing"

    def _candidate_run(self, program, arrays):
        """`program`'s results of `arrays`, or None when it failed (noted
        once): TensorFlow writes into no input, so the engine so far then
        runs the same arrays."""
        try:
            return program.run(arrays)
        except Exception as error:  # noqa: BLE001 - a kernel refused these inputs
            program.failed(error)
            return None

    def _current_run(self, arrays):
        self.last_engine = self.current_name
        return self.current(arrays)

    def _rent(self, name, timed, prepared):
        """The program CPU seconds to wait for before preparing candidate
        `name`, after candidate `timed` took `prepared` CPU seconds (of
        the thread that prepared it) to prepare. Rent-or-buy: buy once the rent paid
        equals the price. XLA after the graph runtime: the price is XLA's
        preparation, estimated from the graph runtime's on the same
        program (XLA_PREPARATION_RATIO), and the rent is what XLA would
        save meanwhile, at most XLA_EXPECTED_GAIN of the program's CPU;
        with the graph runtime's 0.3-1.3 s that is 5-20 s of program CPU.
        Paying for XLA as if it saved the whole step (the eighth pass's
        rule: wait as much CPU as the preparations so far took) put its
        compile, which slows the training beside it on 2 cores, into the
        first 10 s of every fit that took the graph runtime. Where XLA is
        predicted to save at least twice the graph runtime's gain
        (XLA_BEST_SHARE), the rent is its predicted gain over the engine
        kept, paid since the program was found hot (the program has
        forgone it since then: TensorFlow's import, 2-30 s of wall time
        on two cores, and the graph runtime's turns), so XLA follows at
        once where that already covers the price (the MLP and LSTM on the
        pinned AVX-512 host). Any other order: the preparations so far
        (this thread's CPU), as if the candidate saved the whole step."""
        if name == "xla" and timed == "tensorflow":
            price = XLA_PREPARATION_RATIO * prepared
            if self.xla_gain is None:
                return RENT_FACTOR * price / XLA_EXPECTED_GAIN
            kept = self.graph_gain if self.current_name == "tensorflow" else 0.0
            paid = self.program_seconds - self.hot_seconds
            return RENT_FACTOR * max(0.0, price / (self.xla_gain - kept) - paid)
        return RENT_FACTOR * time.thread_time()

    def _pay_rent(self, rent):
        """In the compile thread, before the next candidate: waits until
        the program has spent, on the engine it has, `rent` CPU seconds
        more (_rent). A program that stops soon never pays for XLA's
        compile (1.5-5.6 s of CPU on the benchmark's models, issue 16
        ninth pass), and the background work stays a fraction of the CPU."""
        start = self.program_seconds
        self._event(f"rests until the program has run {rent:.2f} s of CPU more")
        while self.program_seconds - start < rent:
            self._check()
            time.sleep(0.05)

    def _timed_run(self, arrays):
        """A run while a candidate is timed: its warm-up runs (WARM_UP_RUNS),
        then the engine so far and the candidate in turn, each run timed,
        so that both are timed under the same load (a busy machine's load
        changes within seconds)."""
        program = self.candidate
        if not self.warm_up and len(self.current_times) <= len(self.candidate_times):
            self.writable(arrays)  # not timed: see __init__
            start = time.perf_counter()
            out = self._current_run(arrays)
            self.current_times.append(time.perf_counter() - start)
        else:
            if not self.warm_up:
                program.hold(arrays, self.held)  # not timed, as writable above
            start = time.perf_counter()
            out = self._candidate_run(program, arrays)
            if out is None:
                self._timing_done()
                return self._current_run(arrays)
            if self.warm_up:
                self.warm_up -= 1
            else:
                self.candidate_times.append(time.perf_counter() - start)
            self.last_engine = program.engine
        if len(self.candidate_times) >= TIMED_RUNS:
            self._keep_the_faster()
        return out

    def _keep_the_faster(self):
        """The candidate's fastest timed run against the fastest engine
        so far's: the faster keeps the program."""
        program = self.candidate
        new, old = min(self.candidate_times), min(self.current_times)
        times = (f"{program.engine} {1e3 * new:.3g} ms, {self.current_name} "
                 f"{1e3 * old:.3g} ms per run")
        kept = new <= old
        logger.info("%s: %s: keeps %s", self.executable.name, times,
                    program.engine if kept else self.current_name)
        if kept:
            self.current, self.current_name = program.run, program.engine
        self._event(f"keeps {self.current_name} ({times})")
        self._timing_done()

    def _timing_done(self):
        """The candidate dropped or kept: the compile thread goes on to the
        next candidate, or ends."""
        self.candidate, self.candidate_times, self.current_times = None, [], []
        self.engine = self.after_timing
        self.timed.set()
