"""Gradient rules of the primitives, checked against central finite
differences in float64 on the host, with random cotangents; every rule is
also run traced (the backward pass recorded in a graph, then evaluated) and
must give the same numbers."""

import json
import subprocess
import sys

import numpy as np
import pytest

from keras_ipu.device import autodiff
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.primitives import control_flow as cf
from keras_ipu.device.primitives import conv
from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import dot
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import fft
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import inter_ipu
from keras_ipu.device.primitives import linalg
from keras_ipu.device.primitives import pooling
from keras_ipu.device.primitives import reduce
from keras_ipu.device.primitives import sort
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives import structure
from keras_ipu.device.trace import trace_flat

F64 = np.dtype("float64")
I32 = np.dtype("int32")

# Primitives that have neither a gradient rule nor a `nondiff` reason yet.
# This list must only shrink.
MISSING = {}


def test_every_primitive_has_a_rule_or_a_reason():
    unexplained = sorted(
        name for name, p in REGISTRY.items()
        if p.grad is None and p.nondiff is None and name not in MISSING
    )
    assert unexplained == []
    # The list must shrink: an entry with a rule now is stale.
    stale = sorted(n for n in MISSING if REGISTRY[n].grad is not None)
    assert stale == []


# The gradient rules of control flow (and host regions) differentiate sub-graphs with the
# autodiff's machinery: the autodiff registers them (autodiff/control_flow.py).
CONTROL_FLOW = {"cond", "custom_vjp", "optimization_barrier", "remat", "scan", "while_loop",
                "host_region"}


def test_importing_the_primitives_alone_declares_every_other_rule():
    # Decision 1 (declared first, rules registered in a second step by the
    # same package): importing the primitives needs nothing else, and gives
    # every rule but those the autodiff registers itself.
    code = (
        "import json, sys\n"
        "import keras_ipu.device.primitives as P\n"
        "assert 'keras_ipu.device.autodiff' not in sys.modules\n"
        "print(json.dumps(sorted(n for n, p in P.REGISTRY.items()\n"
        "                        if p.grad is None and p.nondiff is None)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    unexplained = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(set(unexplained) - set(MISSING)) == sorted(CONTROL_FLOW)
    assert all(REGISTRY[n].grad is not None for n in CONTROL_FLOW)  # autodiff imported


def _call(fn, args):
    out = fn(*args)
    return out if isinstance(out, (tuple, list)) else [out]


def numeric_vjp(fn, args, cts, eps=1e-6):
    """sum_k <ct_k, d out_k / d args[i]> by central differences."""
    grads = []
    for i, a in enumerate(args):
        a = np.asarray(a)
        if a.dtype.kind not in "fc":
            grads.append(None)
            continue
        g = np.zeros(a.shape, a.dtype)
        flat = g.reshape(-1)
        for j in range(a.size):
            def at(delta):
                b = a.copy().reshape(-1)
                b[j] += delta
                new = list(args)
                new[i] = b.reshape(a.shape)
                outs = _call(fn, new)
                return sum(
                    np.sum(np.real(np.asarray(o) * c))
                    for o, c in zip(outs, cts) if c is not None
                )

            flat[j] = (at(eps) - at(-eps)) / (2 * eps)
        grads.append(g)
    return grads


def random_cotangents(outs, rng):
    cts = []
    for o in outs:
        o = np.asarray(o)
        if o.dtype.kind in "fc":
            cts.append(rng.standard_normal(o.shape).astype(o.dtype))
        else:
            cts.append(None)
    return cts


def traced_vjp(fn, args, cts):
    """The VJP recorded in a graph (args and cotangents are its inputs),
    then evaluated: the backward pass must be traceable."""
    n = len(args)
    live = [i for i, c in enumerate(cts) if c is not None]

    def whole(*xs):
        prim, ct = xs[:n], xs[n:]
        _, back = autodiff.vjp(lambda *a: list(_call(fn, a)), *prim)
        full = [None] * len(cts)
        for i, c in zip(live, ct):
            full[i] = c
        return back(full)

    avals = [ShapedArray(np.shape(a), np.asarray(a).dtype) for a in args]
    avals += [ShapedArray(cts[i].shape, cts[i].dtype) for i in live]
    graph, captures = trace_flat(whole, avals)
    assert captures == []
    return graph, eval_graph(graph, *args, *(cts[i] for i in live))


# Names of the primitives whose rules check_grad has run (see the last test).
EXERCISED = set()


def _record(fn, args):
    avals = [ShapedArray(np.shape(a), np.asarray(a).dtype) for a in args]
    graph, _ = trace_flat(lambda *a: list(_call(fn, a)), avals)
    EXERCISED.update(n.primitive.name for n in graph.nodes)


def check_grad(fn, *args, seed=0, rtol=1e-5, atol=1e-6, traced=True,
               eps=1e-6):
    _record(fn, args)
    rng = np.random.default_rng(seed)
    outs = _call(fn, args)
    cts = random_cotangents(outs, rng)
    _, back = autodiff.vjp(lambda *a: list(_call(fn, a)), *args)
    got = back(cts)
    want = numeric_vjp(fn, args, cts, eps)
    for g, w in zip(got, want):
        if w is None:
            continue
        assert np.asarray(g).shape == w.shape
        assert np.asarray(g).dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol)
    if traced:
        graph, traced_got = traced_vjp(fn, args, cts)
        for g, t, w in zip(got, traced_got, want):
            if w is None:
                continue
            np.testing.assert_allclose(np.asarray(t), np.asarray(g),
                                       rtol=1e-9, atol=1e-12)
    return got


