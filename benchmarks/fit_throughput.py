"""Training throughput of `model.fit` under KERAS_BACKEND=ipu, tensorflow and jax.

One run of this script benchmarks every requested backend, each on each
model in a subprocess of its own (Keras fixes its backend when it is first
imported; an earlier model's background work stays out of the next one's
figures), on the same models, the same synthetic data (seeded NumPy) and
the same initial weights (the first backend builds each model and saves a
.weights.h5 file; the other backends load it). It prints a table and, with --out, writes it as JSON.

    python benchmarks/fit_throughput.py --out results.json
    python benchmarks/fit_throughput.py --quick --backends ipu --models mlp

Per model and backend it reports:
  - first_epoch_s: wall time of the first epoch, from the start of fit() to
    the end of epoch 1 (tracing, compiling and the first steps included);
  - samples_per_s: the median over the timed epochs (epochs 2..) of
    steps * batch_size / epoch time, i.e. after warm-up. The timed epochs
    are --timed-epochs and then as many more as the timed window needs to
    last --min-timed-seconds (wall): the MLP's 30-step epochs last 0.15 s
    at two threads, where a wake-up or another process's time slice moves
    one epoch by 10-20%;
  - cpu_ms_per_step: the process's CPU time (all threads) per step over the
    timed epochs (median): the work, where wall time on a busy machine is
    mostly the scheduler's share; the table's "cores used" is that CPU time
    per wall second (CPU ms/step x steps/s), how many cores the step kept busy;
  - the loss after the first epoch, which should agree across backends
    (same data, weights and order; a check that they ran the same thing);
  - on ipu, each epoch's seconds, CPU ms per step and the host engine that
    ran its last step, and when `auto` (the default engine) became hot,
    had each TensorFlow candidate ready and kept one: the reported figure
    is what `auto` gives in this window; a longer --timed-epochs run shows
    where it settles.
Ratios ipu/tensorflow and ipu/jax of samples_per_s (> 1: ipu is faster) and
of first_epoch_s (> 1: ipu is slower to start) are computed per model.

Threads: every worker process is pinned to the same --threads CPU cores
(sched_setaffinity) and told to use that many threads in each library:
OMP/OpenBLAS/MKL (NumPy's BLAS, used by the ipu backend's host kernels),
TensorFlow's intra- and inter-op pools and XLA:CPU's Eigen pool (jax).
`--threads default` sets none of this: no pinning, and the thread variables
removed from the workers' environment, so each library picks its own
threads on every core this process may use, as a user who sets nothing gets.
"""

import argparse
import collections
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

# Each entry runs in its own process: (Keras backend, extra environment,
# jit_compile for TensorFlow). The ipu engines (KERAS_IPU_ENGINE): "ipu" is
# the default (auto: NumPy first, then the fastest of TensorFlow's graph
# runtime and XLA for programs that keep running), "ipu-numpy",
# "ipu-tensorflow" and "ipu-xla" pin one engine; "tensorflow-xla" is TensorFlow
# with jit_compile=True (XLA), as a user who wants speed runs it.
VARIANTS = {
    "ipu": ("ipu", {}, None),
    "ipu-numpy": ("ipu", {"KERAS_IPU_ENGINE": "numpy"}, None),
    "ipu-tensorflow": ("ipu", {"KERAS_IPU_ENGINE": "tensorflow"}, None),
    "ipu-xla": ("ipu", {"KERAS_IPU_ENGINE": "xla"}, None),
    "tensorflow": ("tensorflow", {}, None),
    "tensorflow-xla": ("tensorflow", {}, True),
    "jax": ("jax", {}, None),
}
BACKENDS = tuple(VARIANTS)
DEFAULT_BACKENDS = ("ipu", "tensorflow", "jax")
# The module whose absence means the backend is not installed.
BACKEND_MODULE = {"ipu": "keras_ipu", "tensorflow": "tensorflow", "jax": "jax"}
for _name, (_keras_backend, _, _) in VARIANTS.items():
    BACKEND_MODULE.setdefault(_name, BACKEND_MODULE[_keras_backend])
MODELS = ("mlp", "cnn", "transformer", "lstm", "demo_functional", "resnet18",
          "bert_small")
DEFAULT_MODELS = ("mlp", "cnn", "transformer", "lstm")
BATCH_SIZE = 128
# `--threads default`: each library's own choice (see thread_environment).
DEFAULT_THREADS = "default"
SEED = 1234
# Steps per epoch when --steps is not given: the large models take seconds
# per step on a small machine.
DEFAULT_STEPS = {"resnet18": 6, "bert_small": 4}
# The timed window's least wall time (--min-timed-seconds): timed epochs are
# added until it is reached, up to MAX_TIMED_EPOCHS. Three 30-step epochs of
# the MLP at two threads were 0.5 s in all, and single runs of the same
# engine differed by 20% (issue 16, eleventh pass).
MIN_TIMED_SECONDS = 5.0
MAX_TIMED_EPOCHS = 200

# Model and data sizes: full, and tiny ones for --quick (a smoke test).
SIZES = {
    "full": {
        "mlp": {"features": 784, "hidden": 512, "classes": 10},
        "cnn": {"image": 32, "channels": 3, "filters": 32, "classes": 10},
        "transformer": {
            "vocab": 1000, "seq": 64, "dim": 64, "heads": 4, "ff": 128,
            "classes": 2,
        },
        "lstm": {"vocab": 1000, "seq": 32, "dim": 64, "units": 128,
                 "classes": 10},
        # Keras' examples/demo_functional.py: Dense 512 layers with
        # residual adds on 100 features, 16 regression outputs, MSE.
        "demo_functional": {"features": 100, "hidden": 512, "outputs": 16},
        # ResNet-18's layout (4 stages of 2 basic blocks) on 32x32 CIFAR
        # images with a 3x3 stem; base width 64 as in the paper's CIFAR
        # adaptations.
        "resnet18": {"image": 32, "width": 64, "blocks": (2, 2, 2, 2),
                     "classes": 10},
        # BERT-Small (Turc et al. 2019): 4 layers, hidden 512, 8 heads,
        # feed-forward 2048, on 128 tokens; classification from token 0.
        "bert_small": {"vocab": 30522, "seq": 128, "layers": 4, "dim": 512,
                       "heads": 8, "ff": 2048, "classes": 2},
    },
    "quick": {
        "mlp": {"features": 16, "hidden": 8, "classes": 3},
        "cnn": {"image": 8, "channels": 3, "filters": 4, "classes": 3},
        "transformer": {
            "vocab": 20, "seq": 6, "dim": 8, "heads": 2, "ff": 8,
            "classes": 2,
        },
        "lstm": {"vocab": 20, "seq": 5, "dim": 4, "units": 4, "classes": 3},
        "demo_functional": {"features": 6, "hidden": 8, "outputs": 2},
        "resnet18": {"image": 8, "width": 4, "blocks": (1, 1, 1, 1),
                     "classes": 3},
        "bert_small": {"vocab": 20, "seq": 6, "layers": 1, "dim": 8,
                       "heads": 2, "ff": 8, "classes": 2},
    },
}


