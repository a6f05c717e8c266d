"""The text summary of a directory of reports."""

import os

from keras_ipu.report.format import fmt_bytes
from keras_ipu.report.format import fmt_seconds
from keras_ipu.report.format import pct
from keras_ipu.report.format import table


def label(report):
    p = report["program"]
    return f"{p['name']} ({p['fingerprint']})"


def overview(reports):
    rows = []
    for r in reports:
        t, mem, cyc = r["target"], r.get("memory"), r.get("cycles")
        row = [label(r), r["program"]["steps"], t["name"]]
        if mem:
            # Several IPUs: the fullest one's numbers, saying which it is.
            fullest = max(mem["ipus"], key=lambda m: m["total"])
            tile = max(mem["ipus"], key=lambda m: m["fullest_tile_bytes"])
            several = len(mem["ipus"]) > 1
            capacity = r["target"]["memory_per_tile"]
            row += [(f"IPU {fullest['ipu']}: " if several else "")
                    + f"{fmt_bytes(fullest['total'])} "
                    f"({pct(fullest['total'], fullest['capacity'])})",
                    (f"IPU {tile['ipu']} tile " if several else "")
                    + f"{tile['fullest_tile']}: {fmt_bytes(tile['fullest_tile_bytes'])} "
                    f"({pct(tile['fullest_tile_bytes'], capacity)})"
                    + ("" if all(m.get("fits", True) for m in mem["ipus"]) else " OOM")]
        else:
            row += ["-", "-"]
        if cyc:
            sps = cyc.get("samples_per_second")
            row += [f"{cyc['cycles_per_step']:,.0f}", fmt_seconds(cyc["step_seconds"]),
                    f"{sps:,.1f}" if sps else "-"]
        else:
            row += ["-", "-", "-"]
        rows.append(row)
    return table(["program", "steps", "target", "peak memory / IPU", "fullest tile",
                  "cycles/step", "step time", "samples/s"], rows)


def details(report, top=5):
    t = report["target"]
    lines = [
        f"== {label(report)}  [{os.path.basename(report['_path'])}]",
        f"   target {t['name']} ({t['product']}{', IPU Model' if t.get('ipu_model') else ''}): "
        f"{t['tiles_per_ipu']} tiles x {fmt_bytes(t['memory_per_tile'])}, "
        f"{t['clock_hz'] / 1e9:g} GHz",
    ]
    mem = report.get("memory")
    if mem:
        capacity = t["memory_per_tile"]
        for m in mem["ipus"]:
            categories = ", ".join(f"{c} {fmt_bytes(v)}" for c, v in m["categories"].items())
            lines.append(
                f"   IPU {m['ipu']}: {fmt_bytes(m['total'])} of {fmt_bytes(m['capacity'])} "
                f"({pct(m['total'], m['capacity'])}); always live "
                f"{fmt_bytes(m['always_live'])}, not always live "
                f"{fmt_bytes(m['not_always_live'])} (peak at step {m['peak_step']}: "
                f"{m['peak_step_name']})")
            lines.append(f"     by category: {categories}")
            lines.append(
                f"     fullest tile {m['fullest_tile']}: "
                f"{fmt_bytes(m['fullest_tile_bytes'])} of {fmt_bytes(capacity)} "
                f"({pct(m['fullest_tile_bytes'], capacity)})")
            if not m.get("fits", True):
                lines.append(
                    f"     DOES NOT FIT: {m['tiles_over_capacity']} tiles over capacity, "
                    f"the fullest by {fmt_bytes(m['most_over_bytes'])} (compiled with "
                    "debug.allowOutOfMemory: a real IPU could not run it)")
    cyc = report.get("cycles")
    if cyc:
        host = cyc["host"]
        lines.append(
            f"   predicted {cyc['cycles_per_step']:,.0f} cycles per step (compute "
            f"{cyc['compute']:,}, exchange {cyc['exchange']:,}, sync {cyc['sync']:,} per "
            f"run of {cyc['steps_per_run']} step(s)), {fmt_seconds(cyc['step_seconds'])} "
            f"per step: device {fmt_seconds(cyc['device_seconds'])} + host transfers "
            f"{fmt_seconds(host['seconds'])} ({host['bytes_in']:,} B in, "
            f"{host['bytes_out']:,} B out) per run")
        pipe = cyc.get("pipeline")
        # Shares are of the IPUs' work; a pipeline's `total` is its schedule's
        # time, with the IPUs' work overlapping.
        work = cyc["compute"] + cyc["exchange"] + cyc["sync"]
        total = (work if pipe else cyc["total"]) or 1
        if pipe:
            lines.append(
                f"   pipelined, schedule {pipe['schedule']}: {pipe['step_cycles']:,} cycles "
                f"per step of {pipe['micro_batches_per_step']} micro-batches, utilisation "
                f"{pipe['utilisation']:.0%}; per micro-batch " + ", ".join(
                    f"IPU {x['ipu']} forward {x['forward_cycles']:,} backward "
                    f"{x['backward_cycles']:,} ({x['in_flight']} in flight)"
                    for x in pipe["ipus"]))
        per_ipu = cyc.get("ipus") or []
        if len(per_ipu) > 1:
            lines.append("   cycles per run by IPU: " + ", ".join(
                f"IPU {x['ipu']} {x['cycles']:,} ({pct(x['cycles'], total)})"
                for x in per_ipu))
        rows = [[o["op"], o["count"], f"{o['cycles']:,}", pct(o["cycles"], total),
                 f"{o['compute']:,}", f"{o['exchange']:,}", f"{o['sync']:,}"]
                for o in cyc["ops"][:top]]
        lines.append("   top ops by cycles:")
        lines.extend("     " + x for x in table(
            ["op", "count", "cycles", "share", "compute", "exchange", "sync"], rows
        ).splitlines())
        rows = [[x["layer"], x["count"], f"{x['cycles']:,}", pct(x["cycles"], total)]
                for x in cyc["layers"][:top]]
        lines.append("   top layers by cycles:")
        lines.extend("     " + x for x in table(
            ["layer", "steps", "cycles", "share"], rows).splitlines())
    return "\n".join(lines)


def summary(reports, top=5):
    parts = [overview(reports)]
    parts.extend(details(r, top) for r in reports)
    return "\n\n".join(parts)