def r(*shape, seed=1, lo=-1.0, hi=1.0):
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    return rng.uniform(lo, hi, shape).astype(F64)


def pos(*shape, seed=1):
    return r(*shape, seed=seed, lo=0.5, hi=2.0)


def unit(*shape, seed=1):
    return r(*shape, seed=seed, lo=-0.8, hi=0.8)


# -- elementwise ------------------------------------------------------------

UNARY = [
    ("neg", r), ("abs", r), ("exp", r), ("exp2", r), ("expm1", r),
    ("log", pos), ("log1p", pos), ("log2", pos), ("log10", pos),
    ("sqrt", pos), ("rsqrt", pos), ("cbrt", pos), ("reciprocal", pos),
    ("square", r), ("sin", r), ("cos", r), ("tan", unit), ("asin", unit),
    ("acos", unit), ("atan", r), ("sinh", r), ("cosh", r), ("tanh", r),
    ("asinh", r), ("acosh", lambda *s: pos(*s) + 1.0), ("atanh", unit),
    ("logistic", r), ("erf", r), ("erfc", r), ("erfinv", unit),
    ("lgamma", pos), ("digamma", lambda *s, **k: r(*s, **k) * 3 + 0.1),
    ("i0", r), ("i0e", r), ("i1", r), ("i1e", r),
    ("real", r), ("imag", r), ("conj", r),
]


