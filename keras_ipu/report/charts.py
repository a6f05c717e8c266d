"""The three pictures of a profile report, drawn on a png.Canvas.

Each chart returns (canvas, caption): the caption holds the title, the
axis ranges and the legend as text, because the rasters carry no lettering
(the HTML page and the summary print the captions beside them).
"""

import numpy as np

from keras_ipu.report.format import fmt_bytes
from keras_ipu.report.png import Canvas

WIDTH, HEIGHT, MARGIN = 800, 260, 8
AXIS = "#333333"
ALWAYS = "#3b6ea5"  # always-live bytes
NOT_ALWAYS = "#8fbce6"  # not-always-live bytes
LIMIT = "#d62728"  # tile capacity, peak step
PHASES = (("compute", "#2ca02c"), ("sync", "#999999"), ("exchange", "#ff7f0e"))
STEP_SHADES = ("#4c78a8", "#9ecae9")


def column_max(values, width):
    """`values` squeezed (largest per column) or stretched to `width` columns."""
    values = np.asarray(values, float)
    n = len(values)
    out = np.zeros(width)
    if not n:
        return out
    np.maximum.at(out, (np.arange(n) * width) // n, values)
    return np.maximum(out, values[(np.arange(width) * n) // width])


def coverage(spans, width):
    """Fraction of each of `width` pixel columns that the [a, b) spans (in
    pixels) cover; a span narrower than a pixel still shows at least a
    quarter shade so that short phases stay visible."""
    out = np.zeros(width + 1)
    for a, b in spans:
        if b <= a:
            continue
        ca, cb = int(a), int(b)
        if ca == cb:
            out[ca] += max(b - a, 0.25)
            continue
        out[ca] += ca + 1 - a
        out[ca + 1:cb] += 1
        out[cb] += b - cb
    return np.minimum(out[:width], 1.0)


def _frame(canvas):
    x0, y1 = MARGIN, canvas.height - MARGIN
    canvas.vline(x0 - 1, MARGIN, y1 + 1, AXIS)
    canvas.hline(x0 - 1, canvas.width - MARGIN, y1, AXIS)
    return x0, MARGIN, canvas.width - MARGIN, y1


def memory_per_tile(report):
    tiles = report["memory"]["tiles"]
    always, total = np.asarray(tiles["always_live"]), np.asarray(tiles["total"])
    capacity = tiles["capacity"]
    top = max(int(total.max(initial=0)), 1)
    show_capacity = capacity <= 1.5 * top
    y_max = (max(top, capacity) * 1.05) if show_capacity else top * 1.1
    canvas = Canvas(WIDTH, HEIGHT)
    x0, y0, x1, y1 = _frame(canvas)
    plot_w, plot_h = x1 - x0, y1 - y0
    scale = plot_h / y_max
    canvas.columns(x0, y1, column_max(total, plot_w) * scale, NOT_ALWAYS)
    canvas.columns(x0, y1, column_max(always, plot_w) * scale, ALWAYS)
    legend = [(ALWAYS, "always live"), (NOT_ALWAYS, "not always live (at the tile peak)")]
    if show_capacity:
        canvas.hline(x0, x1, y1 - capacity * scale, LIMIT)
        legend.append((LIMIT, f"tile capacity {fmt_bytes(capacity)}"))
    return canvas, {
        "title": f"Memory per tile, IPU {tiles['ipu']} (fullest: tile "
                 f"{tiles['fullest_tile']}, {fmt_bytes(tiles['fullest_tile_bytes'])} of "
                 f"{fmt_bytes(capacity)})",
        "x": f"tile 0 .. {len(total) - 1}",
        "y": f"0 .. {fmt_bytes(y_max)}",
        "legend": legend,
    }


def liveness(report):
    live = report["liveness"]
    values = np.asarray(live["not_always_live"], float)
    top = max(values.max(initial=0), 1.0)
    canvas = Canvas(WIDTH, HEIGHT)
    x0, y0, x1, y1 = _frame(canvas)
    plot_w, plot_h = x1 - x0, y1 - y0
    scale = plot_h / (top * 1.1)
    canvas.columns(x0, y1, column_max(values, plot_w) * scale, NOT_ALWAYS)
    peak = live["peak_step"]
    if peak >= 0 and len(values):
        canvas.vline(x0 + (peak + 0.5) * plot_w / len(values), y0, y1, LIMIT)
    return canvas, {
        "title": f"Not-always-live memory over {len(values)} program steps "
                 f"(peak {fmt_bytes(values.max(initial=0))} at step {peak}; always live "
                 f"{fmt_bytes(live['always_live'])} on top)",
        "x": f"program step 0 .. {max(len(values) - 1, 0)}",
        "y": f"0 .. {fmt_bytes(top * 1.1)}",
        "legend": [(NOT_ALWAYS, "not always live on the IPU"), (LIMIT, "tile peak step")],
    }


def loop_body_liveness(report):
    """The liveness inside the largest loop body (a device loop's step)."""
    body = report["liveness"]["bodies"][0]
    values = np.asarray(body["not_always_live"], float)
    top = max(values.max(initial=0), 1.0)
    canvas = Canvas(WIDTH, HEIGHT)
    x0, y0, x1, y1 = _frame(canvas)
    scale = (y1 - y0) / (top * 1.1)
    canvas.columns(x0, y1, column_max(values, x1 - x0) * scale, NOT_ALWAYS)
    peak = int(np.argmax(values)) if len(values) else -1
    if peak >= 0:
        canvas.vline(x0 + (peak + 0.5) * (x1 - x0) / len(values), y0, y1, LIMIT)
    where = f" ({body['source']})" if body.get("source") else ""
    return canvas, {
        "title": f"Memory inside the {body['op']} at program step {body['step']}{where}: "
                 f"{body['steps']} body steps, peak {fmt_bytes(body['peak'])} at body "
                 f"step {peak} (values of the body only)",
        "x": f"body step 0 .. {max(len(values) - 1, 0)}",
        "y": f"0 .. {fmt_bytes(top * 1.1)}",
        "legend": [(NOT_ALWAYS, "bytes of the body's own values"), (LIMIT, "peak")],
    }


MAX_TIMELINE_STEPS = 50000


def _count_leaves(steps):
    n = 0
    for e in steps:
        loops = e.get("loops")
        n += sum(x["repeat"] * _count_leaves(x["trace"]) for x in loops) if loops else 1
    return n


def _leaves(steps, origin, budget):
    """(start, end, {phase: (start, end)}) of the leaf steps, absolute
    cycles; loop bodies opened up pass after pass while the budget lasts."""
    for e in steps:
        loops = e.get("loops")
        if loops:
            n = sum(x["repeat"] * _count_leaves(x["trace"]) for x in loops)
            if n <= budget[0]:
                at = origin + e["start"]
                for loop in loops:
                    length = max((x["end"] for x in loop["trace"]), default=0)
                    for _ in range(loop["repeat"]):
                        yield from _leaves(loop["trace"], at, budget)
                        at += length
                continue
        budget[0] -= 1
        yield (origin + e["start"], origin + e["end"],
               {p: (origin + e[p][0], origin + e[p][1]) for p, _ in PHASES})


def timeline(report):
    trace = report["execution_trace"]
    end = max((e["end"] for e in trace), default=0) or 1
    leaves = list(_leaves(trace, 0, [MAX_TIMELINE_STEPS]))
    lanes = 1 + len(PHASES)
    canvas = Canvas(WIDTH, 40 + 30 * lanes)
    x0, y0, x1, y1 = _frame(canvas)
    plot_w = x1 - x0
    lane_h = (y1 - y0) / lanes
    px = plot_w / end
    for i, (start, stop, _) in enumerate(leaves):
        canvas.fill(x0 + start * px, y0 + 2, x0 + stop * px, y0 + lane_h - 2,
                    STEP_SHADES[i % 2])
    for lane, (phase, color) in enumerate(PHASES, start=1):
        spans = [(p[phase][0] * px, p[phase][1] * px) for _, _, p in leaves]
        top = y0 + lane * lane_h
        canvas.shade_columns(x0, top + 2, top + lane_h - 2, coverage(spans, plot_w), color)
    opened = " (loop bodies opened up)" if len(leaves) > len(trace) else ""
    return canvas, {
        "title": f"Predicted execution timeline of one run: {len(leaves)} steps"
                 f"{opened}, {end:,} cycles",
        "x": f"cycle 0 .. {end:,}",
        "y": "lanes: program steps, " + ", ".join(p for p, _ in PHASES),
        "legend": [(STEP_SHADES[0], "program step (alternating shades)")]
                  + [(c, p) for p, c in PHASES],
    }


def _has_body(report):
    return bool((report.get("liveness") or {}).get("bodies"))


CHARTS = (
    ("memory_per_tile", lambda r: r.get("memory"), memory_per_tile),
    ("liveness", lambda r: r.get("liveness"), liveness),
    ("loop_body_liveness", _has_body, loop_body_liveness),
    ("timeline", lambda r: r.get("execution_trace"), timeline),
)


def draw_all(report):
    """[(kind, canvas, caption)] for the charts the report has data for."""
    return [(kind, *draw(report)) for kind, has, draw in CHARTS if has(report)]
