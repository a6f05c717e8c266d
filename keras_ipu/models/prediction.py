"""What the simulator predicts for training an IPU-extended model: memory
per IPU and stage, cycles per stage, copies between IPUs, the all-reduce
across replicas, the pipeline's bubbles, samples per second.

    pred = predict_training(model, batch_size=8)
    print(pred)              # one row per IPU
    pred.fits, pred.samples_per_second

The program is one micro-batch's training step (forward stage by stage,
loss, backward, the all-reduce of the gradients when replicated, the
weight update), traced and optimized by the compiler's passes but not run
(no data, no IPU memory needed: trace and compile only). Only the shapes
of the model's variables are read: a model built inside
`keras.StatelessScope(initialize_variables=False)` (variables never
allocated) can be predicted too, as the BERT-Large benchmark does. The
compiler's placement pass (device/compiler/placement.py) puts each node on
the IPU of its stage (recorded by the trace; the loss, the optimizer and
the gradients' all-reduce where the values they read are) with the copies
between IPUs, and the simulator's sharding model
(device/simulator/sharding.py) times the placed pipeline:
`gradient_accumulation` micro-batches
per weight update under the schedule, the weight update and the
all-reduce once per step. Replicas run side by side: the system trains
`replicas` times the samples of one pipeline in the same time.
"""

import dataclasses

import numpy as np

from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import optimize
from keras_ipu.device.compiler.placement import Placement
from keras_ipu.device.compiler.placement import on_one_ipu
from keras_ipu.device.compiler.placement import place
from keras_ipu.device.compiler.pipeline import running_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.pytree import flatten
from keras_ipu.device.pytree import unflatten
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator.feeds import Feeds
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import sharding
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.units import fmt_bytes
from keras_ipu.distribute.replication import tracing_replicas
from keras_ipu.models.offload import program_offload
from keras_ipu.models.recomputation import training_recomputation
from keras_ipu.models.training_step import GRADIENT_ACCUMULATION
from keras_ipu.models.training_step import accumulated_train_step