@pytest.mark.parametrize("name,gen", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_unary(name, gen, shape):
    p = REGISTRY[name]
    check_grad(lambda x: p.bind(x), gen(*shape))


@pytest.mark.parametrize("name", ["sign", "floor", "ceil", "round", "trunc",
                                  "angle"])
def test_piecewise_constant_unary_has_zero_gradient(name):
    x = r(5) * 3 + 0.25
    (g,) = check_grad(lambda v: REGISTRY[name].bind(v), x)
    np.testing.assert_array_equal(np.asarray(g), 0.0)


BINARY = [
    ("add", r, r), ("sub", r, r), ("mul", r, r), ("div", r, pos),
    ("rem", pos, pos), ("mod", pos, pos), ("pow", pos, r),
    ("max", r, r), ("min", r, r),
    ("atan2", r, pos), ("hypot", r, r), ("copysign", pos, r),
    ("logaddexp", r, r), ("logaddexp2", r, r),
]
SHAPES = [((), ()), ((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((4,), ())]


@pytest.mark.parametrize("name,gx,gy", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary_with_broadcasting(name, gx, gy, shapes):
    p = REGISTRY[name]
    x = gx(*shapes[0], seed=2)
    y = gy(*shapes[1], seed=3)
    if name in ("rem", "mod"):
        # Away from the jumps of x mod y.
        x = x + 4.1
    check_grad(lambda a, b: p.bind(a, b), x, y)


def test_floor_div_has_zero_gradient():
    gx, gy = check_grad(lambda a, b: ew.floor_div_p.bind(a, b),
                        r(4) * 3 + 0.1, pos(4))
    np.testing.assert_array_equal(np.asarray(gx), 0.0)
    np.testing.assert_array_equal(np.asarray(gy), 0.0)


def test_max_tie_splits_the_gradient():
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([1.0, 5.0, 0.0])
    _, back = autodiff.vjp(lambda a, b: ew.max_p.bind(a, b), x, y)
    gx, gy = back(np.ones(3))
    np.testing.assert_array_equal(np.asarray(gx), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(np.asarray(gy), [0.5, 1.0, 0.0])


def test_pow_at_zero_exponent_and_base():
    x = np.array([0.0, 2.0])
    y = np.array([0.0, 0.0])
    _, back = autodiff.vjp(lambda a, b: ew.pow_p.bind(a, b), x, y)
    gx, gy = back(np.ones(2))
    np.testing.assert_array_equal(np.asarray(gx), [0.0, 0.0])
    np.testing.assert_allclose(np.asarray(gy), [0.0, np.log(2.0)])


def test_select_and_clamp():
    pred = np.array([[True, False, True]])
    check_grad(lambda a, b: ew.select_p.bind(pred, a, b), r(2, 3), r(3))
    x = np.array([-2.0, -0.5, 0.3, 0.9, 3.0])
    check_grad(lambda lo, v, hi: ew.clamp_p.bind(lo, v, hi),
               np.float64(-1.0), x, np.array([1.0] * 5))


def test_comparisons_and_integer_outputs_are_nondiff():
    x, y = r(4), r(4, seed=9)

    def f(a, b):
        mask = ew.gt_p.bind(a, b)
        return ew.select_p.bind(mask, ew.mul_p.bind(a, b), b)

    check_grad(f, x, y)


def test_convert_element_type():
    x = r(3, 2)
    f32 = np.dtype("float32")

    def f(v):
        low = cv.convert_element_type_p.bind(v, dtype=f32)
        return cv.convert_element_type_p.bind(
            ew.mul_p.bind(low, low), dtype=F64)

    # float32 in the middle: a coarser difference step and tolerance.
    check_grad(f, x, rtol=1e-3, atol=1e-4, eps=1e-3)
    # Through an integer conversion the gradient is zero.
    (g,) = check_grad(
        lambda v: cv.convert_element_type_p.bind(
            cv.convert_element_type_p.bind(v, dtype=I32), dtype=F64),
        x * 5)
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def _complex(re, im):
    c128 = np.dtype(np.complex128)
    return ew.add_p.bind(
        cv.convert_element_type_p.bind(re, dtype=c128),
        ew.mul_p.bind(cv.convert_element_type_p.bind(im, dtype=c128),
                      np.complex128(1j)))


@pytest.mark.parametrize("name", ["abs", "angle", "real", "imag", "conj",
                                  "exp", "mul"])
def test_complex_operands(name):
    # Cotangents of complex values c satisfy dL = Re(sum c dz); the loss
    # here is real, through real/imag parts of the result.
    re, im = r(5), r(5, seed=3)

    def f(a, b):
        z = _complex(a, b)
        args = (z, z) if name == "mul" else (z,)
        out = REGISTRY[name].bind(*args)
        if out.dtype.kind != "c":
            return out
        return [ew.real_p.bind(out), ew.imag_p.bind(out)]

    check_grad(f, re, im)


# -- structure --------------------------------------------------------------


def test_reshape_transpose_broadcast_rev():
    x = r(2, 3, 4)
    check_grad(lambda v: structure.reshape_p.bind(v, new_shape=(6, -1)), x)
    check_grad(lambda v: structure.transpose_p.bind(v, permutation=(2, 0, 1)),
               x)
    check_grad(lambda v: structure.broadcast_to_p.bind(v, shape=(5, 2, 3, 4)),
               x)
    check_grad(lambda v: structure.broadcast_to_p.bind(v, shape=(2, 3, 4)),
               r(3, 1))
    check_grad(lambda v: structure.rev_p.bind(v, axes=(0, 2)), x)


def test_concatenate_and_pad():
    check_grad(lambda a, b, c: structure.concatenate_p.bind(a, b, c, axis=1),
               r(2, 1), r(2, 3), r(2, 2))
    cfg = ((1, 2, 0), (-1, 1, 2))
    check_grad(lambda v, p: structure.pad_p.bind(v, p, config=cfg),
               r(3, 4), np.float64(0.5))


# -- indexing ---------------------------------------------------------------


def test_slice_and_dynamic_slices():
    x = r(5, 6)
    check_grad(lambda v: indexing.slice_p.bind(
        v, start_indices=(1, -5), limit_indices=(None, 6), strides=(2, 3)), x)
    check_grad(lambda v: indexing.slice_p.bind(
        v, start_indices=(3, 0), limit_indices=(3, 6), strides=(1, 1)), x)
    i, j = np.int32(3), np.int32(-1)
    check_grad(lambda v: indexing.dynamic_slice_p.bind(
        v, i, j, slice_sizes=(2, 3)), x)
    check_grad(lambda v, u: indexing.dynamic_update_slice_p.bind(v, u, i, j),
               x, r(2, 3))


def test_gather_and_scatter():
    x = r(4, 3)
    idx = np.array([[0], [3], [-1], [7], [0]], np.int32)
    check_grad(lambda v: indexing.gather_p.bind(v, idx, mode="clip"), x)
    check_grad(lambda v: indexing.gather_p.bind(v, idx, mode="fill",
                                                fill_value=0.0), x)
    bidx = np.array([[[2], [0]], [[1], [1]], [[0], [2]], [[2], [2]]], np.int32)
    check_grad(lambda v: indexing.gather_p.bind(v, bidx, mode="clip",
                                                batch_dims=1), x)
    uidx = np.array([[1], [3], [9]], np.int32)
    for mode in ("add", "update", "mul", "min", "max"):
        check_grad(lambda v, u: indexing.scatter_p.bind(v, uidx, u, mode=mode),
                   x, r(3, 3, seed=4))
    dup = np.array([[1], [1]], np.int32)
    check_grad(lambda v, u: indexing.scatter_p.bind(v, dup, u, mode="add"),
               x, r(2, 3))
    # A tie between x and an update splits the cotangent.
    _, back = autodiff.vjp(
        lambda v, u: indexing.scatter_p.bind(v, uidx[:1], u, mode="max"),
        np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[3.0, 1.0]]))
    gx, gu = back(np.ones((2, 2)))
    np.testing.assert_allclose(np.asarray(gx), [[1, 1], [0.5, 1]])
    np.testing.assert_allclose(np.asarray(gu), [[0.5, 0]])


# -- reductions, cumulative, sort -------------------------------------------


@pytest.mark.parametrize("axes", [(0,), (1,), (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "reduce_min",
                                  "reduce_prod"])
def test_reductions(name, axes):
    check_grad(lambda v: REGISTRY[name].bind(v, axes=axes), r(2, 3, 4))


def test_reduce_prod_with_a_zero_and_extremum_ties():
    x = np.array([[2.0, 0.0, 3.0], [1.0, 2.0, 4.0]])
    (g,) = check_grad(lambda v: reduce.reduce_prod_p.bind(v, axes=(1,)), x)
    _, back = autodiff.vjp(
        lambda v: reduce.reduce_prod_p.bind(v, axes=(1,)), x)
    np.testing.assert_allclose(np.asarray(back(np.ones(2))[0])[0], [0, 6, 0])
    y = np.array([1.0, 3.0, 3.0])
    _, back = autodiff.vjp(lambda v: reduce.reduce_max_p.bind(v, axes=(0,)), y)
    np.testing.assert_allclose(np.asarray(back(np.float64(1.0))[0]),
                               [0, .5, .5])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_cumulative(name, reverse):
    x = pos(3, 4)
    check_grad(lambda v: REGISTRY[name].bind(v, axis=1, reverse=reverse), x)
    check_grad(lambda v: REGISTRY[name].bind(v, axis=0, reverse=reverse), x)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cumulative_extrema(name, reverse):
    x = np.random.default_rng(2).permutation(12).reshape(3, 4) / 5.0
    check_grad(lambda v: REGISTRY[name].bind(v, axis=1, reverse=reverse), x)
    check_grad(lambda v: REGISTRY[name].bind(v, axis=0, reverse=reverse), x)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_values_and_carried_operand(descending):
    x = r(3, 5)
    check_grad(lambda v: sort.sort_p.bind(v, dimension=1,
                                          descending=descending)[0], x)
    check_grad(lambda v, w: sort.sort_p.bind(v, w, dimension=0,
                                             descending=descending),
               x, r(3, 5, seed=8))


def test_top_k_and_argmax():
    x = r(2, 6)
    check_grad(lambda v: sort.top_k_p.bind(v, k=3)[0], x)

    def f(v):
        i = reduce.argmax_p.bind(v, axis=1, index_dtype=I32)
        return ew.mul_p.bind(cv.convert_element_type_p.bind(i, dtype=F64),
                             reduce.reduce_sum_p.bind(v, axes=(1,)))

    check_grad(f, x)


# -- dot_general ------------------------------------------------------------

DOTS = [
    ((3, 4), (4, 5), (((1,), (0,)), ((), ()))),
    ((4,), (4,), (((0,), (0,)), ((), ()))),
    ((3,), (2,), (((), ()), ((), ()))),
    ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,)))),
    ((5, 2, 3, 4), (4, 2, 3, 6), (((2, 3), (2, 0)), ((1,), (1,)))),
    ((2, 3, 4), (3, 2), (((1, 0), (0, 1)), ((), ()))),
]