# --------------------------------------------------------------------------
# Worker side: runs inside one backend's process (keras imported here only).


def build_model(keras, name, size):
    layers = keras.layers
    if name == "mlp":
        return keras.Sequential(
            [
                keras.Input((size["features"],)),
                layers.Dense(size["hidden"], activation="relu"),
                layers.Dense(size["hidden"], activation="relu"),
                layers.Dense(size["classes"]),
            ],
            name="mlp",
        )
    if name == "cnn":
        f = size["filters"]
        return keras.Sequential(
            [
                keras.Input((size["image"], size["image"], size["channels"])),
                layers.Conv2D(f, 3, padding="same"),
                layers.BatchNormalization(),
                layers.ReLU(),
                layers.MaxPooling2D(2),
                layers.Conv2D(2 * f, 3, padding="same"),
                layers.BatchNormalization(),
                layers.ReLU(),
                layers.MaxPooling2D(2),
                layers.Flatten(),
                layers.Dense(size["classes"]),
            ],
            name="cnn",
        )
    if name == "transformer":
        tokens = keras.Input((size["seq"],), dtype="int32")
        x = layers.Embedding(size["vocab"], size["dim"])(tokens)
        attn = layers.MultiHeadAttention(
            size["heads"], size["dim"] // size["heads"]
        )(x, x)
        x = layers.LayerNormalization()(x + attn)
        ff = layers.Dense(size["ff"], activation="relu")(x)
        ff = layers.Dense(size["dim"])(ff)
        x = layers.LayerNormalization()(x + ff)
        x = layers.GlobalAveragePooling1D()(x)
        out = layers.Dense(size["classes"])(x)
        return keras.Model(tokens, out, name="transformer")
    if name == "lstm":
        return keras.Sequential(
            [
                keras.Input((size["seq"],), dtype="int32"),
                layers.Embedding(size["vocab"], size["dim"]),
                layers.LSTM(size["units"]),
                layers.Dense(size["classes"]),
            ],
            name="lstm",
        )
    if name == "demo_functional":
        inputs = keras.Input((size["features"],))
        h = size["hidden"]
        x = layers.Dense(h, activation="relu")(inputs)
        for _ in range(4):  # four residual pairs: nine Dense 512 in all
            residual = x
            x = layers.Dense(h, activation="relu")(x)
            x = layers.Dense(h, activation="relu")(x)
            x = layers.Add()([x, residual])
        outputs = layers.Dense(size["outputs"])(x)
        return keras.Model(inputs, outputs, name="demo_functional")
    if name == "resnet18":
        return _resnet18(keras, size)
    if name == "bert_small":
        return _bert_small(keras, size)
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def _resnet18(keras, size):
    layers = keras.layers

    def conv_bn(x, filters, strides=1, relu=True):
        x = layers.Conv2D(filters, 3, strides=strides, padding="same",
                          use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((size["image"], size["image"], 3))
    x = conv_bn(inputs, size["width"])
    for stage, count in enumerate(size["blocks"]):
        filters = size["width"] * 2 ** stage
        for block in range(count):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.Conv2D(filters, 1, strides=strides,
                                         use_bias=False)(shortcut)
                shortcut = layers.BatchNormalization()(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(size["classes"])(x), name="resnet18")


def _bert_small(keras, size):
    layers = keras.layers
    tokens = keras.Input((size["seq"],), dtype="int32")
    x = layers.Embedding(size["vocab"], size["dim"])(tokens)
    positions = layers.Embedding(size["seq"], size["dim"])(
        keras.ops.arange(size["seq"])[None, :])
    x = layers.LayerNormalization(epsilon=1e-12)(x + positions)
    for _ in range(size["layers"]):
        attn = layers.MultiHeadAttention(
            size["heads"], size["dim"] // size["heads"])(x, x)
        x = layers.LayerNormalization(epsilon=1e-12)(x + attn)
        ff = layers.Dense(size["ff"], activation="gelu")(x)
        ff = layers.Dense(size["dim"])(ff)
        x = layers.LayerNormalization(epsilon=1e-12)(x + ff)
    pooled = layers.Dense(size["dim"], activation="tanh")(x[:, 0])
    return keras.Model(tokens, layers.Dense(size["classes"])(pooled),
                       name="bert_small")


def make_data(name, size, samples):
    """The same arrays in every backend process: a seeded NumPy generator."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    if name in ("mlp", "demo_functional"):
        x = rng.standard_normal((samples, size["features"]), dtype=np.float32)
    elif name in ("cnn", "resnet18"):
        shape = (samples, size["image"], size["image"], size.get("channels", 3))
        x = rng.standard_normal(shape, dtype=np.float32)
    else:
        x = rng.integers(0, size["vocab"], (samples, size["seq"]),
                         dtype=np.int32)
    if name == "demo_functional":
        y = rng.random((samples, size["outputs"]), dtype=np.float32)
    else:
        y = rng.integers(0, size["classes"], (samples,), dtype=np.int32)
    return x, y


def seed_keras(keras, seed, with_tensorflow):
    """Seeds what `keras.utils.set_random_seed` seeds. That call also seeds
    TensorFlow, importing it (several seconds and its thread pools) in a
    worker of any backend; nothing here draws from TensorFlow's generator
    (NumPy data, shuffle=False, no dropout), so without `with_tensorflow`
    (--keras-seed) TensorFlow is seeded only where the worker has already
    loaded it: a worker carries TensorFlow only when its backend, or `auto`,
    loads it, as for a user who does not call set_random_seed."""
    if with_tensorflow or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    # set_random_seed's own steps, but for its `tf.random.set_seed`.
    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)


def weights_checksum(model):
    import numpy as np

    return float(sum(np.abs(np.asarray(w, dtype=np.float64)).sum()
                     for w in model.get_weights()))


def make_optimizer(keras, name):
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=0.001)
    return keras.optimizers.SGD(learning_rate=0.001, momentum=0.9)


def make_loss(keras, name):
    """The loss model `name` trains with (demo_functional regresses, as in
    Keras' examples/demo_functional.py; the others classify)."""
    if name == "demo_functional":
        return keras.losses.MeanSquaredError()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


OPTIMIZERS = {"sgd": "SGD(learning_rate=0.001, momentum=0.9)",
              "adam": "Adam(learning_rate=0.001)"}


def train_step_flops(model, steps_per_execution):
    """Floating-point operations of one training step, as keras_ipu's cost
    model counts them (a matmul 2 per multiply-add, an elementwise op 1 per
    element) on the compiled train program; None off the ipu backend."""
    import gc

    from keras_ipu.device.compiler.executable import Executable

    programs = [o for o in gc.get_objects()
                if isinstance(o, Executable) and o.name == "train_step_loop"]
    if not programs:
        return None
    exe = programs[-1]
    total = sum(step.flops for step in exe.prediction.steps)
    return total / max(1, exe.prediction.steps_per_run)


class ConcurrencyCounts:
    """How the ipu run loop's launched kernels went (device/native/threads.py),
    counted in this process: launches handed to a Python pool thread
    (`launched`), launched as jobs of the C pool (`on_c_pool`: a weight
    gradient with its update, a C chain or a product alone, no GIL), and
    of those the ones no helper had taken by the join, so the run loop ran
    them itself (`c_pool_run_by_caller`); launches run at once in the
    caller (`ran_in_caller`: the pool was backing off after a late split),
    and late splits (a join that waited for a pool thread that lost its
    core, or a caller that lost its own). On a quiet machine the late ones
    say whether fit's steps ran their kernels side by side as
    step_profile.py --run-loop does."""

    KEYS = ("launched", "on_c_pool", "c_pool_run_by_caller", "ran_in_caller", "late")

    def __init__(self):
        from keras_ipu.device.native import threads

        self.counts = dict.fromkeys(self.KEYS, 0)
        self.late_sources = collections.Counter()
        launch = getattr(threads, "launch", None)
        launch_on_c_pool = getattr(threads, "launch_on_c_pool", None)
        note_split = getattr(threads, "_note_split", None)
        ran = getattr(threads, "_Ran", None)
        on_c_pool = getattr(threads, "_OnCPool", None)
        if None in (launch, launch_on_c_pool, note_split, ran, on_c_pool):
            self.counts = {}  # a pool without these: nothing to count
            return
        counts = self.counts

        def counted_launch(fn, args):
            job = launch(fn, args)
            counts["ran_in_caller" if type(job) is ran else "launched"] += 1
            return job

        def counted_finish(finish):
            def finish_counted(handle):
                result, stats = finish(handle)
                counts["c_pool_run_by_caller"] += bool(stats[0])
                return result, stats

            return finish_counted

        def counted_launch_on_c_pool(start, fn, args):
            # Its fallback (the C kernels refused the operands) goes
            # through threads.launch, counted there.
            job = launch_on_c_pool(start, fn, args)
            if type(job) is ran:
                counts["ran_in_caller"] += 1
            elif type(job) is on_c_pool:
                counts["on_c_pool"] += 1
                handle, finish = job.started
                job.started = (handle, counted_finish(finish))
            return job

        late_sources = self.late_sources

        def counted_note_split(late, now, at_once=False):
            if late:
                counts["late"] += 1
                late_sources[_noting_source(sys._getframe(1))] += 1
            return note_split(late, now, at_once)

        # Programs bind threads.launch and launch_on_c_pool when they are
        # built: set before fit.
        threads.launch, threads.launch_on_c_pool = counted_launch, counted_launch_on_c_pool
        threads._note_split = counted_note_split

    _installed = None

    @classmethod
    def installed(cls):
        """The process's one counter (each would wrap the last one's)."""
        if cls._installed is None:
            cls._installed = cls()
        return cls._installed

    def reset(self):
        for key in self.counts:
            self.counts[key] = 0
        self.late_sources.clear()

    def per_step(self, steps):
        return {key: round(value / steps, 2) for key, value in self.counts.items()} or None

    def late_sources_per_step(self, steps):
        """Late splits per step by what noted them (see _noting_source),
        most first."""
        return {source: round(n / steps, 2) for source, n in self.late_sources.most_common()}


def _noting_source(frame):
    """Which rule noted a late split, and for which kernel: the function
    that called threads._note_split (note_pool_split, parallel_for,
    _join_on_c_pool, join, note_blocks) and its caller (the kernel: a
    product plan, a C chain's run_all, a pooling or sum kernel), as
    "rule<kernel". Where the shared back-off still starts on a many-core
    machine is the question these answer (issue 16, sixteenth pass)."""
    names = []
    while frame is not None and len(names) < 2:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "<".join(names)


class EngineLog:
    """Which host engine (compiler/engine_choice.py) ran the training program in
    each epoch, and when `auto` changed it: the runners of this process's
    executables, noted as the Executable asks for them (it looks
    `engine_choice.runner` up on each first run)."""

    _installed = None

    def __init__(self):
        from keras_ipu.device.compiler import engine_choice

        self.engine_choice = engine_choice
        self.runners = []
        runner = self.runner_wrapped = engine_choice.runner

        def noted_runner(executable):
            run = runner(executable)
            self.runners.append((executable, run))
            return run

        engine_choice.runner = noted_runner

    @classmethod
    def installed(cls):
        """The process's one log (each would wrap the last one's)."""
        if cls._installed is None:
            cls._installed = cls()
        return cls._installed

    def begin_model(self):
        """A new model's fit follows: the runners noted so far are an
        earlier model's (one worker fits each model in turn), whose engines
        and events are not this one's."""
        self.runners.clear()

    def _training(self):
        return [(exe, run) for exe, run in self.runners
                if (exe.name or "").startswith("train_step")]

    def engine_now(self):
        """The engine of the training program's last run."""
        used = {self.engine_choice.current_engine(exe) for exe, _ in self._training()}
        return ",".join(sorted(e for e in used if e)) or None

    def events(self, since):
        """`auto`'s steps since `since` (perf_counter), as (seconds since
        `since`, what)."""
        out = [(t - since, what) for _, run in self._training()
               for t, what in getattr(run, "events", ()) if t >= since]
        return sorted(out)


def run_model(keras, name, size, args, weights_path):
    steps = model_steps(args, name)
    batch = args.batch_size
    x, y = make_data(name, size, steps * batch)
    seed_keras(keras, SEED, args.keras_seed)
    model = build_model(keras, name, size)
    if args.save_weights:
        model.save_weights(weights_path)
    else:
        model.load_weights(weights_path)
    model.compile(
        optimizer=make_optimizer(keras, args.optimizer),
        loss=make_loss(keras, name),
        steps_per_execution=args.steps_per_execution,
        jit_compile="auto" if args.jit_compile == "auto" else True,
    )

    marks = {}
    counts = ConcurrencyCounts.installed() if keras.backend.backend() == "ipu" else None
    engine_log = EngineLog.installed() if keras.backend.backend() == "ipu" else None
    if engine_log is not None:
        engine_log.begin_model()

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            marks["begin"] = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1 and counts is not None:
                counts.reset()  # the timed epochs only
            marks[("begin", epoch)] = time.perf_counter()
            marks[("cpu begin", epoch)] = time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            marks[("end", epoch)] = time.perf_counter()
            marks[("cpu end", epoch)] = time.process_time()
            marks[("loss", epoch)] = float(logs["loss"])
            if engine_log is not None:
                marks[("engine", epoch)] = engine_log.engine_now()
            marks["epochs"] = epoch + 1
            if epoch >= args.timed_epochs and (
                    marks[("end", epoch)] - marks[("end", 0)] >= args.min_timed_seconds):
                self.model.stop_training = True

    most = max(args.timed_epochs, MAX_TIMED_EPOCHS) if args.min_timed_seconds else args.timed_epochs
    fit_start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1 + most, shuffle=False,
              verbose=0, callbacks=[Clock()])
    fit_s = time.perf_counter() - fit_start
    epochs = marks["epochs"]
    epoch_s = [marks[("end", e)] - marks[("begin", e)]
               for e in range(1, epochs)]
    rates = [steps * batch / s for s in epoch_s]
    # CPU seconds of the whole process (all its threads) per step: on a
    # busy machine wall time measures the scheduler's share as much as the
    # work; this measures the work (threads that spin count too).
    cpu_ms = [1e3 * (marks[("cpu end", e)] - marks[("cpu begin", e)]) / steps
              for e in range(1, epochs)]
    flops = None
    epochs_log = [
        {"epoch": e, "s": round(marks[("end", e)] - marks[("begin", e)], 3),
         "ended_s": round(marks[("end", e)] - marks["begin"], 3),
         "cpu_ms_per_step": round(1e3 * (marks[("cpu end", e)] - marks[("cpu begin", e)])
                                  / steps, 1),
         "engine": marks.get(("engine", e))}
        for e in range(epochs)]
    tiering = None
    if keras.backend.backend() == "ipu":
        flops = train_step_flops(model, args.steps_per_execution)
        # Seconds since fit began: which epoch each step of `auto` fell in.
        tiering = [(round(t, 2), what) for t, what in engine_log.events(marks["begin"])]
    return {
        "samples_per_s": statistics.median(rates) if rates else None,
        "samples_per_s_min": min(rates) if rates else None,
        "samples_per_s_max": max(rates) if rates else None,
        "first_epoch_s": marks[("end", 0)] - marks["begin"],
        "timed_epoch_s": epoch_s,
        "cpu_ms_per_step": statistics.median(cpu_ms) if cpu_ms else None,
        "fit_total_s": fit_s,
        "loss_after_first_epoch": marks[("loss", 0)],
        "initial_weights_abs_sum": None,  # filled below
        "jit_compile": bool(model.jit_compile),
        "parameters": int(model.count_params()),
        "steps_per_epoch": steps,
        "train_step_flops": flops,
        "engine": os.environ.get("KERAS_IPU_ENGINE", "auto")
        if keras.backend.backend() == "ipu" else None,
        "concurrency_per_step": counts.per_step(steps * (epochs - 1))
        if counts is not None and epochs > 1 else None,
        "late_sources_per_step": counts.late_sources_per_step(steps * (epochs - 1))
        if counts is not None and epochs > 1 and counts.counts else None,
        "epochs": epochs_log,
        "tiering": tiering,
    }


def configure_threads_in_process(backend, threads):
    """The library-level part of the thread settings (after import)."""
    if backend == "tensorflow" and threads == DEFAULT_THREADS:
        import tensorflow as tf

        return {
            "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        return {
            "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }
    return {}


def model_steps(args, name):
    if args.steps is not None:
        return args.steps
    return 3 if args.quick else DEFAULT_STEPS.get(name, 30)


def worker_main(args):
    backend = os.environ["KERAS_BACKEND"]
    size_table = SIZES["quick" if args.quick else "full"]
    info = {"threads": configure_threads_in_process(backend, args.threads)}
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"keras loaded backend {keras.backend.backend()!r}, "
            f"expected {backend!r}"
        )
    keras.config.set_floatx("float32")
    info["keras"] = keras.__version__
    info["backend_version"] = _backend_version(backend)
    info["affinity"] = sorted(os.sched_getaffinity(0))
    results = {}
    for name in args.models.split(","):
        weights = Path(args.weights_dir) / f"{name}.weights.h5"
        try:
            size = size_table[name]
            res = run_model(keras, name, size, args, weights)
            # The initial weights, reloaded: equal sums across backends
            # show the loading worked.
            model = build_model(keras, name, size)
            model.load_weights(weights)
            res["initial_weights_abs_sum"] = weights_checksum(model)
            results[name] = res
        except Exception as err:  # report and go on with the next model
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        print(f"[{backend}] {name}: {results[name]}", file=sys.stderr,
              flush=True)
    info["models"] = results
    # Whether the worker carried TensorFlow (its backend, `auto`'s engines,
    # or --keras-seed loaded it): its import and threads are part of what
    # the worker's figures include.
    info["tensorflow_loaded"] = "tensorflow" in sys.modules
    Path(args.result_file).write_text(json.dumps(info))


def _backend_version(backend):
    if backend == "ipu":
        import keras_ipu

        return getattr(keras_ipu, "__version__", "dev")
    module = __import__(BACKEND_MODULE[backend])
    return module.__version__


# --------------------------------------------------------------------------
# Driver side: never imports keras; starts one worker per backend.


def thread_environment(threads):
    """Environment variables that fix each library's thread count; they
    must be set before the library is loaded, hence in the child's env.
    None for DEFAULT_THREADS: each of these is removed instead."""
    if threads == DEFAULT_THREADS:
        return {name: None for name in thread_environment(1)}
    n = str(threads)
    xla = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
           if threads == 1 else
           f"--xla_cpu_multi_thread_eigen=true "
           f"intra_op_parallelism_threads={threads}")
    return {
        "OMP_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": n,
        "XLA_FLAGS": xla,
        # keras_ipu's own cap (device/native/threads.py), so that one left
        # in the driver's shell cannot hold ipu below the others.
        "KERAS_IPU_HOST_THREADS": n,
    }


def worker_environment(threads, extra=()):
    """The driver's environment with the thread settings of `threads`."""
    env = dict(os.environ)
    for name, value in [*thread_environment(threads).items(), *dict(extra).items()]:
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def benchmark_cores(threads):
    """The cores a worker runs on: the first `threads` of this process's,
    or all of them for DEFAULT_THREADS."""
    cores = sorted(os.sched_getaffinity(0))
    return cores if threads == DEFAULT_THREADS else cores[:threads]


def installed(backend):
    return importlib.util.find_spec(BACKEND_MODULE[backend]) is not None


def run_cell(variant, name, args, weights_dir, result_file):
    """`variant` on model `name` in a worker process of its own: a model's
    fit is measured without what an earlier one left running (`auto`'s
    background XLA compile of the last model went on, at nice 19, into the
    next model's first epochs and its timed runs: issue 16, tenth pass).
    The first cell of a model to run builds its initial weights and saves
    them; every later one (other backends, later rounds) loads them.
    Returns the worker's info, or {"error": ...} when it died."""
    save = not weights_file(weights_dir, name).exists()
    return run_worker(variant, args, weights_dir, save, result_file, [name])


def weights_file(weights_dir, name):
    return Path(weights_dir) / f"{name}.weights.h5"


def round_order(backends, round_index, rounds):
    """The order backends run in, round `round_index` of `rounds`: rotated
    by an equal share each round, so that no backend always runs first
    (beside a cold cache) or right after the slowest one."""
    if not backends:
        return []
    shift = round_index * max(1, len(backends) // rounds) % len(backends)
    return backends[shift:] + backends[:shift]


def combine_rounds(runs):
    """One (model, backend) cell from its rounds' results: the median of
    samples/s, first-epoch time and CPU ms per step over the rounds that
    ran, `samples_per_s_min/max` the spread of the rounds' medians, the
    other fields those of the median round, and every round under
    `rounds`. A single run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    ok = [run for run in runs if "error" not in run]
    if not ok:
        return {"error": runs[0]["error"], "rounds": runs}
    rates = [run["samples_per_s"] for run in ok]
    cell = dict(sorted(ok, key=lambda run: run["samples_per_s"])[(len(ok) - 1) // 2])
    cell.update(
        samples_per_s=statistics.median(rates),
        samples_per_s_min=min(rates),
        samples_per_s_max=max(rates),
        first_epoch_s=statistics.median(run["first_epoch_s"] for run in ok),
        rounds=runs,
    )
    cpu = [run["cpu_ms_per_step"] for run in ok if run.get("cpu_ms_per_step") is not None]
    cell["cpu_ms_per_step"] = statistics.median(cpu) if cpu else None
    return cell


def run_rounds(backends, args, weights_dir):
    """Every (model, backend) cell `args.rounds` times: round by round, in
    each round model by model, and each model's backends one after another
    in the round's order (round_order), so the backends compared in a
    round ran minutes apart at most. Returns (results, orders, built_by)."""
    runs = {b: {name: [] for name in args.model_list} for b in backends}
    infos, wall = {}, dict.fromkeys(backends, 0.0)
    orders, built_by = [], {}
    for r in range(args.rounds):
        order = round_order(backends, r, args.rounds)
        orders.append(order)
        for name in args.model_list:
            for backend in order:
                tag = f" (round {r + 1} of {args.rounds})" if args.rounds > 1 else ""
                print(f"backend {backend}: running {name}{tag} ...",
                      file=sys.stderr, flush=True)
                had_weights = weights_file(weights_dir, name).exists()
                one = run_cell(backend, name, args, weights_dir,
                               os.path.join(weights_dir, f"{backend}.{name}.{r}.json"))
                if not had_weights and weights_file(weights_dir, name).exists():
                    built_by[name] = backend
                if "error" in one:  # the worker died: that cell's error, the others go on
                    print(f"backend {backend}: {name}: {one['error']}", file=sys.stderr)
                    runs[backend][name].append({"error": one["error"]})
                    continue
                wall[backend] += one.pop("process_wall_s")
                runs[backend][name].append(one.pop("models")[name])
                infos.setdefault(backend, one)
    results = {}
    for backend in backends:
        cells = {name: combine_rounds(rs) for name, rs in runs[backend].items() if rs}
        if backend not in infos:  # every worker died: the first error
            results[backend] = next(iter(cells.values()), {"error": "no run"})
            continue
        results[backend] = {**infos[backend], "models": cells,
                            "process_wall_s": wall[backend]}
    return results, orders, built_by


def run_worker(variant, args, weights_dir, save_weights, result_file, models):
    backend, extra_env, jit = VARIANTS[variant]
    env = worker_environment(args.threads, extra_env)
    env["KERAS_BACKEND"] = backend
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker",
        "--models", ",".join(models),
        "--timed-epochs", str(args.timed_epochs),
        "--min-timed-seconds", str(args.min_timed_seconds),
        "--steps-per-execution", str(args.steps_per_execution),
        "--threads", str(args.threads),
        "--jit-compile", "true" if jit else args.jit_compile,
        "--batch-size", str(args.batch_size),
        "--optimizer", args.optimizer,
        "--weights-dir", weights_dir,
        "--result-file", result_file,
    ]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps)]
    if args.quick:
        cmd.append("--quick")
    if args.keras_seed:
        cmd.append("--keras-seed")
    if save_weights:
        cmd.append("--save-weights")
    cores = benchmark_cores(args.threads)

    def pin():
        os.sched_setaffinity(0, cores)

    start = time.perf_counter()
    with busy_processes(cores if args.load else ()):
        proc = subprocess.run(cmd, env=env, preexec_fn=pin, capture_output=True,
                              text=True, timeout=args.timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not Path(result_file).exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"error": f"worker exited with {proc.returncode}:\n{tail}"}
    info = json.loads(Path(result_file).read_text())
    info["process_wall_s"] = wall
    return info


BUSY_LOOP = "while True:\n    pass\n"


class busy_processes:
    """`--load`: one process spinning on the benchmark's cores while a
    backend runs (another user's job on the same machine)."""

    def __init__(self, cores):
        self.cores = list(cores)
        self.procs = []

    def __enter__(self):
        if self.cores:
            cores = self.cores
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", BUSY_LOOP],
                preexec_fn=lambda: os.sched_setaffinity(0, cores)))
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
            proc.wait()


BLAS_PEAK_CODE = """
import json, time, numpy as np
sizes = {sizes}
operands = {{n: (np.random.default_rng(0).standard_normal((n, n), dtype=np.float32),
                np.random.default_rng(1).standard_normal((n, n), dtype=np.float32))
            for n in sizes}}


def rate(product_for):
    rates = []
    for n, (a, b) in operands.items():
        product = product_for(n)
        product(a, b)
        best = float("inf")
        for _ in range({repeats}):
            start = time.perf_counter()
            product(a, b)
            best = min(best, time.perf_counter() - start)
        rates.append(2 * n ** 3 / best / 1e9)
    return max(rates)


openblas = rate(lambda n: np.matmul)
try:
    from threadpoolctl import threadpool_info
    kernels = sorted({{i.get("architecture") or "?" for i in threadpool_info()
                      if i.get("internal_api") == "openblas"}})
except ImportError:
    kernels = []
ours = None
try:
    from keras_ipu.device.native import product_pool, threads
    if product_pool.native_gemm():
        time.sleep(0.5)  # OpenBLAS' idle threads spin ~0.1 s after its calls
        ours = rate(lambda n: threads.matmul_plan(0, n, n, n, np.float32) or product_pool.matmul)
except ImportError:
    pass
print(json.dumps([openblas, ", ".join(kernels) or None, ours]))
"""


class Peak(NamedTuple):
    """The benchmark host's float32 product peak (blas_peak)."""
    kernels: str | None  # OpenBLAS' kernels (threadpoolctl's architecture)
    openblas_gflops: float | None  # NumPy's np.matmul
    native_gflops: float | None  # keras_ipu's own gemm, where the engine runs it

    @property
    def gflops(self):
        """The faster of the two: every backend's yardstick (None where the
        probe failed)."""
        if self.openblas_gflops is None:
            return None
        return max(self.openblas_gflops, self.native_gflops or 0.0)

    def describe(self):
        openblas = (f"OpenBLAS {self.kernels} kernels "
                    f"{self.openblas_gflops and round(self.openblas_gflops, 1)}")
        if self.native_gflops is None:
            return openblas
        return f"keras_ipu's AVX-512 gemm {round(self.native_gflops, 1)}, {openblas}"


def blas_peak(threads, quick=False):
    """The Peak of float32 products, the fastest of square products of
    512, 1024 and 2048, with `threads` threads on the benchmark's cores:
    this host's practical float32 limit, the yardstick for every backend's
    GFLOP/s. Two probes:
    NumPy's sgemm (OpenBLAS), naming which of its kernels it runs
    (threadpoolctl's "architecture": OPENBLAS_CORETYPE or its own pick for
    this CPU), and where the ipu backend's NumPy engine runs keras_ipu's
    own AVX-512 gemm (product_pool.native_gemm), that kernel as the engine
    splits the product. On the AVX-512 EPYC VM of issue 16's seventeenth
    pass, with OPENBLAS_CORETYPE=Haswell in the environment, OpenBLAS' AVX2
    kernels ran the MLP's products at 121-127 GFLOP/s per core, its
    SkylakeX ones at 185-241, our kernel (twenty-first pass) at 230-260
    (benchmarks/README.md): the peak is the faster, so no backend reads
    above it. All None where the probe fails."""
    # Three sizes, the fastest counting: kernels peak at different shapes
    # (our gemm, whose operand panels leave L1 as k grows, ran 2048^3 at
    # 146 GFLOP/s on one core and 512^3 at 262; on two threads 1024^3 at
    # 392, 2048^3 at 314: issue 16, twenty-first pass, the lead's run).
    sizes, repeats = ((256,), 2) if quick else ((512, 1024, 2048), 5)
    env = worker_environment(threads)
    cores = benchmark_cores(threads)
    proc = subprocess.run(
        [sys.executable, "-c", BLAS_PEAK_CODE.format(sizes=sizes, repeats=repeats)],
        env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if proc.returncode != 0:
        return Peak(None, None, None)
    openblas, kernels, ours = json.loads(proc.stdout.strip().splitlines()[-1])
    return Peak(kernels, openblas, ours)


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The first CPU's model name, family and model as Linux reports them
    (two VMs called "AMD EPYC" differed 1.6x in the BLAS peak: issue 16,
    seventeenth pass), or None elsewhere."""
    # The driver's import: light (no keras, NumPy or engine), and the
    # workers, whose figures it could touch, never call this.
    from keras_ipu.device.cpuinfo import first_cpu

    fields = first_cpu(cpuinfo)
    if "model name" not in fields:
        return None
    return (f"{fields['model name']} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')})")


def _rate(results, backend, name):
    return results.get(backend, {}).get("models", {}).get(name, {})


def ratios(results, models):
    """Per model, each ipu variant over each other backend, and over the
    fastest of them (`/best`), of samples/s and first-epoch time."""
    out = {}
    ipus = [b for b in results if VARIANTS.get(b, ("",))[0] == "ipu"]
    peers = [b for b in results if VARIANTS.get(b, ("",))[0] != "ipu"]
    for name in models:
        row = {}
        for ipu_name in ipus:
            ipu = _rate(results, ipu_name, name)
            if not ipu.get("samples_per_s"):
                continue
            best, compared = None, 0
            for other in peers:
                ref = _rate(results, other, name)
                if ipu.get("samples_per_s") and ref.get("samples_per_s"):
                    compared += 1
                    row[f"{ipu_name}/{other}"] = {
                        "samples_per_s": ipu["samples_per_s"] / ref["samples_per_s"],
                        "first_epoch_s": ipu["first_epoch_s"] / ref["first_epoch_s"],
                    }
                    if best is None or ref["samples_per_s"] > best[1]["samples_per_s"]:
                        best = (other, ref)
            if compared > 1:
                row[f"{ipu_name}/best"] = {
                    "samples_per_s": ipu["samples_per_s"] / best[1]["samples_per_s"],
                    "first_epoch_s": ipu["first_epoch_s"] / best[1]["first_epoch_s"],
                    "best": best[0],
                }
        ours = _fastest(results, ipus, name)
        theirs = _fastest(results, peers, name)
        if len(ipus) > 1 and ours and theirs:
            row["ours/best"] = {
                "samples_per_s": ours[1]["samples_per_s"] / theirs[1]["samples_per_s"],
                "first_epoch_s": ours[1]["first_epoch_s"] / theirs[1]["first_epoch_s"],
                "ours": ours[0], "best": theirs[0],
            }
        out[name] = row
    return out


def _fastest(results, backends, name):
    """(backend, its result) of the most samples/s on `name`, or None."""
    ran = [(b, _rate(results, b, name)) for b in backends]
    ran = [(b, res) for b, res in ran if res.get("samples_per_s")]
    return max(ran, key=lambda pair: pair[1]["samples_per_s"]) if ran else None


def ratios_over_rounds(results, models, rounds):
    """ratios() of the cells' medians and, with several rounds, each
    ratio's value in each round (`samples_per_s_rounds`, None where a side
    did not run that round; `best_rounds`: the fastest peer of each round),
    so a reader sees whether ours won every round or only the medians."""
    out = ratios(results, models)
    if rounds == 1:
        return out
    per_round = []
    for r in range(rounds):
        view = {b: {"models": {name: _round_of(cell, r)
                               for name, cell in entry.get("models", {}).items()}}
                for b, entry in results.items()}
        per_round.append(ratios(view, models))
    for name, row in out.items():
        for key, val in row.items():
            got = [one[name].get(key) for one in per_round]
            val["samples_per_s_rounds"] = [g and g["samples_per_s"] for g in got]
            if "best" in val:
                val["best_rounds"] = [g and g["best"] for g in got]
            if "ours" in val:
                val["ours_rounds"] = [g and g["ours"] for g in got]
    return out


def _round_of(cell, r):
    rounds = cell.get("rounds")
    if rounds is None:  # one round (or a cell that never ran)
        return cell if r == 0 else {}
    return rounds[r] if r < len(rounds) else {}


def _flops(report, name):
    """The training step's FLOPs (keras_ipu's count, the same model for
    every backend)."""
    for entry in report["results"].values():
        flops = entry.get("models", {}).get(name, {}).get("train_step_flops")
        if flops:
            return flops
    return None


def _cells_with(report, field, present=False):
    """(model, backend, result) of the report's cells whose `field` is set
    (truthy; with `present`, anything but None), in the table's order."""
    for name in report["config"]["models"]:
        for backend in report["config"]["backends"]:
            res = report["results"].get(backend, {}).get("models", {}).get(name) or {}
            value = res.get(field)
            if (value is not None) if present else value:
                yield name, backend, res


