"""Float16 as on the IPU: stochastic rounding and floating-point exceptions.

The IPUConfig category `floating_point_behaviour` (inv, div0, oflo, esr,
nanoo, set_all) sets the IPU's floating-point unit. The compiler reads it
once per executable (`current_fp_behaviour()`, part of the executable cache
key) and, when an executable is lowered, `wrap_kernel` gives each step the
behaviour of the device:

- esr (StochasticRoundingBehaviour): ON rounds every float16 result of
  arithmetic stochastically (see stochastic_rounding.py): float32 -> float16
  conversions, dot_general and convolutions (accumulated in float32 on the
  AMP units, rounded once), reductions and cumulative sums, and elementwise
  float16 ops (computed in float32, then rounded). Data movement (reshape,
  gather, ...) and exact ops (abs, max, floor, select, ...) round nothing.
  REPLICA_IDENTICAL_ONLY: on the IPU it rounds stochastically only the
  replica-identical parts of the graph. The lowered program here has one
  replica per run, where every value is trivially replica-identical, so it
  behaves as ON. The random bits come from the device seed:
  `keras_ipu.utils.reset_ipu_seed(seed)` reseeds them before the next run (so
  a run after the same reset rounds identically); without it the seed is
  random, as on the IPU ("By default this seed is set randomly").
- inv, div0, oflo: an op whose result shows the exception raises an
  IPUFloatingPointError subclass naming the op, the Keras layer it came from,
  the exception and what to do. Detection is per op, after it runs, on its
  outputs: inv = NaN where no input was NaN; div0 = +-inf from finite inputs
  at a pole (x/0, reciprocal/rsqrt(0), log(0), log1p(-1), atanh(+-1),
  0**negative, lgamma/digamma at non-positive integers); oflo = +-inf (or the
  NaN of nanoo) from finite inputs anywhere else. Ops inside a fused
  elementwise chain are checked one by one, so the error names the op.
  Poplar also counts any operation on a NaN operand as invalid; here a NaN
  is reported where it is made (the first op to trap on the IPU too), and
  NaN or inf arriving from the host data passes without an error.
  Comparisons and other ops with integer or bool results are not checked.
- nanoo. Our reading of the reference: the API text says only "If True,
  Not-a-Number (NaN) on overflow mode will be enabled"; the user guide's
  "Controlling the half-precision floating-point unit" (which it points to)
  says "the nanoo bit selects between clipping or generating a NaN when a
  half-precision number overflows", and Poplar's FloatingPointBehaviour adds
  that with nanoo the invalid-operation flag is set. So, for float16 results
  only: nanoo=False clips an overflowing result to +-65504;
  nanoo=True makes it NaN, and that NaN counts as an invalid operation (so
  inv traps it too). Division by zero is not an overflow and stays +-inf;
  float32 overflow is IEEE (+-inf) either way.
- All off (the default IPUConfig, or no configured system): the compiler
  does not call wrap_kernel at all (`FPBehaviour.active` is False), so programs run
  the plain NumPy kernels with no overhead, and float16 overflow is IEEE inf
  there, as on the other Keras backends: the simulator emulates the FPU's
  overflow modes only once floating_point_behaviour turns something on.
  Float32 ops are left untouched unless inv, div0 or oflo is on. One
  approximation: with only nanoo on, a fused float16 chain is checked where
  its results are not finite (then re-run op by op), so an intermediate
  overflow that a later op makes finite again (1 / exp(large)) goes unseen.
"""

import functools

import numpy as np

from keras_ipu.device.config import system_config
from keras_ipu.device.trace import is_backward
from keras_ipu.device.simulator import stochastic_rounding
from keras_ipu.device.simulator.system import DEFAULT_BEHAVIOUR  # noqa: F401 (public)
from keras_ipu.device.simulator.system import FPBehaviour  # noqa: F401 (public)

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
_FLOATS = frozenset((F16, F32, F64))
HALF_MAX = float(np.finfo(np.float16).max)


# -- the configured behaviour -------------------------------------------------


def current_fp_behaviour():
    """The behaviour of the configured IPU system (defaults when none is)."""
    return system_config.configuration().fp_behaviour


# -- the errors -----------------------------------------------------------------


