"""The predicted IPU timeline of program runs, laid out once for every view.

The TensorBoard trace (the Chrome JSON file and the XSpace) and the report's
timeline picture draw the same lanes, top-down:

    Program runs     one slice per run: host -> IPU, the program, IPU -> host
    Host transfers   the run's PCIe transfers (inputs in, outputs out)
    Program steps    each step a superstep (compute, sync, exchange), named
                     by op and Keras layer; a pipelined program's: a row
                     per IPU, each micro-batch's forward and backward pass
                     where its schedule puts them (pipeline_slices)
    Loop bodies      one pass after another through each loop body (the
                     device loop's training step is the body of its scan)
    Nested bodies    the bodies inside those

and a memory counter per IPU (bytes live at each program step). A run lasts
what the scalars and the summary call the step time times the steps per
run: device cycles at the target's clock plus the host transfers
(prediction.Prediction.step_seconds).
"""

import dataclasses

from keras_ipu.device.simulator import profile

LANES = ("Program runs", "Host transfers", "Program steps", "Loop bodies",
         "Nested bodies")
RUNS, TRANSFERS, STEPS, BODIES = 0, 1, 2, 3
# Program steps are drawn for the first runs of each program only, as
# Poplar's autoReport.executionProfileProgramRunCount (default 2) does;
# later runs are one slice each, which says so.
STEP_DETAIL_RUNS = 2
# Step slices per run at most (a device loop of many iterations would
# otherwise make a file TensorBoard cannot open); a run cut short says so.
MAX_STEP_EVENTS = 20000
NO_LAYER = "(no layer)"
MEMORY_COUNTER = "IPU {ipu} memory (predicted bytes)"


@dataclasses.dataclass
class Slice:
    lane: int  # index into LANES
    name: str
    start_us: float
    dur_us: float
    args: dict
    ipu: int = 0


@dataclasses.dataclass
class Counter:
    name: str
    ts_us: float
    values: dict  # series name -> value
    ipu: int = 0


transfer_seconds = profile.transfer_seconds


def run_seconds(pred):
    """One run: the device's cycles and both transfers."""
    return pred.device_seconds + pred.host_seconds


def step_name(op, source):
    """A program step's slice name: its op and the Keras layer it belongs to."""
    return f"{op} ({source})" if source else f"{op} {NO_LAYER}"


def run_slices(exe, pred, label, begin_us, detailed=True, budget=None, memo=None):
    """([Slice], [Counter]) of one run of `exe` starting at `begin_us`
    (microseconds). `detailed`: draw its program steps and loop bodies
    (else the run slice says they are not drawn). `budget`: [step slices
    left], shared by the runs of a trace; `memo`: the sub-graph predictions
    they share (profile.execution_trace)."""
    budget = [MAX_STEP_EVENTS] if budget is None else budget
    target = pred.target
    us_per_cycle = 1e6 / target.clock_hz
    seconds_in, seconds_out = transfer_seconds(pred)
    device_us = pred.cycles * us_per_cycle
    start_device = begin_us + seconds_in * 1e6
    end_us = start_device + device_us + seconds_out * 1e6
    run_args = {
        "program": label, "target": target.name,
        "cycles": pred.cycles, "device time (us)": round(device_us, 3),
        "host transfers (us)": round((seconds_in + seconds_out) * 1e6, 3),
        "steps per run": pred.steps_per_run,
        "predicted step time (us)": round(pred.step_seconds * 1e6, 3),
    }
    slices = [Slice(RUNS, label, begin_us, end_us - begin_us, run_args)]
    if seconds_in:
        slices.append(Slice(TRANSFERS, "host -> IPU", begin_us, seconds_in * 1e6,
                            {"bytes": pred.host_bytes_in}))
    if seconds_out:
        slices.append(Slice(TRANSFERS, "IPU -> host", start_device + device_us,
                            seconds_out * 1e6, {"bytes": pred.host_bytes_out}))
    if not detailed:
        run_args["program steps drawn"] = (
            f"no: only the first {STEP_DETAIL_RUNS} runs of each program are "
            "drawn step by step")
        slices[0].name = f"{label} (steps not drawn)"
        return slices, []
    if getattr(pred, "pipeline", None) is not None:
        return slices + pipeline_slices(pred.pipeline, start_device, us_per_cycle, budget), \
            pipeline_counters(pred.pipeline, start_device, start_device + device_us)
    trace = profile.execution_trace(pred, exe, memo=memo)
    before = budget[0]
    _step_slices(slices, trace, start_device, us_per_cycle, STEPS, budget)
    if budget[0] <= 0:
        run_args["program steps drawn"] = (
            f"partly: the trace holds at most {MAX_STEP_EVENTS} step slices")
    elif before == budget[0]:
        run_args["program steps drawn"] = "no step takes any cycles"
    return slices, [c for ipu in (getattr(exe, "ipus", None) or (0,))
                    for c in memory_counters(exe, pred, trace, start_device, us_per_cycle, ipu)]


