"""Memory and cycles of a program placed on several IPUs (sharded, or
pipelined), read from its placement (compiler/placement.py):

    placement = Placement.of({"model/block1": 0, "model/block2": 1})
    exe = compile_graph(graph, CompileOptions(placement=placement))
    pred = predict_sharded(exe, target="ipu21", gradient_accumulation_count=16,
                           schedule="Grouped", batch_size=16)
    print(pred)

Everything per IPU comes from the placed program: each node's stage and
IPU, the ipu_copy nodes where a value crosses IPUs (their cycles are the
IPU-Link transfer, cost_model.ipu_link_cycles), the memory model's count of
what each IPU holds. What this module adds is the pipeline schedule. The
micro-batch it reads is the body of the program's micro-batch loop (the
innermost loop whose body spans IPUs: `pipeline_path`; a Keras step's loop
over its micro-batches, a functional pipeline's while loop), or the program
itself when it is one micro-batch. The rest of the graph holding the loop
runs once per pass of the loop (the accumulators' set-up and the weight
update of a Keras step: counted with the update), and the loops around it
(the device loop of steps_per_execution steps) repeat the whole.

A placed pipelined program's executable predicts itself this way: its
CompileOptions.pipeline (a Pipelining: the schedule, micro-batches per
step; ops/pipeline_placement.PipelinePlacement makes it) goes to
predict_pipelined, whose Prediction's cycles are the schedule's and whose
`pipeline` is the ShardedPrediction.

Time. Per micro-batch, IPU k spends F_k (its forward nodes, and the copies
they wait for) and B_k (its backward nodes and their copies). In program
order the forward pass climbs the stages and the backward pass comes back:
nodes before the first node of the last stage are forward, and the last
stage's; the others are backward. With n stages and g micro-batches
(gradient_accumulation_count):
- Grouped (Graphcore's default): the forward and backward stages of all IPUs
  run together in each slot: (g + n - 1) x max_k (F_k + B_k); utilisation
  g / (g + n - 1) for balanced stages (cost_model.pipeline_utilisation,
  from shared/DESIGN.md).
- Interleaved: forward and backward slots alternate, each as slow as its
  slowest IPU: (g + n - 1) x (max_k F_k + max_k B_k).
- Sequential: as a sharded model, one IPU at a time: g x sum_k (F_k + B_k).
An inference pipeline (Pipelining.training False: evaluate, predict, a
functional pipeline without an optimizer) runs its forward passes only,
with the same ramp-up and ramp-down: B_k = 0 in the formulas above, and
nothing is stashed (one micro-batch in flight on every stage).
Nodes named by `weight_update` (the optimizer's, when the caller knows
them) run once per step, after the last micro-batch, not once per
micro-batch: + max_k W_k (all IPUs update together; Sequential: sum_k W_k).
Without it, a traced training step's update counts once per micro-batch,
an over-estimate of (g - 1) x W_k.

Memory. Each IPU's MemoryReport (memory_model.analyze_memory(ipu=k)) plus
the stash of each of its stages: the values stage s's forward pass makes
that its own backward pass reads, one copy per micro-batch in flight on
stage s (its position among all the pipeline's n stages, not its IPU's:
an IPU holding two stages holds two stashes of different depths):
Grouped 2 (n - 1 - s) + 1, Interleaved n - s, Sequential 1 (b with batch
serialization, which also holds the values passed between stages for b
micro-batches), cost_model.pipeline_stage_in_flight [TFFIFO]. A gradient
one stage makes for a weight another stage of the same IPU also uses
(BERT's tied embedding and decoder) is added to the weight's accumulator
in the stage that makes it, as Graphcore's GradientAccumulatorSink unifies
the accumulators of several stages into one buffer
(tools/custom_ops/stateful_gradient_accumulate.h): it waits in no FIFO. The
out-of-memory error names the IPU and its fullest tile. The schedule changes time and memory, never values (DESIGN decision
5).

Offloaded optimizer state (`offload`, an Offload: Graphcore's
offload_weight_update_variables): those program inputs live in Streaming
Memory, not in the IPU's always-live memory; the weight update loads each
(its replica's shard, then an all-gather, when replicated_optimizer_state_
sharding splits it over the replicas) and stores it back, once per step
(cost_model.offloaded_update_cycles).
"""