@pytest.mark.parametrize("ls,rs,dims", DOTS, ids=str)
def test_dot_general(ls, rs, dims):
    check_grad(lambda a, b: dot.dot_general_p.bind(a, b,
                                                   dimension_numbers=dims),
               r(*ls), r(*rs, seed=4))


# -- conv and pooling -------------------------------------------------------

CONVS = [
    # (lhs shape NCHW logical, rhs OIHW, strides, padding, lhs_dil, rhs_dil,
    #  groups, channels_last)
    ((2, 3, 5, 6), (4, 3, 3, 2), (1, 1), ((0, 0), (0, 0)), (1, 1), (1, 1), 1,
     False),
    ((1, 2, 7, 6), (3, 2, 3, 3), (2, 3), ((1, 2), (0, 1)), (1, 1), (1, 1), 1,
     True),
    ((1, 4, 6, 6), (6, 2, 2, 3), (1, 2), ((1, 1), (-1, 2)), (1, 1), (2, 1), 2,
     True),
    ((2, 3, 4, 4), (3, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 3,
     True),
    ((1, 2, 3, 4), (2, 2, 2, 2), (1, 1), ((1, 1), (0, 1)), (2, 2), (1, 1), 1,
     False),
    ((1, 2, 8), (3, 2, 3), (2,), ((2, 1),), (1,), (2,), 1, True),
    # Groups with input dilation, kernel dilation and strides.
    ((1, 4, 5, 5), (6, 2, 2, 2), (2, 1), ((1, 0), (0, 1)), (2, 1), (1, 2), 2,
     False),
    # Depthwise with a channel multiplier, 1-D, channels last.
    ((2, 3, 7), (6, 1, 3), (2,), ((1, 1),), (1,), (1,), 3, True),
]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_conv_general_dilated(case):
    ls, rs, strides, padding, ld, rd, groups, channels_last = case
    nd = len(ls)
    lhs, rhs = r(*ls), r(*rs, seed=6)
    dims = conv.default_dimension_numbers(nd)
    if channels_last:
        to_last = (0,) + tuple(range(2, nd)) + (1,)
        lhs = np.transpose(lhs, to_last)
        rhs = np.transpose(rhs, tuple(range(2, nd)) + (1, 0))
        spec = (0, nd - 1) + tuple(range(1, nd - 1))
        dims = (spec, (nd - 1, nd - 2) + tuple(range(nd - 2)), spec)
    check_grad(
        lambda a, b: conv.conv_general_dilated_p.bind(
            a, b, window_strides=strides, padding=padding, lhs_dilation=ld,
            rhs_dilation=rd, dimension_numbers=dims,
            feature_group_count=groups),
        lhs, rhs)


POOLS = [
    ((2, 5, 6, 1), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0), (0, 0), (0, 0), (0, 0)),
     (1, 1, 1, 1)),
    ((1, 5, 5, 2), (1, 3, 3, 1), (1, 1, 2, 1), ((0, 0), (1, 1), (1, 0), (0, 0)),
     (1, 1, 1, 1)),
    ((7,), (3,), (2,), ((-1, 2),), (2,)),
]


@pytest.mark.parametrize("op", ["max", "sum", "min"])
@pytest.mark.parametrize("case", POOLS, ids=lambda c: str(c[0]))
def test_reduce_window(op, case):
    shape, window, strides, padding, wdil = case
    # Distinct values: no ties inside a window.
    x = np.random.default_rng(3).permutation(
        int(np.prod(shape))).reshape(shape).astype(F64) / 7
    check_grad(
        lambda v: pooling.reduce_window_p.bind(
            v, op=op, window_dimensions=window, window_strides=strides,
            padding=padding, base_dilation=(1,) * len(shape),
            window_dilation=wdil),
        x)