class IPUFloatingPointError(ArithmeticError):
    """A floating-point exception trapped by the (simulated) IPU.

    Attributes: flag ("inv", "div0" or "oflo"), primitive (the op's name),
    source (the Keras layer path, or None), count (results affected),
    backward (whether the op computes gradients: the backward pass).
    """

    flag = None

    def __init__(self, message, *, primitive=None, source=None, count=0):
        super().__init__(message)
        self.primitive = primitive
        self.source = source
        self.count = count
        self.backward = is_backward(source)


class IPUInvalidOperationError(IPUFloatingPointError):
    flag = "inv"


class IPUDivideByZeroError(IPUFloatingPointError, ZeroDivisionError):
    flag = "div0"


class IPUOverflowError(IPUFloatingPointError, OverflowError):
    flag = "oflo"


_ERRORS = {
    "inv": IPUInvalidOperationError,
    "div0": IPUDivideByZeroError,
    "oflo": IPUOverflowError,
}

_WHAT = {
    "inv": (
        "invalid operation",
        "are NaN although no input was NaN (0/0, inf - inf, 0 * inf, sqrt or "
        "log of a negative number{nanoo})",
    ),
    "div0": (
        "divide by zero",
        "are +-inf from a division of a finite value by zero (or a pole such as "
        "log(0))",
    ),
    "oflo": (
        "overflow",
        "overflowed: every input was finite but the result is beyond the largest "
        "{dtype} ({limit:g}){shown}",
    ),
}

_ADVICE = {
    "inv": (
        "check the layer's inputs (NaN or inf in the data, a negative value under "
        "sqrt or log) and the learning rate; in float16, use loss scaling "
        "(keras.mixed_precision.LossScaleOptimizer)."
    ),
    "div0": (
        "check the layer's inputs for a zero divisor (an all-zero vector being "
        "normalised, a zero variance) and add an epsilon; check the learning rate."
    ),
    "oflo": (
        "check the layer's inputs and the learning rate (diverging weights "
        "overflow first); in float16, use loss scaling "
        "(keras.mixed_precision.LossScaleOptimizer) or keep this layer in float32 "
        "(dtype='float32')."
    ),
}


def _raise(flag, op, mask, out_dtype, behaviour):
    count = int(np.count_nonzero(mask))
    first = np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape) if mask.ndim else ()
    title, detail = _WHAT[flag]
    detail = detail.format(
        dtype=out_dtype.name,
        limit=float(np.finfo(out_dtype).max),
        shown=", shown as NaN (nanoo)" if behaviour.nanoo and out_dtype == F16 else "",
        nanoo="; with nanoo, a float16 overflow is NaN too" if behaviour.nanoo else "",
    )
    where = (
        f"layer {str(op.source)!r}"
        if op.source
        else "an op outside any recorded Keras layer"
    )
    if is_backward(op.source):
        where = "the backward pass (the gradients) of " + where
    message = (
        f"IPU floating-point exception: {title} "
        f"(floating_point_behaviour.{flag} is on) in `{op.name}`{op.context} of "
        f"{where}: {count} of {mask.size} {out_dtype.name} results {detail}; first "
        f"at index {tuple(int(i) for i in first)}. What to do: {_ADVICE[flag]} "
        f"Or stop trapping it: set `config.floating_point_behaviour.{flag} = False` "
        "(and set_all = False) before config.configure_ipu_system()."
    )
    raise _ERRORS[flag](message, primitive=op.name, source=op.source, count=count)


# -- the random bits of stochastic rounding -------------------------------------


class DeviceRandomSource:
    """A random stream of /device:IPU:0 (the stochastic rounding unit's, or
    another hardware random stream named by `stream`).

    reset_ipu_seed stores a new (seed, identical_replicas) entry in the
    system's `seeds`; the next draw after that restarts the stream from
    the seed. A new system (configure_ipu_system) starts a new random stream.
    """

    def __init__(self, stream=0x5EED5):
        self.stream = stream
        self._rng = None
        self._system = None
        self._entry = None

    def generator(self):
        system = system_config.current_system()
        entry = system.seeds.get(0)
        if self._rng is None or system is not self._system or entry is not self._entry:
            self._system, self._entry = system, entry
            if entry is None:
                self._rng = np.random.default_rng()
            else:
                # A stream of its own: not the one the same seed gives elsewhere.
                self._rng = np.random.default_rng([int(entry[0]) % 2**64, self.stream])
        return self._rng


