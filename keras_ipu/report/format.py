"""Number formatting shared by the summary and the HTML page."""

from keras_ipu.device.units import fmt_bytes  # noqa: F401 (re-exported)


def fmt_seconds(s):
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def table(header, rows):
    """Left-aligned text columns, numbers right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]

    def numeric(text):
        return text[:1].isdigit() or text[:1] == "-" and text[1:2].isdigit()

    def line(cells):
        return "  ".join(c.rjust(w) if numeric(c) else c.ljust(w)
                         for c, w in zip(cells, widths)).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)