def test_pooling_gradients_pad_only_what_the_window_pads():
    # A max pool's gradient is one select_and_scatter_add (no per-tap pads,
    # slices or selects: the TensorFlow engine emits it as MaxPoolGrad);
    # a sum's gradient pads each tap's share into place, and only padded
    # pooling crops the sum back (no identity pads: full copies per step).
    x = r(2, 4, 4, 3)
    nodes = {}
    for op in ("max", "sum"):
        for name, padding in (("valid", ((0, 0),) * 4),
                              ("same", ((0, 0), (0, 1), (0, 1), (0, 0)))):
            fn = lambda v, op=op, padding=padding: pooling.reduce_window_p.bind(  # noqa: E731
                v, op=op, window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1),
                padding=padding, base_dilation=(1,) * 4, window_dilation=(1,) * 4)
            y = fn(x)
            ct = r(*np.shape(y), seed=2)
            graph, (g,) = traced_vjp(fn, [x], [ct])
            nodes[op, name] = [(n.primitive.name, n.params.get("config")) for n in graph.nodes
                               if n.primitive.name in ("pad", "select_and_scatter_add",
                                                       "slice", "select")]
            _, back = autodiff.vjp(fn, x)
            np.testing.assert_array_equal(np.asarray(g), np.asarray(back(ct)[0]))
    assert nodes["max", "valid"] == nodes["max", "same"] == [("select_and_scatter_add", None)]
    taps = nodes["sum", "valid"]
    identity = ((0, 0, 0),) * 4
    assert len(taps) == 4 and all(p == "pad" and c != identity for p, c in taps)
    # The same taps into one more row and column, then the crop.
    assert [p for p, _ in nodes["sum", "same"]] == ["pad"] * 5


@pytest.mark.parametrize("case", POOLS, ids=lambda c: str(c[0]))
def test_select_and_scatter_add_is_linear_in_the_cotangent(case):
    # Its own gradient (a max pool's second derivative): each window reads
    # the cotangent back where its first maximum is.
    shape, window, strides, padding, wdil = case
    x = np.random.default_rng(5).integers(0, 3, shape).astype(F64)  # ties
    y = np.asarray(pooling.reduce_window_p.bind(
        x, op="max", window_dimensions=window, window_strides=strides, padding=padding,
        base_dilation=(1,) * len(shape), window_dilation=wdil))
    check_grad(lambda g: pooling.select_and_scatter_add_p.bind(
        g, x, y, op="max", window_dimensions=window, window_strides=strides,
        padding=padding, window_dilation=wdil), r(*y.shape))


def test_max_pool_tie_goes_to_the_first_maximum():
    x = np.array([1.0, 1.0, 0.0, 2.0])
    _, back = autodiff.vjp(
        lambda v: pooling.reduce_window(v, "max", (2,), (2,)), x)
    (g,) = back(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(np.asarray(g), [1, 0, 0, 1])


# -- linalg and fft ---------------------------------------------------------


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("unit_diagonal", [False, True])
def test_triangular_solve(left_side, lower, transpose_a, unit_diagonal):
    a = r(2, 3, 3) + 3 * np.eye(3)
    b = r(3, 2) if left_side else r(2, 3)
    check_grad(
        lambda m, v: linalg.triangular_solve_p.bind(
            m, v, left_side=left_side, lower=lower, transpose_a=transpose_a,
            conjugate_a=False, unit_diagonal=unit_diagonal),
        a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lower", [True, False])
def test_cholesky(lower):
    m = r(4, 4)
    spd = m @ m.T + 4 * np.eye(4)
    check_grad(lambda x: linalg.cholesky_p.bind(x, lower=lower), spd,
               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths", [(6,), (5,), (4,), (9,), (3, 6), (2, 5)],
                         ids=str)
def test_real_ffts(lengths):
    x = r(2, 3, 6)
    check_grad(lambda v: [ew.real_p.bind(o) for o in [fft.fft_p.bind(
        v, fft_type="RFFT", fft_lengths=lengths)]] + [ew.imag_p.bind(
            fft.fft_p.bind(v, fft_type="RFFT", fft_lengths=lengths))], x)
    spec = (r(2, 3, 4) + 1j * r(2, 3, 4, seed=5)).astype(np.complex128)

    def f(re, im):
        z = ew.add_p.bind(
            cv.convert_element_type_p.bind(re, dtype=np.complex128),
            ew.mul_p.bind(cv.convert_element_type_p.bind(
                im, dtype=np.complex128), np.complex128(1j)))
        return fft.fft_p.bind(z, fft_type="IRFFT", fft_lengths=lengths)

    check_grad(f, spec.real.copy(), spec.imag.copy())


@pytest.mark.parametrize("lower", [True, False])
def test_eigh(lower):
    m = r(4, 4)
    x = m + m.T + np.diag([0.0, 1.0, 2.0, 3.0])

    def f(a):
        w, v = linalg.eigh_p.bind(a, lower=lower)
        # v * v: independent of each eigenvector's sign.
        return [w, ew.mul_p.bind(v, v)]

    check_grad(f, x)
    check_grad(lambda a: linalg.eigh_p.bind(a, lower=lower)[0], r(2, 3, 3))


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 2)], ids=str)
def test_svd(shape):
    x = r(*shape)

    def f(a):
        u, s, vh = linalg.svd_p.bind(a, full_matrices=False, compute_uv=True)
        # Squares: independent of the singular vectors' signs.
        return [ew.mul_p.bind(u, u), s, ew.mul_p.bind(vh, vh)]

    check_grad(f, x)
    check_grad(lambda a: linalg.svd_p.bind(a, full_matrices=False,
                                           compute_uv=False)[0], x)


def test_lu():
    x = r(2, 4, 4)
    check_grad(lambda a: linalg.lu_p.bind(a)[0], x)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (2, 4, 2)], ids=str)
