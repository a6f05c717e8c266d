"""The device loop: one execution of `steps_per_execution` steps.

As on the IPU (DESIGN.md decision 4), the unit of work is the loop, not the
step: the execution's batches are stacked along a new leading axis (the
infeed), a `scan` runs the stateless step over them carrying the model
state, and each step's outputs come back stacked (the outfeed). Compiled,
the whole loop is ONE executable, traced and compiled once per batch
signature and then reused; eagerly (`run_eagerly=True`) the same step runs
op by op on the host, one batch after the other.

Batches of different shapes (the smaller last batch of an epoch) cannot be
stacked: an execution is split into runs of consecutive batches with the
same signature, each run one call of the compiled loop.

Results are "chunks": one per run, each a structure of NumPy arrays with a
leading axis of one entry per step.
"""

import numpy as np

from keras.src import tree

from keras_ipu.backend.control_flow import scan
from keras_ipu.device.array import Tensor
from keras_ipu.backend.trainer_ops import memory_advice
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler.executable import programs_compute
from keras_ipu.device.config import system_config
from keras_ipu.device.compiler.demotion import InputRangeError
from keras_ipu.device.jit import jit
from keras_ipu.device.trace import default_source
from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError


def _host_array(x):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy"):  # tf.data / other frameworks' tensors
        return np.asarray(x.numpy())
    return np.asarray(x)


class _NotPlain(Exception):
    pass


def _plain_structure(t):
    if t is None:
        return None
    kind = type(t)
    if kind is tuple or kind is list:
        return (kind.__name__, tuple(_plain_structure(v) for v in t))
    if kind is dict:
        return ("dict", tuple((k, _plain_structure(t[k])) for k in sorted(t, key=repr)))
    if hasattr(t, "shape") and hasattr(t, "dtype"):
        return 0  # an array
    raise _NotPlain


def _structure(batch):
    """A hashable key of the batch's nesting, None entries included. Plain
    tuples, lists and dicts of arrays (what the data adapters give) are
    described directly; anything else through Keras' tree (slower)."""
    try:
        return _plain_structure(batch)
    except _NotPlain:
        return repr(tree.map_structure(lambda v: v is None, batch))


class _Run:
    """Consecutive batches of one signature: the first batch (the
    structure), and each batch's leaves as host arrays (None kept)."""

    __slots__ = ("structure", "first", "leaves")

    def __init__(self, structure, first):
        self.structure = structure
        self.first = first
        self.leaves = []

    def batches(self):
        return [tree.pack_sequence_as(self.first, ls) for ls in self.leaves]


def _runs(batches):
    """Consecutive batches grouped by signature: what must agree for
    batches to share one compiled loop is the structure (with the None
    entries, absent from the program) and every array's shape and dtype."""
    runs = []
    last = None
    for batch in batches:
        leaves = [
            None if v is None else _host_array(v) for v in tree.flatten(batch)
        ]
        structure = _structure(batch)
        sig = (
            structure,
            tuple(None if v is None else (v.shape, v.dtype.str) for v in leaves),
        )
        if not runs or sig != last:
            runs.append(_Run(structure, batch))
            last = sig
        runs[-1].leaves.append(leaves)
    return runs


def _infeed(run):
    """Every array of the run stacked along a steps axis (a view for a
    single step: the program never writes its inputs)."""
    flat_runs = [[v for v in leaves if v is not None] for leaves in run.leaves]
    if len(flat_runs) == 1:
        return [v[None] for v in flat_runs[0]]
    return [np.stack(vs) for vs in zip(*flat_runs)]


def _to_host(outputs):
    return tree.map_structure(
        lambda x: None if x is None else np.asarray(x), outputs
    )


def _fill_nones(structure, arrays):
    """`structure` with its non-None leaves replaced by `arrays`."""
    it = iter(arrays)
    leaves = [None if x is None else next(it) for x in tree.flatten(structure)]
    return tree.pack_sequence_as(structure, leaves)


# model_state's kinds of state -> the profile's memory categories.
_STATE_CATEGORY = {"trainable": "weights", "non_trainable": "weights",
                   "optimizer": "optimizer state", "metrics": "metric state"}