RANDOM_SOURCE = DeviceRandomSource()


def stochastic_round(x):
    """Round `x` to float16 stochastically with the device's random bits."""
    return stochastic_rounding.round_to_float16(x, RANDOM_SOURCE.generator())


def _kind(primitive):
    """What the floating-point behaviour does to an op: its primitive's
    fp_class ("elementwise", "accumulating", "checked", "convert", "fused";
    None: nothing, no float arithmetic that rounds or overflows)."""
    return primitive.fp_class


def _is_half_dtype(value):
    return (isinstance(value, np.dtype) and value == F16) or value is np.float16


def _zero(x):
    return x == 0


# Where an inf from finite inputs is a division by zero (a pole), not an overflow.
def _pole_int(x):
    return (x <= 0) & (np.floor(x) == x)


_POLES = {
    "div": lambda x, y: y == 0,
    "floor_div": lambda x, y: y == 0,
    "reciprocal": _zero,
    "rsqrt": _zero,
    "log": _zero,
    "log2": _zero,
    "log10": _zero,
    "log1p": lambda x: x == -1,
    "atanh": lambda x: np.abs(x) == 1,
    "pow": lambda x, y: (x == 0) & (y < 0),
    "lgamma": _pole_int,
    "digamma": _pole_int,
}


class _Op:
    __slots__ = ("name", "kind", "source", "context", "behaviour")

    def __init__(self, name, kind, source, behaviour, context=""):
        self.name = name
        self.kind = kind
        self.source = source
        self.behaviour = behaviour
        self.context = context


# -- after an op: classify its non-finite results, apply nanoo, trap -------------


def _float_inputs(xs):
    return [x for x in xs if x.dtype.kind in "fc"]


def _events(op, xs, out):
    """Masks over `out`: (invalid, divide by zero, overflow)."""
    shape = out.shape
    nan_out = np.isnan(out)
    inf_out = np.isinf(out)
    floats = _float_inputs(xs)
    if op.kind in ("elementwise", "convert"):
        nan_in = np.zeros(shape, bool)
        inf_in = np.zeros(shape, bool)
        for x in floats:
            nan_in |= np.broadcast_to(np.isnan(x), shape)
            inf_in |= np.broadcast_to(np.isinf(x), shape)
        invalid = nan_out & ~nan_in
        fresh_inf = inf_out & ~nan_in & ~inf_in
        pole_rule = _POLES.get(op.name)
        if pole_rule is not None and fresh_inf.any():
            wide = [np.broadcast_to(x, shape) for x in xs]
            with np.errstate(all="ignore"):
                div0 = fresh_inf & pole_rule(*wide)
        else:
            div0 = np.zeros(shape, bool)
        return invalid, div0, fresh_inf & ~div0
    # Accumulations: an input value cannot be traced to one output element.
    any_nan_in = any(np.isnan(x).any() for x in floats)
    all_finite_in = not any_nan_in and all(np.isfinite(x).all() for x in floats)
    none = np.zeros(shape, bool)
    if not all_finite_in:
        return (nan_out if not any_nan_in else none), none, none
    # From finite inputs, an inf (or a NaN from inf - inf inside the sum)
    # means a partial result overflowed first.
    return none, none, inf_out | nan_out


def _after(op, xs, out):
    """`out` (a float result, not all finite) as the device leaves it; raises
    the first enabled exception among div0, oflo, inv."""
    behaviour = op.behaviour
    invalid, div0, overflow = _events(op, xs, out)
    half = out.dtype == F16
    clip = half & overflow & np.isinf(out)
    if clip.any():
        out = np.array(out, copy=True)
        if behaviour.nanoo:
            out[clip] = np.nan
            invalid = invalid | clip  # Poplar: nanoo sets the invalid flag
        else:
            out[clip] = np.copysign(np.float16(HALF_MAX), out[clip])
    if behaviour.div0 and div0.any():
        _raise("div0", op, div0, out.dtype, behaviour)
    if behaviour.oflo and overflow.any():
        _raise("oflo", op, overflow, out.dtype, behaviour)
    if behaviour.inv and invalid.any():
        _raise("inv", op, invalid, out.dtype, behaviour)
    return out


