"""Liveness, per-tile mapping and the out-of-memory error, by hand."""

import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError
from keras_ipu.device.simulator.memory_model import analyze_memory
from keras_ipu.device.simulator.memory_model import check_memory
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

IPU2 = TARGETS["ipu2"]


def tiny_graph():
    # x:f32[256] (1 KiB); a = exp x; b = a + x; c = sum b.
    def body(b, x):
        a = b.op("exp", x, source="model/act")
        s = b.op("add", a, x, source="model/residual")
        return b.op("reduce_sum", s, axes=(0,), source="model/pool")

    return build([aval((256,))], body)


def test_peak_liveness_by_hand():
    r = analyze_memory(tiny_graph(), IPU2)
    # step 0: {a} 1024; step 1: b = a + x is computed in place into a (a's
    # last use), {b} 1024; step 2: {b, c} 1028 (b dies after).
    assert r.not_always_live_bytes == 1028
    assert r.peak_step == 2
    assert "reduce_sum" in r.peak_step_name and "model/pool" in r.peak_step_name
    assert r.input_bytes == 1024
    # Tiles, in allocation order [TFMAP]: a 1 KiB tensor is 128 grains at
    # 16 per tile, 128 B on each of 8 tiles: x on tiles 0-7, a on 8-15, b
    # (in place of a) on 8-15 too, the 4-byte c on tile 16.
    assert [t.start for t in r.largest_live if t.made_by.startswith("model/")] == [8, 16]
    # Code [TFREPORT]: the fixed code on every tile; each step's on the tiles
    # of its operands and results (exp: 0-15, add: 0-15, sum: 8-16); each
    # vertex type's codelet where it writes (exp, add: 8-15; sum: 16).
    fixed, step, codelet = (cm.CONTROL_CODE_BYTES_PER_TILE, cm.CODE_BYTES_PER_STEP_PER_TILE,
                            cm.VERTEX_CODE_BYTES_PER_CODELET)
    assert (fixed, codelet) == (989, 141)
    code_8_15 = fixed + 3 * step + 2 * codelet
    assert r.code_bytes == 1472 * fixed + (16 + 16 + 9) * step + (8 + 8 + 1) * codelet
    assert r.always_live_bytes == 1024 + r.code_bytes
    # The fullest tile: 8 (the first of 8-15, code and a/b: 128 B), above
    # tiles 0-7 (x and less code) and 16.
    assert (r.tile, r.tile_always_live_bytes, r.tile_bytes) == (8, code_8_15, code_8_15 + 128)
    made = [t.made_by for t in r.largest_live]
    assert any("model/residual (add, step 1)" in m for m in made)
    assert any("model/pool" in m for m in made)
    assert r.fits
    assert "not always live" in str(r)


def test_executable_gives_the_same_peak():
    exe = compile_graph(tiny_graph(), CompileOptions(fuse_elementwise=False))
    r = analyze_memory(exe, IPU2)
    assert r.not_always_live_bytes == 1028
    assert r.peak_step == 2
    # Executables keep each step's Keras layer path, as graphs do.
    made = [t.made_by for t in r.largest_live]
    assert any("model/residual (add, step 1)" in m for m in made), made