import dataclasses

from keras_ipu.device.ir import runs_on
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.control_flow import scan_p
from keras_ipu.device.primitives.control_flow import while_p
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import prediction
from keras_ipu.device.units import fmt_bytes

SCHEDULES = ("Grouped", "Interleaved", "Sequential")


@dataclasses.dataclass(frozen=True)
class Copy:
    """One value crossing from IPU `src` to IPU `dst`."""

    nbytes: int
    src: int
    dst: int
    step: int  # the index of its ipu_copy node in the step program
    aval: object
    phase: str  # "forward", "backward" or "update": that of the node it feeds
    cycles: int
    value: object = None  # the Var copied


@dataclasses.dataclass(frozen=True)
class Offload:
    """Program inputs held in Streaming Memory and the outputs that are
    their new values (positions, as resident_inputs), and the replicas
    each is partitioned over (1: not sharded)."""

    inputs: tuple = ()
    outputs: tuple = ()
    shards: int = 1

    def values(self, graph):
        """(input Vars, output Vars) of `graph` (memory_model's streamed)."""
        return ({graph.inputs[i] for i in self.inputs},
                {graph.outputs[i] for i in self.outputs})


@dataclasses.dataclass
class IPUPrediction:
    ipu: int
    stages: tuple
    steps: tuple  # indices of the program steps it runs
    forward_cycles: int  # per micro-batch, copies in included
    backward_cycles: int
    copy_in_bytes: int
    copy_in_cycles: int
    stash_bytes: int  # activations one micro-batch stashes for the backward pass
    in_flight: int  # micro-batches its first stage stashes at once under the schedule
    memory: object  # MemoryReport, the stash included
    weight_update_cycles: int = 0  # once per step, offload_cycles included
    offload_cycles: int = 0  # of those: moving offloaded state (once per step)
    # (stage, stash bytes of one micro-batch, micro-batches in flight) of
    # each of its stages that stashes: the stash_bytes and in_flight above
    # are their sum and the first stage's count.
    stashes: tuple = ()

    @property
    def cycles(self):
        """Per micro-batch."""
        return self.forward_cycles + self.backward_cycles


