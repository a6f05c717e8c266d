"""Automatic pipeline split: choose stage boundaries for a model over a
number of IPUs (beyond Graphcore's API, which leaves the split to the user).

    plan = keras_ipu.models.auto_pipeline(model, num_ipus=4, batch_size=8)
    print(plan)              # each stage: layers, memory, cycles; and why
    plan.apply(model)        # set_pipeline_stage_assignment + device mapping

How: fit's own program (the device loop around one weight update of
`gradient_accumulation` micro-batches: models/prediction.py's
trace_training_step) is traced once with every layer invocation in a stage
of its own, so each program step knows its invocation. Contiguous runs of
invocations (in execution order, so every stage reads only earlier stages)
are the candidate stages. A split renames the stages of that trace; the
compiler's placement pass places it and the simulator predicts it exactly
as the executable fit compiles for that split predicts itself
(sharding.predict_sharded under the schedule over the g micro-batches:
bubbles, copies, each IPU's memory with the activations stashed for the
schedule, the weight update once per step). With up to EXHAUSTIVE_SPLITS
contiguous splits every one is predicted; beyond, a dynamic program first
splits the invocations' own cycles (the slowest stage paces a pipeline),
then a local search moves one boundary at a time while that improves the
prediction. The plan is the best split predicted: one that fits every IPU
before one that does not, then the fewest cycles per weight update. The
plan says which stage is the bottleneck, the utilisation and whether all
fits.
"""

import dataclasses
import itertools
import math

from keras_ipu.backend.trainer_ops.model_state import TRAIN_STATE
from keras_ipu.backend.trainer_ops.model_state import state_variables
from keras_ipu.device.compiler.placement import restaged
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import sharding
from keras_ipu.device.simulator.prediction import ipu_cycles
from keras_ipu.device.simulator.prediction import step_costs
from keras_ipu.device.units import fmt_bytes
from keras_ipu.models.offload import program_offload
from keras_ipu.models.prediction import TrainingPrediction
from keras_ipu.models.prediction import fit_pipelining
from keras_ipu.models.prediction import placed_step
from keras_ipu.models.prediction import predict_fit_program
from keras_ipu.models.prediction import trace_training_step
from keras_ipu.models.training_step import GRADIENT_ACCUMULATION


@dataclasses.dataclass
class PipelinePlan:
    model_name: str
    assignment: list  # stage of each layer invocation (execution order)
    invocations: list  # "layer (node index)" of each invocation
    prediction: object  # TrainingPrediction of the split
    reason: str
    # Every split predicted (a tuple of stages per invocation): its cycles
    # per weight update.
    candidates: dict = dataclasses.field(default_factory=dict)

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


# Up to this many contiguous splits, every one is predicted; beyond, a local
# search from the balanced split (each prediction places and times the
# whole program: a fraction of a second for a small model, more for a big one).
EXHAUSTIVE_SPLITS = 64


def _contiguous_splits(m, n):
    """Every split of m invocations (in execution order) into n non-empty
    contiguous stages."""
    for cuts in itertools.combinations(range(1, m), n - 1):
        bounds = (0,) + cuts + (m,)
        yield [k for k in range(n) for _ in range(bounds[k], bounds[k + 1])]


def _split_count(m, n):
    return math.comb(m - 1, n - 1)


def _neighbours(split, n):
    """The splits one boundary away: a stage's first or last invocation
    moved to the neighbour stage, every stage kept non-empty."""
    out = []
    for k in range(n - 1):
        last = max(i for i, s in enumerate(split) if s == k)
        for index, to in ((last, k + 1), (last + 1, k)):
            moved = list(split)
            moved[index] = to
            if set(moved) == set(range(n)):
                out.append(moved)
    return out


def _rank(sharded):
    """Order of preference: splits that fit first, fastest per weight
    update; splits that do not fit by how far their fullest tile is over."""
    over = max(p.memory.tile_bytes - p.memory.tile_capacity for p in sharded.ipus)
    if sharded.fits:
        return (0, sharded.step_cycles, max(p.memory.tile_bytes for p in sharded.ipus))
    return (1, over, sharded.step_cycles)


