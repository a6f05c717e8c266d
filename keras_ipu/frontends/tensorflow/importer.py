"""HLO -> keras_ipu IR: the importer.

`import_module(module_proto)` traces the module's entry computation into a
keras_ipu `Graph` (device/ir.py) by applying one *rule* per HLO opcode
(opcodes/): each rule binds device primitives on the tracer's values, so the
imported program is an ordinary traced program that the compiler and the
simulator take as they are (memory, cycles, out-of-memory errors, profiles,
the executable cache, floating-point behaviour).

Values while importing:
- a `Tracer` (a value computed by the program) or a NumPy array (a constant:
  an HLO literal, or an op of constants folded at import time, as XLA's
  constant folding would);
- `Broadcast(value, shape)`: an HLO `broadcast` not materialised yet. XLA
  spells out every broadcast (a bias add is broadcast + add); our
  elementwise primitives broadcast NumPy-style, so an elementwise op takes
  the small value and the full array is only built where an op needs it;
- a Python tuple for a tuple-shaped value, `TOKEN` for an HLO token.

Every node recorded carries the TensorFlow op that made it (HLO metadata
op_name, such as "sequential/dense/MatMul") as its source, so memory
reports, profiles and floating-point traps name TensorFlow ops and Keras
layers.

Side effects (infeed/outfeed streams, stateful random numbers) are ordered
by an *effect token* the importer threads through the program, loops and
branches included (as JAX orders its effects): each effectful primitive
takes the current token and returns the next one. The token is a graph
input and output, so no pass can drop, merge, fold or reorder an effect.
"""

import contextlib
import dataclasses

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import aval_of
from keras_ipu.device.rule_table import rule_decorator
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import current_builder
from keras_ipu.device.trace import source_scope
from keras_ipu.device.trace import stage_scope
from keras_ipu.device.trace import trace_flat
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow.attributes import OUTSIDE_COMPILATION


class HloImportError(NotImplementedError):
    """An HLO instruction the front end cannot express on the simulated IPU."""


TOKEN = type("HloToken", (), {"__repr__": lambda self: "TOKEN"})()
TOKEN_AVAL = ShapedArray((), np.uint32)

# An op of constants is computed at import time when its results are at most
# this big (as the compiler's constant folding does, with the same limit):
# a bigger constant would cost device memory; the computation that makes it
# does not.
FOLD_LIMIT_BYTES = 1 << 20


@dataclasses.dataclass
class Broadcast:
    """`value` (same rank as `shape`, size-1 axes where broadcast) standing
    for an array of `shape` that has not been built."""

    value: object
    shape: tuple


def is_array_value(x):
    return isinstance(x, (Tracer, np.ndarray, Broadcast))


def shape_of(x):
    if isinstance(x, Broadcast):
        return tuple(x.shape)
    return tuple(x.shape)


def dtype_of(x):
    if isinstance(x, Broadcast):
        return x.value.dtype
    return np.dtype(x.dtype)


# -- the rule table -------------------------------------------------------------

RULES = {}


# @rule(*opcodes): the decorated `fn(imp, instr, operands) -> value` imports
# those HLO opcodes.
rule = rule_decorator(RULES, "HLO opcode {name!r} has two import rules.")


def _load_rules():
    from keras_ipu.frontends.tensorflow import opcodes  # noqa: F401 (registers)


def describe(instr):
    """'opcode (TF op "name" of type T)' for messages."""
    meta = instr.metadata
    what = f"HLO `{instr.opcode}` instruction {instr.name!r}"
    if meta.op_name or meta.op_type:
        what += f" (TensorFlow op {meta.op_name or '?'!r}"
        what += f" of type {meta.op_type}" if meta.op_type else ""
        what += ")"
    return what


def _source(instr):
    return instr.metadata.op_name or None


