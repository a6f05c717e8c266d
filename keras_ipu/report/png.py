"""A small raster canvas and PNG writer (NumPy + zlib + struct).

Pictures must come out on any machine keras_ipu runs on, and neither
matplotlib nor Pillow is a dependency: an RGB array, filled rectangles and
columns, encoded as an 8-bit truecolour PNG, is all the charts need.
"""

import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def encode_png(rgb):
    """PNG bytes of an (height, width, 3) uint8 array."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"encode_png needs an (height, width, 3) array, got shape {rgb.shape}")
    height, width = rgb.shape[:2]
    # Filter type 0 (none) before every row.
    raw = np.zeros((height, 1 + 3 * width), np.uint8)
    raw[:, 1:] = rgb.reshape(height, 3 * width)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (PNG_SIGNATURE + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + _chunk(b"IEND", b""))


def png_size(data):
    """(width, height) read from PNG bytes (for tests and the HTML page)."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def hex_color(text):
    text = text.lstrip("#")
    return tuple(int(text[i:i + 2], 16) for i in (0, 2, 4))


class Canvas:
    """White RGB pixels; y grows downwards as in images."""

    def __init__(self, width, height, background="#ffffff"):
        self.width, self.height = int(width), int(height)
        self.pixels = np.empty((self.height, self.width, 3), np.uint8)
        self.pixels[:] = hex_color(background)

    def fill(self, x0, y0, x1, y1, color):
        """Fills [x0, x1) x [y0, y1), clipped; any rectangle that overlaps a
        pixel column gets at least that one column (tiny steps stay visible)."""
        x0, x1 = int(np.floor(x0)), int(np.ceil(x1))
        y0, y1 = int(np.floor(y0)), int(np.ceil(y1))
        x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
        x0, y0 = max(x0, 0), max(y0, 0)
        x1, y1 = min(x1, self.width), min(y1, self.height)
        if x0 < x1 and y0 < y1:
            self.pixels[y0:y1, x0:x1] = hex_color(color) if isinstance(color, str) else color

    def columns(self, x0, y_base, heights, color):
        """Bars from y_base upwards, one pixel column per entry of `heights`."""
        heights = np.clip(np.round(np.asarray(heights, float)).astype(int), 0, y_base)
        rgb = hex_color(color)
        rows = np.arange(self.height)[:, None]
        cols = slice(int(x0), int(x0) + len(heights))
        mask = (rows < y_base) & (rows >= y_base - heights[None, :])
        region = self.pixels[:, cols]
        region[mask[:, : region.shape[1]]] = rgb

    def shade_columns(self, x0, y0, y1, coverage, color):
        """Columns from x0 blended towards `color` by `coverage` (0..1 each):
        a lane where many short events share a pixel shows how much of it
        they fill instead of a solid block."""
        f = np.clip(np.asarray(coverage, float), 0, 1)[None, :, None]
        cols = slice(int(x0), int(x0) + f.shape[1])
        rows = slice(int(y0), int(y1))
        region = self.pixels[rows, cols].astype(float)
        target = np.asarray(hex_color(color), float)
        self.pixels[rows, cols] = np.round(region * (1 - f) + target * f).astype(np.uint8)

    def hline(self, x0, x1, y, color):
        self.fill(x0, y, x1, y + 1, color)

    def vline(self, x, y0, y1, color):
        self.fill(x, y0, x + 1, y1, color)

    def png(self):
        return encode_png(self.pixels)

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.png())
        return path
