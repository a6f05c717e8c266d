"""The PNG writer and the charts, checked by decoding the bytes again."""

import struct
import zlib

import numpy as np

from keras_ipu.report import charts
from keras_ipu.report.png import PNG_SIGNATURE
from keras_ipu.report.png import Canvas
from keras_ipu.report.png import encode_png
from keras_ipu.report.png import png_size


def decode_rgb(data):
    """A minimal PNG reader for what encode_png writes (8-bit RGB, filter 0)."""
    assert data[:8] == PNG_SIGNATURE
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, *_ = header
    assert (depth, color) == (8, 2)
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 3 * width)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 3)


def test_encode_png_round_trips_pixels():
    rgb = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    data = encode_png(rgb)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_size(data) == (7, 5)
    np.testing.assert_array_equal(decode_rgb(data), rgb)


def test_canvas_fill_and_columns():
    c = Canvas(10, 6)
    c.fill(6, 1, 8, 3, "#ff0000")
    c.fill(8.2, 0, 8.3, 1, "#00ff00")  # thinner than a pixel: still one column
    c.columns(0, 6, [0, 1, 2.4, 6, 99], "#0000ff")
    px = decode_rgb(c.png())
    assert (px[1:3, 6:8] == [255, 0, 0]).all() and (px[0, 6] == 255).all()
    assert (px[0, 8] == [0, 255, 0]).all() and (px[0, 9] == 255).all()
    blue = (px == [0, 0, 255]).all(axis=2)
    assert blue[:, :5].sum(axis=0).tolist() == [0, 1, 2, 6, 6]


def test_column_max_squeezes_and_stretches():
    assert charts.column_max([1, 5, 2, 7], 2).tolist() == [5, 7]
    assert charts.column_max([3, 4], 4).tolist() == [3, 3, 4, 4]
    assert charts.column_max([], 3).tolist() == [0, 0, 0]


def _entry(index, op, start, compute, sync, exchange, loops=None):
    c, y, e = start + compute, start + compute + sync, start + compute + sync + exchange
    entry = {"index": index, "op": op, "source": None, "start": start, "end": e,
             "compute": [start, c], "sync": [c, y], "exchange": [y, e]}
    if loops:
        entry["loops"] = loops
    return entry


def test_timeline_opens_loop_bodies_pass_after_pass():
    body = [_entry(0, "exp", 0, 10, 5, 0), _entry(1, "add", 15, 5, 5, 0)]  # 25 per pass
    trace = [_entry(0, "scan", 0, 45, 30, 0, loops=[{"repeat": 3, "trace": body}]),
             _entry(1, "mul", 75, 5, 5, 0)]
    assert charts._count_leaves(trace) == 7
    leaves = list(charts._leaves(trace, 0, [100]))
    assert [(a, b) for a, b, _ in leaves] == [
        (0, 15), (15, 25), (25, 40), (40, 50), (50, 65), (65, 75), (75, 85)]
    assert leaves[2][2]["compute"] == (25, 35)
    # Over budget: the loop stays one step.
    assert [(a, b) for a, b, _ in charts._leaves(trace, 0, [3])] == [(0, 75), (75, 85)]
    report = {"execution_trace": trace}
    canvas, caption = charts.timeline(report)
    assert "7 steps (loop bodies opened up)" in caption["title"]
    assert png_size(canvas.png()) == (800, 160)


def test_loop_body_liveness_is_drawn_when_the_report_has_bodies():
    report = {"liveness": {"not_always_live": [10], "tile0": [1], "always_live": 5,
                           "peak_step": 0,
                           "bodies": [{"step": 0, "op": "scan", "source": None, "steps": 3,
                                       "peak": 30, "not_always_live": [10, 30, 20]}]}}
    kinds = [k for k, _, _ in charts.draw_all(report)]
    assert kinds == ["liveness", "loop_body_liveness"]
    report["liveness"]["bodies"] = []
    assert [k for k, _, _ in charts.draw_all(report)] == ["liveness"]


def test_coverage_is_the_covered_fraction_of_each_column():
    cov = charts.coverage([(0.5, 2.0), (3.0, 3.1), (4, 4)], 5)
    np.testing.assert_allclose(cov, [0.5, 1.0, 0.0, 0.25, 0.0])
    assert charts.coverage([(0, 1), (0, 1)], 2).tolist() == [1.0, 0.0]  # capped


def test_shade_columns_blends_towards_the_colour():
    c = Canvas(3, 2)
    c.shade_columns(0, 0, 2, [0.0, 0.5, 1.0], "#000000")
    px = decode_rgb(c.png())
    assert px[:, 0].tolist() == [[255] * 3] * 2
    assert px[:, 1].tolist() == [[128] * 3] * 2  # round(127.5)
    assert px[:, 2].tolist() == [[0] * 3] * 2
