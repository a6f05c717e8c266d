"""The Executable: a lowered program run by a tight loop.

The executable keeps its optimized Graph (`graph`): its nodes are the
program's steps, in order, as the memory model, the cycle prediction and
the profile read them. Lowering gives every value a slot (an index into a
list): inputs first, then constants, then each node's outputs. A step of
the run loop is (kernel, operand slots, output slot(s), multiple-results
flag, slots to clear): the kernel is pre-bound to its params, and the slots
whose value dies at this step (liveness.py) are cleared right after it, so
NumPy can reuse their memory. `run` does no dict lookups or type checks
per op: the steps are written out once as a straight-line Python function
(straight_line.py), a local variable per slot.

An Executable pickles without its kernels (they are rebound on load from
the primitives, which pickle by name): the on-disk cache stores it, with
what the compiler learnt about it on its target (`memory`, `prediction`,
see device_checks.py).

The floating-point behaviour (numerics) is fixed at compile time: when it
asks for anything, every lowered kernel is wrapped by numerics.wrap_kernel.
Control-flow bodies come compiled (`subprograms`, by the pipeline, with the
same options): their lowerings run them.

Running honours the configured device_connection.type (`run`): ALWAYS and
ON_DEMAND compute; PRE_COMPILE returns zeros of the output shapes, as
Graphcore documents; NEVER raises DeviceNotAttachedError. Those zeros
are no result: a caller that writes a program's outputs back into state
(variables, optimizer slots) asks `programs_compute()` first.
"""

import dataclasses
import logging

import numpy as np

from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler import engine_choice
from keras_ipu.device.compiler import control_flow
from keras_ipu.device.compiler import concurrent_steps
from keras_ipu.device.compiler.concurrent_steps import concurrent_program
from keras_ipu.device.compiler.early_updates import early_program
from keras_ipu.device.compiler.demotion import check_integer_range
from keras_ipu.device.compiler.donation import donatable_operands
from keras_ipu.device.compiler.donation import owned_values
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.lowering import ALIGNED_OUTPUT_LOWERINGS
from keras_ipu.device.compiler.lowering import ORDERED_OUTPUT_LOWERINGS
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.compiler.straight_line import straight_line
from keras_ipu.device import liveness
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.units import fmt_bytes as _fmt_bytes
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import ipus_of
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Var
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.enums import DeviceConnectionType
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import profile
from keras_ipu.device.simulator.prediction import host_traffic

FORMAT_VERSION = 4

logger = logging.getLogger("keras_ipu.device")

_ALWAYS = DeviceConnectionType.ALWAYS


def run_program(program, nodes, n_inputs):
    """The run loop's steps of `program` (one step per node of `nodes`, its
    first `n_inputs` slots the program's inputs):
    in-place updates moved up to their operands (early_updates.py), and on
    several threads independent steps launched beside the next ones, an
    update with the product making its gradient (concurrent_steps.py); there
    an update moves only into that product's job or right after a step
    that runs alone."""
    if host_threads.max_threads() < 2:
        return early_program(program, nodes)[0]

    def moves(j, after):
        # Right after a step that runs alone (a split product) the update
        # keeps nothing from running at once.
        return (concurrent_steps.is_barrier(nodes[after])
                or concurrent_steps.pairs_with(program, nodes, j, after, n_inputs))

    return concurrent_program(*early_program(program, nodes, moves), n_inputs)


def programs_compute():
    """False when the configured system only compiles (PRE_COMPILE): a run
    returns zeros of the output shapes, which must not become new state
    (NEVER raises when run)."""
    current = system_config.configured_system()
    return current is None or current.executes


class DeviceNotAttachedError(RuntimeError):
    """Running a program on a system that compiles only (NEVER)."""


def _fmt_param(value):
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, Graph):
        return "{...}"
    if isinstance(value, tuple) and value and isinstance(value[0], Graph):
        return "(" + " ".join("{...}" for _ in value) + ")"
    return repr(value)


def _frozen(value):
    """A private read-only copy of a constant: the program keeps the value
    it was traced with even if the caller later mutates their array, and a
    kernel can never write into it."""
    array = np.array(value, copy=True)
    array.setflags(write=False)
    return array


