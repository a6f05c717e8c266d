"""Predicted cycles, step time and throughput of a single-IPU program.

`predict_costs(executable_or_graph, target=...)` walks the program's steps
in order; each step is one bulk-synchronous superstep: compute, one sync,
exchange (cost_model, where every constant and formula lives). Host
transfers (inputs in, outputs out, over PCIe) add to the step time. With
TF_POPLAR_FLAGS=--log_cycle_count=N the prediction is logged.

Control flow costs its sub-graphs as its cost rule counts them
(primitives/control_flow.py: a scan's body `length` times, a while loop's
body its trip count as loop_trips.py reads it from the program, else the
assumed count, which the summary then mentions; a cond its costliest
branch): `counted_parts`
and `cycles` compose them, the one place that does; the profile opens the
same parts up (`sub_predictions`).
"""

import dataclasses
import math
import logging

from keras_ipu.device.config import system_config
from keras_ipu.device.ir import runs_on
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import loop_trips
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import partition
from keras_ipu.device.units import fmt_bytes

logger = logging.getLogger("keras_ipu.cycles")


@dataclasses.dataclass
class StepCost:
    index: int
    name: str
    kind: str
    source: object
    tiles: int
    flops: int
    macs: int
    compute: int
    exchange: int
    sync: int
    # The IPU it runs on (a copy: the receiving one); None for a control-flow
    # step whose sub-graphs span IPUs (Prediction.ipu_cycles opens it).
    ipu: object = 0

    @property
    def cycles(self):
        return self.compute + self.exchange + self.sync


def counted_parts(cost, target):
    """The Parts of a control-flow cost that count: all of them, or (combine
    "max": a cond) the one costing most cycles."""
    if cost.combine != "max" or not cost.parts:
        return list(cost.parts)
    return [max(cost.parts, key=lambda p: sum(_part_cycles(p, target)))]


def _part_cycles(part, target):
    """(compute, exchange, sync) of one pass through a Part, times its repeat."""
    c = e = s = 0
    for sub in part.costs:
        sc, se, ss, _ = cycles(sub, target)
        c, e, s = c + sc, e + se, s + ss
    return part.repeat * c, part.repeat * e, part.repeat * s


def cycles(cost, target):
    """(compute, exchange, sync, tiles) cycles of one cost record on
    `target`: one superstep, or the counted parts of a control-flow step."""
    if cost.parts:
        parts = [_part_cycles(p, target) for p in counted_parts(cost, target)]
        c, e, s = (sum(x[i] for x in parts) for i in range(3))
        return c, e, s, 0
    if cost.kind == "view":
        return 0, 0, 0, 0
    if cost.kind == "collective":
        tiles = cost_model.work_tiles(cost, target)
        links, syncs = cost_model.collective_link_cycles(
            cost.link_bytes, cost.link_steps, target)
        links += _cross_instance_cycles(cost, target)
        return (cost_model.compute_cycles(cost, target, tiles), links,
                syncs + cost_model.sync_cycles(1), tiles)
    if cost.kind == "stream":
        moved = cost.bytes_in + cost.bytes_out
        return 0, cost_model.stream_cycles(moved, target), cost_model.sync_cycles(1), 0
    if cost.kind == "link":
        if not cost.bytes_out:
            return 0, 0, 0, 0
        return (0, cost_model.ipu_link_cycles(cost.bytes_out, target)
                - cost_model.INTER_IPU_SYNC_CYCLES, cost_model.INTER_IPU_SYNC_CYCLES, 0)
    tiles = cost_model.work_tiles(cost, target)
    compute = cost_model.compute_cycles(cost, target, tiles)
    moved = cost_model.exchange_bytes(cost, target, tiles)
    exchange = cost_model.exchange_cycles(moved, tiles, target)
    return compute, exchange, cost_model.sync_cycles(1), tiles


