"""Memory and cycles of a program split over several IPUs: sharding and
pipelining, at the level of the simulator's program steps.

    pred = predict_sharded(exe, {"model/block1": 0, "model/block2": 1},
                           target="ipu21", gradient_accumulation_count=16,
                           schedule="Grouped", batch_size=16)
    print(pred)

The assignment gives each program step a pipeline stage; stage s runs on IPU
`device_mapping[s]` (default: IPU s). It is, in order of preference:
- a dict {Keras layer path prefix: stage}: a step whose `source` (the layer
  path the trace recorded) starts with a prefix takes its stage (the longest
  prefix wins);
- a sequence with one stage per program step;
- a callable (index, step) -> stage or None.
A step left without a stage (no layer path: the loss, the optimizer) takes
the stage of the program input (weight, optimizer slot) it reads, when a
placed step reads that input too; otherwise the stage of the step before it.

Memory, per IPU: the always-live bytes of the inputs its steps read (inputs
read on several IPUs are held by each), the code of its steps, and the
liveness of the values its steps make and of the values copied in from other
IPUs (live from the copy to their last use there); the sender keeps a value
until it has been copied. A pipeline also stashes the activations each
stage's backward pass reads, one copy per micro-batch in flight (below).
The out-of-memory error names the IPU and its fullest tile. A control-flow
step (a device loop's scan, a cond) is one step: it is placed whole.

Copies: every value made on one IPU and read on another crosses the
IPU-Links once per receiving IPU (cost_model.ipu_link_cycles).

Time. Per micro-batch, IPU k spends F_k (its forward steps, and the copies
they wait for) and B_k (its backward steps and their copies). In program order the
forward pass climbs the stages and the backward pass comes back: steps of a
stage before the first step of the last stage are its forward pass, the
others its backward pass; the last stage's steps are all counted as forward.
With n stages and g micro-batches (gradient_accumulation_count):
- Grouped (Graphcore's default): the forward and backward stages of all IPUs
  run together in each slot: (g + n - 1) x max_k (F_k + B_k); utilisation
  g / (g + n - 1) for balanced stages (cost_model.pipeline_utilisation,
  from shared/DESIGN.md).
- Interleaved: forward and backward slots alternate, each as slow as its
  slowest IPU: (g + n - 1) x (max_k F_k + max_k B_k).
- Sequential: as a sharded model, one IPU at a time: g x sum_k (F_k + B_k).
Steps named in `weight_update` (the optimizer's, when the caller knows
them) run once per step, after the last micro-batch, not once per
micro-batch: + max_k W_k (all IPUs update together; Sequential: sum_k W_k).
Without it, a traced training step's update counts once per micro-batch,
an over-estimate of (g - 1) x W_k.
Micro-batches in flight on stage k, i.e. the activations its backward pass
stashes: Grouped 2 (n - 1 - k) + 1, Interleaved n - k, Sequential 1. The
schedule changes time and memory, never values (DESIGN decision 5).
"""

import dataclasses

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Node
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.prediction import predict_costs

SCHEDULES = ("Grouped", "Interleaved", "Sequential")


class _Transfer:
    """Stands in for a primitive in one IPU's step list: an inter-IPU copy
    (received: makes the value on this IPU; sent: its last use here)."""

    cost = None
    multiple_results = True
    subgraph_params = ()

    def __init__(self, name):
        self.name = name


_RECEIVE = _Transfer("inter_ipu_copy_in")
_SEND = _Transfer("inter_ipu_copy_out")


@dataclasses.dataclass(frozen=True)
class Copy:
    """One value crossing from IPU `src` to IPU `dst`."""

    nbytes: int
    src: int
    dst: int
    step: int  # the first step on dst that reads it
    aval: object
    phase: str  # "forward" or "backward" (of the receiving IPU)
    cycles: int
    value: object = None  # the program's key of the value


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
    in_flight: int  # micro-batches stashed at once under the schedule
    memory: object  # MemoryReport, the stash included
    weight_update_cycles: int = 0  # once per step

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
        fmt = memory_model._fmt_bytes
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


# -- stage assignment -------------------------------------------------------------


def _stage_from_prefixes(prefixes, source):
    if not source:
        return None
    best = None
    for prefix, stage in prefixes.items():
        if source == prefix or source.startswith(prefix.rstrip("/") + "/") or (
                source.startswith(prefix)):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, stage)
    return None if best is None else best[1]


