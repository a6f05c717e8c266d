"""Start tiles [TFMAP], code per tile [TFREPORT] and the TileLoad the
liveness walk sums, by hand."""

import numpy as np

from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator import tile_mapping

from compiler_graphs import aval


def test_each_tensor_starts_where_the_previous_ended():
    layout = tile_mapping.Layout(10)
    small, tiny, whole = aval((64,)), aval(()), aval((10 * 32,))  # 256 B, 4 B, 1280 B
    layout.place("a", small)  # 256 B: 2 tiles of 128 B, tiles 0-1
    layout.place("b", small)  # tiles 2-3
    layout.place("w", whole)  # 1280 B over all 10 tiles: not moved, no advance
    layout.place("c", tiny)  # tile 4
    assert [layout.start(k) for k in "abwc"] == [0, 2, 0, 4]
    layout.place("a", small)  # placed once
    assert layout.start("a") == 0
    # Wrapping: five more 2-tile tensors take 5-6, 7-8, 9-0, 1-2, 3-4.
    for k in "defgh":
        layout.place(k, small)
    assert [layout.start(k) for k in "defgh"] == [5, 7, 9, 1, 3]
    assert layout.vector("f", small).tolist() == [128] + [0] * 8 + [128]
    assert layout.tiles_of("f", small).tolist() == [9, 0]


def test_step_code_on_the_tiles_it_touches_and_codelets_once_per_tile():
    class Node:
        class primitive:
            name = "add"

    class V:
        def __init__(self, a):
            self.aval = a

    layout = tile_mapping.Layout(10)
    x, y, z = V(aval((64,))), V(aval((64,))), V(aval((64,)))
    for v in (x, y, z):
        layout.place(v, v.aval)  # tiles 0-1, 2-3, 4-5
    layout.add_step(Node, [x, y], [z])
    layout.add_step(Node, [z], [z])
    fixed, step, codelet = (cm.CONTROL_CODE_BYTES_PER_TILE, cm.CODE_BYTES_PER_STEP_PER_TILE,
                            cm.VERTEX_CODE_BYTES_PER_CODELET)
    # The first step touches 0-5 and writes 4-5; the second touches and
    # writes 4-5: the add codelet is there once.
    assert layout.code.tolist() == (
        [fixed + step] * 4 + [fixed + 2 * step + codelet] * 2 + [fixed] * 4)


def test_code_constants_come_from_the_published_summary():
    # [TFREPORT]: 851,272 B control code + 351,328 B host exchange code,
    # 170,788 B vertex code, over 1,216 tiles.
    assert cm.CONTROL_CODE_BYTES_PER_TILE == 989
    assert cm.VERTEX_CODE_BYTES_PER_CODELET == 141


def test_tile_load_sums_and_compares_by_the_fullest_tile():
    base = np.array([10, 0, 0])
    a = tile_mapping.TileLoad(np.array([0, 8, 0]), base)
    b = tile_mapping.TileLoad(np.array([1, 0, 0]), base)
    assert (a.excess, b.excess) == (0, 1)  # 8 on tile 1 stays under tile 0's 10
    assert b > a and a > 0 - 1 and not a > 0
    both = 0 + a + b
    assert both.vector.tolist() == [1, 8, 0] and both.excess == 1
    assert (both + (-1) * b).vector.tolist() == [0, 8, 0]
    # Equal excess: the load holding more bytes is the larger.
    c = tile_mapping.TileLoad(np.array([0, 2, 0]), base)
    assert a > c and max(c, a) is a and int(a) == 0
