"""Automatic pipeline split: choose stage boundaries for a model over a
number of IPUs (beyond Graphcore's API, which leaves the split to the user).

    plan = keras_ipu.models.auto_pipeline(model, num_ipus=4, batch_size=8)
    print(plan)              # each stage: layers, memory, cycles; and why
    plan.apply(model)        # set_pipeline_stage_assignment + device mapping

How: one micro-batch's training step is traced once with every layer
invocation in a stage of its own (models/prediction.py), so each program
step knows its invocation. Contiguous runs of invocations (in execution
order, so every stage reads only earlier stages) are the candidate
stages; a dynamic program picks the split into `num_ipus` stages whose
slowest stage is fastest (forward + backward cycles per micro-batch, the
weight update counted once per `gradient_accumulation` micro-batches),
since the slowest stage paces a pipeline. The compiler's placement pass
then places the program on that split (the trace's stages renamed) and the
simulator's sharding model checks every IPU's memory
(weights, optimizer state, activations stashed for the schedule); while
an IPU does not fit, a layer moves from it to a neighbour stage. The plan
says which stage is the bottleneck, the utilisation and whether all fits.
"""

import dataclasses

from keras_ipu.backend.trainer_ops.model_state import TRAIN_STATE
from keras_ipu.backend.trainer_ops.model_state import state_variables
from keras_ipu.device.compiler.placement import restaged
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p
from keras_ipu.device.simulator import sharding
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.units import fmt_bytes
from keras_ipu.models.offload import offload_of
from keras_ipu.models.prediction import TrainingPrediction
from keras_ipu.models.prediction import once_per_step
from keras_ipu.models.prediction import placed_step
from keras_ipu.models.prediction import trace_training_step


@dataclasses.dataclass
class PipelinePlan:
    model_name: str
    assignment: list  # stage of each layer invocation (execution order)
    invocations: list  # "layer (node index)" of each invocation
    prediction: object  # TrainingPrediction of the split
    reason: str

    @property
    def fits(self):
        return self.prediction.fits

    @property
    def num_stages(self):
        return max(self.assignment) + 1

    def apply(self, model):
        """Pipeline `model` as planned: its stage assignment and one IPU
        per stage."""
        current = model.get_pipeline_stage_assignment()
        for a, stage in zip(current, self.assignment):
            a.pipeline_stage = stage
        model.set_pipeline_stage_assignment(current)
        model.set_pipelining_options(device_mapping=list(range(self.num_stages)))
        return model

    def __str__(self):
        fmt = fmt_bytes
        pred = self.prediction
        lines = [
            f"Pipeline plan for {self.model_name}: {self.num_stages} stages on "
            f"{self.num_stages} {pred.sharded.target.name} IPUs, micro-batch "
            f"{pred.batch_size}, gradient accumulation {pred.gradient_accumulation}, "
            f"schedule {pred.sharded.schedule}",
            f"{'stage':>5} {'cycles':>12} {'memory':>11} {'tile peak':>11}  layers",
        ]
        for p in pred.sharded.ipus:
            names = [n for n, s in zip(self.invocations, self.assignment) if s == p.ipu]
            shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
            lines.append(
                f"{p.ipu:>5} {p.cycles:>12,} {fmt(p.memory.total_bytes):>11} "
                f"{fmt(p.memory.tile_bytes):>11}  {shown}"
                + ("" if p.memory.fits else "  OUT OF MEMORY")
            )
        sps = pred.samples_per_second
        lines.append(
            f"  {'fits' if self.fits else 'does NOT fit'}; utilisation "
            f"{100 * pred.utilisation:.0f}%; {pred.step_seconds * 1e3:,.3f} ms per weight "
            f"update" + (f"; {sps:,.1f} samples/s" if sps else "")
        )
        streamed = sum(p.memory.streamed_bytes for p in pred.sharded.ipus)
        if streamed:
            moved = max(p.offload_cycles for p in pred.sharded.ipus)
            lines.append(
                f"  optimizer state in Streaming Memory (offload_weight_update_variables): "
                f"{fmt(streamed)}, not counted above; loading and storing it takes up to "
                f"{moved:,} cycles per weight update")
        lines.append(f"  why: {self.reason}")
        return "\n".join(lines)


