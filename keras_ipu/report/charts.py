"""The pictures of a profile report, drawn with matplotlib.

Each picture stands on its own: a title naming the program, axes with
ticks and units, named lanes and a legend. matplotlib is imported only
here, when pictures are asked for (`pip install keras_ipu[profile]`
brings it); it draws on its own Figure objects (no pyplot state), so
drawing works in any thread and without a display.

    draw_all(report) -> [(kind, png bytes, title)]

kinds: memory_ipu<N> (memory per tile by category, and the IPU's total by
category against its capacity: one per IPU), liveness (bytes live over
the program steps, peak marked), loop_body_liveness (inside the largest
loop body), cycles_by_layer, timeline (the predicted run, lanes as in
report/timeline.py).
"""

import io

import numpy as np

from keras_ipu.device.simulator import profile
from keras_ipu.report.format import fmt_bytes

# One colour per memory category (colour-blind-safe tableau order).
CATEGORY_COLOURS = {
    "weights": "#4e79a7", "optimizer state": "#f28e2b", "metric state": "#b07aa1",
    "stream buffers": "#59a14f", "program inputs": "#76b7b2", "constants": "#9c755f",
    "code": "#bab0ac", "activations": "#e15759",
}
PHASE_COLOURS = {"compute": "#4e79a7", "sync": "#bab0ac", "exchange": "#f28e2b"}
LIMIT = "#d62728"
# The timeline: layers in the tableau colours, the run and its transfers in
# colours no layer gets (they were the same teal and green as two layers).
LAYER_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                 "#b07aa1", "#ff9da7")
OTHER_LAYERS = "#bab0ac"
RUN_COLOUR = "#ffffff"
TRANSFER_COLOUR = "#333333"
DPI = 100
MAX_TIMELINE_STEPS = 20000


def _matplotlib():
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise ImportError(
            "Drawing the report's pictures needs matplotlib, which is not "
            "installed. Install it with `pip install keras_ipu[profile]` (or "
            "`pip install matplotlib`), or pass --no-pictures for the summary "
            "only.") from None
    return Figure, FuncFormatter


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _bytes_axis(axis, vmax):
    """Ticks at round binary sizes (1, 2, 4, 8 ... KiB), labelled with units."""
    from matplotlib.ticker import MultipleLocator

    _, FuncFormatter = _matplotlib()
    step = 2.0 ** max(0, int(np.ceil(np.log2(max(vmax, 1) / 6))))
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(max(int(v), 0))))


def label(report):
    p = report["program"]
    return f"{p['name']} ({p['fingerprint']})"


def _target(report):
    t = report["target"]
    return f"{t['name']} ({t['product']})"


# -- memory, one picture per IPU ----------------------------------------------
def memory_ipu(report, ipu_index=0):
    Figure, _ = _matplotlib()
    memory = report["memory"]
    tiles, ipu = memory["tiles"][ipu_index], memory["ipus"][ipu_index]
    categories = [c for c in profile.CATEGORIES if c in tiles["categories"]]
    per_tile = [np.asarray(tiles["categories"][c], float) for c in categories]
    n = len(tiles["total"])
    capacity = tiles["capacity"]
    fig = Figure(figsize=(10, 6.2))
    top_ax, bottom_ax = fig.subplots(2, 1, height_ratios=[3, 1])
    x = np.arange(n)
    top_ax.stackplot(x, *per_tile, labels=categories, step="post",
                     colors=[CATEGORY_COLOURS[c] for c in categories], linewidth=0)
    total = np.asarray(tiles["total"], float)
    peak = max(total.max(initial=0), 1.0)
    if capacity <= 1.6 * peak:
        top_ax.axhline(capacity, color=LIMIT, linestyle="--",
                       label=f"tile capacity ({fmt_bytes(capacity)})")
    over = np.flatnonzero(total > capacity)
    if len(over):
        top_ax.plot(over, total[over], "v", color=LIMIT, markersize=4,
                    label=f"{len(over)} tiles over capacity (by up to "
                          f"{fmt_bytes(int((total - capacity).max()))})")
    fullest = tiles["fullest_tile"]
    # Above the data (the y range leaves room), clear of the legend outside.
    top_ax.annotate(f"fullest: tile {fullest}, {fmt_bytes(tiles['fullest_tile_bytes'])}",
                    xy=(fullest, total[fullest]), xytext=(0.3, 0.94),
                    textcoords="axes fraction", va="top",
                    arrowprops={"arrowstyle": "->", "color": "#333333"})
    y_max = max(peak, capacity if capacity <= 1.6 * peak else 0) * 1.15
    top_ax.set_xlim(0, n)
    top_ax.set_ylim(0, y_max)
    top_ax.set_xlabel(f"tile (0 .. {n - 1})")
    top_ax.set_ylabel("bytes on the tile")
    _bytes_axis(top_ax.yaxis, y_max)
    # Outside the axes: inside, it hid the fullest tiles of a full IPU.
    top_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                  title=f"at the peak\n(program step {ipu['peak_step']})", title_fontsize=7)
    top_ax.grid(axis="y", alpha=0.3)
    top_ax.set_title("Memory per tile by category", fontsize=10)

    left = 0
    for c in categories:
        value = ipu["categories"].get(c, 0)
        bottom_ax.barh([0], [value], left=left, color=CATEGORY_COLOURS[c],
                       label=f"{c} {fmt_bytes(value)}")
        left += value
    if left * 20 >= ipu["capacity"]:
        bottom_ax.axvline(ipu["capacity"], color=LIMIT, linestyle="--",
                          label=f"IPU capacity ({fmt_bytes(ipu['capacity'])})")
    x_max = (max(left, 1) * 1.05 if left * 20 < ipu["capacity"]
             else max(left, ipu["capacity"]) * 1.05)
    bottom_ax.set_xlim(0, x_max)
    bottom_ax.set_yticks([0], [f"IPU {ipu['ipu']}"])
    bottom_ax.set_xlabel("bytes on the IPU at the peak"
                         + ("" if left * 20 >= ipu["capacity"] else
                            f" (capacity {fmt_bytes(ipu['capacity'])} is off the scale)"))
    _bytes_axis(bottom_ax.xaxis, x_max)
    bottom_ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    bottom_ax.set_title(f"IPU {ipu['ipu']} total: {fmt_bytes(ipu['total'])} of "
                        f"{fmt_bytes(ipu['capacity'])}"
                        + ("" if ipu.get("fits", True) else " - DOES NOT FIT"),
                        fontsize=10)
    fig.suptitle(f"{label(report)} on IPU {ipu['ipu']} of {_target(report)}: memory at "
                 f"the peak", fontsize=12)
    fig.tight_layout()
    return _png(fig), f"Memory of {label(report)} on IPU {ipu['ipu']}"


