"""Control flow for the ipu backend: eager on the host, traced into graphs.

With concrete operands every function here runs the user's Python directly
(as JAX does under `jax.disable_jit`): a cond calls one branch, a loop is a
Python loop. When an operand (or the predicate) is a Tracer, the functions
are traced into sub-graphs and one control-flow primitive is recorded, so a
compiled program keeps its loops and branches. Loops are also kept whole
whenever a trace is running, even on concrete operands: their bodies may
close over traced values, and unrolling would copy the body per step.
"""

import builtins

import numpy as np

from keras.src import tree

from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import control_flow as cf
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import current_builder
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.trace import tracing

_PY_SCALARS = (bool, int, float, complex)


def _any_tracer(*trees):
    return any(isinstance(x, Tracer) for x in tree.flatten(trees))


def _stays_a_loop(*trees):
    """Whether a loop must be traced as one primitive: an operand is traced,
    or a trace is running (its body may close over traced values; unrolling
    it into the enclosing graph would copy the body once per step)."""
    return current_builder() is not None or _any_tracer(*trees)


def _knp():
    from keras_ipu.backend import numpy as knp

    return knp


def _unwrap_variable(x):
    from keras_ipu.backend.core import Variable

    return x.value if isinstance(x, Variable) else x


def _to_arrays(leaves):
    return [convert_to_tensor(_unwrap_variable(x)) for x in leaves]


class _Traced:
    """One traced function: its graph, captures and output structure."""

    def __init__(self, graph, captures, out_tree, none, weak):
        self.graph = graph
        self.captures = captures
        self.out_tree = out_tree
        # Per leaf of out_tree: whether it is None (not a graph output).
        self.none = none
        # Per graph output: whether it was a Python scalar (weakly typed).
        self.weak = weak


def _trace(fn, in_avals, allow_none=False):
    """Trace fn(*tracers) -> any structure of arrays into a _Traced."""
    box = {}

    def flat_fn(*tracers):
        out = fn(*tracers)
        leaves = tree.flatten(out)
        if not allow_none and any(x is None for x in leaves):
            raise ValueError(
                "A traced control-flow function returned None where an array "
                f"was expected (output structure: {out!r})."
            )
        box["tree"] = out
        box["none"] = [x is None for x in leaves]
        box["weak"] = [isinstance(x, _PY_SCALARS) for x in leaves if x is not None]
        return _to_arrays([x for x in leaves if x is not None])

    graph, captures = trace_flat(flat_fn, in_avals)
    return _Traced(graph, captures, box["tree"], box["none"], box["weak"])


def _align_captures(traced_fns):
    """Make every graph take the union of all captures (same order).

    Returns the list of outer Tracers to pass after the explicit operands.
    """
    union = []
    seen = {}
    for t in traced_fns:
        for c in t.captures:
            if id(c.var) not in seen:
                seen[id(c.var)] = len(union)
                union.append(c)
    for t in traced_fns:
        n_explicit = len(t.graph.inputs) - len(t.captures)
        own = dict(zip((id(c.var) for c in t.captures),
                       t.graph.inputs[n_explicit:]))
        t.graph.inputs = t.graph.inputs[:n_explicit] + [
            own.get(id(c.var)) or Var(c.aval) for c in union
        ]
        t.captures = list(union)
    return union


def _unify_weak_outputs(traced_fns):
    """A Python-scalar output takes the dtype the other functions give it
    (as a weakly typed constant would), so `lambda: 0.0` matches a float16
    branch."""
    n = len(traced_fns[0].graph.outputs)
    if any(len(t.graph.outputs) != n for t in traced_fns):
        return
    for i in range(n):
        strong = [t.graph.outputs[i].aval.dtype for t in traced_fns
                  if not t.weak[i]]
        if not strong:
            continue
        for t in traced_fns:
            out = t.graph.outputs[i]
            if t.weak[i] and isinstance(out, Literal) and out.aval.dtype != strong[0]:
                t.graph.outputs[i] = Literal(
                    convert_to_tensor(out.value, strong[0].name)
                )


def _check_same_tree(a, b, what):
    try:
        tree.assert_same_structure(a, b)
    except (ValueError, TypeError) as e:
        # A list where a tuple was given holds the same values: accept it.
        if len(tree.flatten(a)) == len(tree.flatten(b)):
            return
        raise ValueError(
            f"{what} must return the same structure; got {a!r} and {b!r}."
        ) from e


def _aval(x):
    return ShapedArray(x.shape, x.dtype)


# -- cond / switch ------------------------------------------------------------