class DeviceLoop:
    """Runs `step(state, batch) -> (outputs, state)` over an execution.

    `compiled`: one jit-compiled scan per batch signature; otherwise the
    step runs eagerly on the host. Call with (state, batches); returns
    (chunks, state) (see the module doc). `state_kinds`: the kind of each
    group of the state (model_state.TRAIN_STATE & co.), for the memory
    categories of the profile and the advice of an out-of-memory error
    (weights, optimizer state, ...).
    """

    def __init__(self, step, compiled, donate_state=False, state_kinds=None, options=None,
                 micro_batches=1):
        self.step = step
        # Batches one step takes, stacked after the steps axis (gradient
        # accumulation, a pipeline): the samples of a step are all of theirs.
        self.micro_batches = micro_batches
        self.compiled = compiled
        # CompileOptions of the loop's programs (None: the defaults).
        self.options = options
        self.state_kinds = tuple(state_kinds or ())
        # The caller gives up the state arrays (jit's donate_argnums): the
        # program may update them in place.
        self.donate_state = donate_state
        self._loops = {}  # batch structure -> Jitted loop
        # (batch structure, state treedef, infeed signature) -> (system
        # configuration, Executable, outputs, their structure): run_held's
        # programs, found once per signature.
        self._held_programs = {}

    def __call__(self, state, batches):
        chunks = []
        for run in _runs(batches):
            if self.compiled:
                outputs, state = self._run_compiled(state, run)
            else:
                outputs, state = self._run_eager(state, run.batches())
            chunks.append(outputs)
        return chunks, state

    def _run_eager(self, state, run):
        per_step = []
        for batch in run:
            outputs, state = self.step(state, batch)
            per_step.append(_to_host(outputs))
        stacked = tree.map_structure(
            lambda *xs: None if xs[0] is None else np.stack(xs), *per_step
        )
        return stacked, state

    def prepare(self, state, batches):
        """Compile the loops these batches need, without running them (so
        that replicas running the loop side by side find it compiled)."""
        if not self.compiled:
            return
        for run in _runs(batches):
            loop = self._loop_for(run)
            stacked = _infeed(run)
            with self._workload(state, stacked):
                try:
                    loop.executable(state, stacked)
                except IPUOutOfMemoryError as e:
                    raise memory_advice.explain_out_of_memory(
                        e, loop, state, stacked, self.state_kinds) from None

    def _loop_for(self, run):
        loop = self._loops.get(run.structure)
        if loop is None:
            template = run.batches()[0]
            output_structure = []
            loop = jit(
                self._make_loop(template, output_structure),
                options=self.options,
                donate_argnums=(0,) if self.donate_state else (),
            )
            loop.output_structure = output_structure
            loop.__name__ = getattr(self.step, "__name__", "step") + "_loop"
            self._loops[run.structure] = loop
        return loop

    def _workload(self, state, stacked):
        # How the program runs, for its cycle prediction: samples per step,
        # steps per run, and the state (weights, optimizer, metrics) that
        # stays on the IPU between runs: the first inputs, the last outputs.
        n_state = len(tree.flatten(state))
        return device_checks.workload(
            batch_size=self._samples_per_step(stacked),
            steps_per_run=int(stacked[0].shape[0]) if stacked else 1,
            resident_inputs=tuple(range(n_state)),
            resident_outputs=tuple(range(-n_state, 0)),
            input_categories=self._input_categories(state, len(stacked)),
        )

    def _samples_per_step(self, stacked):
        """Samples per step: the axis after the steps (and after the
        micro-batches of a step that stacks them), times the micro-batches."""
        axis = 2 if self.micro_batches > 1 else 1
        if not stacked or stacked[0].ndim <= axis:
            return None
        return int(stacked[0].shape[axis]) * self.micro_batches

    def run_held(self, held, batches):
        """One execution on the state `held` keeps (held_state.HeldState,
        the arrays this loop's program returned last time), updating it;
        the chunks, as __call__ returns them. The program of the batches'
        signature is found once (not through jit's flattening, conversions
        and lookup per call) and run with the held arrays as its first
        inputs (Executable.run_resident). None, with nothing run, where
        this path does not apply (eager steps, batches of several
        signatures in one execution, a system that does not compute):
        __call__ runs those."""
        if not self.compiled or not programs_compute():
            return None
        runs = _runs(batches)
        if len(runs) != 1:
            return None
        run = runs[0]
        stacked = _infeed(run)
        key = (run.structure, held.treedef, tuple([(a.shape, a.dtype) for a in stacked]))
        entry = self._held_programs.get(key)
        context = system_config.configuration()
        if entry is None or entry[0] is not context:
            entry = self._held_program(key, context, held, run, stacked)
            if entry is None:
                return None
        _, executable, n_outputs, output_structure = entry
        try:
            results = executable.run_resident(held.flat, stacked)
        except InputRangeError as e:
            raise _renamed(e, run, len(held.flat)) from None
        held.flat = results[n_outputs:]
        return [_fill_nones(output_structure, results[:n_outputs])]

    def _held_program(self, key, context, held, run, stacked):
        """The entry of run_held's programs for `key` (compiled now if
        needed), or None when the program does not give back the state in
        the avals it takes it (then run_held never applies to it)."""
        loop = self._loop_for(run)
        state = held.state()
        with self._workload(state, stacked):
            try:
                executable = loop.executable(state, stacked)
            except IPUOutOfMemoryError as e:
                raise memory_advice.explain_out_of_memory(
                    e, loop, state, stacked, self.state_kinds) from None
        n_state = len(held.flat)
        n_outputs = len(executable.out_avals) - n_state
        if (
            not hasattr(executable, "run_resident")
            or len(executable.in_avals) != n_state + len(stacked)
            or n_outputs < 0
            or executable.out_avals[n_outputs:] != executable.in_avals[:n_state]
        ):
            return None
        if len(self._held_programs) >= _HELD_PROGRAMS:
            self._held_programs.clear()  # signatures come and go: stay bounded
        entry = (context, executable, n_outputs, loop.output_structure[0])
        self._held_programs[key] = entry
        return entry

    def _run_compiled(self, state, run):
        loop = self._loop_for(run)
        stacked = _infeed(run)
        with self._workload(state, stacked):
            try:
                flat_outputs, new_state = loop(state, stacked)
            except InputRangeError as e:
                raise _renamed(e, run, len(tree.flatten(state))) from None
            except IPUOutOfMemoryError as e:
                raise memory_advice.explain_out_of_memory(
                    e, loop, state, stacked, self.state_kinds) from None
        if not programs_compute():
            # PRE_COMPILE: the program was compiled (and cached) but not run,
            # so its results are zeros; they are no new state. The donated
            # arrays are untouched (nothing ran), so the state stays as it was.
            return _fill_nones(loop.output_structure[0], list(flat_outputs)), state
        state = new_state
        # The executable's results are fresh arrays nobody else holds: as
        # Tensors, Variable.assign takes them as they are instead of copying
        # every weight again (about a tenth of a small model's step).
        state = tree.map_structure(Tensor, state)
        # The jitted loop returns flat outputs (jit's own pytrees know plain
        # tuples, lists and dicts); Keras' tree rebuilds namedtuples & co.
        outputs = _fill_nones(loop.output_structure[0], list(flat_outputs))
        return outputs, state

    def executables(self):
        """The programs compiled for this loop so far, oldest first."""
        return [exe for loop in self._loops.values() for exe in loop.executables()]

    def _input_categories(self, state, n_stacked):
        """The memory category of each input of the compiled loop: the
        state's groups by kind, then the infeed's stacked batches."""
        if len(self.state_kinds) != len(state):
            return None
        categories = []
        for kind, group in zip(self.state_kinds, state):
            categories += [_STATE_CATEGORY.get(kind, "weights")] * len(tree.flatten(group))
        return tuple(categories) + ("stream buffers",) * n_stacked

    def _make_loop(self, template, output_structure):
        step = self.step
        none_mask = [v is None for v in tree.flatten(template)]

        def rebuild(arrays):
            it = iter(arrays)
            leaves = [None if is_none else next(it) for is_none in none_mask]
            return tree.pack_sequence_as(template, leaves)

        def device_loop(state, stacked):
            def body(carry, arrays):
                with default_source(None):
                    outputs, carry = step(carry, rebuild(arrays))
                return carry, outputs

            # Profiles name the loop's own steps "device loop"; the step
            # traced in its body keeps its layers' names.
            with default_source("device loop"):
                state, outputs = scan(body, state, stacked)
            # Only the structure is kept (not the traced values).
            output_structure[:] = [
                tree.map_structure(lambda x: None if x is None else 0, outputs)
            ]
            return [x for x in tree.flatten(outputs) if x is not None], state

        return device_loop