def _balanced_split(costs, parts):
    """Boundaries of `costs` (a list) into `parts` contiguous non-empty runs
    minimising the largest run's sum (dynamic programming)."""
    m = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (m + 1) for _ in range(parts + 1)]
    cut = [[0] * (m + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for j in range(k, m + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    stages, j = [0] * m, m
    for k in range(parts, 0, -1):
        i = cut[k][j]
        for t in range(i, j):
            stages[t] = k - 1
        j = i
    return stages


def auto_pipeline(model, num_ipus, batch_size, *, gradient_accumulation=None,
                  schedule=None, target=None, replicas=1, print_fn=print):
    """The PipelinePlan of `model` (compiled, made in an IPUStrategy scope)
    over `num_ipus` IPUs (see the module doc). Prints it with `print_fn`
    (None: silent)."""
    from keras_ipu.ops.pipelining_ops import PipelineSchedule

    defaults = model._ipu_default_assignment()
    if any(a.is_nested_model for a in defaults):
        raise NotImplementedError(
            f"auto_pipeline of {model.name}, which contains nested models, is not "
            "supported: split it by hand (set_pipeline_stage_assignment), or build "
            "the model without nesting."
        )
    m = len(defaults)
    if not isinstance(num_ipus, int) or num_ipus < 1:
        raise ValueError(f"num_ipus must be a positive int, got {num_ipus!r}.")
    if num_ipus > m:
        raise ValueError(
            f"{model.name} has {m} layer invocations: it cannot be split into "
            f"{num_ipus} pipeline stages. Use at most {m} IPUs."
        )
    options = model._ipu_options
    g = gradient_accumulation or options.pipelining_gradient_accumulation_steps_per_replica \
        or max(2 * num_ipus, 1)
    schedule = schedule if schedule is not None else options.pipeline_schedule
    if not isinstance(schedule, PipelineSchedule):
        schedule = PipelineSchedule[str(schedule).capitalize()]

    # Trace once with every invocation in its own stage.
    saved = model._ipu_assignment
    for i, a in enumerate(defaults):
        a.pipeline_stage = i
    object.__setattr__(model, "_ipu_assignment", defaults)
    try:
        layout = {}
        graph, n_state = trace_training_step(model, batch_size, replicas, layout=layout)
    finally:
        object.__setattr__(model, "_ipu_assignment", saved)

    # Cycles per invocation: its nodes, and the nodes the placement gives it
    # (the loss after the last layer; a weight's update where the weight is).
    by_invocation = placed_step(graph, list(range(m)))
    single = predict_costs(by_invocation, target=target, log=False,
                           resident_inputs=tuple(range(n_state)))
    once = once_per_step(model)
    costs = [0.0] * m
    for node, step in zip(by_invocation.nodes, single.steps):
        if node.primitive is ipu_copy_p:
            continue  # between invocations: a split decides which cross IPUs
        costs[node.stage] += step.cycles / g if once(node) else step.cycles

    assignment = _balanced_split(costs, num_ipus) if num_ipus > 1 else [0] * m
    moves = 0

    def predict(split):
        placed = placed_step(restaged(graph, split), list(range(num_ipus)))
        return sharding.predict_sharded(
            placed, target=target,
            gradient_accumulation_count=g, schedule=schedule.name, batch_size=batch_size,
            resident_inputs=tuple(range(n_state)), resident_outputs=tuple(range(-n_state, 0)),
            weight_update=once, memory_schedule="best",
            offload=offload_of(model, state_variables(model, TRAIN_STATE), replicas, g,
                               placed, layout["state_outputs"]),
        )

    sharded = predict(assignment)
    visited = {tuple(assignment)}
    while not sharded.fits and moves < 4 * m:
        moved = _relieve(assignment, sharded, num_ipus, visited)
        if moved is None:
            break
        visited.add(tuple(moved))
        assignment, moves = moved, moves + 1
        sharded = predict(assignment)

    prediction = TrainingPrediction(
        model_name=model.name, sharded=sharded, replicas=replicas, batch_size=batch_size,
        device_mapping=tuple(range(num_ipus)), prefetch_depth=options.prefetch_depth,
    )
    names = [f"{a.layer.name} ({getattr(a, 'node_index', 0)})" for a in defaults]
    plan = PipelinePlan(model.name, assignment, names, prediction,
                        _reason(prediction, moves, num_ipus))
    if print_fn is not None:
        print_fn(str(plan))
    return plan


def _relieve(assignment, sharded, n, visited):
    """Move one invocation off the first IPU that does not fit to a
    neighbour stage (the one with more room first; a split already tried
    is not tried again: a layer pushed on from a full neighbour moves on
    further); None when no move is left."""
    over = next(p for p in sharded.ipus if not p.memory.fits)
    stage = over.ipu
    members = [i for i, s in enumerate(assignment) if s == stage]
    if len(members) <= 1:
        return None
    room = {p.ipu: p.memory.tile_capacity - p.memory.tile_bytes for p in sharded.ipus}
    options = []
    if stage > 0:
        options.append((room.get(stage - 1, 0), members[0], stage - 1))
    if stage < n - 1:
        options.append((room.get(stage + 1, 0), members[-1], stage + 1))
    for _, index, to in sorted(options, reverse=True):
        out = list(assignment)
        out[index] = to
        if tuple(out) not in visited:
            return out
    return None


def _reason(prediction, moves, n):
    ipus = prediction.sharded.ipus
    if not prediction.fits:
        worst = max(ipus, key=lambda p: p.memory.tile_bytes - p.memory.tile_capacity)
        fmt = fmt_bytes
        return (f"no split over {n} IPU(s) fits: IPU {worst.ipu}'s fullest tile needs "
                f"{fmt(worst.memory.tile_bytes)} of {fmt(worst.memory.tile_capacity)}; use "
                "more IPUs, a smaller micro-batch or recomputation")
    if n == 1:
        return "one IPU holds the whole model"
    slowest = max(ipus, key=lambda p: p.cycles)
    text = (f"boundaries balance the cycles per micro-batch; stage {slowest.ipu} is the "
            f"slowest ({slowest.cycles:,} cycles) and paces the pipeline")
    if moves:
        text += f"; {moves} layer(s) moved between neighbour stages so that every IPU fits"
    return text