def cond(pred, true_fn, false_fn):
    pred = _unwrap_variable(pred)
    if not isinstance(pred, Tracer):
        return true_fn() if pred else false_fn()
    from keras_ipu.device.primitives.convert import convert_element_type_p

    if pred.ndim != 0:
        pred = _knp().reshape(pred, ())
    index = convert_element_type_p.bind(
        convert_to_tensor(pred, "bool"), dtype=np.dtype("int32")
    )
    return _traced_switch(index, [false_fn, true_fn], (), "cond")


def switch(index, branches, *operands):
    index = _unwrap_variable(index)
    if not _any_tracer(index, operands):
        i = int(convert_to_tensor(index, "int32"))
        return branches[builtins.min(builtins.max(i, 0), len(branches) - 1)](
            *operands
        )
    index = convert_to_tensor(index, "int32")
    if isinstance(index, Tracer) and index.ndim != 0:
        index = _knp().reshape(index, ())
    return _traced_switch(index, list(branches), operands, "switch")


def _traced_switch(index, branches, operands, what):
    if not branches:
        raise ValueError(f"{what}: `branches` must hold at least one function.")
    op_leaves = _to_arrays(tree.flatten(operands))
    in_avals = [_aval(x) for x in op_leaves]

    def branch_fn(fn):
        def flat(*tracers):
            return fn(*tree.pack_sequence_as(operands, list(tracers)))

        return flat

    traced = [_trace(branch_fn(b), in_avals, allow_none=True) for b in branches]
    for i, t in enumerate(traced[1:], 1):
        _check_same_tree(
            traced[0].out_tree, t.out_tree,
            f"{what}: branch 0 and branch {i} (true_fn and false_fn for cond)",
        )
    _unify_weak_outputs(traced)
    captures = _align_captures(traced)
    outs = cf.cond_p.bind(
        index, *op_leaves, *captures,
        branches=tuple(t.graph for t in traced),
    )
    return _repack(traced[0], outs)


def _repack(traced, flat_outs):
    flat_outs = list(flat_outs)
    leaves = [None if is_none else flat_outs.pop(0) for is_none in traced.none]
    return tree.pack_sequence_as(traced.out_tree, leaves)


# -- while_loop / fori_loop ---------------------------------------------------


def while_loop(cond, body, loop_vars, maximum_iterations=None):
    is_tuple = isinstance(loop_vars, (tuple, list))
    loop_vars = tuple(loop_vars) if is_tuple else (loop_vars,)
    loop_vars = tree.map_structure(
        lambda x: convert_to_tensor(_unwrap_variable(x)), loop_vars
    )

    def next_vars(vars_):
        out = body(*vars_)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    done = 0
    while not _stays_a_loop(loop_vars):
        if maximum_iterations is not None and done >= maximum_iterations:
            return loop_vars if is_tuple else loop_vars[0]
        keep_going = cond(*loop_vars)
        if isinstance(keep_going, Tracer):
            break
        if not keep_going:
            return loop_vars if is_tuple else loop_vars[0]
        loop_vars = tree.map_structure(convert_to_tensor, next_vars(loop_vars))
        done += 1
    remaining = None
    if maximum_iterations is not None:
        remaining = maximum_iterations - done
    out = _traced_while(cond, next_vars, loop_vars, remaining)
    return out if is_tuple else out[0]


def _traced_while(cond, next_vars, loop_vars, maximum_iterations):
    leaves = _to_arrays(tree.flatten(loop_vars))
    counted = maximum_iterations is not None
    if counted:
        leaves.append(convert_to_tensor(0, "int32"))
    in_avals = [_aval(x) for x in leaves]
    n_user = len(leaves) - counted

    def user_vars(tracers):
        return tree.pack_sequence_as(loop_vars, list(tracers[:n_user]))

    def cond_flat(*tracers):
        keep_going = convert_to_tensor(cond(*user_vars(tracers)))
        if keep_going.dtype != np.bool_:
            keep_going = convert_to_tensor(keep_going, "bool")
        if keep_going.ndim != 0:
            keep_going = _knp().reshape(keep_going, ())
        if counted:
            keep_going = _knp().logical_and(
                keep_going, _knp().less(tracers[-1], maximum_iterations)
            )
        return [keep_going]

    def body_flat(*tracers):
        new_vars = next_vars(user_vars(tracers))
        _check_same_tree(
            loop_vars, new_vars, "while_loop: `loop_vars` and `body`"
        )
        out = _to_arrays(tree.flatten(new_vars))
        out = [_match_dtype(o, a, "while_loop body") for o, a in
               zip(out, in_avals)]
        if counted:
            out.append(_knp().add(tracers[-1], convert_to_tensor(1, "int32")))
        return out

    cond_t = _trace(cond_flat, in_avals)
    body_t = _trace(body_flat, in_avals)
    outs = cf.while_p.bind(
        *leaves, *cond_t.captures, *body_t.captures,
        cond_graph=cond_t.graph, body_graph=body_t.graph,
        n_cond_consts=len(cond_t.captures),
    )
    return tree.pack_sequence_as(loop_vars, list(outs[:n_user]))


