"""Hand computations of the cost model on ipu2 (1472 tiles, 16/64 MACs per
tile per cycle for fp32/fp16, 4 B per tile per cycle of exchange)."""

import math

import numpy as np
import pytest

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator import prediction
from keras_ipu.device.simulator.targets import TARGETS

IPU2 = TARGETS["ipu2"]
MM = ((((1,), (0,)), ((), ())))


def cost_of(name, in_avals, **params):
    prim = REGISTRY[name]
    outs = prim.abstract_eval(*in_avals, **params)
    outs = tuple(outs) if prim.multiple_results else (outs,)
    return prim.cost(tuple(in_avals), outs, **params)


def test_linear_mapping_follows_poplar_defaults():
    # 8-byte grains, at least 128 bytes (16 grains) per tile, from tile 0 up.
    assert cm.linear_mapping(4000, 4, 1472) == (32, 128)  # 500 grains / 16
    assert cm.linear_mapping(4, 4, 1472) == (1, 4)
    # 16 MiB: 2,097,152 grains, 1425 per tile -> all 1472 tiles, 11,400 B on tile 0.
    assert cm.linear_mapping(16 * 2**20, 4, 1472) == (1472, 1425 * 8)
    assert cm.linear_mapping(0, 4, 1472) == (0, 0)


def test_dot_general_macs_and_bytes():
    c = cost_of("dot_general", (ShapedArray((64, 32), "float32"),
                                ShapedArray((32, 128), "float32")),
                dimension_numbers=MM)
    assert c.kind == "matmul"
    assert c.macs == 64 * 128 * 32 == 262144
    assert c.flops == 2 * 262144
    assert c.bytes_in == (64 * 32 + 32 * 128) * 4
    assert c.bytes_out == 64 * 128 * 4


def test_dot_general_cycles_partial_utilisation():
    c = cost_of("dot_general", (ShapedArray((64, 32), "float32"),
                                ShapedArray((32, 128), "float32")),
                dimension_numbers=MM)
    # Output 32 KiB = 4096 grains at 16 per tile: 256 tiles (inputs: 192).
    assert cm.work_tiles(c, IPU2) == 256
    rate = 16 * cm.MATMUL_EFFICIENCY  # fp32 MACs per tile per cycle achieved
    assert cm.compute_cycles(c, IPU2) == math.ceil(262144 / (256 * rate)) + cm.VERTEX_OVERHEAD_CYCLES
    # Same shape in float16: half the bytes (128 tiles), 4x the MAC rate.
    h = cost_of("dot_general", (ShapedArray((64, 32), "float16"),
                                ShapedArray((32, 128), "float16")),
                dimension_numbers=MM)
    assert cm.work_tiles(h, IPU2) == 128
    rate16 = 64 * cm.MATMUL_EFFICIENCY
    assert cm.compute_cycles(h, IPU2) == math.ceil(262144 / (128 * rate16)) + cm.VERTEX_OVERHEAD_CYCLES


def test_dot_general_cycles_full_utilisation():
    c = cost_of("dot_general", (ShapedArray((2048, 1024), "float32"),
                                ShapedArray((1024, 2048), "float32")),
                dimension_numbers=MM)
    macs = 2048 * 2048 * 1024
    assert c.macs == macs
    assert cm.work_tiles(c, IPU2) == 1472
    expected = math.ceil(macs / (1472 * 16 * cm.MATMUL_EFFICIENCY)) + cm.VERTEX_OVERHEAD_CYCLES
    assert cm.compute_cycles(c, IPU2) == expected
    if cm.MATMUL_EFFICIENCY == 0.5:
        assert expected == 364723 + cm.VERTEX_OVERHEAD_CYCLES
    # Exchange: operands (2 x 8 MiB) spread over 1472 tiles at 4 B/cycle.
    moved = cm.exchange_bytes(c, IPU2)
    assert moved == 2 * 2048 * 1024 * 4
    assert cm.exchange_cycles(moved, 1472, IPU2) == math.ceil(moved / (1472 * 4))


