"""A TensorFlow function compiled for the simulated IPU through XLA.

    step = bridge(tf_function)        # or a plain Python function of TF ops
    outputs = step(*args)             # one executable run per call

Per call: TensorFlow traces the function (its own cache decides when to
retrace); the first time a trace is seen, TensorFlow's tf2xla bridge lowers
it to HLO (the program TensorFlow would hand to XLA: `jit_compile=True`,
stage "hlo"), the importer turns the HLO into a keras_ipu graph and the
compiler makes an Executable for the configured IPU system. The run reads
the function's tensor arguments and the variables it uses, runs the
executable on the simulated IPU, writes every variable the function
updated (XLA reports them as outputs aliased to their inputs) and returns
the function's outputs as TensorFlow tensors.

XLA decides what compiles: an op with no XLA kernel fails with
TensorFlow's own message, as on the IPU. Graphcore's SDK does the same
(TensorFlow -> XLA -> Poplar); see 003_*.txt of the reference.
"""

import dataclasses
import threading
import weakref

import numpy as np

from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler.cache import CACHE
from keras_ipu.device.compiler.executable import programs_compute
from keras_ipu.device.interrupts import deferred_interrupts
from keras_ipu.device.jit import note_recompiles
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.placement import recorded_stages
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator.system import rounded_shards
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow import variable_categories
from keras_ipu.frontends.tensorflow.captured_variables import CapturedInputs
from keras_ipu.frontends.tensorflow.captured_variables import assign
from keras_ipu.frontends.tensorflow.captured_variables import is_resource
from keras_ipu.frontends.tensorflow.captured_variables import value_of
from keras_ipu.frontends.tensorflow.importer import import_module
from keras_ipu.ops.pipeline_placement import PipelinePlacement

_state = threading.local()


def tracing_for_ipu():
    """True while the front end is tracing a function for the IPU (the
    compat entry points, loops and queues check it)."""
    return getattr(_state, "depth", 0) > 0


class _Tracing:
    def __enter__(self):
        _state.depth = getattr(_state, "depth", 0) + 1

    def __exit__(self, *exc):
        _state.depth -= 1


def _tf():
    import tensorflow as tf

    return tf


def as_xla_function(fn):
    """`fn` as a tf.function that compiles with XLA: a tf.function with
    jit_compile=True as it is; another tf.function recompiled with it; a
    Python function wrapped."""
    tf = _tf()
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    if isinstance(fn, polymorphic_function.Function):
        if fn._jit_compile:  # noqa: SLF001 - no public accessor
            return fn
        return tf.function(fn.python_function, jit_compile=True,
                           reduce_retracing=False)
    return tf.function(fn, jit_compile=True)


@dataclasses.dataclass
class Program:
    """One trace of the function (for given values of the arguments XLA
    takes as compile-time constants), imported and compiled."""

    graph: object  # the imported keras_ipu graph
    param_inputs: tuple  # per HLO parameter: its position among the inputs
    n_outputs: int  # the function's own outputs (then the updated variables)
    updates: tuple  # per updated variable: (output position, input position)
    uses_token: bool
    structured_outputs: object
    name: str
    resident: tuple  # graph inputs that stay on the IPU (variables)
    input_categories: tuple = ()  # per graph input (variable_categories)
    cache_key: object = None  # of its executable in CACHE
    context: object = None
    trace: object = None
    options: object = None  # its own CompileOptions (a placed pipeline), else the function's
    pipeline: object = None  # the ops.pipeline_runs.PipelineRun it holds, if any
    placement: object = None  # its ops.pipeline_placement.PipelinePlacement, if placed


@dataclasses.dataclass
class _Trace:
    """A TensorFlow trace: its inputs (flat arguments, then captured
    values), which of them XLA bakes in as constants, one Program per value
    of those, and the reads and writes of its captured variables."""

    constant_inputs: tuple
    programs: dict
    captured: object  # captured_variables.CapturedInputs