def _step_slices(out, steps, origin, us_per_cycle, lane, budget, ipu=0):
    for step in steps:
        if budget[0] <= 0:
            return
        if step["end"] == step["start"]:
            continue
        # A control-flow step spanning IPUs (ipu None): its body's steps say.
        where = ipu if step.get("ipu") is None else step["ipu"]
        c, y, e = (b - a for a, b in (step["compute"], step["sync"], step["exchange"]))
        out.append(Slice(
            min(lane, len(LANES) - 1), step_name(step["op"], step["source"]),
            origin + step["start"] * us_per_cycle,
            (step["end"] - step["start"]) * us_per_cycle,
            {"op": step["op"], "layer": step["source"] or NO_LAYER,
             "step": step["index"], "cycles": c + y + e, "compute cycles": c,
             "sync cycles": y, "exchange cycles": e,
             "output bytes": step.get("bytes")}, where))
        budget[0] -= 1
        at = origin + step["start"] * us_per_cycle
        for loop in step.get("loops", ()):
            length = max((x["end"] for x in loop["trace"]), default=0) * us_per_cycle
            for _ in range(loop["repeat"]):
                if budget[0] <= 0 or not length:
                    break
                _step_slices(out, loop["trace"], at, us_per_cycle, lane + 1, budget, where)
                at += length


def pipeline_schedule(pipe):
    """[(ipu, what, micro-batch or None, start, cycles)] of one step of a
    pipelined program (sharding.ShardedPrediction), cycles from 0, as its
    schedule times it (sharding.py's module doc): Grouped: slot t of
    max_k (F_k + B_k) cycles, the IPU at pipeline position r working on
    micro-batch t - r, forward then backward; Interleaved: a forward slot of
    max_k F_k then a backward slot of max_k B_k; Sequential: each
    micro-batch through the IPUs one after another. Then the weight update
    (all IPUs together; Sequential: one after another); an inference
    pipeline has forward passes only, and its work after them."""
    ipus, g, n = pipe.ipus, pipe.gradient_accumulation_count, len(pipe.ipus)
    out = []
    if pipe.schedule == "Sequential" or n == 1:
        per_micro_batch = sum(p.cycles for p in ipus)
        for m in range(g):
            t = m * per_micro_batch
            for p in ipus:
                out.append((p.ipu, "forward", m, t, p.forward_cycles))
                out.append((p.ipu, "backward", m, t + p.forward_cycles, p.backward_cycles))
                t += p.cycles
        end = g * per_micro_batch
    else:
        grouped = pipe.schedule == "Grouped"
        forward_slot = max(p.cycles if grouped else p.forward_cycles for p in ipus)
        slot = forward_slot + (0 if grouped else max(p.backward_cycles for p in ipus))
        for r, p in enumerate(ipus):
            for m in range(g):
                t = (m + r) * slot
                out.append((p.ipu, "forward", m, t, p.forward_cycles))
                back = t + (p.forward_cycles if grouped else forward_slot)
                out.append((p.ipu, "backward", m, back, p.backward_cycles))
        end = (g + n - 1) * slot
    # An inference pipeline's work after its micro-batches updates no weights.
    after = "weight update" if pipe.training else "after the micro-batches"
    for p in ipus:
        out.append((p.ipu, after, None, end, p.weight_update_cycles))
        if pipe.schedule == "Sequential" or n == 1:
            end += p.weight_update_cycles
    return [x for x in out if x[4]]