def shard_of(instr):
    """The IPU shard an instruction is pinned to: XLA's maximal sharding on
    one device, which `scopes.ipu_shard` puts on TensorFlow ops and tf2xla
    copies onto their HLO; None when it has none (the placement pass puts it
    where the values it reads are)."""
    if not instr.HasField("sharding"):
        return None
    _, xla_data_pb2 = hlo_proto.protos()
    sharding = instr.sharding
    if (sharding.type != xla_data_pb2.OpSharding.MAXIMAL
            or len(sharding.tile_assignment_devices) != 1):
        return None
    return int(sharding.tile_assignment_devices[0])


# -- effects ------------------------------------------------------------------

# Opcodes with side effects: their order is kept by the effect token.
EFFECT_OPCODES = frozenset({"send", "recv", "infeed", "outfeed", "rng",
                            "rng-get-and-update-state"})


class Importer:
    """Imports one HloModuleProto (see the module doc).

    `replicas`: how many replicas run the program (the group of its
    collectives when their replica groups are left empty).
    """

    def __init__(self, module, replicas=1):
        _load_rules()
        self.module = module
        # Replicas the program runs on (collectives need the group size).
        self.replicas = replicas
        self.computations = {c.id: c for c in module.computations}
        self.by_name = {c.name: c for c in module.computations}
        self.token = None  # the current effect token (a Tracer) while importing
        self.vectorized = False  # applying a scalar computation to arrays
        self._effects = {}
        self._materialized = {}
        # custom-call Qr results -> (R, Q) (opcodes/linalg.py)
        self.qr_factors = {}
        self.uses_token = any(self.has_effects(c) for c in module.computations)

    # -- computations -----------------------------------------------------

    def computation(self, comp_id):
        return self.computations[comp_id]

    def called(self, instr, index=0):
        return self.computations[instr.called_computation_ids[index]]

    def has_effects(self, comp):
        """Whether `comp` (or a computation it calls) has side effects."""
        found = self._effects.get(comp.id)
        if found is None:
            self._effects[comp.id] = False  # no cycles in HLO; guards anyway
            found = any(
                i.opcode in EFFECT_OPCODES
                or OUTSIDE_COMPILATION in i.frontend_attributes.map
                or (i.opcode == "custom-call" and i.custom_call_has_side_effect)
                or any(self.has_effects(self.computations[c])
                       for c in i.called_computation_ids)
                for i in comp.instructions
            )
            self._effects[comp.id] = found
        return found

    def run(self, comp, args):
        """The value of computation `comp` applied to `args` (one value per
        parameter), recorded into the running trace."""
        env = {}
        params = {}
        for instr in comp.instructions:
            if instr.opcode == "parameter":
                params[instr.parameter_number] = instr
        if len(params) != len(args):
            raise HloImportError(
                f"HLO computation {comp.name!r} takes {len(params)} parameters; "
                f"{len(args)} were given."
            )
        for item in _schedule(comp):
            if isinstance(item, HostGroup):
                self._run_host_region(comp, item, env)
                continue
            if item.opcode == "parameter":
                env[item.id] = args[item.parameter_number]
                continue
            operands = [env[i] for i in item.operand_ids]
            env[item.id] = self.apply(item, operands)
        return env[comp.root_id]

    def _run_host_region(self, comp, group, env):
        """The instructions of an outside-compilation scope, run by the host
        as one host_region: the values they read cross to the host, the
        values the rest of the program reads come back."""
        from keras_ipu.device.primitives.host_transfer import host_region_p

        members = {i.id for i in group.instructions}
        inputs = []
        for instr in group.instructions:
            for o in instr.operand_ids:
                if o not in members and o not in inputs:
                    inputs.append(o)
        used_outside = {o for i in comp.instructions if i.id not in members
                        for o in i.operand_ids}
        outputs = [i.id for i in group.instructions
                   if i.id in used_outside or i.id == comp.root_id]
        for o in inputs:
            if not is_array_value(env[o]):
                raise HloImportError(
                    f"outside compilation scope {group.name!r} reads a tuple or "
                    "token; only arrays can be sent to the host."
                )
        in_values = [self.array(env[o]) for o in inputs]
        in_avals = [TOKEN_AVAL] + [aval_of(self.raw(v)) for v in in_values]

        def fn(token, *tracers):
            local = dict(zip(inputs, tracers))
            for instr in group.instructions:
                local[instr.id] = self.apply(instr, [local[o] for o in instr.operand_ids])
            outs = [local[o] for o in outputs]
            if not all(is_array_value(v) for v in outs):
                raise HloImportError(
                    f"outside compilation scope {group.name!r} returns a tuple "
                    "or token to the device; only arrays can come back."
                )
            return [token] + [self.array(v) for v in outs]

        graph, captures = trace_flat(fn, in_avals)
        if captures:
            raise HloImportError(f"outside compilation scope {group.name!r} captured device values.")
        builder = current_builder()
        token, *results = host_region_p.bind_traced(
            builder, self.token, *[self.raw(v) for v in in_values],
            graph=graph, name=group.name)
        self.token = token
        env.update(zip(outputs, results))

    def apply(self, instr, operands):
        fn = RULES.get(instr.opcode)
        if fn is None:
            raise HloImportError(
                f"The TensorFlow front end has no rule for {describe(instr)}: "
                f"XLA opcode {instr.opcode!r} cannot run on the simulated IPU yet. "
                "Rewrite that part of the TensorFlow function with other ops, "
                "or run it outside the compiled function."
            )
        shard = shard_of(instr)
        pinned = stage_scope(shard) if shard is not None else contextlib.nullcontext()
        with source_scope(_source(instr)), pinned:
            try:
                return fn(self, instr, operands)
            except HloImportError as e:
                if describe(instr) in str(e):
                    raise
                raise HloImportError(f"{describe(instr)}: {e}") from e

    # -- values -------------------------------------------------------------

    def raw(self, x):
        """x as a primitive operand: a Tracer or a NumPy array; a pending
        Broadcast stays small (NumPy-style broadcasting does the rest)."""
        if isinstance(x, Broadcast):
            return x.value
        return x

    def array(self, x):
        """x as a full array (a pending Broadcast is built now, once)."""
        if isinstance(x, Broadcast):
            key = id(x)
            hit = self._materialized.get(key)
            if hit is not None and hit[0] is x:
                return hit[1]
            from keras_ipu.device.primitives.structure import broadcast_to_p

            full = self.bind(broadcast_to_p, x.value, shape=tuple(x.shape))
            self._materialized[key] = (x, full)
            return full
        if x is TOKEN or isinstance(x, tuple):
            raise HloImportError(f"expected an array operand, got {x!r}")
        return x

    def bind(self, prim, *args, **params):
        """Apply a primitive: recorded in the running trace when an operand
        is traced (or the result is too big to be a constant), computed now
        when every operand is a constant."""
        args = [self.raw(a) for a in args]
        if any(type(a) is Tracer for a in args):
            return prim.bind(*args, **params)
        out = prim.abstract_eval(*[aval_of(a) for a in args], **params)
        outs = out if prim.multiple_results else (out,)
        nbytes = sum((o.nbytes or 0) for o in outs)
        if (nbytes > FOLD_LIMIT_BYTES or prim.name.startswith(("rng", "random"))
                or _holds_graph(params)):
            builder = current_builder()
            return prim.bind_traced(builder, *args, **params)
        with np.errstate(all="ignore"):
            result = prim.bind(*args, **params)
        if prim.multiple_results:
            return tuple(np.asarray(r) for r in result)
        return np.asarray(result)

    def elementwise(self, prim, instr, *args, **params):
        """An elementwise primitive over HLO operands: pending broadcasts
        stay pending when the result is still smaller than the HLO shape."""
        out = self.bind(prim, *args, **params)
        if self.vectorized:
            return out
        want = tuple(instr.shape.dimensions)
        if tuple(out.shape) != want:
            return Broadcast(out, want)
        return out

    def constant(self, value, dtype):
        return np.asarray(value, dtype=dtype)

    # -- tracing sub-computations --------------------------------------------

    def trace_computation(self, comp, params, with_token):
        """(graph, captures, out_structure) of `comp` traced as a sub-graph
        whose inputs are the array leaves of `params` (one value per
        parameter; plus the effect token when `with_token`)."""
        leaves, structure = flatten_value(tuple(params))
        in_avals = [aval_of(self.raw(self.array(v))) for v in leaves]
        return self.trace_sub_graph(
            in_avals, with_token,
            lambda tracers: self.run(comp, list(unflatten_value(structure, tracers))))

    def trace_sub_graph(self, in_avals, with_token, body):
        """(graph, captures, out_structure) of `body(tracers)` (it runs
        computations on them and returns a value) traced over inputs of
        `in_avals`; with `with_token` the effect token is the graph's last
        input and output, and the outer token is restored after."""
        box = {}
        saved_token = self.token

        def fn(*tracers):
            tracers = list(tracers)
            if with_token:
                self.token = tracers.pop()
            out_leaves, box["structure"] = flatten_value(body(tracers))
            outs = [self.array(v) for v in out_leaves]
            if with_token:
                outs.append(self.token)
            return outs

        try:
            graph, captures = trace_flat(fn, in_avals + ([TOKEN_AVAL] if with_token else []))
        finally:
            self.token = saved_token
        return graph, captures, box["structure"]

    def scalar_computation(self, comp, *args):
        """Apply a computation of scalars (a reducer, a comparator) to arrays
        elementwise: its instructions are elementwise, so applying it to
        arrays applies it to each element."""
        bad = sorted({i.opcode for i in comp.instructions} - SCALAR_SAFE)
        if bad:
            raise HloImportError(
                f"the computation {comp.name!r} applied per element uses "
                f"{', '.join(bad)}, which only elementwise computations may "
                "(the front end applies reducers and comparators to whole "
                "arrays at once)."
            )
        saved = self.vectorized
        self.vectorized = True
        try:
            return self.run(comp, list(args))
        finally:
            self.vectorized = saved