def _cross_instance_cycles(cost, target):
    """The instances' part of an all-reduce in a multi-process job (its
    replicas: 2 (k - 1) ring steps, cost_model.all_reduce_link_traffic)."""
    instances, _ = system_config.configured_instances()
    if instances <= 1:
        return 0
    local = (cost.link_steps or 0) // 2 + 1
    seconds = cost_model.cross_instance_reduction_seconds(
        cost.bytes_in, local, instances, target, on_hosts=partition.reduces_on_hosts())
    return math.ceil(seconds * target.clock_hz)


def step_costs(graph, target):
    """The StepCost of each node of `graph`, in order."""
    steps = []
    for i, node in enumerate(graph.nodes):
        record = cost_util.node_cost(node)
        compute, exchange, sync, tiles = cycles(record, target)
        flops, macs = cost_util.totals([record])
        steps.append(StepCost(i, node.primitive.name, record.kind, node.source, tiles,
                              flops, macs, compute, exchange, sync, runs_on(node)))
    return steps


def ipu_cycles(graph, steps, target, memo=None, skip=None):
    """{IPU: cycles} of one run of `graph` (its StepCosts `steps`): each step
    on the IPU it runs on, a control-flow step spanning IPUs opened up;
    without the step at index `skip` (a pipeline's loop, timed apart)."""
    per_ipu = {}
    for i, (s, node) in enumerate(zip(steps, graph.nodes)):
        if i == skip:
            continue
        if s.ipu is not None:
            per_ipu[s.ipu] = per_ipu.get(s.ipu, 0) + s.cycles
            continue
        for repeat, _, sub in sub_predictions(node, target, memo):
            for ipu, c in sub.ipu_cycles.items():
                per_ipu[ipu] = per_ipu.get(ipu, 0) + repeat * c
    return per_ipu


@dataclasses.dataclass
class Prediction:
    target: object
    steps: list  # StepCost per program step
    compute_cycles: int
    exchange_cycles: int
    sync_cycles: int
    cycles: int  # of one run of the program
    steps_per_run: int  # training steps one run performs (the device loop)
    host_bytes_in: int
    host_bytes_out: int
    host_seconds: float
    batch_size: object  # samples per step, or None
    memory: object  # MemoryReport
    # {IPU: cycles of one run} (a one-IPU program: {0: cycles}); the IPUs of
    # a placed program work in turn unless pipelined (sharding.py).
    ipu_cycles: dict = dataclasses.field(default_factory=dict)
    # A pipelined program (sharding.predict_pipelined): its ShardedPrediction,
    # whose schedule `cycles` follows; compute, exchange and sync stay the
    # IPUs' work summed (they overlap under the schedule).
    pipeline: object = None
    # While loops whose trips the program does not say (loop_trips.py):
    # counted at cost_model.WHILE_LOOP_ASSUMED_TRIPS, and said so.
    uncounted_loops: int = 0

    @property
    def cycles_per_step(self):
        return self.cycles / self.steps_per_run

    @property
    def device_seconds(self):
        return cost_model.cycles_to_seconds(self.cycles, self.target)

    @property
    def step_seconds(self):
        return (self.device_seconds + self.host_seconds) / self.steps_per_run

    @property
    def samples_per_second(self):
        if not self.batch_size or not self.step_seconds:
            return None
        return self.batch_size / self.step_seconds

    def summary(self):
        sps = self.samples_per_second
        pipe = self.pipeline
        scheduled = "" if pipe is None else (
            f"pipelined over {pipe.n_stages} IPUs, schedule {pipe.schedule}, "
            f"{pipe.gradient_accumulation_count} micro-batches per step, utilisation "
            f"{100 * pipe.utilisation:.0f}%; work summed: ")
        uncounted = "" if not self.uncounted_loops else (
            f"; {self.uncounted_loops} while loop(s) whose trips the program does not "
            f"fix counted {cost_model.WHILE_LOOP_ASSUMED_TRIPS} trip(s) each")
        return (
            f"{self.target.name}: {self.cycles_per_step:,.0f} cycles per step "
            f"({scheduled}compute {self.compute_cycles:,}, exchange {self.exchange_cycles:,}, "
            f"sync {self.sync_cycles:,} per run), "
            f"{self.step_seconds * 1e6:,.1f} us per step"
            + (f", {sps:,.1f} samples/s" if sps is not None else "") + uncounted
        )

    def __str__(self, top=15):
        t = self.target
        head = (f"{'step':>5}  {'op':<22} {'kind':<11} {'tiles':>5} {'compute':>11} "
                f"{'exchange':>10} {'sync':>7} {'cycles':>11}  source")
        lines = [
            f"Cycle prediction on {t.name} ({t.product}, {t.tiles_per_ipu} tiles, "
            f"{t.clock_hz / 1e9:g} GHz)",
            head,
        ]
        shown = sorted(self.steps, key=lambda s: -s.cycles)[:top]
        for s in sorted(shown, key=lambda s: s.index):
            lines.append(
                f"{s.index:>5}  {s.name[:22]:<22} {s.kind:<11} {s.tiles:>5} "
                f"{s.compute:>11,} {s.exchange:>10,} {s.sync:>7,} {s.cycles:>11,}  "
                f"{s.source or ''}"
            )
        if len(self.steps) > len(shown):
            lines.append(f"       ... {len(self.steps) - len(shown)} cheaper steps not shown")
        lines += [
            f"{'total':>5}  {'':<22} {'':<11} {'':>5} {self.compute_cycles:>11,} "
            f"{self.exchange_cycles:>10,} {self.sync_cycles:>7,} {self.cycles:>11,}",
            f"  device time {self.device_seconds * 1e6:,.2f} us per run, host "
            f"transfers {self.host_seconds * 1e6:,.2f} us ({self.host_bytes_in:,} B in, "
            f"{self.host_bytes_out:,} B out)",
            "  " + self.summary(),
        ]
        if self.memory is not None:
            m = self.memory
            lines.append(
                f"  memory: {fmt_bytes(m.total_bytes)} on the IPU, "
                f"fullest tile {m.tile} at {fmt_bytes(m.tile_bytes)} of "
                f"{fmt_bytes(m.tile_capacity)}"
            )
        return "\n".join(lines)


