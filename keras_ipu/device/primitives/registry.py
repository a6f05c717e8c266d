"""The primitive registry: one place per primitive.

A Primitive declares together (as `jax.lax` does):
  - shape_rule(*avals, **params) -> ShapedArray or tuple of them. It must
    accept unknown (None) dimensions and return None where a dimension is
    unknown. Operands are ShapedArrays; params are static Python values.
  - kernel(*ndarrays, **params) -> ndarray or tuple: the NumPy computation.
  - grad: the gradient rule, `rule(cotangents, inputs, outputs, **params)
    -> list`: one cotangent per output in (None = zero), the primal
    operands/results (Tensors or Tracers), one cotangent per input out
    (None = zero; cotangents of broadcast operands summed back to the
    operand's shape; integer/bool operands None). It only binds primitives,
    so backward passes trace. Or `nondiff`: why there is no gradient
    (autodiff passes zero through it). See keras_ipu/device/autodiff/.
    Registered in a second step (primitives/grads/), once every primitive
    is declared: a rule binds primitives of other families.
  - cost: the cost rule, `rule(in_avals, out_avals, **params) -> Cost`
    (cost_util.py), whose record the cost model turns into cycles.
  - its facts, read by the compiler, the numerics and the memory model
    (never re-derived from names): elementwise, ufunc and ufunc_kinds,
    ieee_exact, fp_class, runtime_value, aliases_operands, the params holding
    sub-graphs, a loop's carries.

`bind` is the single entry point used by the backend: with no traced operand
the kernel runs now (eager, on the host) and returns Tensors; with a traced
operand a Node is recorded and Tracers are returned.
"""

import numpy as np

from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import aval_of
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import current_source
from keras_ipu.device.trace import in_layer
from keras_ipu.device.trace import innermost_builder

REGISTRY = {}


