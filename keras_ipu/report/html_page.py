"""One self-contained HTML page: summaries as text, charts as base64 PNGs
(no scripts, stylesheets or images from elsewhere)."""

import base64
import html

from keras_ipu.report import summary as _summary

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
figure { margin: 1em 0; }
figcaption { font-size: 0.85em; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin: 0 0.3em 0 0.8em;
          vertical-align: middle; border: 1px solid #555; }
"""


def _figure(png_bytes, caption):
    data = base64.b64encode(png_bytes).decode("ascii")
    legend = "".join(
        f'<span class="swatch" style="background:{html.escape(color)}"></span>'
        f"{html.escape(text)}" for color, text in caption["legend"])
    return (
        f'<figure><figcaption><b>{html.escape(caption["title"])}</b></figcaption>'
        f'<img alt="{html.escape(caption["title"])}" src="data:image/png;base64,{data}">'
        f"<figcaption>x: {html.escape(caption['x'])}; y: {html.escape(caption['y'])}"
        f"<br>{legend}</figcaption></figure>"
    )


def page(reports, charts, top=5):
    """`charts`: per report, [(kind, png bytes, caption)]."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
        "<title>keras_ipu profile reports</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>keras_ipu profile reports ({len(reports)})</h1>",
        "<p>Predicted by the keras_ipu IPU system model: memory from the liveness "
        "of the program's tensors under linear tile mapping, cycles from the cost "
        "model.</p>",
        f"<pre>{html.escape(_summary.overview(reports))}</pre>",
    ]
    for report, figures in zip(reports, charts):
        parts.append(f"<h2>{html.escape(_summary.label(report))}</h2>")
        parts.append(f"<pre>{html.escape(_summary.details(report, top))}</pre>")
        parts.extend(_figure(png, caption) for _, png, caption in figures)
    parts.append("</body></html>")
    return "\n".join(parts)