def test_elementwise_add_cycles():
    c = cost_of("add", (ShapedArray((1000,), "float32"), ShapedArray((1000,), "float32")))
    assert (c.flops, c.macs, c.bytes_in, c.bytes_out, c.kind) == (1000, 0, 8000, 4000, "elementwise")
    assert cm.work_tiles(c, IPU2) == 32  # 4000 B = 500 grains, 16 per tile
    # float32 on the 64-bit vector unit: 2 lanes; 1000 / 32 tiles -> 32
    # elements = 16 vectors on the busiest tile, each 1 cycle of arithmetic +
    # 2 of load/store and loop (poplibs' estimate), + the vertex overhead
    # (198 supervisor + 6 workers x 20).
    assert cm.VERTEX_OVERHEAD_CYCLES == 318
    assert cm.elementwise_vectors(c, 32) == 16
    assert cm.compute_cycles(c, IPU2) == 16 + 2 * 16 + 318
    assert cm.exchange_bytes(c, IPU2) == 0  # mapped like its operands
    compute, exchange, sync, tiles = prediction.cycles(c, IPU2)
    assert (compute, exchange, sync, tiles) == (16 + 32 + 318, 0, 300, 32)


def test_fused_chain_pays_the_load_store_once():
    from keras_ipu.device.primitives import cost_util

    # A chain of 3 float16 ops over 4096 elements, one output: 3 FLOPs per
    # element. 8 KiB over 64 tiles (16 grains of 8 B each) -> 64 elements =
    # 16 vectors of 4 half lanes: 3 x 16 + 2 x 16 + 318.
    x = ShapedArray((4096,), "float16")
    fused = cost_util.make((x, x), (x,), "elementwise", 3 * 4096)
    assert cm.work_tiles(fused, IPU2) == 64
    assert cm.compute_cycles(fused, IPU2) == 48 + 32 + 318
    # Three separate ops pay the load/store (and the overhead) three times.
    single = cost_util.make((x, x), (x,), "elementwise", 4096)
    assert 3 * cm.compute_cycles(single, IPU2) == 3 * (16 + 32 + 318) > 48 + 32 + 318


def test_transcendental_costs_more_than_add():
    x = ShapedArray((1000,), "float16")
    assert cost_of("exp", (x,)).flops == cm.TRANSCENDENTAL_FLOPS * 1000
    assert cost_of("neg", (x,)).flops == 1000
    assert cm.vector_flops_per_tile_per_cycle(np.float16) == 4
    assert cm.vector_flops_per_tile_per_cycle(np.float32) == 2


def test_transpose_exchange_bytes():
    c = cost_of("transpose", (ShapedArray((64, 64), "float32"),), permutation=(1, 0))
    assert (c.kind, c.flops, c.bytes_in) == ("copy", 0, 16384)
    assert cm.exchange_bytes(c, IPU2) == 16384
    # 16 KiB output over 128 tiles (2048 grains, 16 per tile), 4 B/tile/cycle.
    assert prediction.cycles(c, IPU2) == (0, 16384 // (128 * 4), 300, 128)


def test_reshape_is_free():
    c = cost_of("reshape", (ShapedArray((8, 8), "float32"),), new_shape=(64,))
    assert prediction.cycles(c, IPU2) == (0, 0, 0, 0)


def test_sync_and_host_transfer():
    assert cm.sync_cycles(3) == 3 * cm.SYNC_CYCLES == 900
    # ipu2: PCIe Gen4 x16, 64 GB/s both ways -> 32 GB/s one way.
    assert cm.host_transfer_seconds(32e9, IPU2) == pytest.approx(1.0 + cm.HOST_TRANSFER_LATENCY_S)
    assert cm.host_transfer_seconds(0, IPU2) == 0.0
    assert cm.ipu_link_seconds(320e9, IPU2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="ipu1"):
        cm.ipu_link_seconds(1, TARGETS["ipu1"])


def test_conv_macs():
    # NHWC 1x8x8x3 input, HWIO 3x3x3x16 kernel, SAME: 8x8x16 outputs, 27 MACs each.
    dn = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    c = cost_of("conv_general_dilated",
                (ShapedArray((1, 8, 8, 3), "float32"), ShapedArray((3, 3, 3, 16), "float32")),
                window_strides=(1, 1), padding=((1, 1), (1, 1)), lhs_dilation=(1, 1),
                rhs_dilation=(1, 1), dimension_numbers=dn, feature_group_count=1)
    assert c.macs == 8 * 8 * 16 * 27