def test_out_of_memory_names_ipu_tile_step_tensors_and_fixes():
    n = 300_000_000  # 1.2 GB of float32: more than an ipu2's 897 MiB

    g = build([aval((16,))], lambda b, x: b.op(
        "reduce_sum",
        b.op("broadcast_to", x, shape=(n // 16, 16), source="model/dense_1/BiasAdd"),
        axes=(0, 1), source="model/head"))
    with pytest.raises(IPUOutOfMemoryError) as info:
        check_memory(g, IPU2)
    msg = str(info.value)
    # Tile 1: the sum's result and its codelet sit there (x is on tile 0,
    # the broadcast over every tile from tile 0).
    for part in ("IPU 0", "tile 1:", "program step 1 (reduce_sum in model/head)", "model/dense_1/BiasAdd",
                 "smaller batch", "Float16 activations", "624.0 KiB"):
        assert part in msg, part
    # Only remedies keras_ipu has, and that suit activations.
    for absent in ("pipeline the model", "availableMemoryProportion", "always-live memory alone"):
        assert absent not in msg, absent
    report = info.value.report
    assert not report.fits
    assert report.tile_bytes > IPU2.sram_bytes_per_tile
    assert "Memory report" in str(report)  # still written


def test_small_program_fits_and_tile_count_matters():
    # x is returned too: -x cannot be computed in place.
    g = build([aval((1000,))], lambda b, x: [b.op("neg", x), x])
    assert check_memory(g, "ipu2").fits
    small = TARGETS["ipu2"].with_tiles(4)
    r = analyze_memory(g, small)
    # 4000 B over 4 tiles: 500 grains, 125 per tile: 1000 B on every tile,
    # not moved [TFMAP]; the fullest tile is tile 0 (the first of equals).
    assert r.tile_bytes - r.tile_always_live_bytes == 1000 and r.tile == 0


def test_loop_body_temporaries_count_at_the_loop_step():
    """A scan body's temporaries exist once, on top of what is live outside
    the loop; the largest of them is named with the layer that made it."""
    import numpy as np
    from keras import ops

    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.trace import source_scope
    from keras_ipu.device.trace import trace_flat

    def fn(x):
        def step(carry, _):
            with source_scope("model/wide"):
                wide = ops.tile(ops.expand_dims(carry, 0), (1024, 1))  # 1024 x 64 f32
            with source_scope("model/pool"):
                return ops.sum(wide, axis=0) * 1e-3, None

        final, _ = ops.scan(step, x, length=3)
        return [final]

    graph, _ = trace_flat(fn, [ShapedArray((64,), np.dtype("float32"))])
    r = analyze_memory(graph, IPU2)
    wide_bytes = 1024 * 64 * 4
    # Outer: the scan's result stays in its carry, the input x (in place);
    # inside: `wide` and the tile op's intermediate of the same size (the
    # graph has both live at once).
    assert r.not_always_live_bytes == 2 * wide_bytes
    assert r.peak_step_name.startswith("scan")
    assert ", at its step " in r.peak_step_name
    assert r.largest_live[0].nbytes == wide_bytes
    assert "model/wide" in r.largest_live[0].made_by


def test_weight_update_is_computed_in_place():
    # w' = w - 0.1 * (x @ v): the product is new (64 x 64 f32, 16 KiB); the
    # scaling goes into the product's buffer and w' into w's (both operands
    # die there), as Poplar's in-place elementwise ops do. Without in-place
    # updates two products' worth would be live at the scaling step.
    mm = (((1,), (0,)), ((), ()))

    def body(b, w, x, v):
        d = b.op("dot_general", x, v, dimension_numbers=mm)
        return b.op("sub", w, b.op("mul", d, lit(0.1, "float32")))

    g = build([aval((64, 64)), aval((64, 64)), aval((64, 64))], body)
    r = analyze_memory(g, IPU2)
    assert r.not_always_live_bytes == 64 * 64 * 4
    assert r.input_bytes == 3 * 64 * 64 * 4


def test_values_still_needed_and_constants_are_never_overwritten():
    # x is returned and the constant is a constant: x + c needs new memory.
    import numpy as np

    g = build([aval((256,))], lambda b, x: [b.op("add", lit(np.ones(256, np.float32)), x), x])
    assert analyze_memory(g, IPU2).not_always_live_bytes == 1024
    # Only x is needed later here: the sum goes into nothing it may reuse.
    g = build([aval((256,)), aval((256,))], lambda b, x, y: [b.op("add", x, y), x, y])
    assert analyze_memory(g, IPU2).not_always_live_bytes == 1024
    g = build([aval((256,)), aval((256,))], lambda b, x, y: [b.op("add", x, y), x])
    assert analyze_memory(g, IPU2).not_always_live_bytes == 0  # into y


def test_best_schedule_takes_the_post_order_when_it_holds_less():
    """Poplar's CHOOSE_BEST: of the program order (both products first,
    then both sums: both products live at once) and the post order from
    the outputs (each product then its sum: one at a time), the lower."""
    from keras_ipu.device import trace as _trace
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.simulator import memory_model as mm
    from keras import ops

    def f(a, b):
        x1, x2 = ops.matmul(a, a), ops.matmul(b, b)
        return [ops.sum(x1), ops.sum(x2)]

    aval = ShapedArray((256, 256), "float32")
    graph, _ = _trace.trace_flat(f, [aval, aval])
    big = 256 * 256 * 4
    program = mm.analyze_memory(graph, IPU2)
    best = mm.analyze_memory(graph, IPU2, schedule="best")
    assert [n.primitive.name for n in mm.post_order(graph).nodes] != [
        n.primitive.name for n in graph.nodes]
    # program: x1, x2 and the first sum (4 B) at once; post order: one
    # product and both sums.
    assert program.not_always_live_bytes == 2 * big + 4
    assert best.not_always_live_bytes == big + 8


def _fed_scan(steps=(10,)):
    """c:f32[8192], xs:f32[*steps, 8192] -> (ys:f32[*steps, 8192], c'): scans
    nested one per leading axis of xs; the innermost body makes c + x_t and
    y_t = 2 x_t."""
    shape = (8192,)
    body = build([aval(shape), aval(shape)],
                 lambda b, c, x: [b.op("add", c, x), b.op("mul", x, lit(2.0, "float32"))])
    for n in reversed(steps):
        inner = body
        inner_xs = aval((n,) + inner.inputs[1].aval.shape)
        body = build([aval(shape), inner_xs], lambda b, c, xs, inner=inner, n=n: b.op(
            "scan", c, xs, body=inner, length=n, reverse=False, n_carry=1, n_xs=1, unroll=1))
    g = build([aval(shape), aval(tuple(steps) + shape)],
              lambda b, c, xs: list(reversed(b.op("scan", c, xs, **body.nodes[0].params))))
    return g


@pytest.mark.parametrize("steps", [(10,), (2, 10)])
def test_a_feed_is_held_as_one_element(steps):
    """[TFFEED]: the infeed copies one element at a time into a tensor of
    one element, the outfeed likewise out of one: a program input the
    infeed feeds and loops only slice (their xs), and a loop's stacked
    result returned through the outfeed, take one innermost element of IPU
    memory, not the stack (nested loops: the innermost slice)."""
    from keras_ipu.device.simulator.feeds import Feeds

    g = _fed_scan(steps)
    xs, ys = g.inputs[1], g.outputs[0]
    assert xs.aval.shape == ys.aval.shape == tuple(steps) + (8192,)
    whole = analyze_memory(g, IPU2)
    fed = analyze_memory(g, IPU2, feeds=Feeds(inputs=(1,), outputs=(0,)))
    element = 8192 * 4
    stack = element * (10 if steps == (10,) else 20)
    assert cm.FEED_ELEMENTS_ON_IPU == 1
    # Always live: the carry and the stacked xs / one element of them.
    assert whole.input_bytes == element + stack
    assert fed.input_bytes == element + element
    # Not always live: the stacked ys (live to the end) / one element; the
    # rest is the same.
    assert whole.not_always_live_bytes - fed.not_always_live_bytes == stack - element
    # Per tile, the element is mapped as a tensor of its own size: 32 KiB
    # over 1,472 tiles is 128 B a tile (the minimum), the stack 224 or 448.
    tile_element = cm.linear_mapping(element, 4, IPU2.tiles_per_ipu)[1]
    tile_stack = cm.linear_mapping(stack, 4, IPU2.tiles_per_ipu)[1]
    assert (tile_element, tile_stack) == (128, 224 if steps == (10,) else 448)
    assert fed.tile_always_live_bytes < whole.tile_always_live_bytes


def test_a_feed_read_whole_is_held_whole():
    """A fed input something reads whole (not only a loop's slices) must be
    on the IPU whole; a stacked result the program reads again is held
    whole too."""
    from keras_ipu.device.simulator.feeds import Feeds

    g = _fed_scan()
    scan = g.nodes[0]
    total = Var(aval(()))
    g.nodes.append(Node(REGISTRY["reduce_sum"], [g.inputs[1]], {"axes": (0, 1)}, [total]))
    ys_sum = Var(aval(()))
    g.nodes.append(Node(REGISTRY["reduce_sum"], [scan.outputs[1]], {"axes": (0, 1)}, [ys_sum]))
    g.outputs += [total, ys_sum]
    whole = analyze_memory(g, IPU2)
    fed = analyze_memory(g, IPU2, feeds=Feeds(inputs=(1,), outputs=(0,)))
    assert fed.input_bytes == whole.input_bytes == 8192 * 4 * 11
    assert fed.not_always_live_bytes == whole.not_always_live_bytes


def test_state_in_streaming_memory_is_loaded_where_a_loop_body_reads_it():
    """Two variables kept in Streaming Memory [TFOFFLOAD], handed to a loop
    as carries (a device loop around a weight update): the body loads each
    where it reads it and stores its new value back at once, so one is on
    the IPU at a time; the loop step itself holds neither."""
    n = 1024  # f32: 4 KiB each
    body = build([aval((n,)), aval((n,)), aval((n,))], lambda b, a, c, x: [
        b.op("mul", a, lit(0.5, "float32")), b.op("mul", c, lit(0.5, "float32"))])
    g = build([aval((n,)), aval((n,)), aval((3, n))], lambda b, a, c, xs: b.op(
        "scan", a, c, xs, body=body, length=3, reverse=False, n_carry=2, n_xs=1, unroll=1))
    a, c = g.inputs[:2]
    streamed = ({a, c}, set(g.outputs))
    r = analyze_memory(g, IPU2, streamed=streamed)
    assert r.streamed_bytes == 2 * n * 4
    # a loaded (4 KiB), halved in place and stored; then c: 4 KiB at most.
    assert r.not_always_live_bytes == n * 4
    assert r.input_bytes == 3 * n * 4  # xs only (not fed here)
