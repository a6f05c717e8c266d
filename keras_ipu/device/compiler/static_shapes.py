"""Static-shape check: IPU programs have static shapes.

A value with an unknown (None) dimension, or a primitive whose output shape
depends on values (unique, nonzero, ...), cannot be compiled; the error
names the op so the user knows which call to change. Sub-graphs (cond
branches, loop bodies) are checked too.
"""

from keras_ipu.device.ir import subgraphs
from keras_ipu.device.trace import in_layer


class StaticShapeError(ValueError):
    pass


def check_static_shapes(graph, context="the compiled program"):
    """Returns `graph` unchanged, or raises StaticShapeError."""
    for i, var in enumerate(graph.inputs):
        if not var.aval.is_static():
            raise StaticShapeError(
                f"Input {i} of {context} has the unknown shape "
                f"{var.aval.short()} (? is a None dimension). IPU programs "
                "have static shapes: call the compiled function with concrete "
                "arrays, or give the model a fixed batch size."
            )
    for node in graph.nodes:
        name = node.primitive.name
        if node.primitive.dynamic_shape:
            raise StaticShapeError(
                f"`{name}`{in_layer(node.source)} in {context} returns an array whose "
                "shape depends on its input values; IPU programs have static "
                "shapes. Use a fixed-size alternative (the `size=` argument "
                "where the op has one) or run it outside the compiled function."
            )
        for var in node.outputs:
            if not var.aval.is_static():
                raise StaticShapeError(
                    f"`{name}`{in_layer(node.source)} in {context} gives a value of "
                    f"unknown shape {var.aval.short()} (? is a None "
                    "dimension). IPU programs have static shapes: make the "
                    "shapes that reach this op concrete."
                )
        for sub in subgraphs(node):
            check_static_shapes(sub, f"a `{name}` sub-graph of {context}")
    return graph