# -- liveness ------------------------------------------------------------------
def _liveness_plot(report, values, steps, title, peak, xlabel):
    Figure, _ = _matplotlib()
    fig = Figure(figsize=(10, 4))
    ax = fig.subplots()
    from matplotlib.ticker import MaxNLocator

    values = np.asarray(values, float)
    x = np.arange(len(values))
    what = "not always live (values the steps make)"
    if len(values) <= 80:
        ax.bar(x, values, width=0.9, color=CATEGORY_COLOURS["activations"], label=what)
    else:
        ax.fill_between(x, values, step="mid", color=CATEGORY_COLOURS["activations"],
                        alpha=0.8, label=what)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if peak is not None and 0 <= peak < len(values):
        where = steps[peak] if steps and peak < len(steps) else None
        text = f"peak: step {peak}, {fmt_bytes(values[peak])}"
        if where:
            text += f"\n{where['op']} in {where['source'] or '(no layer)'}"
        ax.axvline(peak, color=LIMIT, linestyle="--", label="peak step")
        ax.annotate(text, xy=(peak, values[peak]), xytext=(0.02, 0.85),
                    textcoords="axes fraction", fontsize=8,
                    arrowprops={"arrowstyle": "->", "color": "#333333"})
    y_max = max(values.max(initial=0), 1.0) * 1.25
    ax.set_xlim(-0.5, max(len(values) - 0.5, 0.5))
    ax.set_ylim(0, y_max)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("bytes on the IPU")
    _bytes_axis(ax.yaxis, y_max)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return _png(fig)


def liveness(report):
    live = report["liveness"]
    title = (f"{label(report)}: memory live over {len(live['not_always_live'])} program "
             f"steps ({fmt_bytes(live['always_live'])} always live on top)")
    png = _liveness_plot(report, live["not_always_live"], live.get("steps"), title,
                         live["peak_step"], "program step")
    return png, f"Liveness of {label(report)}"


def loop_body_liveness(report):
    body = report["liveness"]["bodies"][0]
    values = body["not_always_live"]
    peak = int(np.argmax(values)) if values else None
    where = f" of {body['source']}" if body.get("source") else ""
    title = (f"{label(report)}: inside the {body['op']}{where} (program step "
             f"{body['step']}), {body['steps']} body steps")
    png = _liveness_plot(report, values, body.get("details"), title, peak,
                         "step of the loop body")
    return png, f"Loop body liveness of {label(report)}"


# -- cycles --------------------------------------------------------------------
def cycles_by_layer(report, top=12):
    Figure, _ = _matplotlib()
    cyc = report["cycles"]
    layers = cyc["layers"][:top]
    rest = sum(x["cycles"] for x in cyc["layers"][top:])
    others = len(cyc["layers"]) - len(layers)
    names = [x["layer"] for x in layers] + ([f"({others} other layers)"] if rest else [])
    values = [x["cycles"] for x in layers] + ([rest] if rest else [])
    total = cyc["total"] or 1
    fig = Figure(figsize=(10, 0.9 + 0.32 * len(names)))
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    bars = ax.barh(y, values, color="#4e79a7")
    for bar, v in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {100 * v / total:.1f}%", va="center", fontsize=8)
    _, FuncFormatter = _matplotlib()
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlim(0, max(values, default=1) * 1.15)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("predicted cycles per run (every step of the run)")
    ax.grid(axis="x", alpha=0.3)
    host = cyc["host"]["seconds"]
    ax.set_title(
        f"{label(report)}: cycles by Keras layer\n{cyc['total']:,} cycles per run of "
        f"{cyc['steps_per_run']} step(s); host transfers add {host * 1e6:,.1f} us per run",
        fontsize=10)
    fig.tight_layout()
    return _png(fig), f"Cycles by layer of {label(report)}"