def format_table(report):
    peak = report["config"].get("blas_peak_gflops")
    batch = report["config"]["batch_size"]
    rounds = report["config"].get("rounds", 1)
    spread = "min..max" if rounds == 1 else f"min..max of {rounds} rounds"
    lines = [
        f"| model | backend | samples/s (median) | {spread} | GFLOP/s "
        "| % of BLAS peak | CPU ms/step | cores used | first epoch s | loss after epoch 1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in report["config"]["models"]:
        flops = _flops(report, name)
        for backend in report["config"]["backends"]:
            entry = report["results"].get(backend, {})
            res = entry.get("models", {}).get(name)
            if res is None:
                why = entry.get("skipped") or entry.get("error", "no result")
                lines.append(f"| {name} | {backend} | skipped: "
                             f"{why.splitlines()[0]} | | | | | | | |")
            elif "error" in res:
                lines.append(f"| {name} | {backend} | error: "
                             f"{res['error'].splitlines()[0][:80]} | | | | | | | |")
            else:
                gflops = pct = ""
                if flops:
                    rate = flops * res["samples_per_s"] / batch / 1e9
                    gflops = f"{rate:.1f}"
                    if peak:
                        pct = f"{100 * rate / peak:.0f}%"
                cpu = res.get("cpu_ms_per_step")
                # CPU seconds per wall second: how many cores the step kept busy
                # (both medians, so an estimate; a second core idle shows as ~1).
                cores = "" if cpu is None else (
                    f"{cpu * res['samples_per_s'] / batch / 1e3:.2f}")
                cpu = "" if cpu is None else f"{cpu:.1f}"
                lines.append(
                    f"| {name} | {backend} | {res['samples_per_s']:.0f} | "
                    f"{res['samples_per_s_min']:.0f}..."
                    f"{res['samples_per_s_max']:.0f} | {gflops} | {pct} | "
                    f"{cpu} | {cores} | {res['first_epoch_s']:.2f} | "
                    f"{res['loss_after_first_epoch']:.4f} |"
                )
    concurrency = [(name, backend, res["concurrency_per_step"])
                   for name, backend, res in _cells_with(report, "concurrency_per_step")]
    if concurrency:
        lines += ["", "| model | backend | kernels launched beside the run loop: "
                  "on a Python thread | as C-pool jobs | of those run by the caller at the join "
                  "| run by the caller (backing off) | late splits |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {name} | {backend} | {c['launched']} | {c.get('on_c_pool', '-')} "
                  f"| {c.get('c_pool_run_by_caller', '-')} | {c['ran_in_caller']} "
                  f"| {c['late']} |" for name, backend, c in concurrency]
    sources = [(name, backend, res["late_sources_per_step"])
               for name, backend, res in _cells_with(report, "late_sources_per_step")]
    if sources:
        lines += ["", "| model | backend | late splits per step by source (rule<kernel) |",
                  "|---|---|---|"]
        lines += [f"| {name} | {backend} | "
                  + "; ".join(f"{source} {n}" for source, n in found.items()) + " |"
                  for name, backend, found in sources]
    epochs = list(_cells_with(report, "tiering", present=True))
    if epochs:
        lines += ["", "| model | backend | per epoch: s, CPU ms/step, engine "
                  "| auto's steps (s since fit began) |", "|---|---|---|---|"]
        lines += [f"| {name} | {backend} | "
                  + "; ".join(f"{e['s']:.2f} s, {e['cpu_ms_per_step']:.0f}, {e['engine']}"
                              for e in res["epochs"])
                  + " | " + "; ".join(f"{t:.1f} {what}" for t, what in res["tiering"]) + " |"
                  for name, backend, res in epochs]
    each = "" if rounds == 1 else " each round's samples/s ratio (wins) |"
    lines += ["", "| model | ratio | samples/s ratio (>1: ipu faster) "
              "| first-epoch time ratio (>1: ipu slower) |" + each,
              "|---|---|---:|---:|" + ("---|" if each else "")]
    for name, row in report["ratios"].items():
        for key, val in row.items():
            label = key
            if "ours" in val:
                label = f"{key} ({val['ours']}/{val['best']})"
            elif "best" in val:
                label = f"{key} ({val['best']})"
            line = (f"| {name} | {label} | {val['samples_per_s']:.3f} | "
                    f"{val['first_epoch_s']:.3f} |")
            if each:
                line += f" {_round_ratios(val)} |"
            lines.append(line)
    return "\n".join(lines)


def _round_ratios(val):
    """`0.95 (jax), 1.10 (tensorflow-xla), - (wins 1 of 2)`: each round's
    ratio, its fastest peer where that is a `/best` ratio."""
    bests = val.get("best_rounds") or [None] * len(val["samples_per_s_rounds"])
    parts, wins, ran = [], 0, 0
    for ratio, best in zip(val["samples_per_s_rounds"], bests):
        if ratio is None:
            parts.append("-")
            continue
        ran += 1
        wins += ratio >= 1
        parts.append(f"{ratio:.2f}" + (f" ({best})" if best else ""))
    return ", ".join(parts) + f" (wins {wins} of {ran})"


def driver_main(args):
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; choose from {','.join(MODELS)}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        sys.exit(f"unknown backend(s) {bad}; choose from {','.join(BACKENDS)}")
    available = os.sched_getaffinity(0)
    if args.threads != DEFAULT_THREADS and args.threads > len(available):
        sys.exit(f"--threads {args.threads} is more than the "
                 f"{len(available)} CPU cores this process may use")
    probe = blas_peak(args.threads, args.quick)
    peak = probe.gflops

    results = {}
    for backend in backends:
        if not installed(backend):
            msg = (f"not installed (no module {BACKEND_MODULE[backend]!r} "
                   f"in {sys.executable}); skipped")
            print(f"backend {backend}: {msg}", file=sys.stderr)
            results[backend] = {"skipped": msg}
    run_order = [b for b in backends if b not in results]
    with tempfile.TemporaryDirectory(prefix="fit_throughput_") as tmp:
        ran, orders, built_by = run_rounds(run_order, args, tmp)
    results.update(ran)

    report = {
        "config": {
            "models": args.model_list,
            "backends": backends,
            "batch_size": args.batch_size,
            "dtype": "float32",
            "steps_per_epoch": {m: model_steps(args, m) for m in args.model_list},
            "timed_epochs": args.timed_epochs,
            "min_timed_seconds": args.min_timed_seconds,
            "steps_per_execution": args.steps_per_execution,
            "jit_compile": args.jit_compile,
            "quick": args.quick,
            "sizes": {m: SIZES["quick" if args.quick else "full"][m]
                      for m in args.model_list},
            "optimizer": OPTIMIZERS[args.optimizer],
            "load": bool(args.load),
            "blas_peak_gflops": peak,
            "blas_kernels": probe.kernels,
            "openblas_gflops": probe.openblas_gflops,
            "native_gemm_gflops": probe.native_gflops,
            "cpu": cpu_model(),
            "threads": args.threads,
            "thread_environment": thread_environment(args.threads),
            "cpu_affinity": benchmark_cores(args.threads),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "weights_built_by": built_by.get(args.model_list[0]),
            "rounds": args.rounds,
            "round_orders": orders,
            "keras_seed": bool(args.keras_seed),
        },
        "results": results,
        "ratios": ratios_over_rounds(results, args.model_list, args.rounds),
    }
    report["table"] = format_table(report)
    print(report["table"])
    cfg = report["config"]
    print(f"\nbatch {args.batch_size}, float32, {args.optimizer}, steps/epoch "
          f"{cfg['steps_per_epoch']}, "
          f"at least {args.timed_epochs} timed epochs after the first "
          f"and {args.min_timed_seconds:g} s of them, "
          f"{'one busy process beside it, ' if args.load else ''}"
          f"BLAS peak {peak and round(peak, 1)} GFLOP/s "
          f"({probe.describe()}; {cfg['cpu']}), "
          f"steps_per_execution {args.steps_per_execution}, "
          f"threads {args.threads} (cores {cfg['cpu_affinity']}; "
          f"{cfg['thread_environment']})")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"JSON written to {args.out}")
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help=f"comma-separated subset of {','.join(BACKENDS)}")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per epoch (default 30; resnet18 6, "
                        "bert_small 4; --quick 3)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                   help="samples per step (default 128)")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="sgd",
                   help="sgd (momentum 0.9, the default) or adam")
    p.add_argument("--load", action="store_true",
                   help="run one busy process on the same cores beside each "
                        "backend (a shared machine)")
    p.add_argument("--timed-epochs", type=int, default=None,
                   help="epochs timed after the first, at least (default 3, --quick 2)")
    p.add_argument("--min-timed-seconds", type=float, default=None,
                   help="more timed epochs (up to %d) until the timed ones last "
                        "this long in all, wall time (default %g, --quick 0)"
                        % (MAX_TIMED_EPOCHS, MIN_TIMED_SECONDS))
    p.add_argument("--steps-per-execution", type=int, default=1,
                   help="Keras' steps_per_execution, the same for every backend")
    p.add_argument("--threads", type=parse_threads, default=1,
                   help="CPU cores and threads per library for every backend, "
                        "or 'default': no pinning and no thread variables "
                        "(each library's own choice, what users get)")
    p.add_argument("--jit-compile", choices=("auto", "true"), default="auto",
                   help="auto: each backend's default (TensorFlow on CPU: "
                        "tf.function without XLA); true: XLA for TensorFlow too")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every (model, backend) this many times, the backends "
                        "interleaved round by round in a rotated order; the report "
                        "gives the medians, their spread and each round's ratios")
    p.add_argument("--keras-seed", action="store_true",
                   help="seed with keras.utils.set_random_seed in every worker, "
                        "which imports TensorFlow there too (a user who seeds); "
                        "default: TensorFlow is seeded only where it is loaded")
    p.add_argument("--quick", action="store_true",
                   help="tiny models and few steps: a smoke test, not a benchmark")
    p.add_argument("--out", help="write the report as JSON to this path")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds allowed per backend process")
    # Internal: the per-backend subprocess.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--weights-dir", help=argparse.SUPPRESS)
    p.add_argument("--save-weights", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.timed_epochs is None:
        args.timed_epochs = 2 if args.quick else 3
    if args.min_timed_seconds is None:
        args.min_timed_seconds = 0.0 if args.quick else MIN_TIMED_SECONDS
    if ((args.steps is not None and args.steps < 1) or args.timed_epochs < 1
            or args.batch_size < 1 or args.rounds < 1):
        p.error("--steps, --timed-epochs, --batch-size and --rounds must be >= 1")
    if args.min_timed_seconds < 0:
        p.error("--min-timed-seconds must be >= 0")
    return args


def parse_threads(text):
    """--threads: a positive number of threads, or DEFAULT_THREADS."""
    if text.strip().lower() == DEFAULT_THREADS:
        return DEFAULT_THREADS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a thread count: give a positive integer, or "
            f"{DEFAULT_THREADS!r} for each library's own threads")
    return value


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
