"""Every primitive of the registry has a cost rule that returns a Cost."""

import keras_ipu.device.compiler  # noqa: F401 (registers fused_elementwise)
import keras_ipu.device.simulator.prediction  # noqa: F401 (its cost rule)
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.primitives.cost_util import Cost


def test_every_primitive_has_a_cost_rule():
    missing = sorted(name for name, p in REGISTRY.items() if not callable(p.cost))
    assert missing == [], f"primitives without a cost rule: {missing}"


def _call(name, ins, **params):
    prim = REGISTRY[name]
    outs = prim.abstract_eval(*ins, **params)
    outs = tuple(outs) if prim.multiple_results else (outs,)
    return prim.cost(tuple(ins), outs, **params)


def test_rules_of_every_category_return_costs():
    f = ShapedArray((8, 8), "float32")
    i = ShapedArray((8,), "int32")
    samples = [
        ("add", (f, f), {}),
        ("erf", (f,), {}),
        ("convert_element_type", (f,), {"dtype": ShapedArray((), "float16").dtype}),
        ("reduce_max", (f,), {"axes": (1,)}),
        ("cumsum", (f,), {"axis": 0}),
        ("transpose", (f,), {"permutation": (1, 0)}),
        ("cholesky", (f,), {"lower": True}),
        ("sort", (f,), {"dimension": 1}),
        ("fft", (ShapedArray((8, 8), "complex64"),), {"fft_type": "FFT", "fft_lengths": (8,)}),
        ("iota", (), {"dtype": i.dtype, "shape": (8,), "dimension": 0}),
    ]
    for name, ins, params in samples:
        c = _call(name, ins, **params)
        assert isinstance(c, Cost), name
        assert c.flops >= 0 and c.bytes_out > 0, name
    assert _call("cholesky", (f,), lower=True).flops == int(8**3 / 3)  # 170
    assert _call("sort", (f,), dimension=1).flops == 64 * 3


def test_max_pool_gradient_costs_its_taps():
    # select_and_scatter_add of a 2x2 pool of (2, 4, 6, 3): 2*2*3*3 = 36
    # window results, 4 taps each, POOL_GRAD_FLOPS_PER_TAP (3) per tap;
    # it reads g, x and y and writes x's shape.
    from keras_ipu.device.simulator import cost_model

    g, x = ShapedArray((2, 2, 3, 3), "float32"), ShapedArray((2, 4, 6, 3), "float32")
    c = _call("select_and_scatter_add", (g, x, g), op="max",
              window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1),
              padding=((0, 0),) * 4, window_dilation=(1,) * 4)
    assert cost_model.POOL_GRAD_FLOPS_PER_TAP == 3
    assert c.flops == 36 * 4 * 3 and c.kind == "elementwise"
    assert c.bytes_in == (36 + 144 + 36) * 4 and c.bytes_out == 144 * 4