def _match_dtype(x, aval, what):
    """Loop values keep their dtype: a body may return a weakly typed result
    (x + 1 on an int8 carry stays int8 in Keras), never a new kind."""
    if x.dtype == aval.dtype:
        return x
    if x.dtype.kind == aval.dtype.kind or (
        x.dtype.kind in "iu" and aval.dtype.kind in "iu"
    ):
        return convert_to_tensor(x, aval.dtype.name)
    raise TypeError(
        f"{what}: a loop value enters as {aval.short()} but comes back as "
        f"{x.dtype.name}. Cast it so it keeps the dtype {aval.dtype.name}."
    )


def fori_loop(lower, upper, body_fun, init_val):
    if not _stays_a_loop(lower, upper, init_val):
        val = init_val
        for i in range(int(lower), int(upper)):
            val = body_fun(i, val)
        return val
    if not _any_tracer(lower, upper):
        # Static bounds: a scan, which reverse-mode autodiff can run
        # backwards (a while_loop cannot be).
        lower, upper = int(lower), int(upper)

        def step(carry, _):
            i, val = carry
            return (i + 1, body_fun(i, val)), None

        (_, val), _ = scan(
            step, (convert_to_tensor(lower, "int32"), init_val),
            length=builtins.max(upper - lower, 0),
        )
        return val
    upper = convert_to_tensor(upper, "int32")

    def keep_going(i, _):
        return _knp().less(i, upper)

    def step(i, val):
        return i + 1, body_fun(i, val)

    _, val = while_loop(
        keep_going, step, (convert_to_tensor(lower, "int32"), init_val)
    )
    return val


# -- scan / map ---------------------------------------------------------------


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    if not callable(f):
        raise TypeError(f"`f` should be a callable. Received: f={f}")
    if not isinstance(unroll, bool):
        if not isinstance(unroll, int) or unroll < 1:
            raise ValueError(
                "`unroll` must be an positive integer or boolean. "
                f"Received: unroll={unroll}"
            )
    if xs is None and length is None:
        raise ValueError("Got no `xs` to scan over and `length` not provided.")
    init = tree.map_structure(
        lambda x: convert_to_tensor(_unwrap_variable(x)), init
    )
    xs_leaves = [] if xs is None else _to_arrays(tree.flatten(xs))
    if length is None:
        length = xs_leaves[0].shape[0]
        if length is None and not _any_tracer(xs_leaves):
            raise ValueError("scan: the leading axis of `xs` has no size.")
    for x in xs_leaves:
        if x.ndim == 0 or (
            x.shape[0] is not None and length is not None
            and x.shape[0] != length
        ):
            raise ValueError(
                f"scan: every `xs` value needs the leading size {length}; got "
                f"shapes {[tuple(v.shape) for v in xs_leaves]}."
            )
    if _stays_a_loop(init, xs_leaves):
        return _traced_scan(f, init, xs, xs_leaves, length, reverse, unroll)
    return _eager_scan(f, init, xs, xs_leaves, int(length), reverse)


def _eager_scan(f, init, xs, xs_leaves, length, reverse):
    carry = init
    ys = []
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for t in steps:
        x_t = None
        if xs is not None:
            x_t = tree.pack_sequence_as(xs, [x[t] for x in xs_leaves])
        carry, y = f(carry, x_t)
        ys.append(y)
    if reverse:
        ys.reverse()
    if not ys or tree.flatten(ys[0]) == [None] or ys[0] is None:
        if ys and ys[0] is not None:
            return carry, ys[0]
        return carry, None
    knp = _knp()
    stacked = tree.map_structure(lambda *y: knp.stack(list(y)), *ys)
    return carry, stacked