def predict_costs(obj, target=None, batch_size=None, steps_per_run=1,
                  resident_inputs=(), check_memory=False, log=None,
                  resident_outputs=(), feeds=None):
    """The Prediction of a Graph or Executable on `target` (IPUTarget or
    name; default: the configured system's).

    batch_size: samples per step (for samples/s). steps_per_run: training
    steps one run of the program performs. resident_inputs: indices of
    inputs that stay on the IPU between runs (weights): not sent over PCIe.
    resident_outputs: indices of outputs that stay on the IPU (the new
    weights and optimizer state of a training step): not read back.
    check_memory: raise IPUOutOfMemoryError when a tile overflows. log:
    log the summary (default: when --log_cycle_count is set). feeds: the
    program's feeds.Feeds (one element of each held on the IPU), or None.
    """
    target = memory_model.resolve_target(target)
    graph = memory_model.graph_of(obj)
    steps = step_costs(graph, target)
    bytes_in, bytes_out, host = host_traffic(
        [v.aval for v in graph.inputs], [v.aval for v in graph.outputs], target,
        resident_inputs, resident_outputs,
    )
    memory = memory_model.analyze_memory(graph, target, feeds=feeds)
    if check_memory and not memory.fits:
        raise memory_model.IPUOutOfMemoryError(memory)
    compute = sum(s.compute for s in steps)
    exchange = sum(s.exchange for s in steps)
    sync = sum(s.sync for s in steps)
    pred = Prediction(
        target=target, steps=steps, compute_cycles=compute,
        exchange_cycles=exchange, sync_cycles=sync,
        cycles=compute + exchange + sync, steps_per_run=max(1, int(steps_per_run)),
        host_bytes_in=bytes_in, host_bytes_out=bytes_out, host_seconds=host,
        batch_size=batch_size, memory=memory, ipu_cycles=ipu_cycles(graph, steps, target),
        uncounted_loops=loop_trips.uncounted(graph),
    )
    if log is None:
        log = log_cycle_count_flag() >= 0
    if log:
        logger.info("Predicted cycles: %s", pred.summary())
    return pred


