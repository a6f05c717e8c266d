"""Contractions and linear algebra: dot, convolution, cholesky,
triangular-solve, fft, the batch-norm opcodes, and the linear-algebra
custom-calls TensorFlow emits on CPU (Eigh)."""

import numpy as np

from keras_ipu.device.primitives import conv
from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import dot
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import fft as fft_prims
from keras_ipu.device.primitives import linalg
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import structure
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import dtype_of
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.importer import shape_of
from keras_ipu.frontends.tensorflow.opcodes.shapes import out_dtype
from keras_ipu.frontends.tensorflow.opcodes.shapes import out_shape
from keras_ipu.frontends.tensorflow.opcodes.shapes import reshape
from keras_ipu.frontends.tensorflow.opcodes.shapes import transpose


def _same_dtype(imp, x, y):
    if dtype_of(x) == dtype_of(y):
        return x, y
    wide = np.promote_types(dtype_of(x), dtype_of(y))
    cast = lambda v: v if dtype_of(v) == wide else imp.bind(cv.convert_element_type_p, v, dtype=wide)  # noqa: E731
    return cast(x), cast(y)


@rule("dot")
def _dot(imp, instr, operands):
    lhs, rhs = (imp.array(x) for x in operands)
    dn = instr.dot_dimension_numbers
    dims = ((tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)),
            (tuple(dn.lhs_batch_dimensions), tuple(dn.rhs_batch_dimensions)))
    lhs, rhs = _same_dtype(imp, lhs, rhs)
    want = out_dtype(instr)
    preferred = None if want == dtype_of(lhs) else want
    return imp.bind(dot.dot_general_p, lhs, rhs, dimension_numbers=dims,
                    preferred_element_type=preferred)


@rule("convolution")
def _convolution(imp, instr, operands):
    lhs, rhs = (imp.array(x) for x in operands)
    lhs, rhs = _same_dtype(imp, lhs, rhs)
    d = instr.convolution_dimension_numbers
    lhs_spec = (d.input_batch_dimension, d.input_feature_dimension, *d.input_spatial_dimensions)
    rhs_spec = (d.kernel_output_feature_dimension, d.kernel_input_feature_dimension,
                *d.kernel_spatial_dimensions)
    out_spec = (d.output_batch_dimension, d.output_feature_dimension, *d.output_spatial_dimensions)
    window = list(instr.window.dimensions)
    nsp = len(lhs_spec) - 2
    if len(window) != nsp:
        raise HloImportError(f"the window has {len(window)} dimensions for {nsp} spatial ones.")
    reversed_axes = tuple(rhs_spec[2 + i] for i, w in enumerate(window) if w.window_reversal)
    if reversed_axes:
        rhs = imp.bind(structure.rev_p, rhs, axes=reversed_axes)
    params = dict(
        window_strides=tuple(int(w.stride) or 1 for w in window),
        padding=tuple((int(w.padding_low), int(w.padding_high)) for w in window),
        lhs_dilation=tuple(int(w.base_dilation) or 1 for w in window),
        rhs_dilation=tuple(int(w.window_dilation) or 1 for w in window),
        feature_group_count=int(instr.feature_group_count) or 1,
    )
    groups = int(instr.batch_group_count) or 1
    if groups > 1:
        lhs, lhs_spec = _batch_groups_as_feature_groups(imp, lhs, lhs_spec, groups)
        params["feature_group_count"] = groups * params["feature_group_count"]
    out = imp.bind(conv.conv_general_dilated_p, lhs, rhs,
                   dimension_numbers=(tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)),
                   **params)
    want = out_dtype(instr)
    if dtype_of(out) != want:
        out = imp.bind(cv.convert_element_type_p, out, dtype=want)
    return out


