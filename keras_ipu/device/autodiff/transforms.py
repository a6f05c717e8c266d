"""The user-facing transforms of the autodiff: vjp, jvp (by transposing
reverse mode), value_and_grad and grad, over pytrees of arrays."""

import numpy as np

from keras_ipu.device import pytree
from keras_ipu.device.array import Tensor
from keras_ipu.device.autodiff.reverse import instantiate
from keras_ipu.device.autodiff.reverse import linearize
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import ad_util
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import trace_flat


def _as_array(x):
    if isinstance(x, (Tensor, Tracer)):
        return x
    variable_value = getattr(x, "value", None)
    if variable_value is not None and isinstance(variable_value, (Tensor, Tracer)):
        return variable_value
    return Tensor(np.asarray(x))


def _aval(x):
    return ShapedArray(x.shape, x.dtype)


def vjp(fn, *primals, has_aux=False):
    """(outputs, vjp_fn): fn(*primals) and the function that maps output
    cotangents (same structure as the outputs) to primal cotangents (same
    structure as the primals). With has_aux, fn returns (outputs, aux) and
    the result is (outputs, vjp_fn, aux); aux is not differentiated."""
    primal_leaves, primal_tree = pytree.flatten(primals)
    flat = [_as_array(x) for x in primal_leaves]
    box = {}

    def flat_fn(*tracers):
        out = fn(*pytree.unflatten(primal_tree, list(tracers)))
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise ValueError(
                    "With has_aux=True the function must return "
                    "(outputs, aux); got " + type(out).__name__
                )
            out, aux = out
            aux_leaves, box["aux_tree"] = pytree.flatten(aux)
            aux_leaves = [_as_array(a) for a in aux_leaves]
        else:
            aux_leaves = []
        leaves, box["tree"] = pytree.flatten(out)
        leaves = [_as_array(o) for o in leaves]
        box["n_out"] = len(leaves)
        return leaves + aux_leaves

    graph, captures = trace_flat(flat_fn, [_aval(x) for x in flat])
    lin = linearize(graph, flat + list(captures), n_active=len(flat))
    n_out = box["n_out"]
    outputs = pytree.unflatten(box["tree"], lin.outputs[:n_out])

    def vjp_fn(cotangents):
        ct_leaves = pytree.flatten_like(box["tree"], cotangents, "vjp_fn: the cotangents")
        if len(ct_leaves) != n_out:
            raise ValueError(
                f"vjp_fn: got {len(ct_leaves)} cotangents for {n_out} "
                "outputs; pass one per output (same structure)."
            )
        cts = [None if c is None else _as_array(c) for c in ct_leaves]
        in_cts = lin.backward(cts + [None] * (len(graph.outputs) - n_out))
        grads = [instantiate(ct, x) for ct, x in zip(in_cts[: len(flat)], flat)]
        return pytree.unflatten(primal_tree, grads)

    if has_aux:
        aux = pytree.unflatten(box["aux_tree"], lin.outputs[n_out:])
        return outputs, vjp_fn, aux
    return outputs, vjp_fn


def jvp(fn, primals, tangents, has_aux=False):
    """(outputs, output tangents) of fn at `primals` along `tangents` (same
    structure as primals); with has_aux, fn returns (outputs, aux) and the
    result is (outputs, output tangents, aux).

    Forward mode by transposing reverse mode: vjp_fn maps output cotangents
    u to J^T u, linearly in u, so the vjp of vjp_fn (at any u, zeros here)
    maps t to J t. It costs two reverse passes and needs the gradient rules
    of the rules (most bind differentiable primitives); a rule binding a
    primitive without a gradient fails with that primitive's name.
    """
    primals = tuple(primals)
    tangents = tuple(tangents)
    flat_p = pytree.leaves(primals)
    flat_t = pytree.leaves(tangents)
    if len(flat_p) != len(flat_t):
        raise ValueError(
            f"jvp: got {len(flat_t)} tangents for {len(flat_p)} primals; pass "
            "one tangent per primal, in the same structure."
        )
    for p, t in zip(flat_p, flat_t):
        if tuple(np.shape(p)) != tuple(np.shape(t)):
            raise ValueError(
                f"jvp: a tangent has shape {tuple(np.shape(t))} but its primal "
                f"has shape {tuple(np.shape(p))}; each tangent must match its "
                "primal."
            )
    result = vjp(fn, *primals, has_aux=has_aux)
    outputs, vjp_fn = result[0], result[1]
    out_leaves, out_tree = pytree.flatten(outputs)
    zeros = [ad_util.zeros_like(_as_array(o)) for o in out_leaves]

    def transpose(*us):
        return pytree.leaves(vjp_fn(pytree.unflatten(out_tree, list(us))))

    _, vjp_of_vjp = vjp(transpose, *zeros)
    out_tangents = vjp_of_vjp([_as_array(t) for t in flat_t])
    out_tangents = pytree.unflatten(out_tree, list(out_tangents))
    if has_aux:
        return outputs, out_tangents, result[2]
    return outputs, out_tangents


def _check_scalar(value):
    if tuple(value.shape) != () or not ad_util.is_differentiable(value.dtype):
        raise TypeError(
            "grad needs a function returning a float scalar; it returned "
            f"shape {tuple(value.shape)} dtype {value.dtype}. Reduce it (e.g. "
            "with keras.ops.sum or mean) or use vjp for non-scalar outputs."
        )


def value_and_grad(fn, argnums=0, has_aux=False):
    """fn's value and its gradient with respect to the arguments `argnums`
    (an int or a tuple of ints; a tuple gives a tuple of gradients). fn must
    return a float scalar (with has_aux: (scalar, aux) and the value is
    (scalar, aux))."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def wrapped(*args):
        for n in nums:
            if not -len(args) <= n < len(args):
                raise ValueError(
                    f"argnums={argnums} is out of range for {len(args)} "
                    "positional arguments."
                )
        chosen = tuple(args[n] for n in nums)

        def partial(*diff_args):
            full = list(args)
            for n, a in zip(nums, diff_args):
                full[n] = a
            return fn(*full)

        result = vjp(partial, *chosen, has_aux=has_aux)
        out, back = result[0], result[1]
        _check_scalar(out)
        grads = back(ad_util.scalar(1, out.dtype))
        value = (out, result[2]) if has_aux else out
        return value, grads[0] if single else tuple(grads)

    return wrapped


def grad(fn, argnums=0, has_aux=False):
    """The gradient of the float-scalar function fn (see value_and_grad);
    with has_aux returns (gradient, aux)."""
    vg = value_and_grad(fn, argnums=argnums, has_aux=has_aux)

    def wrapped(*args):
        value, grads = vg(*args)
        if has_aux:
            return grads, value[1]
        return grads

    return wrapped