def assign_stages(graph, assignment):
    """The stage of every program step (see the module doc)."""
    steps = graph.nodes
    if isinstance(assignment, dict):
        raw = [_stage_from_prefixes(assignment, st.source) for st in steps]
    elif callable(assignment):
        raw = [assignment(i, st) for i, st in enumerate(steps)]
    else:
        raw = list(assignment)
        if len(raw) != len(steps):
            raise ValueError(
                f"The assignment lists {len(raw)} stages but the program has "
                f"{len(steps)} steps: give one stage per step, or a dict of "
                "layer path prefixes {prefix: stage}."
            )
    for i, s in enumerate(raw):
        if s is not None and (not isinstance(s, int) or s < 0):
            raise ValueError(f"Step {i}: stage {s!r} is not a non-negative int.")
    if all(s is None for s in raw):
        sources = sorted({st.source for st in steps if st.source})[:5]
        raise ValueError(
            f"No program step matches the assignment {assignment!r}: the "
            f"steps' layer paths are e.g. {sources or 'absent (untraced sources)'}."
            " Use prefixes of those paths, or give one stage per step."
        )
    # Inputs (weights, optimizer slots) live where the placed steps read them.
    home = {}
    input_keys = set(graph.inputs)
    for st, s in zip(steps, raw):
        if s is not None:
            for k in st.inputs:
                if k in input_keys:
                    home[k] = max(home.get(k, s), s)
    first = next(s for s in raw if s is not None)
    stages, prev = [], first
    for st, s in zip(steps, raw):
        if s is None:
            homes = [home[k] for k in st.inputs if k in home]
            s = max(homes) if homes else prev
        stages.append(s)
        prev = s
    return stages


def _schedule_name(schedule):
    name = getattr(schedule, "name", schedule)
    for known in SCHEDULES:
        if str(name).lower() == known.lower():
            return known
    raise ValueError(
        f"Unknown pipeline schedule {schedule!r}: use one of {', '.join(SCHEDULES)} "
        "(PipelineSchedule.Grouped, .Interleaved, .Sequential)."
    )


def in_flight(schedule, stage, n_stages):
    """Micro-batches whose activations stage `stage` holds at once."""
    if schedule == "Grouped":
        return 2 * (n_stages - 1 - stage) + 1
    if schedule == "Interleaved":
        return n_stages - stage
    return 1


# -- the prediction -------------------------------------------------------------