def _checked(compute, op, multi, float_outputs):
    if multi:
        def run_multi(*xs):
            outs = list(compute(*xs))
            for i in float_outputs:
                o = outs[i]
                if not np.isfinite(o).all():
                    outs[i] = _after(op, xs, np.asarray(o))
            return tuple(outs)

        return run_multi

    def run(*xs):
        out = compute(*xs)
        if np.isfinite(out).all():
            return out
        return _after(op, xs, np.asarray(out))

    return run


# -- stochastic rounding of one op ----------------------------------------------


def _rounded(primitive, params, kind):
    """The op computed at float32 and rounded stochastically to float16."""
    if kind == "convert":

        def convert(x):
            return stochastic_round(x)

        return convert
    kernel = primitive.kernel
    wide_params = {k: (F32 if _is_half_dtype(v) else v) for k, v in params.items()}

    def rounded(*xs):
        wide = [x.astype(F32) if x.dtype == F16 else x for x in xs]
        with np.errstate(all="ignore"):
            out = np.asarray(kernel(*wide, **wide_params))
        return stochastic_round(out)

    return rounded


# -- fused elementwise chains ---------------------------------------------------


def _wrap_fused(kernel, params, source, behaviour):
    chain, results = params["chain"], params["results"]
    steps = []
    half_arithmetic = False
    for prim, params_items, refs, aval in chain:
        step_params = dict(params_items)
        fn = prim.kernel
        if step_params:
            fn = functools.partial(fn, **step_params)
        step_avals = tuple(r[2] for r in refs)
        wrapped = wrap_kernel(
            fn, prim, step_params, step_avals, (aval,), source, behaviour,
            context=" (in a fused elementwise chain)",
        )
        half_arithmetic |= wrapped is not fn and aval.dtype == F16
        steps.append((wrapped, tuple((kind == "in", k) for kind, k, _ in refs)))
    if not (behaviour.traps or half_arithmetic):
        return kernel

    def interpret(*xs):
        temps = []
        for fn, refs in steps:
            temps.append(np.asarray(fn(*[xs[k] if is_in else temps[k] for is_in, k in refs])))
        return tuple(temps[j] for j in results)

    # The fused kernel may write into its donated operands: it cannot be
    # re-run on them, so such chains always go op by op.
    if behaviour.traps or behaviour.stochastic_rounding or params.get("donate"):
        return interpret

    # Only the clipping of float16 overflow: the fast fused kernel, and the
    # op-by-op interpreter when one of its results is not finite.
    half_results = tuple(i for i, j in enumerate(results) if chain[j][3].dtype == F16)

    def clipped(*xs):
        outs = kernel(*xs)
        for i in half_results:
            if not np.isfinite(outs[i]).all():
                return interpret(*xs)
        return outs

    return clipped


# -- the entry point of the compiler --------------------------------------------


def wrap_kernel(
    kernel, primitive, params, in_avals, out_avals, source, behaviour, context=""
):
    """`kernel` with the floating-point behaviour of the device.

    Returns `kernel` itself when the behaviour changes nothing for this op
    (every op of a float32 program with all flags off).
    """
    kind = _kind(primitive)
    if kind is None:
        return kernel
    if kind == "fused":
        return _wrap_fused(kernel, params, source, behaviour)
    float_outputs = tuple(i for i, a in enumerate(out_avals) if a.dtype in _FLOATS)
    if not float_outputs:
        return kernel
    half = any(out_avals[i].dtype == F16 for i in float_outputs)
    if kind == "convert":
        src, dst = in_avals[0].dtype, out_avals[0].dtype
        narrowing = src.kind in "iuc" or (src.kind == "f" and src.itemsize > dst.itemsize)
        if not narrowing:
            return kernel  # widening and same-size conversions are exact
    if not (half or behaviour.traps):
        return kernel
    compute = kernel
    multi = primitive.multiple_results
    if half and behaviour.stochastic_rounding and not multi and kind != "checked":
        compute = _rounded(primitive, params, kind)
    op = _Op(primitive.name, kind, source, behaviour, context)
    return _checked(compute, op, multi, float_outputs)
