"""One self-contained, interactive HTML page of profile reports.

Everything is inside the file (data as JSON, a small script, the
matplotlib pictures as base64 PNGs): it opens offline, from disk. As in
PopVision's views, hovering shows the numbers behind a picture: a tile (its
bytes by category and the tensors it holds at the peak), a program step or
loop-body step (bytes live, op, Keras layer, the largest values alive
there) and an op of the timeline (cycles by phase, layer, time).
"""

import base64
import html
import json

from keras_ipu.device.simulator import profile
from keras_ipu.report import summary as _summary

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1200px; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
h2 { border-top: 1px solid #ccc; padding-top: 0.8em; }
.view { position: relative; margin: 0.6em 0 1.4em 0; }
.view canvas { border: 1px solid #ddd; cursor: crosshair; display: block; }
.view .caption { font-size: 0.9em; margin-bottom: 0.3em; }
.tip { position: fixed; pointer-events: none; background: #fffff0; border: 1px solid #888;
       padding: 0.4em 0.6em; font-size: 0.8em; white-space: pre; display: none;
       box-shadow: 2px 2px 6px rgba(0,0,0,0.25); z-index: 10; }
details { margin: 0.5em 0; }
img { max-width: 100%; }
.legend span { display: inline-block; width: 0.9em; height: 0.9em; margin: 0 0.3em 0 0.9em;
               vertical-align: middle; border: 1px solid #555; }
"""

# Drawing and hovering; data come from the JSON blocks of the page.
SCRIPT = r"""
const COLOURS = __COLOURS__;
const CATEGORIES = __CATEGORIES__;
const tip = document.getElementById('tip');
function fmtBytes(b) {
  const u = ['B', 'KiB', 'MiB', 'GiB']; let i = 0; b = Number(b);
  while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b.toFixed(0)) + ' ' + u[i];
}
function fmtInt(n) { return Math.round(n).toLocaleString('en-US'); }
function showTip(ev, text) {
  tip.textContent = text; tip.style.display = 'block';
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = x + 'px'; tip.style.top = (ev.clientY + 14) + 'px';
}
function hideTip() { tip.style.display = 'none'; }
function setup(canvas, draw, hit) {
  const ctx = canvas.getContext('2d');
  draw(ctx, canvas.width, canvas.height);
  canvas.addEventListener('mousemove', ev => {
    const r = canvas.getBoundingClientRect();
    const text = hit((ev.clientX - r.left) * canvas.width / r.width,
                     (ev.clientY - r.top) * canvas.height / r.height);
    if (text) showTip(ev, text); else hideTip();
  });
  canvas.addEventListener('mouseleave', hideTip);
}
function axes(ctx, w, h, pad, yMax, yLabel) {
  ctx.strokeStyle = '#333'; ctx.fillStyle = '#333'; ctx.font = '11px sans-serif';
  ctx.beginPath(); ctx.moveTo(pad, 8); ctx.lineTo(pad, h - 22); ctx.lineTo(w - 8, h - 22);
  ctx.stroke();
  ctx.textAlign = 'right';
  for (let k = 0; k <= 4; k++) {
    const v = yMax * k / 4, y = h - 22 - (h - 30) * k / 4;
    ctx.fillText(fmtBytes(v), pad - 4, y + 4);
  }
  ctx.save(); ctx.translate(12, h / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = 'center';
  ctx.fillText(yLabel, 0, 0); ctx.restore();
}
function tileView(canvas, report, t) {
  const tiles = report.memory.tiles[t], n = tiles.total.length, pad = 70;
  const cats = CATEGORIES.filter(c => tiles.categories[c]);
  const yMax = Math.max(...tiles.total, 1) * 1.15;
  const tensors = report.memory.tensors;
  setup(canvas, (ctx, w, h) => {
    const pw = w - pad - 8, ph = h - 30;
    axes(ctx, w, h, pad, yMax, 'bytes on the tile');
    for (let x = 0; x < pw; x++) {
      const i = Math.floor(x * n / pw); let base = 0;
      for (const c of cats) {
        const v = tiles.categories[c][i]; ctx.fillStyle = COLOURS[c];
        ctx.fillRect(pad + x, h - 22 - (base + v) / yMax * ph, 1, v / yMax * ph); base += v;
      }
    }
    if (tiles.capacity < yMax) {
      ctx.strokeStyle = '#d62728'; ctx.setLineDash([5, 4]); ctx.beginPath();
      const y = h - 22 - tiles.capacity / yMax * ph; ctx.moveTo(pad, y); ctx.lineTo(w - 8, y);
      ctx.stroke(); ctx.setLineDash([]);
    }
    ctx.fillStyle = '#333'; ctx.textAlign = 'center';
    ctx.fillText('tile 0 .. ' + (n - 1), pad + pw / 2, h - 6);
  }, (x, y) => {
    const pw = canvas.width - pad - 8;
    if (x < pad || x > pad + pw) return null;
    const i = Math.min(n - 1, Math.floor((x - pad) * n / pw));
    let text = 'tile ' + i + ': ' + fmtBytes(tiles.total[i]) + ' of ' +
               fmtBytes(tiles.capacity) + (tiles.total[i] > tiles.capacity ? '  OVER CAPACITY' : '');
    for (const c of cats) if (tiles.categories[c][i])
      text += '\n  ' + c + ': ' + fmtBytes(tiles.categories[c][i]);
    // A tensor covers z.tiles tiles from z.start on, wrapping past the last.
    const at = z => (i - (z.start || 0) + n) % n;
    const held = tensors.filter(z => at(z) < z.tiles).slice(0, 6);
    if (held.length) {
      text += '\ntensors on this tile (largest first):';
      for (const z of held) {
        const here = at(z) < z.tiles - 1 ? z.per_tile : z.bytes - (z.tiles - 1) * z.per_tile;
        text += '\n  ' + z.tensor + '  ' + fmtBytes(here) + '  ' + z.category + ': ' + z.made_by;
      }
    }
    return text;
  });
}
function stepView(canvas, values, details, peak, always, what) {
  const n = values.length, pad = 70, yMax = Math.max(...values, 1) * 1.2;
  setup(canvas, (ctx, w, h) => {
    const pw = w - pad - 8, ph = h - 30, bw = pw / Math.max(n, 1);
    axes(ctx, w, h, pad, yMax, 'bytes on the IPU');
    for (let i = 0; i < n; i++) {
      ctx.fillStyle = i === peak ? '#d62728' : COLOURS['activations'];
      ctx.fillRect(pad + i * bw, h - 22 - values[i] / yMax * ph, Math.max(bw - 0.5, 1),
                   values[i] / yMax * ph);
    }
    ctx.fillStyle = '#333'; ctx.textAlign = 'center';
    ctx.fillText(what + ' 0 .. ' + (n - 1) + (peak >= 0 ? '   (red: peak, ' + what + ' ' + peak + ')' : ''),
                 pad + pw / 2, h - 6);
  }, (x, y) => {
    const pw = canvas.width - pad - 8;
    if (x < pad || x > pad + pw || !n) return null;
    const i = Math.min(n - 1, Math.floor((x - pad) * n / pw)), d = (details || [])[i];
    let text = what + ' ' + i + (i === peak ? ' (the peak)' : '') + ': ' +
               fmtBytes(values[i]) + ' not always live' +
               (always ? ' + ' + fmtBytes(always) + ' always live' : '');
    if (d) {
      text += '\n  ' + d.op + ' in ' + (d.source || '(no layer)');
      if (d.inside) text += '\n  its peak inside: ' + d.inside;
      if (d.live.length) text += '\nlargest values alive here:';
      for (const [t, b, m] of d.live) text += '\n  ' + t + '  ' + fmtBytes(b) + '  ' + m;
    }
    return text;
  });
}
function leaves(steps, origin, out, depth, budget) {
  for (const e of steps) {
    out.push({s: origin + e.start, e: origin + e.end, op: e.op, src: e.source, d: depth,
              c: e.compute[1] - e.compute[0], y: e.sync[1] - e.sync[0],
              x: e.exchange[1] - e.exchange[0]});
    let at = origin + e.start;
    for (const loop of (e.loops || [])) {
      const len = Math.max(0, ...loop.trace.map(z => z.end));
      for (let r = 0; r < loop.repeat && budget[0] > 0 && len > 0; r++) {
        budget[0] -= loop.trace.length; leaves(loop.trace, at, out, depth + 1, budget); at += len;
      }
    }
  }
  return out;
}
function timelineView(canvas, report) {
  const cyc = report.cycles, us = 1e6 / report.target.clock_hz;
  const hin = cyc.host.seconds_in * 1e6, hout = cyc.host.seconds_out * 1e6;
  const dev = cyc.total * us, total = hin + dev + hout || 1;
  const items = leaves(report.execution_trace, 0, [], 0, [20000]);
  const lanes = __LANES__;
  const pad = 110, palette = __LAYER_COLOURS__;
  const colour = {}; let k = 0;
  function col(src) { const key = src || ''; if (!(key in colour)) colour[key] = palette[k++ % palette.length]; return colour[key]; }
  function laneY(l, h) { return 6 + l * (h - 30) / lanes.length; }
  setup(canvas, (ctx, w, h) => {
    const pw = w - pad - 8, lh = (h - 30) / lanes.length - 4, sx = pw / total;
    ctx.font = '11px sans-serif'; ctx.fillStyle = '#333'; ctx.textAlign = 'right';
    lanes.forEach((name, l) => ctx.fillText(name, pad - 6, laneY(l, h) + lh / 2 + 4));
    ctx.strokeStyle = '#333'; ctx.fillStyle = __RUN_COLOUR__;
    ctx.fillRect(pad, laneY(0, h), total * sx, lh); ctx.strokeRect(pad, laneY(0, h), total * sx, lh);
    ctx.fillStyle = __TRANSFER_COLOUR__;
    ctx.fillRect(pad, laneY(1, h), Math.max(hin * sx, hin ? 1 : 0), lh);
    ctx.fillRect(pad + (hin + dev) * sx, laneY(1, h), Math.max(hout * sx, hout ? 1 : 0), lh);
    for (const it of items) {
      ctx.fillStyle = col(it.src);
      ctx.fillRect(pad + (hin + it.s * us) * sx, laneY(Math.min(2 + it.d, 4), h),
                   Math.max((it.e - it.s) * us * sx, 0.5), lh);
    }
    ctx.fillStyle = '#333'; ctx.textAlign = 'center';
    ctx.fillText('predicted time in the run: 0 .. ' + total.toFixed(1) + ' us', pad + pw / 2, h - 6);
  }, (x, y) => {
    const h = canvas.height, pw = canvas.width - pad - 8, sx = pw / total;
    const l = Math.floor((y - 6) / ((h - 30) / lanes.length));
    const t = (x - pad) / sx;
    if (x < pad || l < 0 || l > 4) return null;
    if (l === 0) return 'run of ' + cyc.steps_per_run + ' step(s): ' + total.toFixed(2) +
      ' us\n  device ' + dev.toFixed(2) + ' us (' + fmtInt(cyc.total) + ' cycles)\n  host transfers ' +
      (hin + hout).toFixed(2) + ' us\n  per step ' + (cyc.step_seconds * 1e6).toFixed(2) + ' us';
    if (l === 1) {
      if (t < hin) return 'host -> IPU: ' + fmtInt(cyc.host.bytes_in) + ' B, ' + hin.toFixed(2) + ' us';
      if (t > hin + dev) return 'IPU -> host: ' + fmtInt(cyc.host.bytes_out) + ' B, ' + hout.toFixed(2) + ' us';
      return null;
    }
    const cycle = (t - hin) / us; let best = null;
    for (const it of items)
      if (Math.min(2 + it.d, 4) === l && it.s <= cycle && cycle <= it.e + (1 / sx) / us &&
          (!best || it.e - it.s < best.e - best.s)) best = it;
    if (!best) return null;
    return best.op + ' in ' + (best.src || '(no layer)') + '\n  ' + fmtInt(best.e - best.s) +
      ' cycles: compute ' + fmtInt(best.c) + ', sync ' + fmtInt(best.y) + ', exchange ' +
      fmtInt(best.x) + '\n  at ' + (hin + best.s * us).toFixed(2) + ' .. ' +
      (hin + best.e * us).toFixed(2) + ' us';
  });
}
document.querySelectorAll('script.report').forEach(block => {
  const report = JSON.parse(block.textContent), root = block.parentElement;
  root.querySelectorAll('canvas[data-view]').forEach(c => {
    const v = c.dataset.view;
    if (v === 'tiles') tileView(c, report, Number(c.dataset.ipu));
    if (v === 'liveness') stepView(c, report.liveness.not_always_live, report.liveness.steps,
                                   report.liveness.peak_step, report.liveness.always_live, 'step');
    if (v === 'body') { const b = report.liveness.bodies[0], vals = b.not_always_live;
      stepView(c, vals, b.details, vals.indexOf(Math.max(...vals)), 0, 'body step'); }
    if (v === 'timeline') timelineView(c, report);
  });
});
"""


def _json_block(report):
    kept = {k: v for k, v in report.items() if not k.startswith("_")}
    text = json.dumps(kept, separators=(",", ":"))
    # Inside <script>: "</" would end the block.
    return text.replace("</", "<\\/")


def _legend():
    return '<div class="legend">' + "".join(
        f'<span style="background:{c}"></span>{html.escape(name)}'
        for name, c in _colours().items()) + "</div>"


def _colours():
    from keras_ipu.report.charts import CATEGORY_COLOURS

    return CATEGORY_COLOURS


def _views(report):
    parts = []
    memory = report.get("memory")
    if memory:
        for i, tiles in enumerate(memory["tiles"]):
            parts.append(
                f'<div class="view"><div class="caption"><b>Memory per tile, IPU '
                f'{tiles["ipu"]}</b> at the peak (hover a tile: its bytes by category '
                f'and the tensors it holds){_legend()}</div>'
                f'<canvas data-view="tiles" data-ipu="{i}" width="1100" height="260">'
                "</canvas></div>")
    live = report.get("liveness")
    if live and (len(live["not_always_live"]) > 2 or not live.get("bodies")):
        parts.append(
            '<div class="view"><div class="caption"><b>Memory live per program step</b> '
            "(hover a step: bytes, op, Keras layer, largest values alive)</div>"
            '<canvas data-view="liveness" width="1100" height="220"></canvas></div>')
    if live and live.get("bodies"):
        body = live["bodies"][0]
        where = f" of {body['source']}" if body.get("source") else ""
        parts.append(
            f'<div class="view"><div class="caption"><b>Memory inside the '
            f'{html.escape(body["op"] + where)} at program step {body["step"]}</b> (the '
            "largest loop body; hover a step)</div>"
            '<canvas data-view="body" width="1100" height="220"></canvas></div>')
    if report.get("cycles") and report.get("execution_trace") is not None:
        parts.append(
            '<div class="view"><div class="caption"><b>Predicted timeline of one run</b> '
            "(hover an op: cycles, Keras layer, time; colours: layers)</div>"
            '<canvas data-view="timeline" width="1100" height="230"></canvas></div>')
    return "\n".join(parts)


def _figure(png_bytes, title):
    data = base64.b64encode(png_bytes).decode("ascii")
    return f'<img alt="{html.escape(title)}" title="{html.escape(title)}" ' \
           f'src="data:image/png;base64,{data}">'


def page(reports, charts, top=5):
    """`charts`: per report, [(kind, png bytes, title)]."""
    from keras_ipu.report import charts as charts_colours
    from keras_ipu.report.timeline import LANES

    script = (SCRIPT.replace("__COLOURS__", json.dumps(_colours()))
              .replace("__CATEGORIES__", json.dumps(list(profile.CATEGORIES)))
              .replace("__LANES__", json.dumps(list(LANES)))
              .replace("__LAYER_COLOURS__", json.dumps(list(charts_colours.LAYER_COLOURS)
                                                       + [charts_colours.OTHER_LAYERS]))
              .replace("__RUN_COLOUR__", json.dumps(charts_colours.RUN_COLOUR))
              .replace("__TRANSFER_COLOUR__", json.dumps(charts_colours.TRANSFER_COLOUR)))
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
        "<title>keras_ipu profile reports</title>",
        f"<style>{STYLE}</style></head><body>",
        '<div id="tip" class="tip"></div>',
        f"<h1>keras_ipu profile reports ({len(reports)})</h1>",
        "<p>Predicted by the keras_ipu IPU system model: memory from the liveness "
        "of the program's tensors under linear tile mapping, cycles from the cost "
        "model. Hover the pictures for the numbers behind them.</p>",
        f"<pre>{html.escape(_summary.overview(reports))}</pre>",
    ]
    for report, figures in zip(reports, charts):
        parts.append("<section>")
        parts.append(f"<script type=\"application/json\" class=\"report\">"
                     f"{_json_block(report)}</script>")
        parts.append(f"<h2>{html.escape(_summary.label(report))}</h2>")
        parts.append(f"<pre>{html.escape(_summary.details(report, top))}</pre>")
        parts.append(_views(report))
        if figures:
            parts.append(f"<details><summary>Pictures ({len(figures)} PNG files, as "
                         "written beside this page)</summary>")
            parts.extend(_figure(png, title) for _, png, title in figures)
            parts.append("</details>")
        parts.append("</section>")
    parts.append(f"<script>{script}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)