def predict_sharded(obj, assignment, target=None, gradient_accumulation_count=1,
                    schedule="Grouped", batch_size=None, device_mapping=None,
                    resident_inputs=(), resident_outputs=(), check_memory=False,
                    weight_update=None):
    """The ShardedPrediction of a Graph or Executable split over IPUs.

    assignment: see the module doc. device_mapping: IPU of each stage
    (default: stage s on IPU s). gradient_accumulation_count: micro-batches
    per step. schedule: "Grouped", "Interleaved" or "Sequential" (or a
    PipelineSchedule). batch_size: samples per micro-batch. resident_inputs
    / resident_outputs: as predict_costs (not moved over PCIe).
    weight_update: step indices (or a callable (index, step) -> bool) run
    once per step rather than per micro-batch.
    check_memory: raise IPUOutOfMemoryError naming the first IPU that does
    not fit.
    """
    target = memory_model.resolve_target(target)
    program = memory_model.graph_of(obj)
    schedule = _schedule_name(schedule)
    g = int(gradient_accumulation_count)
    if g < 1:
        raise ValueError(f"gradient_accumulation_count must be >= 1, got {g}.")
    stages = assign_stages(program, assignment)
    used_stages = sorted(set(stages))
    if device_mapping is None:
        device_mapping = list(range(max(used_stages) + 1))
    device_mapping = list(device_mapping)
    if max(used_stages) >= len(device_mapping):
        raise ValueError(
            f"Stage {max(used_stages)} has no IPU: device_mapping {device_mapping} "
            f"lists {len(device_mapping)} stages."
        )
    ipu_of = [device_mapping[s] for s in stages]
    ipus = sorted(set(ipu_of))
    n = len(ipus)
    rank = {d: r for r, d in enumerate(ipus)}  # pipeline position of each IPU

    single = predict_costs(program, target=target, resident_inputs=resident_inputs,
                           resident_outputs=resident_outputs, log=False)
    step_cycles = [s.cycles for s in single.steps]

    # Forward / backward: the last stage's first step is the turning point.
    last_ipu = max(ipus, key=lambda d: rank[d])
    turn = min(i for i, d in enumerate(ipu_of) if d == last_ipu)

    if weight_update is None:
        once = set()
    elif callable(weight_update):
        once = {i for i, st in enumerate(program.nodes) if weight_update(i, st)}
    else:
        once = set(weight_update)

    def phase(i):
        if i in once:
            return "update"
        return "forward" if ipu_of[i] == last_ipu or i < turn else "backward"

    made_by = {v: i for i, node in enumerate(program.nodes) for v in node.outputs}
    avals = _Avals()

    copies, seen = [], set()
    for i, st in enumerate(program.nodes):
        d = ipu_of[i]
        for k in st.inputs:
            j = made_by.get(k)
            if j is None or ipu_of[j] == d or (k, d) in seen:
                continue
            seen.add((k, d))
            nbytes = avals[k].nbytes or 0
            copies.append(Copy(nbytes, ipu_of[j], d, i, avals[k], phase(i),
                               cost_model.ipu_link_cycles(nbytes, target), k))

    results = []
    for d in ipus:
        mine = [i for i in range(len(program.nodes)) if ipu_of[i] == d]
        fwd = sum(step_cycles[i] for i in mine if phase(i) == "forward")
        bwd = sum(step_cycles[i] for i in mine if phase(i) == "backward")
        upd = sum(step_cycles[i] for i in mine if phase(i) == "update")
        incoming = [c for c in copies if c.dst == d]
        fwd += sum(c.cycles for c in incoming if c.phase == "forward")
        bwd += sum(c.cycles for c in incoming if c.phase == "backward")
        upd += sum(c.cycles for c in incoming if c.phase == "update")
        # Stash: values made (or received) in this IPU's forward pass that
        # its backward pass reads.
        fwd_values = {k: avals[k] for i in mine if phase(i) == "forward"
                      for k in program.nodes[i].outputs}
        fwd_values.update({c.value: c.aval for c in incoming if c.phase == "forward"})
        stashed = {k for i in mine if phase(i) == "backward"
                   for k in program.nodes[i].inputs if k in fwd_values}
        stash_bytes = sum(fwd_values[k].nbytes or 0 for k in stashed)
        stash_tile = sum(memory_model.tile_bytes(fwd_values[k], target.tiles_per_ipu)
                         for k in stashed)
        flight = in_flight(schedule, rank[d], n) if d != last_ipu else 1
        report = memory_model.analyze_memory(
            _ipu_program(program, ipu_of, d, made_by), target, ipu=d)
        extra = flight - 1
        if extra and stash_bytes:
            report = dataclasses.replace(
                report,
                not_always_live_bytes=report.not_always_live_bytes + extra * stash_bytes,
                tile_bytes=report.tile_bytes + extra * stash_tile,
            )
        results.append(IPUPrediction(
            ipu=d, stages=tuple(sorted({stages[i] for i in mine})), steps=tuple(mine),
            forward_cycles=fwd, backward_cycles=bwd,
            copy_in_bytes=sum(c.nbytes for c in incoming),
            copy_in_cycles=sum(c.cycles for c in incoming),
            stash_bytes=stash_bytes, in_flight=flight, memory=report,
            weight_update_cycles=upd,
        ))

    if schedule == "Sequential" or n == 1:
        total = g * sum(p.cycles for p in results)
        total += sum(p.weight_update_cycles for p in results)
    else:
        if schedule == "Grouped":
            total = (g + n - 1) * max(p.cycles for p in results)
        else:  # Interleaved
            total = (g + n - 1) * (max(p.forward_cycles for p in results)
                                   + max(p.backward_cycles for p in results))
        total += max(p.weight_update_cycles for p in results)
    pred = ShardedPrediction(
        target=target, schedule=schedule, gradient_accumulation_count=g,
        stage_of_step=tuple(stages), ipus=results, copies=copies,
        step_cycles=int(total), host_seconds=g * single.host_seconds,
        batch_size=batch_size,
    )
    if check_memory:
        for p in results:
            if not p.memory.fits:
                raise memory_model.IPUOutOfMemoryError(p.memory)
    return pred


class _Avals:
    """aval of a program value (Var or Literal)."""

    def __getitem__(self, value):
        return value.aval


def _ipu_program(graph, ipu_of, d, made_by):
    """IPU d's own step list: its steps, with a copy-in step before the
    first use of each value made elsewhere and a copy-out step where a value
    made here is first read by each other IPU."""
    nodes, received, sent = [], set(), set()
    for i, node in enumerate(graph.nodes):
        if ipu_of[i] == d:
            for v in node.inputs:
                j = made_by.get(v)
                if j is not None and ipu_of[j] != d and v not in received:
                    received.add(v)
                    nodes.append(Node(_RECEIVE, [], {}, [v], f"copy from IPU {ipu_of[j]}"))
            nodes.append(node)
        else:
            for v in node.inputs:
                j = made_by.get(v)
                if j is not None and ipu_of[j] == d and (v, ipu_of[i]) not in sent:
                    sent.add((v, ipu_of[i]))
                    nodes.append(Node(_SEND, [v], {}, [], f"copy to IPU {ipu_of[i]}"))
    read = {v for node in nodes for v in node.inputs}
    made = {v for node in nodes for v in node.outputs}
    out = Graph()
    out.inputs = [v for v in graph.inputs if v in read]
    out.nodes = nodes
    out.outputs = [v for v in graph.outputs
                   if v in made and made_by.get(v) is not None and ipu_of[made_by[v]] == d]
    return out