def _batch_groups_as_feature_groups(imp, lhs, lhs_spec, groups):
    """batch_group_count G as a feature grouping: the batch splits into G
    contiguous chunks, chunk g becoming feature group g (XLA's definition:
    output features of group g see batch chunk g)."""
    perm = lhs_spec
    x = transpose(imp, lhs, perm)  # (N, C, *spatial)
    n, c, *spatial = shape_of(x)
    if n % groups:
        raise HloImportError(f"batch_group_count {groups} does not divide the batch size {n}.")
    x = reshape(imp, x, (groups, n // groups, c, *spatial))
    x = transpose(imp, x, (1, 0, *range(2, 3 + len(spatial))))
    x = reshape(imp, x, (n // groups, groups * c, *spatial))
    return x, tuple(range(2 + len(spatial)))


@rule("cholesky")
def _cholesky(imp, instr, operands):
    (a,) = operands
    return imp.bind(linalg.cholesky_p, imp.array(a), lower=bool(instr.cholesky_options.lower))


@rule("triangular-solve")
def _triangular_solve(imp, instr, operands):
    a, b = (imp.array(x) for x in operands)
    o = instr.triangular_solve_options
    _, xla_data_pb2 = hlo_proto.protos()
    kind = xla_data_pb2.TriangularSolveOptions.Transpose.Name(o.transpose_a)
    return imp.bind(linalg.triangular_solve_p, a, b, left_side=bool(o.left_side),
                    lower=bool(o.lower), transpose_a=kind in ("TRANSPOSE", "ADJOINT"),
                    conjugate_a=kind == "ADJOINT", unit_diagonal=bool(o.unit_diagonal))


@rule("fft")
def _fft(imp, instr, operands):
    (x,) = operands
    _, xla_data_pb2 = hlo_proto.protos()
    kind = xla_data_pb2.FftType.Name(instr.fft_type)
    out = imp.bind(fft_prims.fft_p, imp.array(x), fft_type=kind,
                   fft_lengths=tuple(int(n) for n in instr.fft_length))
    want = out_dtype(instr)
    if dtype_of(out) != want:
        out = imp.bind(cv.convert_element_type_p, out, dtype=want)
    return out


# -- batch normalisation (XLA's BatchNormExpander formulas) -----------------------


def _channel(imp, v, rank, feature):
    shape = [1] * rank
    shape[feature] = shape_of(v)[0]
    return reshape(imp, v, tuple(shape))


def _moments(imp, x, feature):
    rank = len(shape_of(x))
    axes = tuple(a for a in range(rank) if a != feature)
    n = np.prod([shape_of(x)[a] for a in axes], dtype=np.int64)
    count = np.asarray(n, dtype_of(x))
    mean = imp.bind(ew.div_p, imp.bind(red.reduce_sum_p, x, axes=axes), count)
    sq = imp.bind(ew.div_p, imp.bind(red.reduce_sum_p, imp.bind(ew.mul_p, x, x), axes=axes), count)
    var = imp.bind(ew.sub_p, sq, imp.bind(ew.mul_p, mean, mean))
    return mean, var, axes, count


@rule("batch-norm-training")
def _batch_norm_training(imp, instr, operands):
    x, scale, offset = (imp.array(v) for v in operands)
    f = int(instr.feature_index)
    rank = len(shape_of(x))
    mean, var, _, _ = _moments(imp, x, f)
    eps = np.asarray(instr.epsilon, dtype_of(x))
    inv = imp.bind(ew.rsqrt_p, imp.bind(ew.add_p, var, eps))
    ch = lambda v: _channel(imp, v, rank, f)  # noqa: E731
    y = imp.bind(ew.mul_p, imp.bind(ew.sub_p, x, ch(mean)), ch(imp.bind(ew.mul_p, inv, scale)))
    y = imp.bind(ew.add_p, y, ch(offset))
    return (y, mean, var)


@rule("batch-norm-inference")
def _batch_norm_inference(imp, instr, operands):
    x, scale, offset, mean, var = (imp.array(v) for v in operands)
    f = int(instr.feature_index)
    rank = len(shape_of(x))
    eps = np.asarray(instr.epsilon, dtype_of(x))
    inv = imp.bind(ew.rsqrt_p, imp.bind(ew.add_p, var, eps))
    ch = lambda v: _channel(imp, v, rank, f)  # noqa: E731
    y = imp.bind(ew.mul_p, imp.bind(ew.sub_p, x, ch(mean)), ch(imp.bind(ew.mul_p, inv, scale)))
    return imp.bind(ew.add_p, y, ch(offset))


@rule("batch-norm-grad")
def _batch_norm_grad(imp, instr, operands):
    x, scale, mean, var, dy = (imp.array(v) for v in operands)
    f = int(instr.feature_index)
    rank = len(shape_of(x))
    axes = tuple(a for a in range(rank) if a != f)
    count = np.asarray(np.prod([shape_of(x)[a] for a in axes], dtype=np.int64), dtype_of(x))
    eps = np.asarray(instr.epsilon, dtype_of(x))
    ch = lambda v: _channel(imp, v, rank, f)  # noqa: E731
    inv = imp.bind(ew.rsqrt_p, imp.bind(ew.add_p, var, eps))
    centered = imp.bind(ew.sub_p, x, ch(mean))
    d_offset = imp.bind(red.reduce_sum_p, dy, axes=axes)
    dy_centered = imp.bind(red.reduce_sum_p, imp.bind(ew.mul_p, dy, centered), axes=axes)
    d_scale = imp.bind(ew.mul_p, dy_centered, inv)
    # dx = scale * inv * (dy - mean(dy) - centered * mean(dy * centered) / (var + eps))
    mean_dy = imp.bind(ew.div_p, d_offset, count)
    k = imp.bind(ew.div_p, imp.bind(ew.div_p, dy_centered, count), imp.bind(ew.add_p, var, eps))
    inner = imp.bind(ew.sub_p, imp.bind(ew.sub_p, dy, ch(mean_dy)), imp.bind(ew.mul_p, centered, ch(k)))
    dx = imp.bind(ew.mul_p, inner, ch(imp.bind(ew.mul_p, scale, inv)))
    return (dx, d_scale, d_offset)


# -- custom-calls -------------------------------------------------------------------


@rule("custom-call")
def _custom_call(imp, instr, operands):
    target = instr.custom_call_target
    handler = CUSTOM_CALLS.get(target)
    if handler is None:
        raise HloImportError(
            f"custom-call target {target!r} has no import rule (known: "
            f"{', '.join(sorted(CUSTOM_CALLS))}). It is an op TensorFlow "
            "lowers to a backend library call; rewrite that part with other "
            "TensorFlow ops, or run it outside the compiled function."
        )
    return handler(imp, instr, operands)


def _eigh(imp, instr, operands):
    """TensorFlow's self_adjoint_eig on CPU: custom-call "Eigh" returning
    (eigenvectors, eigenvalues), eigenvalues ascending; its backend config
    is "lower,sort_eigenvalues,max_iter,tolerance" (lower=1: the lower
    triangle is read)."""
    (a,) = operands
    fields = bytes(instr.backend_config or b"").decode("ascii", "replace").split(",")
    lower = fields[0].strip() != "0" if fields and fields[0].strip() else True
    w, v = imp.bind(linalg.eigh_p, imp.array(a), lower=lower)
    shapes = [tuple(t.dimensions) for t in instr.shape.tuple_shapes]
    if shapes and shapes[0] == tuple(shape_of(v)):
        return (v, w)
    return (w, v)


def _qr(imp, instr, operands):
    """custom-call "Qr" (LAPACK geqrf: R in the upper triangle, Householder
    reflectors below it and in `taus`), as TensorFlow uses it: its result
    only goes to the upper-triangle reads of R and to
    ProductOfElementaryHouseholderReflectors, which makes Q. The QR
    factorization (the qr primitive, LAPACK's signs as XLA's) gives R, with
    zeros below the diagonal, and Q, kept for that product."""
    (a,) = operands
    q, r = imp.bind(linalg.qr_p, imp.array(a), mode="complete")
    taus_dims, taus_dtype = hlo_proto.array_shape(instr.shape.tuple_shapes[1])
    taus = np.zeros(taus_dims, taus_dtype)
    imp.qr_factors[id(r)] = (r, q)
    return (r, taus)


def _householder_product(imp, instr, operands):
    """custom-call "ProductOfElementaryHouseholderReflectors" of a "Qr"
    result: the first n columns of its Q."""
    packed, _ = operands
    entry = imp.qr_factors.get(id(packed))
    if entry is None or entry[0] is not packed:
        raise HloImportError(
            "ProductOfElementaryHouseholderReflectors of reflectors that do not "
            "come straight from a Qr custom-call is not supported.")
    q = entry[1]
    out = tuple(int(d) for d in instr.shape.dimensions)
    qshape = shape_of(q)
    if out[-1] > qshape[-1]:
        raise HloImportError(f"a Householder product of {out[-1]} columns from a {qshape[-1]}-column Q.")
    if out == qshape:
        return q
    from keras_ipu.device.primitives import indexing

    return imp.bind(indexing.slice_p, q, start_indices=(0,) * len(out), limit_indices=out,
                    strides=(1,) * len(out))


CUSTOM_CALLS = {"Eigh": _eigh, "Qr": _qr,
                "ProductOfElementaryHouseholderReflectors": _householder_product}


def register_custom_call(target):
    """Register `fn(imp, instr, operands)` for custom-call `target`."""

    def register(fn):
        CUSTOM_CALLS[target] = fn
        return fn

    return register


__all__ = ["register_custom_call", "out_shape"]