@dataclasses.dataclass
class TrainingPrediction:
    """The prediction of one model's training on the configured system."""

    model_name: str
    sharded: object  # sharding.ShardedPrediction of one replica
    replicas: int
    batch_size: int  # samples per micro-batch
    device_mapping: tuple  # IPU of each stage
    prefetch_depth: object  # infeed prefetch (None: the default, 1)

    @property
    def gradient_accumulation(self):
        return self.sharded.gradient_accumulation_count

    @property
    def fits(self):
        return self.sharded.fits

    @property
    def step_seconds(self):
        """One weight update: device time and host transfers (which overlap
        when the infeed prefetches, cost_model.overlapped_host_seconds)."""
        device = cost_model.cycles_to_seconds(self.sharded.step_cycles, self.sharded.target)
        return cost_model.overlapped_host_seconds(
            device, self.sharded.host_seconds, self.prefetch_depth)

    @property
    def samples_per_second(self):
        """Of the whole system: every replica's samples."""
        samples = self.batch_size * self.gradient_accumulation * self.replicas
        return samples / self.step_seconds if self.step_seconds else None

    @property
    def utilisation(self):
        return self.sharded.utilisation

    def stages_of_ipu(self, ipu):
        return tuple(s for s, d in enumerate(self.device_mapping) if d == ipu)

    def check_memory(self):
        """Raise IPUOutOfMemoryError naming the IPU and its stages when one
        does not fit."""
        for p in self.sharded.ipus:
            if not p.memory.fits:
                error = memory_model.IPUOutOfMemoryError(p.memory)
                stages = ", ".join(map(str, self.stages_of_ipu(p.ipu)))
                error.args = (f"Pipeline stage(s) {stages} of {self.model_name}: "
                              + error.args[0],)
                error.stages = self.stages_of_ipu(p.ipu)
                raise error

    def __str__(self):
        pred = self.sharded
        fmt = fmt_bytes
        schedule = f", schedule {pred.schedule}" if len(pred.ipus) > 1 else ""
        lines = [
            f"Training {self.model_name} on {pred.target.name}: {len(pred.ipus)} IPU(s) per "
            f"replica x {self.replicas} replica(s), micro-batch {self.batch_size}, "
            f"gradient accumulation {self.gradient_accumulation}{schedule}",
            f"{'ipu':>4} {'stages':<8} {'forward':>12} {'backward':>12} {'update':>10} "
            f"{'stash':>10} {'x':>3} {'memory':>11} {'tile peak':>11}",
        ]
        offloaded = any(p.memory.streamed_bytes for p in pred.ipus)
        if offloaded:
            lines[-1] += f" {'offloaded':>11} {'offload cycles':>14}"
        for p in pred.ipus:
            m = p.memory
            # One IPU: forward and backward are one program (all in "forward").
            backward = f"{p.backward_cycles:>12,}" if len(pred.ipus) > 1 else f"{'(with fwd)':>12}"
            lines.append(
                f"{p.ipu:>4} {','.join(map(str, self.stages_of_ipu(p.ipu))):<8} "
                f"{p.forward_cycles:>12,} {backward} "
                f"{p.weight_update_cycles:>10,} {fmt(p.stash_bytes):>10} {p.in_flight:>3} "
                f"{fmt(m.total_bytes):>11} {fmt(m.tile_bytes):>11}"
                + (f" {fmt(m.streamed_bytes):>11} {p.offload_cycles:>14,}" if offloaded else "")
                + ("" if m.fits else "  OUT OF MEMORY")
            )
        sps = self.samples_per_second
        lines.append(
            f"  {len(pred.copies)} inter-IPU copies ({fmt(pred.copy_bytes)} per micro-batch), "
            f"{pred.step_cycles:,} cycles per weight update, utilisation "
            f"{100 * pred.utilisation:.0f}%, {self.step_seconds * 1e3:,.3f} ms per step"
            + (f", {sps:,.1f} samples/s" if sps else "")
        )
        return "\n".join(lines)


def _sample_batch(model, batch_size):
    """Zero inputs and targets of the model's shapes (only their shapes and
    dtypes are traced)."""
    def zeros(tensor):
        shape = (batch_size,) + tuple(tensor.shape[1:])
        return ShapedArray(shape, np.dtype(tensor.dtype))

    from keras.src import tree

    graph = model._ipu_graph_function()
    x = tree.map_structure(zeros, getattr(graph, "_inputs_struct", graph.inputs))
    losses = getattr(model, "loss", None)
    if not isinstance(losses, (list, tuple)):
        losses = [losses] * len(graph.outputs)

    def target(tensor, loss):
        shape = (batch_size,) + tuple(tensor.shape[1:])
        name = loss if isinstance(loss, str) else type(loss).__name__
        if "sparse" in (name or "").lower():  # integer labels, no class axis
            return ShapedArray(shape[:-1], np.dtype("int32"))
        return ShapedArray(shape, np.dtype(tensor.dtype))

    y = [target(t, loss) for t, loss in zip(graph.outputs, losses)]
    return x, (y if len(y) > 1 else y[0])