class BridgedFunction:
    """`fn` (a tf.function or a Python function of TensorFlow ops) run on
    the simulated IPU through XLA; see the module doc.

    `placement` (ops/pipeline_placement.PipelinePlacement: a rule from
    TensorFlow op name to pipeline stage, such as stages.pipeline_stage_of,
    the IPU of each stage, and a pipeline's schedule) compiles the program
    placed: each node on its op's stage, with the copies between IPUs,
    memory and cycles per IPU (stages.py), predicted under the schedule.
    `stage_of` and `device_mapping` say the same of a program placed but
    not pipelined. A program holding a functional pipeline is placed by
    the record its pipeline makes (pipeline_simulation.placement_of).
    """

    def __init__(self, fn, options=None, stage_of=None, device_mapping=None,
                 placement=None):
        self.python_function = fn
        self.tf_function = as_xla_function(fn)
        self.options = options or CompileOptions(demote_64bit=False)
        if placement is None and stage_of is not None:
            placement = PipelinePlacement.of(device_mapping, stage_of=stage_of)
        self.placement = placement
        self._traces = weakref.WeakKeyDictionary()
        # (argument shapes and dtypes, TensorFlow's function context) -> the
        # concrete function TensorFlow traced for them (_find_trace).
        self._by_signature = {}
        self._pipelines = weakref.WeakKeyDictionary()  # cf -> its PipelineRuns
        self.__name__ = getattr(fn, "__name__", "tf_function")
        self.compile_count = 0
        # Set by a caller that knows some variables better than their names
        # tell (the Keras trainer: its metrics'): () -> {id(tf.Variable): category}.
        self.known_variables = None

    # -- tracing and compiling --------------------------------------------

    def concrete(self, *args, **kwargs):
        from keras_ipu.ops.pipeline_runs import recording

        # A functional pipeline traced here records what its placement
        # needs (ops/pipeline_simulation.py); TensorFlow traces once per cf.
        with _Tracing(), recording() as runs:
            cf = self.tf_function.get_concrete_function(*args, **kwargs)
        if runs:
            self._pipelines[cf] = tuple(runs)
        return cf

    def flat_inputs(self, cf, args, kwargs):
        """The inputs of a call: flat tensor arguments, then captured values."""
        from tensorflow.python.eager.polymorphic_function import function_type_utils

        # As tf.function's own call: bound first by the function's type,
        # which fills in the parameters' defaults (a trace's type has none:
        # a call leaving one out would not bind), then by the trace's.
        fn = self.tf_function
        bound = function_type_utils.canonicalize_function_inputs(
            args, kwargs, fn._function_type, fn._default_values)  # noqa: SLF001 - no public accessor
        bound = cf.function_type.bind(*bound.args, **bound.kwargs)
        return list(cf.function_type.unpack_inputs(bound)), list(cf.captured_inputs)

    def program(self, args, kwargs=None, replicas=1):
        """(concrete function, inputs, arrays, Program) of a call with `args`
        and `kwargs` on `replicas` replicas; the Program is compiled on
        first use."""
        kwargs = kwargs or {}
        cf, flat, captured = self._find_trace(args, kwargs)
        trace = self._traces.get(cf)
        flat_arrays = [value_of(x) for x in flat]
        if trace is None:
            captured_arrays = [value_of(x) for x in captured]
        else:
            captured_arrays = trace.captured.read()
        arrays = flat_arrays + captured_arrays
        key = None if trace is None else (replicas, _constant_key(arrays, trace.constant_inputs))
        program = None if trace is None else trace.programs.get(key)
        if program is None:
            program, constants = self._import(cf, flat, captured, arrays, replicas)
            if trace is None:
                trace = self._traces[cf] = _Trace(constants, {}, CapturedInputs(captured, captured_arrays))
            trace.programs[(replicas, _constant_key(arrays, constants))] = program
        program.trace = trace
        return cf, flat + captured, arrays, program

    def _find_trace(self, args, kwargs):
        """(concrete function, flat arguments, captured inputs) of a call.

        TensorFlow finds a call's trace by hashing the function's type, its
        captures included: about 1.2 ms per call for a training step with
        hundreds of variables. A call from eager code whose arguments are
        all arrays or eager tensors (what TensorFlow traces by shape and
        dtype alone) takes the trace TensorFlow gave the same shapes and
        dtypes in the same TensorFlow context; any other call asks
        TensorFlow. The arguments are flattened (and converted) by
        TensorFlow either way."""
        fast = None if kwargs else _array_signature(args)
        cf = None
        if fast is not None:
            from tensorflow.python.eager.polymorphic_function import function_context

            fast = (fast, function_context.make_function_context())
            cf = self._by_signature.get(fast)
        if cf is None:
            cf = self.concrete(*args, **kwargs)
            if fast is not None:
                if len(self._by_signature) >= _SIGNATURES_KEPT:
                    self._by_signature.clear()
                self._by_signature[fast] = cf
        flat, captured = self.flat_inputs(cf, args, kwargs)
        return cf, flat, captured

    def hlo_module(self, cf, flat, captured):
        from tensorflow.python.eager import context

        with _Tracing():
            serialized = context.context().get_compiler_ir(
                device_name=None, platform_name="CPU", function_name=cf.name,
                flat_args=list(flat), captured_inputs=list(captured),
                stage="hlo_serialized")
        return hlo_proto.parse_module(serialized)

    def _import(self, cf, flat, captured, arrays, replicas=1):
        module = self.hlo_module(cf, flat, captured)
        imported = import_module(module, replicas=replicas)
        graph = imported.graph
        options = pipeline = None
        placement = self.placement
        if placement is None:
            from keras_ipu.ops import pipeline_simulation

            pipeline = pipeline_simulation.the_pipeline(self._pipelines.get(cf))
            if pipeline is not None:
                placement = pipeline_simulation.placement_of(pipeline)
            elif recorded_stages(graph):
                # ipu_shard marked ops (the importer's stages): shard s on IPU s.
                placement = PipelinePlacement.of(None)
        if placement is not None:
            graph = placement.staged(graph)
            options = placement.options(self.options)
        param_avals = [(tuple(v.aval.shape), v.aval.dtype)
                       for v in imported.graph.inputs[:imported.n_params]]
        input_avals = [(tuple(a.shape), a.dtype) for a in arrays]
        param_inputs = _align(param_avals, input_avals, self.__name__)
        constants = tuple(i for i in range(len(arrays)) if i not in param_inputs)
        n_outputs = len(cf.outputs)
        aliases = {tuple(e.output_shape_index): e.parameter_number
                   for e in module.input_output_alias.entries}
        # One output is returned bare (shape index ()), several as a tuple.
        single = not isinstance(imported.output_structure, tuple)
        updates = []
        for k in range(n_outputs, imported.n_outputs):
            param = aliases.get(() if single else (k,))
            if param is None:
                raise NotImplementedError(
                    f"{self.__name__}: output {k} of the XLA program is neither a "
                    "function output nor a variable update."
                )
            updates.append((k, param_inputs[param]))
        inputs = list(flat) + list(captured)
        resident = tuple(p for p, i in enumerate(param_inputs) if is_resource(inputs[i]))
        by_handle = {id(v.handle): v for v in cf.variables}
        kinds = variable_categories.categories(
            [variable_categories.variable_of(inputs[i], by_handle) for i in param_inputs],
            self.known_variables() if self.known_variables else None)
        self.compile_count += 1
        note_recompiles(self.__name__, self.compile_count, input_avals[:len(flat)], CACHE.capacity)
        program = Program(
            graph=graph, param_inputs=tuple(param_inputs), n_outputs=n_outputs,
            updates=tuple(updates), uses_token=imported.uses_token,
            structured_outputs=cf.structured_outputs, name=self.__name__,
            resident=resident, options=options, pipeline=pipeline, placement=placement,
            input_categories=kinds + ((variable_categories.ARGUMENT,) * imported.uses_token),
        )
        return program, constants

    def executables(self):
        """The Executables compiled for this function so far and still in
        the cache (memory, prediction, profile: as for any keras_ipu
        program)."""
        found = (CACHE.peek(p.cache_key) for trace in list(self._traces.values())
                 for p in trace.programs.values() if p.cache_key is not None)
        return [exe for exe in found if exe is not None]

    def executable(self, program):
        # The program keeps the cache key, not the executable: the cache
        # alone holds executables, so a function called with many shapes
        # keeps at most the cache's capacity alive (a dropped one compiles
        # again, or loads from the disk cache).
        context = system_config.configuration()
        exe = None
        if program.cache_key is not None and program.context is context:
            exe = CACHE.lookup(program.cache_key)
        if exe is None:
            # The variables stay on the IPU between runs, as Graphcore's
            # resource variables do: not host transfers; the profile report
            # splits them into weights and optimizer state. A caller that
            # knows the samples and steps of a run (the tf.keras trainer)
            # has said so around the call.
            with device_checks.workload(**{
                    **device_checks.current_workload(),
                    "resident_inputs": program.resident,
                    "resident_outputs": tuple(k for k, _ in program.updates),
                    "input_categories": program.input_categories}):
                program.cache_key, exe = CACHE.get_keyed(
                    program.graph, program.options or self.options, name=program.name)
            program.context = context
            # Graphcore's compiler refuses a program whose shards (rounded
            # up to a power of two) do not divide the device's IPUs (its
            # replicas are the quotient).
            system_config.current_system().device(0).replication_factor(
                rounded_shards(max(exe.ipus) + 1))
            if program.pipeline is not None:
                from keras_ipu.ops.pipeline_simulation import check_before_first_run

                check_before_first_run(exe, program.pipeline)
        return exe

    # -- running --------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.run(args, kwargs)

    def run(self, args, kwargs=None, replicas=1):
        """Run the function on `replicas` replicas of its program (SPMD: each
        replica in its own host thread, meeting in collectives, reading its
        own infeed elements; simulator/replicas.py). Returns replica 0's
        outputs; the variables get replica 0's values."""
        cf, inputs, arrays, program = self.program(args, kwargs, replicas)
        feed = [arrays[i] for i in program.param_inputs]
        if program.uses_token:
            feed.append(np.zeros((), np.uint32))
        exe = self.executable(program)
        if replicas == 1:
            results = list(exe.run(*feed))
        else:
            from keras_ipu.device.simulator.replicas import run_replicated

            results = list(run_replicated(lambda *xs: exe.run(*xs), [feed] * replicas)[0])
        if not programs_compute():  # PRE_COMPILE's zeros are no new values
            return _pack(program.structured_outputs, results[:program.n_outputs])
        captured = program.trace.captured
        n_flat = len(inputs) - captured.n
        positions, values = [], []
        # A Ctrl-C waits until every variable this run updates is stored.
        with deferred_interrupts(f"the variable updates of {self.__name__}"):
            for out_pos, in_pos in program.updates:
                if in_pos < n_flat:
                    assign(inputs[in_pos], results[out_pos])
                else:
                    positions.append(in_pos - n_flat)
                    values.append(results[out_pos])
            if positions:
                captured.write(positions, values)
        return _pack(program.structured_outputs, results[:program.n_outputs])