# run_held's programs kept per loop (a full execution, the shortened last
# one, a smaller last batch, each of fit and of its validation).
_HELD_PROGRAMS = 8


def _renamed(error, run, n_state):
    """An InputRangeError of the loop's program naming the batch's array."""
    return error.renamed(_batch_leaf_name(run.first, error.index - n_state))


_BATCH_PARTS = ("x", "y", "sample_weight")


def _batch_leaf_name(batch, index):
    """How an error names array `index` of a batch's non-None arrays:
    `y`, `x['ids']`, `x[1]` (Keras' (x, y, sample_weight) batches)."""
    paths = [p for p, v in tree.flatten_with_path(batch) if v is not None]
    if not 0 <= index < len(paths):
        return "a model state value"
    path = paths[index]
    # As keras' unpack_x_y_sample_weight reads a batch.
    if isinstance(batch, (tuple, list)) and 1 <= len(batch) <= 3:
        name, path = _BATCH_PARTS[path[0]], path[1:]
    else:
        name = "x"
    return name + "".join(f"[{p!r}]" for p in path)


def last_step(chunks):
    """The outputs of the execution's last step (the logs callbacks see)."""
    return tree.map_structure(
        lambda x: None if x is None else x[-1], chunks[-1]
    )


def every_step(chunks):
    """The outputs of each step of the execution, in order (the logs
    asynchronous callbacks see, one entry per step)."""
    steps = []
    for chunk in chunks:
        leaves = [x for x in tree.flatten(chunk) if x is not None]
        for i in range(len(leaves[0]) if leaves else 0):
            steps.append(tree.map_structure(lambda x, i=i: None if x is None else x[i], chunk))
    return steps


def concatenate_steps(chunks):
    """Every step's batch outputs joined along the batch axis (predict)."""

    def join(*xs):
        if xs[0] is None:
            return None
        return np.concatenate([x.reshape((-1,) + x.shape[2:]) for x in xs])

    return tree.map_structure(join, *chunks)