def _traced_scan(f, init, xs, xs_leaves, length, reverse, unroll):
    init_leaves = _to_arrays(tree.flatten(init))
    n_carry = len(init_leaves)
    in_avals = [_aval(x) for x in init_leaves] + [
        ShapedArray(x.shape[1:], x.dtype) for x in xs_leaves
    ]

    def body(*tracers):
        carry = tree.pack_sequence_as(init, list(tracers[:n_carry]))
        x_t = None
        if xs is not None:
            x_t = tree.pack_sequence_as(xs, list(tracers[n_carry:]))
        new_carry, y = f(carry, x_t)
        _check_same_tree(init, new_carry, "scan: `init` and the carry of `f`")
        carry_out = [
            _match_dtype(o, a, "scan body")
            for o, a in zip(_to_arrays(tree.flatten(new_carry)), in_avals)
        ]
        return carry_out, y

    traced = _trace(body, in_avals, allow_none=True)
    if isinstance(unroll, bool):
        unroll = 0 if unroll else 1
    outs = cf.scan_p.bind(
        *init_leaves, *xs_leaves, *traced.captures,
        body=traced.graph,
        length=None if length is None else int(length),
        reverse=bool(reverse),
        n_carry=n_carry,
        n_xs=len(xs_leaves),
        unroll=int(unroll),
    )
    _, ys = _repack(traced, outs)
    return tree.pack_sequence_as(init, list(outs[:n_carry])), ys


def map(f, xs):  # noqa: A001 (Keras' name)
    def step(_, x):
        return (), f(x)

    _, ys = scan(step, (), xs)
    return ys


def vectorized_map(function, elements):
    # There is no batching transform yet: the function runs once per element
    # (a Python loop eagerly, a scan when traced), as on the NumPy backend.
    return map(function, elements)


# -- associative_scan ---------------------------------------------------------


def associative_scan(f, elems, reverse=False, axis=0):
    if not callable(f):
        raise TypeError(f"`f` should be a callable. Received: f={f}")
    knp = _knp()
    leaves = _to_arrays(tree.flatten(elems))
    if not leaves:
        return elems
    ndim = leaves[0].ndim
    axis = axis % ndim if ndim else 0
    lengths = {x.shape[axis] for x in leaves}
    if len(lengths) != 1:
        raise ValueError(
            "Array inputs to associative_scan must have the same "
            f"first dimension. (saw: {[tuple(x.shape) for x in leaves]})"
        )
    (n,) = lengths

    def combine(a, b):
        out = f(tree.pack_sequence_as(elems, a), tree.pack_sequence_as(elems, b))
        return _to_arrays(tree.flatten(out))

    if reverse:
        leaves = [knp.flip(x, axis=axis) for x in leaves]
    if n is None:
        out = _sequential_prefix(combine, leaves, axis)
    else:
        out = _parallel_prefix(combine, leaves, axis, n)
    if reverse:
        out = [knp.flip(x, axis=axis) for x in out]
    return tree.pack_sequence_as(elems, out)


def _take(x, axis, start, stop, step=1):
    index = [builtins.slice(None)] * x.ndim
    index[axis] = builtins.slice(start, stop, step)
    return x[tuple(index)]


def _interleave(evens, odds, axis):
    """e0 o0 e1 o1 ... along axis (len(evens) is len(odds) or one more)."""
    knp = _knp()
    n_odd = odds.shape[axis]
    head = _take(evens, axis, 0, n_odd)
    pairs = knp.stack([head, odds], axis=axis + 1)
    shape = list(head.shape)
    shape[axis] = 2 * n_odd
    merged = knp.reshape(pairs, shape)
    if evens.shape[axis] > n_odd:
        merged = knp.concatenate([merged, _take(evens, axis, n_odd, None)], axis)
    return merged