@dataclasses.dataclass
class ShardedPrediction:
    target: object
    schedule: str
    gradient_accumulation_count: int
    stage_of_step: tuple
    ipus: list  # IPUPrediction per IPU used, by IPU number
    copies: list  # Copy
    step_cycles: int  # one step: g micro-batches through the pipeline
    host_seconds: float  # per step
    batch_size: object  # samples per micro-batch, or None
    # Steps one run of the program performs (its device loop's, as the cost
    # model counts loops), and the cycles of that run (the steps, and the
    # work around them once per run).
    steps_per_run: int = 1
    program_cycles: int = 0
    # False for an inference pipeline: forward passes only, and the work
    # after its micro-batches is no weight update.
    training: bool = True

    @property
    def n_stages(self):
        return len(self.ipus)

    @property
    def copy_bytes(self):
        return sum(c.nbytes for c in self.copies)

    @property
    def step_seconds(self):
        return cost_model.cycles_to_seconds(self.step_cycles, self.target) + self.host_seconds

    @property
    def samples_per_second(self):
        if not self.batch_size or not self.step_seconds:
            return None
        return self.batch_size * self.gradient_accumulation_count / self.step_seconds

    @property
    def utilisation(self):
        """Busy IPU-cycles over available IPU-cycles of a step."""
        busy = sum(self.gradient_accumulation_count * p.cycles + p.weight_update_cycles
                   for p in self.ipus)
        return busy / (self.n_stages * self.step_cycles) if self.step_cycles else 0.0

    @property
    def fits(self):
        return all(p.memory.fits for p in self.ipus)

    def __str__(self):
        t = self.target
        lines = [
            f"Sharded prediction on {self.n_stages} x {t.name}: schedule {self.schedule}, "
            f"gradient accumulation {self.gradient_accumulation_count}",
            f"{'ipu':>4} {'stages':<8} {'steps':>6} {'forward':>12} {'backward':>12} "
            f"{'copy in':>11} {'always live':>12} {'not always':>12} {'tile peak':>11}",
        ]
        fmt = fmt_bytes
        for p in self.ipus:
            m = p.memory
            lines.append(
                f"{p.ipu:>4} {','.join(map(str, p.stages)):<8} {len(p.steps):>6} "
                f"{p.forward_cycles:>12,} {p.backward_cycles:>12,} {fmt(p.copy_in_bytes):>11} "
                f"{fmt(m.always_live_bytes):>12} {fmt(m.not_always_live_bytes):>12} "
                f"{fmt(m.tile_bytes):>11}" + ("" if m.fits else "  OUT OF MEMORY")
            )
        sps = self.samples_per_second
        lines.append(
            f"  {len(self.copies)} inter-IPU copies, {fmt(self.copy_bytes)} per micro-batch; "
            f"{self.step_cycles:,} cycles per step, {self.step_seconds * 1e6:,.1f} us, "
            f"utilisation {100 * self.utilisation:.0f}%"
            + (f", {sps:,.1f} samples/s" if sps is not None else "")
        )
        return "\n".join(lines)


def _schedule_name(schedule):
    name = getattr(schedule, "name", schedule)
    for known in SCHEDULES:
        if str(name).lower() == known.lower():
            return known
    raise ValueError(
        f"Unknown pipeline schedule {schedule!r}: use one of {', '.join(SCHEDULES)} "
        "(PipelineSchedule.Grouped, .Interleaved, .Sequential)."
    )


def in_flight(schedule, stage, n_stages, batch_serialization_iterations=1):
    """Micro-batches whose activations stage `stage` (its position among the
    pipeline's `n_stages` stages) holds at once (cost_model
    .pipeline_stage_in_flight; with batch serialization, Sequential only:
    each stage's loop runs its forward pass over that many micro-batches
    before any backward pass)."""
    if schedule == "Sequential":
        return batch_serialization_iterations
    return cost_model.pipeline_stage_in_flight(schedule, stage, n_stages)


# -- the prediction -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pipelining:
    """What the placement of a pipelined program does not say and its
    prediction needs: the schedule, the micro-batches per weight update
    (None: every micro-batch one run of the pipeline loop processes, as an
    inference pipeline), whether it trains (a backward pass), the layer
    paths (or parts of them) of nodes inside the micro-batch loop that run
    once per step (a functional pipeline's weight update), and the
    micro-batches one run of the loop processes when its trip count is only
    known at run time (a while loop loop_trips.py cannot count: the cost
    model assumes WHILE_LOOP_ASSUMED_TRIPS), the layer path the micro-batch loop was
    traced in where it does not span IPUs (one IPU), and the optimizer
    state it offloads. The caller compiling a pipelined program gives it as
    CompileOptions.pipeline: the executable's prediction (predict_costs)
    applies it."""

    schedule: str = "Grouped"
    gradient_accumulation_count: object = None
    training: bool = True
    once_per_step: tuple = ()
    loop_micro_batches: object = None
    loop_source: str = None  # the micro-batch loop's layer path (pipeline_path)
    offload: object = None  # an Offload: its optimizer state in Streaming Memory
    # Micro-batches each stage loops over per pipeline iteration (Sequential,
    # one IPU); gradient_accumulation_count counts all of them.
    batch_serialization_iterations: int = 1

    def __post_init__(self):
        object.__setattr__(self, "schedule", _schedule_name(self.schedule))
        object.__setattr__(self, "once_per_step", tuple(self.once_per_step))