# Opcodes a reducer/comparator may use when applied to whole arrays.
SCALAR_SAFE = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "compare", "select",
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "and", "or",
    "xor", "not", "negate", "abs", "convert", "bitcast-convert", "reshape",
    "broadcast", "copy", "sign", "exponential", "log", "log-plus-one",
    "exponential-minus-one", "is-finite", "shift-left", "shift-right-logical",
    "shift-right-arithmetic", "remainder", "power", "clamp",
})


def _holds_graph(params):
    from keras_ipu.device.ir import Graph

    return any(isinstance(v, Graph) or (isinstance(v, tuple) and v
                                        and isinstance(v[0], Graph))
               for v in params.values())


@dataclasses.dataclass
class HostGroup:
    """The instructions of one outside-compilation scope of a computation."""

    name: str
    instructions: list


def _schedule(comp):
    """The instructions of `comp` in an order where every operand comes
    first, each outside-compilation scope contracted into one HostGroup
    (placed where all its inputs are ready)."""
    order = _post_order(comp)
    names = {i.id: i.frontend_attributes.map[OUTSIDE_COMPILATION] for i in order
             if OUTSIDE_COMPILATION in i.frontend_attributes.map}
    if not names:
        return order
    groups = {}
    for instr in order:
        if instr.id in names:
            groups.setdefault(names[instr.id], []).append(instr)
    by_id = {i.id: i for i in order}

    def node_of(i):
        return ("g", names[i]) if i in names else ("i", i)

    def deps(node):
        kind, key = node
        members = groups[key] if kind == "g" else [by_id[key]]
        found = []
        for m in members:
            for o in m.operand_ids:
                d = node_of(o)
                if d != node and d not in found:
                    found.append(d)
        return found

    done, active, out = set(), set(), []

    def visit(node):
        stack = [(node, iter(deps(node)))]
        active.add(node)
        while stack:
            current, pending = stack[-1]
            nxt = next(pending, None)
            if nxt is None:
                stack.pop()
                active.discard(current)
                done.add(current)
                kind, key = current
                out.append(HostGroup(key, groups[key]) if kind == "g" else by_id[key])
                continue
            if nxt in done:
                continue
            if nxt in active:
                raise HloImportError(
                    f"the outside compilation scope {current[1] if current[0] == 'g' else nxt[1]!r} "
                    "both feeds and reads device code in between; put the "
                    "host code in one scope whose inputs are computed before it."
                )
            active.add(nxt)
            stack.append((nxt, iter(deps(nxt))))

    for instr in order:
        node = node_of(instr.id)
        if node not in done:
            visit(node)
    return out