def test_qr(shape):
    check_grad(lambda a: linalg.qr_p.bind(a, mode="reduced"), r(*shape))
    check_grad(lambda a: linalg.qr_p.bind(a, mode="reduced")[1], r(*shape))


@pytest.mark.parametrize("fft_type", ["FFT", "IFFT"])
@pytest.mark.parametrize("lengths", [(6,), (4,), (8,), (3, 5)], ids=str)
def test_fft(fft_type, lengths):
    x = (r(2, 3, 6) + 1j * r(2, 3, 6, seed=4)).astype(np.complex128)

    def f(re, im):
        z = ew.add_p.bind(
            cv.convert_element_type_p.bind(re, dtype=np.complex128),
            ew.mul_p.bind(cv.convert_element_type_p.bind(
                im, dtype=np.complex128), np.complex128(1j)))
        out = fft.fft_p.bind(z, fft_type=fft_type, fft_lengths=lengths)
        return [ew.real_p.bind(out), ew.imag_p.bind(out)]

    check_grad(f, x.real.copy(), x.imag.copy())


# -- identities -------------------------------------------------------------


def test_gradient_through_stop_gradient_and_barrier():
    def f(x):
        y = cf.stop_gradient_p.bind(ew.mul_p.bind(x, x))
        (z,) = cf.optimization_barrier_p.bind(ew.sin_p.bind(x))
        return ew.add_p.bind(ew.mul_p.bind(y, x), z)

    x = r(3)
    _, back = autodiff.vjp(f, x)
    (g,) = back(np.ones(3))
    # stop_gradient: y counts as a constant.
    np.testing.assert_allclose(np.asarray(g), x * x + np.cos(x))
    check_grad(lambda v: cf.optimization_barrier_p.bind(
        ew.sin_p.bind(v), v), x)


def test_gradient_of_an_inter_ipu_copy_goes_back():
    def f(x):
        return ew.sin_p.bind(inter_ipu.ipu_copy_p.bind(x, src=0, dst=1))

    check_grad(f, r(3))


def test_gradient_through_marker_identities():
    from keras_ipu.device.primitives import markers

    x = r(3)
    check_grad(lambda v: markers.recomputation_checkpoint_p.bind(
        ew.sin_p.bind(v)), x)
    check_grad(lambda v: markers.assume_equal_across_replicas_p.bind(
        ew.sin_p.bind(v), inplace=True), x)


def test_trigamma_used_by_digamma_matches_scipy():
    from scipy import special as sp

    from keras_ipu.device.primitives.grads.special import trigamma

    x = np.concatenate([np.linspace(-5.7, 0.45, 40), np.linspace(0.5, 40, 40),
                        [1e-3, 100.0]])
    np.testing.assert_allclose(np.asarray(trigamma(x)), sp.polygamma(1, x),
                               rtol=1e-10)


def test_special_rules_at_zero():
    check_grad(lambda v: special.i1e_p.bind(v), np.array([0.0, 0.5, -2.0]))
    check_grad(lambda v: special.i1_p.bind(v), np.array([0.0, 0.5, -2.0]))


# -- incomplete gamma and beta functions ------------------------------------

GAMMA_SHAPES = [((), ()), ((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)),
                ((), (4,))]


@pytest.mark.parametrize("name", ["igamma", "igammac"])
@pytest.mark.parametrize("shapes", GAMMA_SHAPES, ids=str)
def test_igamma_with_broadcasting(name, shapes):
    a = r(*shapes[0], seed=2, lo=0.3, hi=5.0)
    x = r(*shapes[1], seed=3, lo=0.05, hi=8.0)
    check_grad(lambda u, v: REGISTRY[name].bind(u, v), a, x)


# (a, x): x near 0, a small, a large with x on either side of a (the
# series and the continued fraction), x far in the tail.
IGAMMA_EDGES = [
    ([0.5, 1.0, 3.0, 0.05], [1e-3, 1e-3, 2e-3, 1e-3]),
    ([0.02, 0.1, 0.02], [0.5, 3.0, 20.0]),
    ([50.0, 50.0, 200.0, 200.0], [45.0, 56.0, 190.0, 215.0]),
    ([2.0, 10.0], [30.0, 40.0]),
]


@pytest.mark.parametrize("name", ["igamma", "igammac"])
@pytest.mark.parametrize("case", IGAMMA_EDGES, ids=str)
def test_igamma_edges(name, case):
    a, x = (np.array(v, F64) for v in case)
    check_grad(lambda u, v: REGISTRY[name].bind(u, v), a, x, eps=1e-7,
               rtol=1e-5, atol=1e-7)


BETA_SHAPES = [((), (), ()), ((3,), (3,), (3,)), ((2, 3), (3,), ()),
               ((2, 1), (1, 3), (2, 3)), ((), (), (4,))]


@pytest.mark.parametrize("shapes", BETA_SHAPES, ids=str)
def test_betainc_with_broadcasting(shapes):
    a = r(*shapes[0], seed=2, lo=0.5, hi=5.0)
    b = r(*shapes[1], seed=3, lo=0.5, hi=5.0)
    x = r(*shapes[2], seed=4, lo=0.05, hi=0.95)
    check_grad(lambda u, v, w: special.betainc_p.bind(u, v, w), a, b, x)