def _parallel_prefix(combine, leaves, axis, n):
    # The classic up-sweep/down-sweep: log2(n) levels, each one call of f on
    # whole slices, so the graph stays small and every level is parallel.
    if n < 2:
        return leaves
    knp = _knp()
    pair_sums = combine(
        [_take(x, axis, 0, n - 1, 2) for x in leaves],
        [_take(x, axis, 1, None, 2) for x in leaves],
    )
    odd = _parallel_prefix(combine, pair_sums, axis, n // 2)
    if n % 2 == 0:
        rest = combine(
            [_take(x, axis, 0, -1) for x in odd],
            [_take(x, axis, 2, None, 2) for x in leaves],
        )
    else:
        rest = combine(odd, [_take(x, axis, 2, None, 2) for x in leaves])
    even = [
        knp.concatenate([_take(x, axis, 0, 1), r], axis)
        for x, r in zip(leaves, rest)
    ]
    return [_interleave(e, o, axis) for e, o in zip(even, odd)]


def _sequential_prefix(combine, leaves, axis):
    """Prefix of unknown length: a scan carrying the running value."""
    knp = _knp()
    moved = [knp.moveaxis(x, axis, 0) for x in leaves]
    first = [knp.expand_dims(_take(x, 0, 0, 1)[0], 0) for x in moved]

    def step(carry, x):
        x = [knp.expand_dims(v, 0) for v in x]
        new = combine(
            [knp.moveaxis(c, 0, axis) for c in carry],
            [knp.moveaxis(v, 0, axis) for v in x],
        )
        new = [knp.moveaxis(v, axis, 0) for v in new]
        return new, [v[0] for v in new]

    _, ys = scan(step, first, [_take(x, 0, 1, None) for x in moved])
    out = [knp.concatenate([a, y], 0) for a, y in zip(first, ys)]
    return [knp.moveaxis(x, 0, axis) for x in out]


# -- gradient control ---------------------------------------------------------


def stop_gradient(variable):
    return cf.stop_gradient_p.bind(
        convert_to_tensor(_unwrap_variable(variable))
    )


def _tensor_leaf(x):
    return isinstance(x, (Tensor, Tracer)) or hasattr(x, "__array__") and not (
        isinstance(x, (str, bytes))
    )


def _split_args(args, kwargs):
    """Tensor leaves of (args, kwargs) become graph inputs; the rest stays
    Python (static)."""
    structure = tree.map_structure(_unwrap_variable, (args, kwargs))
    leaves = tree.flatten(structure)
    positions = [i for i, x in enumerate(leaves) if _tensor_leaf(x)]
    tensors = _to_arrays([leaves[i] for i in positions])

    def rebuild(tracers):
        new = list(leaves)
        for i, t in zip(positions, tracers):
            new[i] = t
        return tree.pack_sequence_as(structure, new)

    return structure, tensors, rebuild


def remat(f):
    def rematerialized(*args, **kwargs):
        structure, tensors, rebuild = _split_args(args, kwargs)
        if current_builder() is None and not _any_tracer(tensors):
            return f(*structure[0], **structure[1])

        def flat(*tracers):
            a, kw = rebuild(tracers)
            return f(*a, **kw)

        traced = _trace(flat, [_aval(x) for x in tensors], allow_none=True)
        outs = cf.remat_p.bind(*tensors, *traced.captures, graph=traced.graph)
        return _repack(traced, outs)

    rematerialized.__wrapped__ = f
    return rematerialized


def custom_gradient(fun):
    """fun(*args) -> (outputs, grad_fn); grad_fn(*upstream) -> one gradient
    per argument (None for none).

    Eagerly the outputs are computed at once (there is no tape to attach the
    gradient to). Traced, a `custom_vjp` node holds the forward graph and the
    backward graph of grad_fn, which the autodiff uses instead of
    differentiating the forward graph.
    """

    def wrapper(*args, **kwargs):
        structure, tensors, rebuild = _split_args(args, kwargs)
        if current_builder() is None and not _any_tracer(tensors):
            outputs, _ = fun(*structure[0], **structure[1])
            return outputs
        return _traced_custom_vjp(fun, tensors, rebuild)

    wrapper.__wrapped__ = fun
    return wrapper


def _traced_custom_vjp(fun, tensors, rebuild):
    fwd = GraphBuilder()
    inputs = [fwd.new_input(_aval(x)) for x in tensors]
    with tracing(fwd):
        a, kw = rebuild(inputs)
        result = fun(*a, **kw)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ValueError(
                "A function decorated with custom_gradient must return "
                "`(outputs, grad_fn)`; got "
                f"{type(result).__name__}."
            )
        outputs, grad_fn = result
        out_leaves = _to_arrays(tree.flatten(outputs))
        out_vars = [fwd.operand(o) for o in out_leaves]

        def bwd_flat(*cts):
            upstream = tree.pack_sequence_as(outputs, list(cts))
            grads = grad_fn(*cts) if len(cts) != 1 else grad_fn(upstream)
            if not isinstance(grads, (tuple, list)):
                grads = (grads,)
            grads = list(grads)
            if len(grads) != len(tensors):
                raise ValueError(
                    f"The grad_fn of a custom_gradient returned {len(grads)} "
                    f"gradients for {len(tensors)} tensor arguments; return "
                    "one per argument (None where there is none)."
                )
            box["nonzero"] = tuple(g is not None for g in grads)
            return _to_arrays([g for g in grads if g is not None])

        box = {}
        bwd_graph, residuals = trace_flat(
            bwd_flat, [v.aval for v in out_vars]
        )
        res_vars = [fwd.operand(r) for r in residuals]
        fwd.graph.outputs = out_vars + res_vars
    outs = cf.custom_vjp_p.bind(
        *tensors, *fwd.captures,
        fwd=fwd.graph,
        bwd=bwd_graph,
        n_outputs=len(out_vars),
        n_args=len(tensors),
        bwd_nonzero=box["nonzero"],
    )
    return tree.pack_sequence_as(outputs, list(outs[: len(out_vars)]))