_LOOPS = (scan_p, while_p)


def _trips(node):
    """How often the cost model counts a loop's body (scan: its length; a
    while loop: its trip count, loop_trips.py); 1 for other control flow."""
    record = cost_util.node_cost(node)
    if node.primitive in _LOOPS and record.parts:
        return record.parts[0].repeat
    return 1


def _body(node):
    return node.params["body"] if node.primitive is scan_p else node.params["body_graph"]


def pipeline_path(graph, loop_source=None):
    """[(graph, index of the node)] from `graph` down to the micro-batch
    loop: the innermost loop whose body spans IPUs (its node is on no IPU),
    as a pipeline's inside the device loop of a Keras execution or within
    the control flow of an imported program, or the loop traced with the
    layer path `loop_source` (a Keras step's "gradient accumulation" loop,
    also on one IPU); [] when there is none (a program of one micro-batch)."""
    def wanted(node):
        if node.primitive not in _LOOPS:
            return False
        if loop_source is not None and node.source == loop_source:
            return True
        # Its body runs stages itself (not only control flow holding them).
        return runs_on(node) is None and any(n.stage is not None for n in _body(node).nodes)

    for i, node in enumerate(graph.nodes):
        inside = [_body(node)] if node.primitive in _LOOPS else list(subgraphs(node))
        for sub in inside:
            below = pipeline_path(sub, loop_source)
            if below:
                return [(graph, i)] + below
        if wanted(node):
            return [(graph, i)]
    return []


def step_program(graph, loop_source=None):
    """(the program of one micro-batch, its runs per program run as the cost
    model counts them): the body of the micro-batch loop (pipeline_path),
    or the program itself."""
    path = pipeline_path(graph, loop_source)
    if not path:
        return graph, 1
    runs = 1
    for g, i in path:
        runs *= _trips(g.nodes[i])
    g, i = path[-1]
    return _body(g.nodes[i]), runs


def _phases(step, once, training=True):
    """forward / backward / update of each node of a placed step program.
    In program order the forward pass climbs the stages and the backward pass
    comes back: nodes before the first node of the last stage, and the last
    stage's, are forward; the others backward (an inference program,
    `training` False, has no backward pass: all forward). A copy goes with
    the node it feeds; `once(node)`: the node runs once per step (an update)."""
    nodes = step.nodes
    last = max(n.stage for n in nodes if n.stage is not None)
    turn = min(i for i, n in enumerate(nodes) if n.stage == last)
    phases = []
    for i, node in enumerate(nodes):
        if once(node):
            phases.append("update")
        elif not training or node.stage == last or i < turn:
            phases.append("forward")
        else:
            phases.append("backward")
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if node.primitive is ipu_copy_p:
            (copy,) = node.outputs
            reader = next((j for j in range(i + 1, len(nodes)) if copy in nodes[j].inputs),
                          None)
            if reader is not None:
                phases[i] = phases[reader]
    return phases


def _update_predicate(weight_update, marks=()):
    """node -> whether it runs once per step: named by `weight_update`
    (layer paths, or a predicate), or its layer path holds one of `marks`
    (Pipelining.once_per_step)."""
    if weight_update is None:
        named = lambda node: False  # noqa: E731
    elif callable(weight_update):
        named = weight_update
    else:
        paths = tuple(p.rstrip("/") for p in weight_update)
        named = lambda node: bool(node.source) and any(  # noqa: E731
            node.source == p or node.source.startswith(p + "/") for p in paths)
    if not marks:
        return named
    return lambda node: named(node) or (
        isinstance(node.source, str) and any(m in node.source for m in marks))


def _offload_cycles(graph, ipu, streamed, offload, target):
    """The once-per-step cycles of loading and storing the offloaded inputs
    IPU `ipu` reads (cost_model.offloaded_update_cycles)."""
    if streamed is None:
        return 0
    mine = [v.aval for v in memory_model.held_on(graph, ipu).inputs if v in streamed[0]]
    full = sum(a.nbytes or 0 for a in mine)
    shard = sum(cost_model.replica_shard_bytes(a.nbytes or 0, a.dtype.itemsize, offload.shards)
                for a in mine)
    return cost_model.offloaded_update_cycles(shard, full, offload.shards, target)