# Signatures _find_trace remembers per function (then it starts afresh).
_SIGNATURES_KEPT = 64


def _array_signature(args):
    """The shapes and dtypes of `args` when all are NumPy arrays or eager
    tensors (TensorFlow traces those by shape and dtype), else None."""
    signature = []
    for a in args:
        kind = type(a)
        if kind is np.ndarray:
            signature.append((kind, a.shape, a.dtype))
        elif kind.__name__ == "EagerTensor":
            signature.append((kind, a._shape_tuple(), a.dtype))  # noqa: SLF001 - TensorFlow's cheap shape
        else:
            return None
    return tuple(signature)


def _constant_key(arrays, positions):
    return tuple((arrays[i].dtype.str, arrays[i].shape, arrays[i].tobytes()) for i in positions)


def _align(params, inputs, name):
    """The input position of each HLO parameter. XLA drops the inputs it
    takes as compile-time constants (a shape, an axis, a slice start): the
    parameters are the other inputs, in order, with their shapes and
    dtypes. Fails when that leaves more than one choice."""
    if len(params) == len(inputs):
        return list(range(len(inputs)))
    n, m = len(params), len(inputs)
    # ways[i][j]: alignments of params[i:] within inputs[j:]
    ways = [[0] * (m + 1) for _ in range(n + 1)]
    for j in range(m + 1):
        ways[n][j] = 1
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            ways[i][j] = ways[i][j + 1] + (ways[i + 1][j + 1] if params[i] == inputs[j] else 0)
    if ways[0][0] != 1:
        raise NotImplementedError(
            f"{name}: XLA compiled {n} parameters for {m} inputs (arguments and "
            "captured values): some arguments are compile-time constants (a "
            "shape, an axis, a slice start) and which ones cannot be told "
            "apart. Pass such values as Python numbers, not tensors."
        )
    out, j = [], 0
    for i in range(n):
        while not (params[i] == inputs[j] and ways[i + 1][j + 1] == 1 and ways[i][j + 1] == 0):
            j += 1
        out.append(j)
        j += 1
    return out


def _pack(structured, outputs):
    """The function's outputs in its structure, as TensorFlow tensors."""
    tf = _tf()
    it = iter(outputs)
    leaves = tf.nest.flatten(structured, expand_composites=True)
    filled = []
    for leaf in leaves:
        if isinstance(leaf, tf.Tensor):
            filled.append(tf.convert_to_tensor(next(it)))
        elif isinstance(leaf, tf.Operation):
            filled.append(None)
        else:
            filled.append(leaf)
    return tf.nest.pack_sequence_as(structured, filled, expand_composites=True)


_bridged = weakref.WeakKeyDictionary()


def bridge(fn):
    """The BridgedFunction of `fn` (one per function object)."""
    try:
        found = _bridged.get(fn)
    except TypeError:  # not weak-referenceable
        return BridgedFunction(fn)
    if found is None:
        found = BridgedFunction(fn)
        _bridged[fn] = found
    return found