def _invocation_costs(placed, g, target):
    """Cycles of each layer invocation of fit's program placed with every
    invocation on an IPU of its own: per micro-batch (the accumulation
    loop's body, copies left out: a split decides which cross IPUs), and
    the work once per weight update (around the loop) over g."""
    target = memory_model.resolve_target(target)
    path = sharding.pipeline_path(placed, GRADIENT_ACCUMULATION)
    holder, index = path[-1]
    body = sharding.step_program(placed, GRADIENT_ACCUMULATION)[0]
    costs = {}
    for node, step in zip(body.nodes, step_costs(body, target)):
        if node.primitive is not ipu_copy_p and step.ipu is not None:
            costs[step.ipu] = costs.get(step.ipu, 0) + step.cycles
    once = ipu_cycles(holder, step_costs(holder, target), target, skip=index)
    for ipu, cycles in once.items():
        costs[ipu] = costs.get(ipu, 0) + cycles / g
    return costs


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

    # Trace fit's program once (g micro-batches per weight update, in the
    # device loop) with every invocation in its own stage; a split renames
    # the stages of that trace.
    saved = model._ipu_assignment
    for i, a in enumerate(defaults):
        a.pipeline_stage = i
    object.__setattr__(model, "_ipu_assignment", defaults)
    try:
        graph, n_state = trace_training_step(model, batch_size, replicas, micro_batches=g,
                                             device_loop=True)
        offload = program_offload(model, state_variables(model, TRAIN_STATE), replicas, g)
        pipelining = fit_pipelining(model, g, schedule)
    finally:
        object.__setattr__(model, "_ipu_assignment", saved)

    predicted = {}

    def predict(split):
        key = tuple(split)
        if key not in predicted:
            placed = placed_step(restaged(graph, list(split)), list(range(num_ipus)))
            predicted[key] = predict_fit_program(placed, n_state, pipelining, batch_size,
                                                 target, offload)
        return predicted[key]

    total = _split_count(m, num_ipus)
    if total <= EXHAUSTIVE_SPLITS:
        for split in _contiguous_splits(m, num_ipus):
            predict(split)
        how = f"all {total} contiguous splits"
    else:
        costs = _invocation_costs(placed_step(graph, list(range(m))), g, target)
        best = _balanced_split([costs.get(i, 0) for i in range(m)], num_ipus)
        while len(predicted) < 16 * num_ipus:
            for split in _neighbours(best, num_ipus):
                predict(split)
            better = min(predicted, key=lambda k: _rank(predict(k)))
            if _rank(predict(better)) >= _rank(predict(best)):
                break
            best = list(better)
        how = (f"{len(predicted)} of {total} contiguous splits: the split balancing each "
               "invocation's cycles and its neighbours, one boundary moved at a time")
    chosen = min(predicted, key=lambda k: _rank(predicted[k]))
    sharded = predicted[chosen]
    prediction = TrainingPrediction(
        model_name=model.name, sharded=sharded, replicas=replicas, batch_size=batch_size,
        device_mapping=tuple(range(num_ipus)), prefetch_depth=options.prefetch_depth,
    )
    names = [f"{a.layer.name} ({getattr(a, 'node_index', 0)})" for a in defaults]
    unfit = sum(not p.fits for p in predicted.values())
    plan = PipelinePlan(model.name, list(chosen), names, prediction,
                        _reason(prediction, num_ipus, how, unfit),
                        {k: v.step_cycles for k, v in predicted.items()})
    if print_fn is not None:
        print_fn(str(plan))
    return plan


def _reason(prediction, n, how, unfit):
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
    text = (f"the fastest per weight update of {how}, as fit's program predicts them "
            f"(the schedule over {prediction.gradient_accumulation} micro-batches, the "
            f"stash included); stage {slowest.ipu} is the slowest ({slowest.cycles:,} cycles "
            "per micro-batch) and paces the pipeline")
    if unfit:
        text += f"; {unfit} of the splits predicted did not fit"
    return text