def trace_training_step(model, batch_size, replicas=1, batch=None, options=None,
                        micro_batches=1, device_loop=False):
    """The optimized Graph of one training step of `model` (staged when
    pipelined), and the number of its state inputs. `micro_batches` > 1:
    the step fit compiles (training_step.accumulated_train_step): a loop
    over that many micro-batches of `batch_size` samples (stacked along a
    leading axis), the gradients accumulated, then one weight update; else
    one micro-batch's gradients go straight to the update. `batch`: the
    avals of one micro-batch (default: zeros of the model's shapes).
    device_loop: the program of a fit's execution of one step (the device
    loop around the step: what the executable of fit runs, and so predicts)."""
    from keras_ipu.models.functions import staged_step
    from keras_ipu.models.functions import gradient_accumulator_dtype

    if model.optimizer is None:
        raise ValueError(
            f"{model.name} has no optimizer: compile it (loss and optimizer) "
            "before predicting its training."
        )
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    batch = _sample_batch(model, batch_size) if batch is None else batch
    # As fit does before its first step: the compiled loss and metrics make
    # their variables (one loss tracker per output) on their first call, and
    # the state traced below must already hold them (a loop carries it).
    model._symbolic_build(data_batch=batch)
    pipelined = model._ipu_is_pipelined()
    method = model._ipu_options.gradient_accumulation_reduction_method
    stages = model._ipu_variable_stages() if pipelined else None
    # Only shapes and dtypes: the variables' values are never read (a model
    # built in StatelessScope(initialize_variables=False) has none).
    variables = model_state.state_variables(model, model_state.TRAIN_STATE)
    state_avals = [[ShapedArray(tuple(v.shape), np.dtype(v.dtype)) for v in group]
                   for group in variables]
    micro_batches = int(micro_batches)
    step = accumulated_train_step(
        model, micro_batches, method, replicas,
        accumulator_dtype=gradient_accumulator_dtype(model) if micro_batches > 1 else None,
        variable_stages=stages)
    if pipelined:
        step = staged_step(model, step)
    from keras.src import tree

    def stacked(n):
        return lambda a: ShapedArray((n,) + tuple(a.shape), a.dtype)

    if micro_batches > 1:
        batch = tree.map_structure(stacked(micro_batches), batch)
    if device_loop:
        # One run of fit's program: the device loop (trainer_ops/device_loop.py)
        # around one step, as the executable of a fit is compiled.
        from keras_ipu.backend.trainer_ops.device_loop import DeviceLoop

        step = DeviceLoop(step, compiled=True)._make_loop(batch, [])
        batch = tree.map_structure(stacked(1), batch)
    leaves, structure = flatten((tuple(state_avals), batch))
    n_state = len(leaves) - len(flatten(batch)[0])

    def flat_fn(*tracers):
        state_in, data = unflatten(structure, tracers)
        if device_loop:
            # The device loop takes the infeed's arrays flat, Nones left out,
            # as DeviceLoop feeds them (a model with several inputs or
            # outputs has a nested batch).
            data = [x for x in tree.flatten(data) if x is not None]
        logs, new_state = step(state_in, data)
        out, _ = flatten((logs, new_state))
        return out

    with tracing_replicas(replicas):
        graph, _ = trace_flat(flat_fn, leaves)
    if options is None:
        options = CompileOptions(recomputation=training_recomputation(model))
    graph, _ = optimize(graph, options)
    return graph, n_state


def _dtype_name(dtype):
    if dtype is None:
        return None
    from keras import backend

    return backend.standardize_dtype(dtype)


