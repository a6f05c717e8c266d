"""dot_general: the one contraction primitive (as lax.dot_general).

dimension_numbers = ((lhs_contracting, rhs_contracting), (lhs_batch,
rhs_batch)). The result has the batch dims, then lhs' free dims, then rhs'
free dims. matmul, dot, tensordot, einsum, inner, outer and vdot are all
built on it.

Gradient rules: grads/dot.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _check_dims(dims, ndim, what):
    dims = tuple(dims)
    for d in dims:
        if not 0 <= d < ndim:
            raise shape_rules.ShapeError(
                f"dot_general: {what} dimension {d} is out of range for an "
                f"operand of rank {ndim}"
            )
    if len(set(dims)) != len(dims):
        raise shape_rules.ShapeError(f"dot_general: repeated {what} dims {dims}")
    return dims


def split_dimensions(lhs_ndim, rhs_ndim, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    lc = _check_dims(lc, lhs_ndim, "lhs contracting")
    rc = _check_dims(rc, rhs_ndim, "rhs contracting")
    lb = _check_dims(lb, lhs_ndim, "lhs batch")
    rb = _check_dims(rb, rhs_ndim, "rhs batch")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise shape_rules.ShapeError(
            "dot_general: lhs and rhs need as many contracting (and batch) "
            f"dims as each other; got {dimension_numbers}"
        )
    if set(lc) & set(lb) or set(rc) & set(rb):
        raise shape_rules.ShapeError(
            f"dot_general: a dim is both batch and contracting in "
            f"{dimension_numbers}"
        )
    lf = tuple(d for d in range(lhs_ndim) if d not in lc and d not in lb)
    rf = tuple(d for d in range(rhs_ndim) if d not in rc and d not in rb)
    return lc, rc, lb, rb, lf, rf


def _match(a, b):
    if a is None:
        return b
    if b is None or a == b:
        return a
    return False


def _dot_general_rule(lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    lc, rc, lb, rb, lf, rf = split_dimensions(lhs.ndim, rhs.ndim, dimension_numbers)
    if lhs.dtype != rhs.dtype:
        raise TypeError(
            f"dot_general: operands must share one dtype, got {lhs.dtype.name} "
            f"and {rhs.dtype.name} (the backend promotes first)"
        )
    batch = []
    for kind, ls, rs in (("contracting", lc, rc), ("batch", lb, rb)):
        for l, r in zip(ls, rs):
            m = _match(lhs.shape[l], rhs.shape[r])
            if m is False:
                raise shape_rules.ShapeError(
                    f"dot_general: {kind} dims do not match: lhs {lhs.shape} "
                    f"dim {l} is {lhs.shape[l]}, rhs {rhs.shape} dim {r} is "
                    f"{rhs.shape[r]}"
                )
            if kind == "batch":
                batch.append(m)
    shape = (
        tuple(batch)
        + tuple(lhs.shape[d] for d in lf)
        + tuple(rhs.shape[d] for d in rf)
    )
    dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    return ShapedArray(shape, dtype)


def compute_dtype(dtype, preferred):
    out = dtype if preferred is None else np.dtype(preferred)
    # NumPy has no BLAS for half types (and ml_dtypes' bfloat16 matmul is a
    # slow generic loop): accumulate them in float32, as the IPU's AMP units
    # do, and round once at the end.
    if out.kind == "f" and out.itemsize < 4:
        return np.dtype(np.float32), out
    if out.kind == "V" or out.name == "bfloat16":
        return np.dtype(np.float32), out
    return out, out


def _dot_general(lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    lhs = np.asarray(lhs)
    rhs = np.asarray(rhs)
    lc, rc, lb, rb, lf, rf = split_dimensions(lhs.ndim, rhs.ndim, dimension_numbers)
    compute, out_dtype = compute_dtype(lhs.dtype, preferred_element_type)
    if lhs.dtype != compute:
        lhs = lhs.astype(compute)
    if rhs.dtype != compute:
        rhs = rhs.astype(compute)
    # Batch-matmul form: (B, M, K) @ (B, K, N), one BLAS call (the
    # compiled kernels' whole product: product_pool.matmul).
    lt = np.transpose(lhs, lb + lf + lc)
    rt = np.transpose(rhs, rb + rc + rf)
    bshape = tuple(lhs.shape[d] for d in lb)
    mshape = tuple(lhs.shape[d] for d in lf)
    nshape = tuple(rhs.shape[d] for d in rf)
    b = int(np.prod(bshape, dtype=np.int64))
    m = int(np.prod(mshape, dtype=np.int64))
    n = int(np.prod(nshape, dtype=np.int64))
    k = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
    out = product_pool.matmul(lt.reshape(b, m, k), rt.reshape(b, k, n))
    out = out.reshape(bshape + mshape + nshape)
    return out if out.dtype == out_dtype else out.astype(out_dtype)


# dot_general(lhs, rhs; dimension_numbers, preferred_element_type): the
# general contraction; preferred_element_type sets the accumulation and
# result dtype (int8 x int8 -> int32).
dot_general_p = Primitive("dot_general", _dot_general_rule, _dot_general,
                          fp_class="accumulating")


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _dot_general_cost(ins, outs, *, dimension_numbers, preferred_element_type=None):
    # One MAC per output element per contracted element (2 FLOPs each).
    (lc, _), _ = dimension_numbers
    k = 1
    for d in lc:
        k *= ins[0].shape[d] or 0
    macs = _cost.size(outs[0]) * k
    return _cost.make(ins, outs, "matmul", 2 * macs, macs)


dot_general_p.cost = _dot_general_cost