def _with_private_constants(graph):
    """`graph` with every constant (Literal) a private read-only copy
    (_frozen), one per distinct value."""
    copies = {}

    def private(operand):
        if type(operand) is not Literal:
            return operand
        key = id(operand.value)
        if key not in copies:
            copies[key] = Literal(_frozen(operand.value))
        return copies[key]

    nodes = [
        copy_node(node, [private(v) for v in node.inputs])
        if any(type(v) is Literal for v in node.inputs) else node
        for node in graph.nodes
    ]
    out = rebuilt(graph, nodes, {})
    out.outputs = [private(v) for v in graph.outputs]
    return out


def _reader_transpose(graph, live, node):
    """The permutation of the transpose that is the one reader of `node`'s
    one result (not a program output), or None."""
    if len(node.outputs) != 1:
        return None
    v = node.outputs[0]
    if not live.read_once(v):
        return None
    reader = graph.nodes[live.readers[v][0]]
    if reader.primitive.name != "transpose":
        return None
    return tuple(reader.params["permutation"])


def _host_bytes(var):
    return (var.aval.nbytes or 0,)


class Executable:
    """A compiled program: `run(*arrays)` -> list of NumPy arrays.

    After compile_graph: `target` (the IPUTarget it was compiled for),
    `memory` (memory_model.MemoryReport of its fullest IPU), `memory_by_ipu`
    ({IPU: MemoryReport}), `prediction` (prediction.Prediction, computed on
    first use; `ipu_cycles` per IPU), `predict(batch_size=, steps_per_run=)`.
    """

    # Set by device_checks for programs compile_graph makes; control-flow
    # bodies keep these defaults.
    target = None
    memory = None  # the MemoryReport of the fullest IPU
    memory_by_ipu = None  # {IPU: MemoryReport}
    workload = None  # device_checks.workload(...) of the compiling caller
    pipeline = None  # a pipelined program's CompileOptions.pipeline
    _prediction = None
    # A program split over the IPUs of a mesh axis: its SplitProgram
    # (compiler/tensor_parallel.py), whose one-IPU part is predicted.
    tensor_parallel = None
    _running_graph = None  # made when first asked for (running_graph)
    # What computes run()'s values (engine_choice.runner: NumPy, XLA or tiered),
    # chosen at the first run.
    _engine_run = None
    # The most threads its kernels split over, or None (the process' policy:
    # threads.max_threads): 1 for a program each thread of a split runs
    # whole (a scan's row block: scan_rows.py). Kept when pickled: an
    # unpickled program is lowered again.
    thread_cap = None

    def __init__(self, graph, notes=(), passes=(), behaviour=None, name=None,
                 donated_inputs=(), subprograms=None):
        self.fp_behaviour = behaviour
        # {step index: compiled sub-graphs} of control-flow steps
        # (control_flow.compile_bodies), given to their lowerings.
        self.subprograms = dict(subprograms or {})
        self.name = name
        self.graph = _with_private_constants(graph)
        self.in_avals = tuple(v.aval for v in graph.inputs)
        self.out_avals = tuple(v.aval for v in graph.outputs)
        self.notes = tuple(notes)  # what the demotion changed, for reports
        self.passes = tuple(passes)  # (pass name, nodes after it)
        live = liveness.analyze(self.graph)
        self.constant_bytes = live.constant_bytes
        # Host buffers live at once (inputs until their last use).
        host = liveness.peak(self.graph, _host_bytes, inputs_live=True, liveness=live)
        self.peak_live_bytes = max(
            sum(a.nbytes or 0 for a in self.in_avals), host.maxima[0] if host else 0)
        self._note_ownership(self.graph, donated_inputs)
        self._bind(live)

    def _note_ownership(self, graph, donated_inputs):
        """What donation (donation.py) means for this program: the inputs its
        kernels may write into (`written_inputs`), which of its outputs are
        arrays it owns (`owned_outputs`: allocated by a kernel, or a donated
        input passed through; a loop may then update them in place), and
        for each loop that updates its carries in place the initial carries
        it owns (`owned_operands`)."""
        self.donated_inputs = tuple(donated_inputs)
        input_index = {v: k for k, v in enumerate(graph.inputs)}
        owned = owned_values(graph, donated_inputs)
        donate = donatable_operands(graph, donated_inputs, owned)
        self.owned_operands = {}
        written = set()
        for i, node in enumerate(graph.nodes):
            positions = node.params.get("donate", ())
            if node.primitive.carries_in_place:
                n_carry = node.primitive.carry_count(node.params)
                positions = tuple(k for k in donate.get(i, ()) if k < n_carry)
                self.owned_operands[i] = positions
            for k in positions:
                if node.inputs[k] in input_index:
                    written.add(input_index[node.inputs[k]])
        self.written_inputs = frozenset(written)
        seen = set()
        owned_outputs = []
        for v in graph.outputs:
            owned_outputs.append(type(v) is Var and v in owned and v not in seen)
            seen.add(v if type(v) is Var else id(v))
        self.owned_outputs = tuple(owned_outputs)

    # -- lowering to the run loop ----------------------------------------
    def _number_slots(self):
        """Slot of every Var, then of every distinct constant (by the
        identity of its value), then of the node outputs; the constants
        by slot."""
        graph = self.graph
        slot_of = {v: k for k, v in enumerate(graph.inputs)}
        constants = {}
        const_slot = {}
        literals = [v for node in graph.nodes for v in node.inputs if type(v) is Literal]
        literals += [v for v in graph.outputs if type(v) is Literal]
        for lit in literals:
            if id(lit.value) not in const_slot:
                const_slot[id(lit.value)] = len(slot_of) + len(constants)
                constants[const_slot[id(lit.value)]] = lit.value
        base = len(slot_of) + len(constants)
        for node in graph.nodes:
            for v in node.outputs:
                slot_of[v] = base
                base += 1

        def slot(operand):
            if type(operand) is Literal:
                return const_slot[id(operand.value)]
            return slot_of[operand]

        return slot, base, constants

    def _bind(self, live=None):
        with host_threads.capped(self.thread_cap):
            self._lower(live)

    def _lower(self, live=None):
        graph = self.graph
        slot, n_slots, constants = self._number_slots()
        live = live or liveness.analyze(graph)
        self.constants = constants  # slot -> ndarray
        self.output_slots = tuple(slot(v) for v in graph.outputs)
        template = [None] * n_slots
        for s, value in constants.items():
            value.setflags(write=False)  # unpickled arrays come back writable
            template[s] = value
        self._template = template
        behaviour = self.fp_behaviour
        wrap = device_checks.kernel_wrapper(behaviour)
        program = []
        kernels = []
        frees_of = []
        returned = {v for v in graph.outputs if type(v) is Var}
        for i, node in enumerate(graph.nodes):
            prim, params = node.primitive, node.params
            if i in self.subprograms:
                params = dict(params, compiled=self.subprograms[i])
            if i in self.owned_operands:  # a loop: its owned initial carries
                params = dict(params, owned_carry=self.owned_operands[i])
            if prim.name in ALIGNED_OUTPUT_LOWERINGS:
                # Returned arrays aligned as TensorFlow's tensors are: the
                # TensorFlow front end hands them to tf.Variables uncopied.
                # Those no later step reads go straight to memory.
                aligned = tuple(k for k, v in enumerate(node.outputs) if v in returned)
                params = dict(params, aligned_outputs=aligned, streamed_outputs=tuple(
                    k for k in aligned if not live.readers.get(node.outputs[k])))
            if prim.name in ORDERED_OUTPUT_LOWERINGS and wrap is None:
                # Not under a floating-point behaviour: its checks call the
                # eager kernel with the node's params.
                order = _reader_transpose(graph, live, node)
                if order is not None:
                    params = dict(params, output_order=order)
            in_avals = tuple(v.aval for v in node.inputs)
            out_avals = tuple(v.aval for v in node.outputs)
            kernel = lower(prim, params, in_avals, out_avals)
            kernels.append(kernel)
            if wrap is not None:
                kernel = wrap(kernel, prim, params, in_avals, out_avals,
                              node.source, behaviour)
            ins = tuple(slot(v) for v in node.inputs)
            outs = tuple(slot(v) for v in node.outputs)
            frees = tuple(sorted(slot(v) for v in live.dying_after(i)))
            frees_of.append(frees)
            multi = prim.multiple_results
            program.append((kernel, ins, outs if multi else outs[0], multi, frees))
        self._program = tuple(program)
        # What the run loop runs: in-place updates right after their
        # operands (early_updates.py) on one thread, independent steps at
        # once (concurrent_steps.py) on more; not under a floating-point
        # behaviour (the program's order).
        self._run_program = (self._program if wrap is not None
                             else run_program(self._program, graph.nodes,
                                              len(graph.inputs)))
        self._kernels = tuple(kernels)  # unwrapped, for printing
        self._frees = tuple(frees_of)
        self._n_inputs = len(self.in_avals)
        self._in_dtypes = tuple(a.dtype for a in self.in_avals)
        self._in_shapes = tuple(a.shape for a in self.in_avals)
        # Constants returned as outputs are copied, and a value returned
        # twice is returned as two arrays: the caller owns its results.
        self._output_plan = tuple(
            (s, s in self.constants or s in self.output_slots[:k])
            for k, s in enumerate(self.output_slots)
        )
        # The run loop as straight-line code (straight_line.py), or None
        # (a very long program: the loop over _run_program runs it).
        self._run_straight = self.straight_line(self._run_program)

    def straight_line(self, steps, extra_inputs=()):
        """run_unchecked's function for `steps` (this program's steps, in
        program order or the run loop's) as straight-line code, or None.
        `extra_inputs`: slots past this program's, given after its inputs."""
        return straight_line(steps, self._n_inputs, self.constants, self._output_plan,
                             name=self.name or "program", extra_inputs=extra_inputs)

    @property
    def steps(self):
        """The program's steps: the nodes of its graph, in order."""
        return self.graph.nodes

    @property
    def ipus(self):
        """The IPUs it runs on ((0,) unless placed on several:
        compiler/placement.py)."""
        return ipus_of(self.graph)

    @property
    def running_graph(self):
        """The program as it runs: `graph` whose control-flow nodes hold the
        compiled bodies (`subprograms`, optimized apart: their elementwise
        chains fused) in place of the traced ones, down every level. The
        simulator reads this one (memory_model.graph_of)."""
        if self._running_graph is None:
            self._running_graph = control_flow.with_bodies(
                self.graph, self.subprograms, lambda exe: exe.running_graph)
        return self._running_graph

    def __getstate__(self):
        state = dict(self.__dict__)
        for key in (
            "_template", "_program", "_run_program", "_run_straight", "_kernels", "_frees",
            "_n_inputs",
            "_in_dtypes",
            "_in_shapes", "_output_plan", "_zeros_noted", "_engine_run", "constants",
            "output_slots", "_running_graph",
        ):
            state.pop(key, None)
        state["format_version"] = FORMAT_VERSION
        return state

    def __setstate__(self, state):
        version = state.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"executable format {version} (this keras_ipu reads "
                f"{FORMAT_VERSION})"
            )
        self.__dict__.update(state)
        self._bind()

    # -- running ---------------------------------------------------------
    def _check_inputs(self, arrays, start=0):
        """`arrays` as the program's inputs from `start` on (cast where a
        demoted dtype allows it), or the error naming the input."""
        if start + len(arrays) != self._n_inputs:
            raise TypeError(
                f"The executable takes {self._n_inputs} inputs "
                f"({', '.join(a.short() for a in self.in_avals)}); got "
                f"{start + len(arrays)}."
            )
        out = []
        for i, x, dtype, shape in zip(
            range(start, self._n_inputs), arrays, self._in_dtypes[start:], self._in_shapes[start:]
        ):
            x = np.asarray(x)
            if x.shape != shape:
                raise ValueError(
                    f"Input {i} has shape {x.shape}, but the executable was "
                    f"compiled for {self.in_avals[i].short()}. Compile again "
                    "for the new shape (jit does this for you)."
                )
            if x.dtype != dtype:
                # A demoted input (float64 -> float32) or a same-kind cast.
                if not np.can_cast(x.dtype, dtype, "same_kind"):
                    raise TypeError(
                        f"Input {i} has dtype {x.dtype}, but the executable "
                        f"was compiled for {self.in_avals[i].short()}. Cast "
                        "the input, or compile again for its dtype."
                    )
                if dtype.kind in "iu" and x.dtype.kind in "iu":
                    # Demoted int64: never wrap a value silently.
                    check_integer_range(i, x, dtype)
                x = x.astype(dtype)
            out.append(x)
        return out

    # -- what the compiler learnt about it -------------------------------
    @property
    def prediction(self):
        """The predicted cycles (prediction.Prediction) on `target`, made
        once, when first asked for."""
        if self._prediction is None:
            self._prediction = device_checks.predict(self)
        return self._prediction

    @prediction.setter
    def prediction(self, value):
        self._prediction = value

    def predict(self, batch_size=None, steps_per_run=None,
                resident_inputs=None, resident_outputs=None):
        """The prediction for a workload (samples per step, training steps
        per run, which inputs and outputs stay on the IPU between runs:
        weights and optimizer state), kept as `prediction`; cheap: no step
        is costed again."""
        pred = self.prediction
        changes = {}
        if batch_size is not None:
            changes["batch_size"] = batch_size
        if steps_per_run is not None:
            changes["steps_per_run"] = max(1, int(steps_per_run))
        if resident_inputs is not None or resident_outputs is not None:
            bytes_in, bytes_out, seconds = host_traffic(
                self.in_avals, self.out_avals, pred.target,
                resident_inputs or (), resident_outputs or (),
            )
            changes.update(host_bytes_in=bytes_in, host_bytes_out=bytes_out,
                           host_seconds=seconds)
        if changes:
            pred = dataclasses.replace(pred, **changes)
            self._prediction = pred
        return pred

    # -- running ---------------------------------------------------------
    def run(self, *arrays):
        current = system_config.configured_system()
        if current is not None and current.connection is not _ALWAYS:
            if not self._attach(current):
                self._check_inputs(arrays)
                return [np.zeros(a.shape, a.dtype) for a in self.out_avals]
        if profile.RUN_LISTENERS:
            return self._run_noted(arrays)
        with np.errstate(all="ignore"):
            return self._engine(self._check_inputs(arrays))

    def run_resident(self, resident, arrays):
        """run(*resident, *arrays) for a program whose first inputs,
        `resident`, are NumPy arrays it returned itself in an earlier run (a
        training state kept between runs, as it stays on the IPU): they are
        checked by their shapes and dtypes alone, and go through run()'s
        checks and casts only when those differ from the program's; the
        rest, `arrays` (the batches), are checked as run() checks them."""
        n = len(resident)
        if (
            [(a.shape, a.dtype) for a in resident]
            != list(zip(self._in_shapes[:n], self._in_dtypes[:n]))
            or profile.RUN_LISTENERS
        ):
            return self.run(*resident, *arrays)
        current = system_config.configured_system()
        if current is not None and current.connection is not _ALWAYS:
            return self.run(*resident, *arrays)
        checked = self._check_inputs(arrays, start=n)
        with np.errstate(all="ignore"):
            return self._engine([*resident, *checked])

    def _engine(self, arrays):
        run = self._engine_run
        if run is None:
            run = self._engine_run = engine_choice.runner(self)
        return run(arrays)

    def _run_noted(self, arrays):
        import time

        start = time.perf_counter()
        with np.errstate(all="ignore"):
            outs = self._engine(self._check_inputs(arrays))
        profile.note_run(self, start, time.perf_counter())
        return outs

    def _attach(self, system):
        """Whether this run computes values (device_connection.type)."""
        connection = system.connection
        if connection == DeviceConnectionType.NEVER:
            raise DeviceNotAttachedError(
                f"Cannot run {self.name or 'this program'} (compiled for "
                f"{getattr(self.target, 'name', 'the IPU')}): no IPU device is "
                "attached, because the IPU system is configured with "
                "device_connection.type = DeviceConnectionType.NEVER, which "
                "compiles programs (and fills the executable cache) but never "
                "attaches to a device. To run it, set "
                "config.device_connection.type = DeviceConnectionType.ALWAYS (or "
                "ON_DEMAND) and call configure_ipu_system(config) again."
            )
        if connection == DeviceConnectionType.PRE_COMPILE:
            if not getattr(self, "_zeros_noted", False):
                self._zeros_noted = True
                logger.warning(
                    "device_connection.type is PRE_COMPILE: %s was compiled "
                    "(and cached) but not run; its outputs are all zeros. Run it "
                    "with device_connection.type ALWAYS or ON_DEMAND.",
                    self.name or repr(self),
                )
            return False
        system.attach()  # ON_DEMAND: attach at the first run
        return True

    def run_unchecked(self, arrays):
        """run() for a list of ndarrays known to match the input avals (a
        loop body called by its control-flow kernel); no errstate either."""
        run = self._run_straight
        if run is not None:
            return run(arrays)
        return self.run_steps(self._run_program, arrays)

    def run_steps(self, steps, arrays):
        """run_unchecked as a loop over `steps` (what the straight-line
        function computes, for a program too long to write out)."""
        env = self._template[:]
        env[: self._n_inputs] = arrays
        for kernel, ins, out, multi, frees in steps:
            if multi:
                results = kernel(*[env[i] for i in ins])
                for s, value in zip(out, results):
                    env[s] = value
            else:
                env[out] = kernel(*[env[i] for i in ins])
            for s in frees:
                env[s] = None
        return [
            np.array(env[s]) if constant else np.asarray(env[s])
            for s, constant in self._output_plan
        ]

    __call__ = run

    # -- printing --------------------------------------------------------
    def __str__(self):
        n_in = len(self.in_avals)
        slot, _, _ = self._number_slots()

        def name(s):
            if s < n_in:
                return f"in{s}"
            if s in self.constants:
                c = self.constants[s]
                short = ShapedArray(c.shape, c.dtype).short()
                if c.size <= 4:
                    return f"{c.tolist()!r}:{short}"
                return f"c{s}:{short}"
            return f"s{s}"

        lines = [
            f"Executable: {n_in} inputs, {len(self.out_avals)} outputs, "
            f"{len(self.steps)} steps, peak live "
            f"{_fmt_bytes(self.peak_live_bytes)}, constants "
            f"{_fmt_bytes(self.constant_bytes)}",
            "  inputs: "
            + " ".join(f"in{i}:{a.short()}" for i, a in enumerate(self.in_avals)),
        ]
        for node, kernel, frees in zip(self.steps, self._kernels, self._frees):
            lhs = " ".join(f"s{slot(v)}:{v.aval.short()}" for v in node.outputs)
            shown = {k: v for k, v in node.params.items() if k not in ("chain", "results")}
            p = ""
            if shown:
                p = "[" + " ".join(f"{k}={_fmt_param(v)}" for k, v in shown.items()) + "]"
            args = " ".join(name(slot(v)) for v in node.inputs)
            line = f"  {lhs} = {node.primitive.name}{p} {args}"
            if frees:
                line += "    ; free " + " ".join(name(s) for s in frees)
            lines.append(line)
            source = getattr(kernel, "source", None)
            if source is not None:  # a fused kernel: show its generated code
                lines.extend("      | " + ln.strip() for ln in source.splitlines()[2:])
                if getattr(kernel, "native", False):
                    whole = getattr(kernel, "whole_chain", None)
                    how = f"its own loop ({whole})" if whole else "one pass"
                    lines.append(f"      | (runs in {how}, in C: native_fusion.py)")
            for label, sub in getattr(kernel, "subprograms", {}).items():
                lines.append(f"      {label}:")
                lines.extend("        " + ln for ln in str(sub).splitlines())
        lines.append("  outputs: " + " ".join(name(s) for s in self.output_slots))
        return "\n".join(lines)

    def __repr__(self):
        return (
            f"<Executable {len(self.steps)} steps: "
            f"({', '.join(a.short() for a in self.in_avals)}) -> "
            f"({', '.join(a.short() for a in self.out_avals)})>"
        )