def host_traffic(in_avals, out_avals, target, resident_inputs=(),
                 resident_outputs=()):
    """(bytes in, bytes out, seconds) over PCIe for one run: every input and
    output except the resident ones (weights kept on the IPU) and the
    streams --use_synthetic_data makes synthetic (values still come from
    the host: the simulator computes on the real data)."""
    resident = {j % len(in_avals) for j in resident_inputs} if in_avals else set()
    kept = {j % len(out_avals) for j in resident_outputs} if out_avals else set()
    bytes_in = sum(a.nbytes or 0 for j, a in enumerate(in_avals) if j not in resident)
    bytes_out = sum(a.nbytes or 0 for j, a in enumerate(out_avals) if j not in kept)
    if _synthetic_data_for("infeed"):
        bytes_in = 0
    if _synthetic_data_for("outfeed"):
        bytes_out = 0
    seconds = (cost_model.host_transfer_seconds(bytes_in, target)
               + cost_model.host_transfer_seconds(bytes_out, target))
    return bytes_in, bytes_out, seconds


def predict_graph(graph, target, memo=None):
    """The step costs of a sub-graph as a Prediction (no memory analysis and
    no host transfers: a body runs inside the program that holds it).
    `memo`: a dict kept by a caller opening many parts (id(graph) -> ...)."""
    key = (id(graph), target)
    if memo is not None and key in memo:
        return memo[key][1]
    steps = step_costs(graph, target)
    compute = sum(x.compute for x in steps)
    exchange = sum(x.exchange for x in steps)
    sync = sum(x.sync for x in steps)
    pred = Prediction(
        target=target, steps=steps, compute_cycles=compute, exchange_cycles=exchange,
        sync_cycles=sync, cycles=compute + exchange + sync, steps_per_run=1,
        host_bytes_in=0, host_bytes_out=0, host_seconds=0.0, batch_size=None,
        memory=None, ipu_cycles=ipu_cycles(graph, steps, target, memo))
    if memo is not None:
        memo[key] = (graph, pred)  # the graph kept: ids stay unique
    return pred


def sub_predictions(node, target, memo=None):
    """[(repeat, graph, Prediction)] of the sub-graphs a control-flow node
    runs, as its cost counts them (counted_parts); [] for other nodes."""
    record = cost_util.node_cost(node)
    return [(p.repeat, p.graph, predict_graph(p.graph, target, memo))
            for p in counted_parts(record, target)]


def _synthetic_data_for(category):
    return system_config.configuration().flags.synthetic_data_for(category)


def log_cycle_count_flag():
    return system_config.configuration().flags.log_cycle_count


@dataclasses.dataclass
class HostReduction:
    """The predicted cost of one reduction of `nbytes` per instance on the
    hosts of `instances` instances (cost_model.host_allreduce_seconds)."""

    nbytes: int
    instances: int
    transfer_seconds: float  # IPU -> host and back, over the host link
    network_seconds: float  # the ring between the hosts

    @property
    def seconds(self):
        return self.transfer_seconds + self.network_seconds

    def summary(self):
        return (
            f"host all-reduce of {self.nbytes:,} B over {self.instances} instances: "
            f"{self.seconds * 1e6:,.1f} us (IPU<->host {self.transfer_seconds * 1e6:,.1f} us, "
            f"network {self.network_seconds * 1e6:,.1f} us)"
        )


def predict_host_allreduce(nbytes, instances, target=None, log=None):
    """The HostReduction of one host-side all-reduce (ipu.distributed and the
    strategies' reductions on the CPU); logged with the cycle predictions
    (TF_POPLAR_FLAGS=--log_cycle_count)."""
    target = memory_model.resolve_target(target)
    total = cost_model.host_allreduce_seconds(nbytes, instances, target)
    transfer = 2 * cost_model.host_transfer_seconds(nbytes, target) if instances > 1 else 0.0
    result = HostReduction(int(nbytes), int(instances), transfer, total - transfer)
    if log is None:
        log = log_cycle_count_flag() >= 0
    if log:
        logger.info("Predicted %s", result.summary())
    return result