# (a, b, x): x near 0 and 1, small and large parameters, both sides of
# the continued fraction's switch point (a + 1) / (a + b + 2).
BETAINC_EDGES = [
    ([0.5, 1.0, 2.0], [2.0, 3.0, 1.0], [1e-3, 1e-3, 2e-3]),
    ([2.0, 3.0, 0.5], [0.5, 1.0, 1.0], [0.999, 0.998, 0.999]),
    ([0.1, 0.05, 0.2], [0.1, 3.0, 0.02], [0.3, 0.01, 0.9]),
    ([50.0, 60.0, 30.0], [40.0, 20.0, 80.0], [0.55, 0.78, 0.25]),
]


@pytest.mark.parametrize("case", BETAINC_EDGES, ids=str)
def test_betainc_edges(case):
    a, b, x = (np.array(v, F64) for v in case)
    check_grad(lambda u, v, w: special.betainc_p.bind(u, v, w), a, b, x,
               eps=1e-7, rtol=1e-5, atol=1e-7)


def test_shape_parameter_derivatives_match_closed_forms():
    from scipy import special as sp

    from keras_ipu.device.primitives import special_derivatives as sg

    # d Q(1, x) / da = e^-x (log x + Euler's gamma) + E1(x).
    x = np.array([1e-4, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 80.0])
    want = np.exp(-x) * (np.log(x) + np.euler_gamma) + sp.exp1(x)
    got = np.asarray(sg.igamma_grad_a_p.bind(np.ones_like(x), x))
    np.testing.assert_allclose(-got, want, rtol=1e-12, atol=1e-300)
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b.
    x = np.linspace(0.01, 0.99, 9)
    da, _ = sg.betainc_grad_ab_p.bind(np.full(9, 2.5), np.ones(9), x)
    np.testing.assert_allclose(np.asarray(da), x ** 2.5 * np.log(x),
                               rtol=1e-12)
    _, db = sg.betainc_grad_ab_p.bind(np.ones(9), np.full(9, 3.5), x)
    np.testing.assert_allclose(np.asarray(db),
                               -(1 - x) ** 3.5 * np.log1p(-x), rtol=1e-12)
    # At the ends of the domain the functions do not depend on a, b.
    da, db = sg.betainc_grad_ab_p.bind(np.array([2.0, 0.5]), np.array(
        [3.0, 0.5]), np.array([0.0, 1.0]))
    np.testing.assert_array_equal(np.asarray(da), 0.0)
    np.testing.assert_array_equal(np.asarray(db), 0.0)
    np.testing.assert_array_equal(
        np.asarray(sg.igamma_grad_a_p.bind(np.array([0.5, 2.0]),
                                           np.array([0.0, np.inf]))), 0.0)


def _richardson(f, a, h):
    d1 = (f(a + h) - f(a - h)) / (2 * h)
    d2 = (f(a + h / 2) - f(a - h / 2)) / h
    return (4 * d2 - d1) / 3


def test_shape_parameter_derivatives_over_a_wide_range():
    # Against SciPy's functions differenced in a (and b), on the side of
    # 1/2 where the difference loses no digits to cancellation.
    from scipy import special as sp

    from keras_ipu.device.primitives import special_derivatives as sg

    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(0.01, 5, 100), rng.uniform(5, 2000, 100)])
    x = np.concatenate([rng.uniform(0, 10, 100), a[100:] * rng.uniform(
        0.8, 1.2, 100)])
    # Steps small against the width ~sqrt(a) of the transition in a.
    h = 1e-3 * np.minimum(a, 50.0)
    p = _richardson(lambda t: sp.gammainc(t, x), a, h)
    q = _richardson(lambda t: -sp.gammaincc(t, x), a, h)
    want = np.where(sp.gammainc(a, x) < 0.5, p, q)
    got = np.asarray(sg.igamma_grad_a_p.bind(a, x))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-13)
    # Very large a: the series runs ~9 sqrt(a) terms.
    a = np.array([1e5, 1e6, 1e6, 1e6])
    x = np.array([1e5 + 100, 1e6, 1e6 - 2000, 1e6 + 2000])
    want = _richardson(lambda t: sp.gammainc(t, x), a, 0.5)
    np.testing.assert_allclose(np.asarray(sg.igamma_grad_a_p.bind(a, x)),
                               want, rtol=1e-7)

    a = rng.uniform(0.05, 60, 200)
    b = rng.uniform(0.05, 60, 200)
    x = rng.uniform(0, 1, 200)
    low = sp.betainc(a, b, x) < 0.5
    got_a, got_b = sg.betainc_grad_ab_p.bind(a, b, x)
    for got, which in ((got_a, 0), (got_b, 1)):
        def f(t, c):
            args = (t, b) if which == 0 else (a, t)
            return sp.betainc(*args, x) if c else -sp.betaincc(*args, x)

        p0 = (a, b)[which]
        want = np.where(low, _richardson(lambda t: f(t, True), p0, 1e-3 * p0),
                        _richardson(lambda t: f(t, False), p0, 1e-3 * p0))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6,
                                   atol=1e-13)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_derivative_primitives_shape_rules(dtype):
    from keras_ipu.device.primitives import special_derivatives as sg

    dt = np.dtype(dtype)
    a = np.array([[0.5], [2.0]], dt)
    x = np.array([0.1, 1.0, 4.0], dt)
    out = np.asarray(sg.igamma_grad_a_p.bind(a, x))
    aval = sg.igamma_grad_a_p.abstract_eval(ShapedArray(a.shape, dt),
                                            ShapedArray(x.shape, dt))
    assert (out.shape, out.dtype) == (aval.shape, aval.dtype) == ((2, 3), dt)
    outs = sg.betainc_grad_ab_p.bind(a, a[::-1], x / 5)
    avals = sg.betainc_grad_ab_p.abstract_eval(*(ShapedArray(v.shape, dt)
                                                 for v in (a, a, x)))
    for o, av in zip(outs, avals):
        o = np.asarray(o)
        assert (o.shape, o.dtype) == (av.shape, av.dtype) == ((2, 3), dt)
    # Traced with an unknown dimension.
    graph, _ = trace_flat(
        lambda u, v: [sg.igamma_grad_a_p.bind(u, v),
                      *sg.betainc_grad_ab_p.bind(u, u, v)],
        [ShapedArray((None, 1), dt), ShapedArray((3,), dt)])
    assert [v.aval.shape for v in graph.outputs] == [(None, 3)] * 3
    assert all(v.aval.dtype == dt for v in graph.outputs)