def _combine(schedule, n, per_ipu):
    """Work done once per step by the IPUs together: side by side (the
    slowest paces), or one after another under Sequential."""
    values = list(per_ipu)
    if not values:
        return 0
    return sum(values) if schedule == "Sequential" or n == 1 else max(values)


def predict_sharded(obj, target=None, gradient_accumulation_count=None,
                    schedule="Grouped", batch_size=None, resident_inputs=(),
                    resident_outputs=(), check_memory=False, weight_update=None,
                    offload=None, memory_schedule="program", training=True,
                    pipelining=None, batch_serialization_iterations=1, feeds=None):
    """The ShardedPrediction of a placed Graph or Executable (see the module
    doc; compile it with CompileOptions(placement=...), or place a graph with
    compiler.placement.place).

    The program is one micro-batch (its weight update named by
    `weight_update`), or holds the micro-batch loop (pipeline_path): the
    loop's body is one micro-batch, the rest of the graph holding the loop
    runs once per pass of the loop (the gradient accumulators' set-up and
    the weight update of a Keras step), and loops around that (the device
    loop) repeat it.

    pipelining: a Pipelining record, or given by its parts:
    gradient_accumulation_count (micro-batches per step; None: those of one
    run of the micro-batch loop), schedule ("Grouped", "Interleaved",
    "Sequential", or a PipelineSchedule), training (False for an inference
    program: no backward pass, nothing stashed). batch_size: samples per
    micro-batch. resident_inputs / resident_outputs: as predict_costs (not
    moved over PCIe). weight_update: nodes of the micro-batch that run once
    per step: layer paths (the optimizer's scope), or a predicate node ->
    bool. check_memory: raise IPUOutOfMemoryError naming the first IPU that
    does not fit. offload: an Offload (optimizer state in Streaming
    Memory), or None. memory_schedule: "program" or "best"
    (memory_model.analyze_memory).
    batch_serialization_iterations: b > 1 (the Sequential schedule, every
    stage on one IPU, gradient_accumulation_count counting all G x b
    micro-batches), given with the parts or in `pipelining`: each stage
    runs over b micro-batches in a loop, so the stash and the values passed
    between stages are held for b at once.
    feeds: the program's feeds.Feeds (its infeed's inputs and outfeed's
    outputs: one element of each held, memory_model.analyze_memory).
    """
    if pipelining is None:
        pipelining = Pipelining(schedule, gradient_accumulation_count, training,
                                batch_serialization_iterations=batch_serialization_iterations)
    schedule, training = pipelining.schedule, pipelining.training
    batch_serialization_iterations = pipelining.batch_serialization_iterations
    target = memory_model.resolve_target(target)
    graph = memory_model.graph_of(obj)
    if not any(True for _ in memory_model.tagged_nodes(graph)):
        raise ValueError(
            "predict_sharded reads a placed program: compile it with "
            "CompileOptions(placement=Placement.of({layer path: stage}, device_mapping)) "
            "or place its graph with keras_ipu.device.compiler.placement.place first."
        )
    path = pipeline_path(graph, pipelining.loop_source)
    if path:
        holder, loop_index = path[-1]
        loop = holder.nodes[loop_index]
        step = _body(loop)
        loop_micro_batches = int(pipelining.loop_micro_batches or _trips(loop))
    else:  # a program of one micro-batch
        holder = loop_index = None
        step = graph
        loop_micro_batches = 1
    g = int(pipelining.gradient_accumulation_count or loop_micro_batches)
    if g < 1:
        raise ValueError(f"gradient_accumulation_count must be >= 1, got {g}.")
    # Steps (weight updates) per pass of the graph holding the loop.
    repeats = loop_micro_batches // g if path else 1
    if path and (repeats < 1 or loop_micro_batches % g):
        raise ValueError(
            f"The pipeline loop runs {loop_micro_batches} micro-batches, not a multiple "
            f"of gradient_accumulation_count {g}: give the micro-batches of one step.")
    steps = prediction.step_costs(step, target)
    nodes = step.nodes
    phase = _phases(step, _update_predicate(weight_update, pipelining.once_per_step), training)
    # Pipeline position of each IPU: the order of its first stage.
    first_stage = {}
    for node in nodes:
        if node.ipu is not None:
            first_stage[node.ipu] = min(first_stage.get(node.ipu, node.stage), node.stage)
    ipus = sorted(first_stage, key=lambda d: (first_stage[d], d))
    n = len(ipus)
    # Once per pass of the loop's holder (the accumulators' set-up and the
    # update of a Keras step): per step, that work over its steps.
    holder_work = {}
    if path:
        holder_work = prediction.ipu_cycles(
            holder, prediction.step_costs(holder, target), target, skip=loop_index)

    copies = [
        Copy(node.inputs[0].aval.nbytes or 0, node.params["src"],
             node.params["dst"], i, node.inputs[0].aval, phase[i], s.cycles,
             node.inputs[0])
        for i, (node, s) in enumerate(zip(nodes, steps)) if node.primitive is ipu_copy_p
    ]

    if batch_serialization_iterations > 1 and (schedule != "Sequential" or n != 1):
        raise ValueError(
            f"batch_serialization_iterations={batch_serialization_iterations} needs the "
            f"Sequential schedule on one IPU; got {schedule} on {n} IPUs.")
    producer_stage = {v: node.stage for node in nodes for v in node.outputs}
    varying = _per_micro_batch(step, loop if path else None)
    # Each stage's position in the pipeline (Graphcore's stage ids).
    stage_ids = sorted({node.stage for node in nodes if node.stage is not None})
    position = {s: k for k, s in enumerate(stage_ids)}
    accumulating = _accumulating(step, loop if path else None)
    streamed = offload.values(graph) if offload is not None and offload.inputs else None
    results = []
    for d in ipus:
        mine = [i for i, node in enumerate(nodes) if node.ipu == d]
        cycles = {"forward": 0, "backward": 0, "update": 0}
        for i in mine:
            cycles[phase[i]] += steps[i].cycles
        for i, node in enumerate(nodes):  # control flow spanning IPUs
            if node.ipu is None and steps[i].ipu is None:
                for repeat, _, sub in prediction.sub_predictions(node, target):
                    cycles[phase[i]] += repeat * sub.ipu_cycles.get(d, 0)
        cycles["update"] += -(-holder_work.get(d, 0) // repeats)
        incoming = [c for c in copies if c.dst == d]
        stashed = _stashed(nodes, mine, phase, producer_stage, varying, accumulating,
                           batch_serialization_iterations > 1)

        def flight_of(stage):
            # Inference stashes nothing: no backward pass reads its activations.
            if not training:
                return 1
            return in_flight(schedule, position[stage], len(stage_ids),
                             batch_serialization_iterations)

        stashes = tuple((s, sum(v.aval.nbytes or 0 for v in values), flight_of(s))
                        for s, values in sorted(stashed.items()))
        stash_bytes = sum(b for _, b, _ in stashes)
        extra_bytes = sum((f - 1) * b for _, b, f in stashes)
        extra_tile = sum(
            (flight_of(s) - 1) * sum(memory_model.tile_bytes(v.aval, target.tiles_per_ipu)
                                     for v in values)
            for s, values in stashed.items())
        flight = flight_of(min(nodes[i].stage for i in mine)) if mine else 1
        report = memory_model.analyze_memory(graph, target, ipu=d, streamed=streamed,
                                             schedule=memory_schedule, feeds=feeds)
        moved = _offload_cycles(graph, d, streamed, offload, target)
        cycles["update"] += moved
        if extra_bytes:
            report = dataclasses.replace(
                report,
                not_always_live_bytes=report.not_always_live_bytes + extra_bytes,
                tile_bytes=report.tile_bytes + extra_tile,
            )
        results.append(IPUPrediction(
            ipu=d, stages=tuple(sorted({nodes[i].stage for i in mine})), steps=tuple(mine),
            forward_cycles=cycles["forward"], backward_cycles=cycles["backward"],
            copy_in_bytes=sum(c.nbytes for c in incoming),
            copy_in_cycles=sum(c.cycles for c in incoming),
            stash_bytes=stash_bytes, in_flight=flight, memory=report,
            weight_update_cycles=cycles["update"], offload_cycles=moved, stashes=stashes,
        ))

    total = _micro_batch_cycles(schedule, g, results)
    total += _combine(schedule, n, (p.weight_update_cycles for p in results))
    # One run of the program: its steps, and the work of the loops around
    # the holder (the device loop's) once per pass.
    program_cycles = repeats * total
    steps_per_run = repeats
    for level, index in reversed(path[:-1]):
        trips = _trips(level.nodes[index])
        other = prediction.ipu_cycles(
            level, prediction.step_costs(level, target), target, skip=index)
        program_cycles = trips * program_cycles + _combine(schedule, n, other.values())
        steps_per_run *= trips
    host = prediction.predict_costs(graph, target, resident_inputs=resident_inputs,
                                    resident_outputs=resident_outputs, log=False)
    # A program of one micro-batch moves one micro-batch's data per run.
    host_per_step = (host.host_seconds / steps_per_run if path
                     else g * host.host_seconds)
    pred = ShardedPrediction(
        target=target, schedule=schedule, gradient_accumulation_count=g,
        stage_of_step=tuple(node.stage for node in nodes), ipus=results, copies=copies,
        step_cycles=int(total), host_seconds=host_per_step,
        batch_size=batch_size, steps_per_run=steps_per_run if path else 1,
        program_cycles=int(program_cycles) if path else int(total), training=training,
    )
    if check_memory:
        for p in results:
            if not p.memory.fits:
                raise memory_model.IPUOutOfMemoryError(p.memory)
    return pred


def _stashed(nodes, mine, phase, producer_stage, varying, accumulating, serialized):
    """{stage: the values stage's FIFO holds per micro-batch} of the steps
    `mine` of one IPU: forward values (made or received there) that its
    backward steps read, under the stage of the backward step reading them
    (Graphcore's FIFOs join a stage's forward and its own backward only; a
    value of another stage read there, which Graphcore would pass through
    the stages between, is counted at the reader's depth, an
    approximation); not a gradient of another stage read by an accumulation
    (`accumulating`: its own stage adds it to the shared accumulator,
    GradientAccumulatorSink); `serialized` (batch serialization): also the
    stage-boundary buffers of b slices (Poplar's CreateBuffer), forward
    values a later stage's forward reads. Only values that differ per
    micro-batch (`varying`): one made from the weights alone (a transposed
    or cast weight) is the same for every micro-batch, one copy, not one
    per micro-batch in flight (Graphcore's pipeline stashes activations)."""
    fwd_values = {v for i in mine if phase[i] == "forward" for v in nodes[i].outputs}
    stashed = {}
    for i in mine:
        node = nodes[i]
        if phase[i] == "backward":
            read = [v for v in node.inputs if v in fwd_values
                    and not (i in accumulating and producer_stage.get(v) != node.stage)]
        elif serialized and phase[i] == "forward":
            read = [v for v in node.inputs
                    if v in fwd_values and producer_stage.get(v) != node.stage]
        else:
            continue
        read = [v for v in read if v in varying]
        if read:
            stashed.setdefault(node.stage, set()).update(read)
    # A value two stages read is held once, by the earlier (deeper) stage.
    seen = set()
    for stage in sorted(stashed):
        stashed[stage] -= seen
        seen |= stashed[stage]
    return {stage: values for stage, values in stashed.items() if values}


def _accumulating(step, loop):
    """Indices of the steps of the micro-batch program `step` that add into
    a value the loop `loop` carries to the next micro-batch (the gradient
    accumulators): those making a carried value, and elementwise steps
    whose results only they read (the sum of a weight's gradients from
    several stages); none without a loop."""
    if loop is None:
        return set()
    carried = set(step.outputs[:loop.primitive.carry_count(loop.params)])
    readers = {}
    for i, node in enumerate(step.nodes):
        for v in node.inputs:
            readers.setdefault(v, set()).add(i)
    outputs = set(step.outputs)
    found = set()
    for i in range(len(step.nodes) - 1, -1, -1):
        node = step.nodes[i]
        if carried.intersection(node.outputs):
            found.add(i)
        elif node.primitive.elementwise and all(
                v not in outputs and readers.get(v) and readers[v] <= found
                for v in node.outputs):
            found.add(i)
    return found


def _per_micro_batch(step, loop):
    """The values of the micro-batch program `step` that differ from one
    micro-batch to the next: those depending on the body inputs the loop
    `loop` changes each iteration (its carries and a scan's slices), not
    only on what it hands every iteration alike (the weights); all of them
    when there is no loop (a program of one micro-batch)."""
    if loop is None:
        return {v for node in step.nodes for v in node.outputs}
    n = loop.primitive.carry_count(loop.params)
    if loop.primitive is scan_p:
        n += loop.params["n_xs"]
    varying = set(step.inputs[:n])
    for node in step.nodes:
        if node.primitive.aliases_operands:  # output k is operand k (a barrier)
            varying.update(o for o, v in zip(node.outputs, node.inputs) if v in varying)
        elif any(v in varying for v in node.inputs):
            varying.update(node.outputs)
    return varying


def _micro_batch_cycles(schedule, g, ipus):
    """g micro-batches through the pipeline of `ipus` (IPUPredictions in
    pipeline order) under `schedule` (see the module doc)."""
    n = len(ipus)
    if schedule == "Sequential" or n == 1:
        return g * sum(p.cycles for p in ipus)
    if schedule == "Grouped":
        return (g + n - 1) * max(p.cycles for p in ipus)
    return (g + n - 1) * (max(p.forward_cycles for p in ipus)
                          + max(p.backward_cycles for p in ipus))


def predict_pipelined(obj, target=None, pipeline=None, batch_size=None, log=None,
                      check_memory=False, **workload):
    """The prediction.Prediction of a placed pipelined program (an
    Executable's: device_checks.predict) under its Pipelining `pipeline`:
    predict_costs' steps, host transfers and work, with `cycles` the
    schedule's (predict_sharded, kept as `pipeline`) and `memory` its
    fullest IPU (the stash of the micro-batches in flight included, the
    optimizer state it offloads not). batch_size: samples per step.
    workload: the rest of predict_costs' arguments."""
    pred = prediction.predict_costs(obj, target, batch_size=batch_size, log=False,
                                    **workload)
    g = pipeline.gradient_accumulation_count
    sharded = predict_sharded(
        obj, pred.target, pipelining=pipeline,
        resident_inputs=workload.get("resident_inputs", ()),
        resident_outputs=workload.get("resident_outputs", ()), offload=pipeline.offload,
        batch_size=batch_size // g if batch_size and g else None, memory_schedule="best",
        feeds=workload.get("feeds"))
    memory = max((p.memory for p in sharded.ipus), key=lambda m: m.tile_bytes)
    if check_memory and not memory.fits:
        raise memory_model.IPUOutOfMemoryError(memory)
    pred = dataclasses.replace(pred, cycles=sharded.program_cycles, memory=memory,
                               pipeline=sharded)
    if log is None:
        log = prediction.log_cycle_count_flag() >= 0
    if log:
        prediction.logger.info("Predicted cycles: %s", pred.summary())
    return pred