def pipeline_slices(pipe, origin, us_per_cycle, budget):
    """The Program steps lane of a pipelined run: one row per IPU, a slice
    per micro-batch's forward and backward pass on it (the stages overlap
    as the schedule has them) and the weight update, for each step of the
    run (pipeline_schedule)."""
    out = []
    for step in range(pipe.steps_per_run):
        at = origin + step * pipe.step_cycles * us_per_cycle
        for ipu, what, m, start, cycles in pipeline_schedule(pipe):
            if budget[0] <= 0:
                return out
            stages = ",".join(str(s) for p in pipe.ipus if p.ipu == ipu for s in p.stages)
            name = what if m is None else f"micro-batch {m} {what}"
            out.append(Slice(STEPS, f"{name} (stage {stages})", at + start * us_per_cycle,
                             cycles * us_per_cycle,
                             {"ipu": ipu, "stages": stages, "step": step, "micro-batch": m,
                              "pass": what, "cycles": cycles,
                              "schedule": pipe.schedule}, ipu))
            budget[0] -= 1
    return out


def pipeline_counters(pipe, start_us, end_us):
    """Each IPU's memory through a pipelined run: its always-live bytes and
    its not-always-live peak (the micro-batches in flight stashed), held
    for the run (the schedule interleaves the micro-batches' steps, so
    there is no one program order to follow)."""
    counters = []
    for p in pipe.ipus:
        name = MEMORY_COUNTER.format(ipu=p.ipu)
        m = p.memory
        counters.append(Counter(name, start_us, {"always live": m.always_live_bytes,
                                                 "not always live": m.not_always_live_bytes},
                                p.ipu))
        counters.append(Counter(name, end_us, {"always live": 0, "not always live": 0}, p.ipu))
    return counters


def memory_counters(exe, pred, trace, origin, us_per_cycle, ipu=0):
    """The memory counter of a run: always-live and not-always-live bytes
    (loop bodies' peaks included, as the memory report counts them) at the
    start of each program step, and zero after the run."""
    per_ipu, _, _ = profile.liveness(exe, pred.target, ipu)
    always = profile.memory_of(exe, pred.target, ipu).always_live_bytes
    name = MEMORY_COUNTER.format(ipu=ipu)
    counters = []
    for step, live in zip(trace, per_ipu):
        counters.append(Counter(name, origin + step["start"] * us_per_cycle,
                                {"always live": always, "not always live": live}, ipu))
    end = origin + (trace[-1]["end"] if trace else 0) * us_per_cycle
    counters.append(Counter(name, end, {"always live": 0, "not always live": 0}, ipu))
    return counters


def lay_out(runs, origin):
    """(slices, counters) of the recorded runs [(executable, wall start,
    wall end)] (perf_counter seconds; `origin`: the trace's start). The IPU
    runs one program at a time: a run starts when its host call started or
    when the previous run ended, whichever is later."""
    slices, counters = [], []
    detailed, known = {}, {}
    device_free = 0.0
    budget = [MAX_STEP_EVENTS]
    memo = {}
    for exe, start, _ in runs:
        if id(exe) not in known:
            known[id(exe)] = (program_label(exe), profile.prediction_of(exe))
        label, pred = known[id(exe)]
        begin = max((start - origin) * 1e6, device_free)
        seen = detailed.get(id(exe), 0)
        detailed[id(exe)] = seen + 1
        s, c = run_slices(exe, pred, label, begin, seen < STEP_DETAIL_RUNS, budget, memo)
        slices += s
        counters += c
        device_free = begin + run_seconds(pred) * 1e6
    return slices, counters


def program_label(exe):
    name = getattr(exe, "name", None) or "program"
    return f"{name} ({profile.program_fingerprint(exe)})"