# -- eig --------------------------------------------------------------------


def _eig_invariants(w, v):
    """Eigenvalues and the phase-invariant v_ij conj(v_0j) (each column's
    phase is a convention; its norm is 1)."""
    ref = ew.conj_p.bind(indexing.slice_p.bind(
        v, start_indices=(0,) * v.ndim,
        limit_indices=tuple(v.shape[:-2]) + (1, v.shape[-1]),
        strides=(1,) * v.ndim))
    vv = ew.mul_p.bind(v, ref)
    return [ew.real_p.bind(w), ew.imag_p.bind(w), ew.real_p.bind(vv),
            ew.imag_p.bind(vv)]


@pytest.mark.parametrize("shape", [(2, 2), (3, 3), (4, 4), (2, 3, 3)],
                         ids=str)
def test_eig(shape):
    x = r(*shape, seed=5)
    # Real matrices with complex-conjugate pairs (4x4 here) and real
    # spectra both occur.
    assert np.iscomplexobj(np.linalg.eigvals(r(4, 4, seed=5)))
    check_grad(lambda a: _eig_invariants(*linalg.eig_p.bind(a)), x)
    check_grad(lambda a: ew.real_p.bind(linalg.eig_p.bind(a)[0]), x)


def test_eig_of_a_complex_matrix():
    re, im = r(3, 3, seed=6), r(3, 3, seed=7)
    check_grad(lambda a, b: _eig_invariants(*linalg.eig_p.bind(
        _complex(a, b))), re, im)


def test_eig_eigenvalue_gradient_by_hand():
    # d w_k / dA = u_k v_k^T / (u_k . v_k), u_k the left eigenvector
    # (u_k^T A = w_k u_k^T). Here w_0 = 1, v_0 = e_0, u_0 = (1, -1).
    x = np.array([[1.0, 2.0], [0.0, 3.0]])
    _, back = autodiff.vjp(lambda a: ew.real_p.bind(linalg.eig_p.bind(a)[0]),
                           x)
    (g,) = back(np.array([1.0, 0.0]))
    np.testing.assert_allclose(np.asarray(g), [[1.0, 0.0], [-1.0, 0.0]],
                               atol=1e-12)


def test_static_bincount_weights():
    from keras_ipu.device.primitives import reduce as red

    x = np.array([0, 3, 3, 1, 0], np.int32)
    check_grad(lambda w: red.static_bincount_p.bind(x, w, length=5), r(5))
    rows = np.array([[0, 2, 2], [1, 1, 0]], np.int32)
    check_grad(lambda w: red.static_bincount_p.bind(rows, w, length=3), r(2, 3))


@pytest.mark.parametrize("name", ["cross_replica_sum", "cross_replica_mean"])
def test_cross_replica_collectives_of_one_replica(name):
    # One replica: the identity; several replicas (run side by side) are
    # checked against finite differences in tests/distribute/test_replication.py.
    check_grad(lambda x: REGISTRY[name].bind(x, replicas=1, group_size=1), r(2, 3))


def test_data_moving_collectives_of_one_replica():
    # One replica: each is the identity (a permute onto itself); their
    # rules on several replicas: tests/device/test_collectives_moving_data.py.
    from keras_ipu.device.primitives import collective as c

    one = ((0,),)
    check_grad(lambda x: c.cross_replica_reduce_scatter_p.bind(
        x, replicas=1, groups=one, op="sum", dimension=0), r(2, 3))
    check_grad(lambda x: c.cross_replica_all_gather_p.bind(
        x, replicas=1, groups=one, dimension=1), r(2, 3))
    check_grad(lambda x: c.cross_replica_all_to_all_p.bind(
        x, replicas=1, groups=one, split_dimension=0, concat_dimension=1), r(2, 3))
    check_grad(lambda x: c.collective_permute_p.bind(x, replicas=1, pairs=((0, 0),)), r(2, 3))


# -- every rule is exercised (keep this test last) ---------------------------

# Rules checked in test_autodiff.py (control flow through the backend).
CHECKED_ELSEWHERE = {"cond", "scan", "remat", "custom_vjp", "while_loop", "fused_elementwise",
                     # tests/frontends/tensorflow/test_host_transfer_primitives.py
                     "host_region"}


def test_every_rule_is_checked_against_finite_differences(request):
    if hasattr(request.config, "workerinput"):
        pytest.skip("needs every test of this module in one process")
    wanted = {n for n in globals() if n.startswith("test_")}
    ran = {item.originalname for item in request.session.items
           if item.module is request.module}
    if ran != wanted:
        pytest.skip("needs every test of this module to run")
    with_rule = {n for n, p in REGISTRY.items() if p.grad is not None}
    unchecked = sorted(with_rule - EXERCISED - CHECKED_ELSEWHERE)
    assert unchecked == []
