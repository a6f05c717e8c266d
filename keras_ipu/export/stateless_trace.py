"""Trace a Keras function into a keras_ipu Graph for export.

    traced = trace(fn, variables, arg_specs)

`fn(*args)` is called once on abstract values: each leaf of `arg_specs`
(a structure of ArgSpec: shape and dtype, None for a size left open) becomes a
graph input, then each Keras variable of `variables`, read through a
StatelessScope so that the graph takes the variables' values as inputs
and returns the new value of each variable `fn` assigns (a counter, a
seed generator's state). Sizes left open stay unknown in the graph (the
shape rules carry them); code that needs such a size as a number cannot
be traced that way, and the error says to fix the size.
"""

import dataclasses

import numpy as np

from keras.src import tree
from keras.src.backend.common.stateless_scope import StatelessScope

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import tracing


class ArgSpec:
    """The shape (None: a size left open) and dtype of one argument leaf."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)


@dataclasses.dataclass
class TracedFunction:
    graph: object  # inputs: the flat arguments, then the variables
    n_args: int
    out_structure: object  # fn's result, its leaves replaced by indices
    n_outputs: int  # graph outputs that are fn's results (then updates)
    updated: tuple  # positions in `variables` of the updated variables


class ExportTraceError(ValueError):
    pass


def trace(fn, variables, arg_specs, name="function"):
    """The TracedFunction of `fn` (see the module doc)."""
    builder = GraphBuilder(parent=None)
    flat_specs = tree.flatten(arg_specs)
    with tracing(builder):
        flat_args = [builder.new_input(ShapedArray(spec.shape, spec.dtype))
                     for spec in flat_specs]
        var_tracers = [builder.new_input(ShapedArray(v.shape, np.dtype(v.dtype)))
                       for v in variables]
        args = tree.pack_sequence_as(arg_specs, flat_args)
        mapping = list(zip(variables, var_tracers))
        try:
            with StatelessScope(state_mapping=mapping) as scope:
                result = fn(*args)
        except (TypeError, ValueError) as error:
            if any(None in spec.shape for spec in flat_specs):
                raise ExportTraceError(
                    f"Exporting {name}: it could not be traced with the sizes the "
                    f"input signature leaves open ({error}). Give those sizes in "
                    "the input signature (for example a fixed batch size: "
                    "keras.InputSpec(shape=(8, ...))) and export again."
                ) from error
            raise
        flat_out = tree.flatten(result)
        updated, new_values = [], []
        for k, (variable, tracer) in enumerate(mapping):
            value = scope.get_current_value(variable)
            if value is not None and value is not tracer:
                updated.append(k)
                new_values.append(value)
        builder.graph.outputs = [builder.operand(_device_value(x)) for x in flat_out + new_values]
    out_structure = tree.pack_sequence_as(result, list(range(len(flat_out))))
    return TracedFunction(
        graph=builder.graph, n_args=len(flat_args), out_structure=out_structure,
        n_outputs=len(flat_out), updated=tuple(updated),
    )


def _device_value(x):
    """A result as the builder takes it: a traced value, or a constant (a
    concrete backend Tensor, a Python number) as an array."""
    from keras_ipu.device.array import Tensor
    from keras_ipu.device.trace import Tracer

    if isinstance(x, Tracer):
        return x
    if isinstance(x, Tensor):
        return x._value  # noqa: SLF001 - the array a concrete Tensor wraps
    return np.asarray(x)