def _leaves(steps, origin, budget, depth=0):
    """(start, end, op, source, depth) of the steps with loop bodies opened
    pass after pass while the budget lasts."""
    for e in steps:
        yield origin + e["start"], origin + e["end"], e["op"], e["source"], depth
        at = origin + e["start"]
        for loop in e.get("loops", ()):
            length = max((x["end"] for x in loop["trace"]), default=0)
            for _ in range(loop["repeat"]):
                if budget[0] <= 0 or not length:
                    break
                budget[0] -= len(loop["trace"])
                yield from _leaves(loop["trace"], at, budget, depth + 1)
                at += length


def timeline(report):
    """The predicted run, lanes as the TensorBoard trace draws them."""
    Figure, _ = _matplotlib()
    from keras_ipu.report import timeline as _timeline

    cyc = report["cycles"]
    clock = report["target"]["clock_hz"]
    us = 1e6 / clock
    host_in, host_out = cyc["host"]["seconds_in"] * 1e6, cyc["host"]["seconds_out"] * 1e6
    device = cyc["total"] * us
    leaves = list(_leaves(report["execution_trace"], 0, [MAX_TIMELINE_STEPS]))
    lanes = list(_timeline.LANES)
    depth = max((d for *_, d in leaves), default=0)
    lanes = lanes[:3 + depth] if depth < 2 else lanes
    fig = Figure(figsize=(11, 1.2 + 0.55 * len(lanes)))
    ax = fig.subplots()
    rows = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
    ax.broken_barh([(0, host_in + device + host_out)], (rows["Program runs"] - 0.4, 0.8),
                   facecolor=RUN_COLOUR, edgecolor="#333333")
    ax.broken_barh([(0, host_in), (host_in + device, host_out)],
                   (rows["Host transfers"] - 0.4, 0.8), color=TRANSFER_COLOUR)
    layer_cycles = {}
    for start, end, _, source, _ in leaves:
        layer_cycles[source] = layer_cycles.get(source, 0) + end - start
    named = sorted(layer_cycles, key=lambda k: -layer_cycles[k])[:8]
    colour = {k: LAYER_COLOURS[i] for i, k in enumerate(named)}
    for start, end, _, source, d in leaves:
        lane = lanes[min(2 + d, len(lanes) - 1)]
        ax.broken_barh([(host_in + start * us, max((end - start) * us, 1e-9))],
                       (rows[lane] - 0.4, 0.8), color=colour.get(source, OTHER_LAYERS),
                       linewidth=0)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=RUN_COLOUR, edgecolor="#333333", label="program run"),
               Patch(color=TRANSFER_COLOUR, label="host transfers (PCIe)")]
    handles += [Patch(color=colour[k], label=k or "(no layer)") for k in named]
    handles.append(Patch(color=OTHER_LAYERS, label="other layers"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
              title="runs, transfers,\nsteps by Keras layer", title_fontsize=7)
    ax.set_yticks([rows[n] for n in lanes], lanes, fontsize=8)
    ax.set_xlim(0, (host_in + device + host_out) * 1.01 or 1)
    ax.set_xlabel("predicted time in the run (us)")
    ax.grid(axis="x", alpha=0.3)
    note = " (loop bodies drawn in part)" if sum(1 for _ in leaves) >= MAX_TIMELINE_STEPS else ""
    ax.set_title(
        f"{label(report)}: one predicted run, {cyc['steps_per_run']} step(s), "
        f"{cyc['step_seconds'] * 1e6:,.1f} us per step{note}", fontsize=10)
    fig.tight_layout()
    return _png(fig), f"Timeline of {label(report)}"


def _has_body(report):
    return bool((report.get("liveness") or {}).get("bodies"))


def draw_all(report):
    """[(kind, png bytes, title)] of the pictures the report has data for."""
    out = []
    memory = report.get("memory")
    if memory:
        for i, tiles in enumerate(memory["tiles"]):
            out.append((f"memory_ipu{tiles['ipu']}", *memory_ipu(report, i)))
    live = report.get("liveness")
    # A program of a step or two (the device loop's scan) says more by its
    # loop body than by its own steps.
    if live and (len(live["not_always_live"]) > 2 or not _has_body(report)):
        out.append(("liveness", *liveness(report)))
    if _has_body(report):
        out.append(("loop_body_liveness", *loop_body_liveness(report)))
    if report.get("cycles"):
        out.append(("cycles_by_layer", *cycles_by_layer(report)))
    if report.get("execution_trace") is not None and report.get("cycles"):
        out.append(("timeline", *timeline(report)))
    return out