class Primitive:
    __slots__ = (
        "name",
        "shape_rule",
        "kernel",
        "multiple_results",
        "grad",
        "residual_grad",
        "nondiff",
        "cost",
        "cost_reads_operands",
        "dynamic_shape",
        "runtime_value",
        "elementwise",
        "aliases_operands",
        "ufunc",
        "ufunc_kinds",
        "ieee_exact",
        "float_kernel",
        "fp_class",
        "subgraph_params",
        "result_graphs",
        "subgraph_operands",
        "carry_count",
        "carries_in_place",
        "doc",
    )

    def __init__(
        self,
        name,
        shape_rule,
        kernel,
        *,
        multiple_results=False,
        nondiff=None,
        dynamic_shape=False,
        runtime_value=False,
        elementwise=False,
        aliases_operands=False,
        ufunc=None,
        ufunc_kinds="",
        ieee_exact=False,
        float_kernel=None,
        fp_class=None,
        subgraph_params=(),
        result_graphs=(),
        subgraph_operands=None,
        carry_count=None,
        carries_in_place=False,
        doc="",
    ):
        if name in REGISTRY:
            raise ValueError(f"Primitive {name!r} is registered twice.")
        self.name = name
        self.shape_rule = shape_rule
        self.kernel = kernel
        self.multiple_results = multiple_results
        # Gradient rule: rule(cotangents, inputs, outputs, **params).
        self.grad = None
        # (forward, backward) when the autodiff runs the forward pass itself
        # to store what the backward pass needs (cond, scan): forward(inputs,
        # params) -> (outputs, residuals or None); backward(cotangents,
        # inputs, outputs, residuals, **params) -> input cotangents.
        self.residual_grad = None
        # Why the primitive has no gradient (integer/boolean outputs, ...).
        self.nondiff = nondiff
        # Cost rule: set beside the declaration, from cost_util's rules.
        self.cost = None
        # The cost rule also takes the node's operands (`operands=`: Vars and
        # Literals): a while loop counts its trips from the constants it
        # starts from (simulator/loop_trips.py).
        self.cost_reads_operands = False
        # Output shape depends on values (unique, nonzero): eager only, and
        # refused by the compiler (IPU programs have static shapes).
        self.dynamic_shape = dynamic_shape
        # Its value is known only when the program runs, never at compile
        # time (random bits: seeds stay runtime values; a collective: the
        # other replicas' operands): constant folding leaves it.
        self.runtime_value = runtime_value
        # One output element from the same element of each (broadcast)
        # operand, one output: fusible into a chain (compiler/fusion.py),
        # computable in place into an operand (memory model).
        self.elementwise = elementwise
        # Result k is operand k, unchanged: an identity that marks values
        # for the compiler (optimization_barrier, recomputation_checkpoint);
        # the memory model gives the result its operand's memory.
        self.aliases_operands = aliases_operands
        # The NumPy ufunc computing it exactly when every operand has the
        # output's dtype, of a kind in `ufunc_kinds` ("*": any operands, the
        # result is bool): lowering calls it directly, with `out=` in fused
        # chains.
        self.ufunc = ufunc
        self.ufunc_kinds = ufunc_kinds
        # Its float32 result is correctly rounded (IEEE 754), so the C
        # kernel of fused chains (native_fusion.py) gives NumPy's bits.
        self.ieee_exact = ieee_exact
        # Its NumPy function without the kernel's per-call dtype checks, for
        # operands of the output's float dtype (which it keeps): lowering
        # calls it directly (not a ufunc: no `out=`).
        self.float_kernel = float_kernel
        # How the IPU's floating-point unit treats it (simulator/numerics.py):
        # "elementwise" (rounded: stochastic rounding, traps), "accumulating"
        # (accumulated in float32, rounded once), "checked" (traps only),
        # "convert", "fused" (a fused chain: op by op); None: no float
        # arithmetic that rounds or overflows (data movement, exact ops).
        self.fp_class = fp_class
        # The params holding the Graphs it runs (a Graph, or a tuple of them:
        # cond's branches), in the order the cost and memory models see them.
        self.subgraph_params = tuple(subgraph_params)
        # The params whose Graphs' outputs are its outputs (a cond: each
        # branch's; a loop: its body's).
        self.result_graphs = tuple(result_graphs)
        # subgraph_operands(params) -> for each sub-graph (ir.subgraphs
        # order), the positions of the operands its inputs receive (None for
        # a sub-graph its operands do not feed: custom_vjp's bwd).
        self.subgraph_operands = subgraph_operands
        # A loop: carry_count(params) -> how many of its operands are the
        # carried state, which its first outputs update (carry k in place of
        # operand k). None for anything else.
        self.carry_count = carry_count
        # A loop whose lowering updates its carried state in place: the
        # Executable tells it which initial carries it owns (`owned_carry`;
        # donation.py), and it copies the others once before it writes them.
        self.carries_in_place = carries_in_place
        self.doc = doc
        REGISTRY[name] = self

    def __repr__(self):
        return f"Primitive({self.name})"

    def __reduce__(self):
        # Pickled by name: executables cached on disk refer to the registry.
        return (get, (self.name,))

    def bind(self, *args, **params):
        for a in args:
            if type(a) is Tracer:
                return self._bind_traced(innermost_builder(args), args, params)
        values = [a._value if type(a) is Tensor else a for a in args]
        out = self.kernel(*values, **params)
        if self.multiple_results:
            return tuple(Tensor(np.asarray(o)) for o in out)
        return Tensor(np.asarray(out))

    def abstract_eval(self, *avals, **params):
        out = self.shape_rule(*avals, **params)
        if self.multiple_results:
            return tuple(out)
        return out

    def bind_traced(self, builder, *args, **params):
        """Record the primitive in `builder` even if every operand is
        concrete: for ops whose static params hold unknown (None) dims, such
        as random bits of shape (None, 3) inside compute_output_spec."""
        return self._bind_traced(builder, args, params)

    def _bind_traced(self, builder, args, params):
        if self.dynamic_shape:
            raise NotImplementedError(
                f"`{self.name}`{in_layer(current_source())} returns an array whose "
                "shape depends on the values of its input; IPU programs have "
                "static shapes, so it "
                "cannot be traced or compiled. Call it eagerly (outside a "
                "compiled function), or use a fixed-size alternative (for "
                "example the `size=` argument where the op has one)."
            )
        avals = [aval_of(a) for a in args]
        try:
            out_avals = self.abstract_eval(*avals, **params)
        except (TypeError, ValueError) as e:
            # The shape rule names the op and the shapes; the trace knows the
            # Keras layer it happened in.
            where = in_layer(current_source())
            if where and e.args and isinstance(e.args[0], str) and where not in e.args[0]:
                e.args = (e.args[0] + where,) + e.args[1:]
            raise
        if self.multiple_results:
            return tuple(builder.add(self, args, params, list(out_avals)))
        return builder.add(self, args, params, [out_avals])[0]


def get(name):
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"No primitive named {name!r}. Known: {sorted(REGISTRY)}"
        ) from None