def _post_order(comp):
    """The instructions of `comp` with every operand before its users (the
    order XLA serialises them in; re-sorted when it is not)."""
    seen = set()
    ordered = True
    for instr in comp.instructions:
        if any(i not in seen for i in instr.operand_ids):
            ordered = False
            break
        seen.add(instr.id)
    if ordered:
        return list(comp.instructions)
    by_id = {i.id: i for i in comp.instructions}
    done, out = set(), []

    def visit(i):
        stack = [(i, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded:
                done.add(node)
                out.append(by_id[node])
                continue
            stack.append((node, True))
            for o in reversed(by_id[node].operand_ids):
                if o not in done:
                    stack.append((o, False))

    for instr in comp.instructions:
        visit(instr.id)
    return out


# -- tuple values -----------------------------------------------------------------


def flatten_value(value):
    """(array leaves, structure) of a possibly nested tuple value; tokens
    are structure, not leaves."""
    leaves = []

    def walk(v):
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        if v is TOKEN:
            return TOKEN
        leaves.append(v)
        return None

    return leaves, walk(value)


def unflatten_value(structure, leaves):
    it = iter(leaves)

    def build(s):
        if isinstance(s, tuple):
            return tuple(build(x) for x in s)
        if s is TOKEN:
            return TOKEN
        return next(it)

    return build(structure)


# -- the entry computation ----------------------------------------------------------


@dataclasses.dataclass
class ImportedModule:
    """The imported program: `graph` takes one input per HLO entry
    parameter (in parameter order), then the effect token when
    `uses_token`; its outputs are the leaves of the entry's result (in
    order), then the token."""

    graph: object
    name: str
    n_params: int
    n_outputs: int
    uses_token: bool
    output_structure: object


def import_module(module, replicas=1):
    """Trace an HloModuleProto into an ImportedModule (see the module doc)."""
    imp = Importer(module, replicas)
    entry = imp.computations[module.entry_computation_id]
    params = sorted(
        (i for i in entry.instructions if i.opcode == "parameter"),
        key=lambda i: i.parameter_number,
    )
    in_avals = []
    for p in params:
        if hlo_proto.is_tuple(p.shape) or hlo_proto.is_token(p.shape):
            raise HloImportError(
                f"the entry parameter {p.name!r} is a tuple or token; the "
                "front end takes array parameters only (TensorFlow passes "
                "arrays)."
            )
        dims, dtype = hlo_proto.array_shape(p.shape)
        in_avals.append(ShapedArray(dims, dtype))
    if imp.uses_token:
        in_avals.append(TOKEN_AVAL)
    box = {}

    def fn(*tracers):
        tracers = list(tracers)
        if imp.uses_token:
            imp.token = tracers.pop()
        out = imp.run(entry, tracers)
        leaves, structure = flatten_value(out)
        box["structure"] = structure
        box["n"] = len(leaves)
        outs = [imp.array(v) for v in leaves]
        if imp.uses_token:
            outs.append(imp.token)
        return outs

    graph, captures = trace_flat(fn, in_avals)
    if captures:
        raise AssertionError("the entry computation captured outer values")
    return ImportedModule(
        graph=graph, name=module.name, n_params=len(params),
        n_outputs=box["n"], uses_token=imp.uses_token,
        output_structure=box["structure"],
    )