def predict_training(model, batch_size, *, gradient_accumulation=None, schedule=None,
                     device_mapping=None, assignment=None, target=None, replicas=None,
                     batch=None):
    """The TrainingPrediction of `model` (made in an IPUStrategy scope,
    compiled) training with micro-batches of `batch_size` samples.

    Defaults come from the model's options: its stage assignment, device
    mapping, pipeline schedule, gradient accumulation, and the replication
    factor of the configured system. `assignment`: a list of stages, one
    per layer invocation (get_pipeline_stage_assignment order), to predict
    a split without setting it.
    """
    options = model._ipu_options
    if assignment is not None:
        saved = model._ipu_assignment
        object.__setattr__(model, "_ipu_assignment", _assignment_of(model, assignment))
    try:
        pipelined = model._ipu_is_pipelined()
        stages = model._ipu_stage_count()
        if device_mapping is None:
            device_mapping = options.pipelining_device_mapping or list(range(stages))
        if gradient_accumulation is None:
            if pipelined:
                gradient_accumulation = options.pipelining_gradient_accumulation_steps_per_replica
            else:
                gradient_accumulation = options.gradient_accumulation_steps_per_replica
            gradient_accumulation = gradient_accumulation or 1
        if schedule is None:
            schedule = options.pipeline_schedule
        if replicas is None:
            replicas = _replicas_or_one(model)
        graph, n_state = trace_training_step(
            model, batch_size, replicas, batch=batch, micro_batches=gradient_accumulation,
            device_loop=True)
        # Under the assignment predicted: what it offloads depends on
        # whether the model is pipelined.
        offload = program_offload(
            model, model_state.state_variables(model, model_state.TRAIN_STATE), replicas,
            gradient_accumulation)
        pipelining = fit_pipelining(model, gradient_accumulation, schedule)
    finally:
        if assignment is not None:
            object.__setattr__(model, "_ipu_assignment", saved)
    placed = placed_step(graph, device_mapping if pipelined else None)
    sharded = predict_fit_program(placed, n_state, pipelining, batch_size, target, offload)
    return TrainingPrediction(
        model_name=model.name, sharded=sharded, replicas=replicas, batch_size=batch_size,
        device_mapping=tuple(device_mapping if pipelined else [0]),
        prefetch_depth=options.prefetch_depth,
    )


def fit_pipelining(model, gradient_accumulation, schedule):
    """The sharding.Pipelining of the program fit compiles (its micro-batch
    loop: the gradient accumulation loop of `gradient_accumulation`
    micro-batches per weight update)."""
    serialized = 1
    if model._ipu_is_pipelined():
        serialized = model._ipu_options.pipelining_batch_serialization_iterations
    return sharding.Pipelining(schedule, gradient_accumulation, loop_source=GRADIENT_ACCUMULATION,
                               batch_serialization_iterations=serialized)


def predict_fit_program(placed, n_state, pipelining, batch_size, target=None, offload=None):
    """The ShardedPrediction of fit's program (trace_training_step with
    device_loop, placed: placed_step) whose first `n_state` inputs are the
    model's state, under `pipelining` (fit_pipelining). The executable of
    the same program predicts the same (its prediction applies the
    schedule: sharding.predict_sharded, device_checks.workload)."""
    return sharding.predict_sharded(
        placed, target=target, pipelining=pipelining, batch_size=batch_size,
        resident_inputs=tuple(range(n_state)), resident_outputs=tuple(range(-n_state, 0)),
        memory_schedule="best", offload=offload,
        # As fit's program: its batches come through the infeed, its logs go
        # back through the outfeed (feeds.feeds_of).
        feeds=Feeds.of_workload(len(placed.inputs), len(placed.outputs),
                                range(n_state, len(placed.inputs)), range(-n_state, 0)),
    )


def placed_step(graph, device_mapping):
    """The traced step placed on the IPUs: its stages (recorded by the
    trace) on `device_mapping`, or, not pipelined (None), all on IPU 0;
    its loop bodies optimized as its executable compiles them (fused), so
    that it is read as the program that runs (compiler.running_graph)."""
    if device_mapping is None:
        return running_graph(on_one_ipu(graph))
    return running_graph(place(graph, Placement.of({}, device_mapping)))


def _replicas_or_one(model):
    try:
        return model._get_replication_factor()
    except ValueError:
        return 1  # the model needs more IPUs than configured: one replica


def _assignment_of(model, stages):
    """Assignments of `model` with the given stage per invocation."""
    out = model._ipu_default_assignment()
    if len(out) != len(stages):
        raise ValueError(
            f"{len(stages)} stages given for the {len(out)} layer invocations of "
            f"{model.name}: give one stage per invocation "
            "(get_pipeline_stage_assignment order)."
        )
    for a, s in zip(out, stages):
        a.pipeline_stage = s
    return out
