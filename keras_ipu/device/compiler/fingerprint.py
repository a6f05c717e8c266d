"""A structural fingerprint of a Graph, stable across processes.

Vars are numbered in order of appearance, Literals hash by value, params by
a typed canonical form (sub-graphs by their own fingerprint). Params the
canonical form does not know are keyed by type name and repr, so a param
whose repr holds a memory address only costs a disk-cache miss.
"""

import hashlib

import numpy as np

from keras_ipu.device.compiler.graph_utils import freeze
from keras_ipu.device.ir import Literal


def _other_key(value):
    name = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    if name is not None and callable(value):
        return f"{module}.{name}"
    return repr(value)


def fingerprint(graph):
    h = hashlib.sha256()

    def put(text):
        h.update(text.encode())
        h.update(b"\x00")

    names = {}

    def ref(operand):
        if type(operand) is Literal:
            value = np.ascontiguousarray(np.asarray(operand.value))
            digest = hashlib.sha256(value.tobytes()).hexdigest()[:24]
            return f"lit({value.dtype.str},{value.shape},{digest})"
        if operand not in names:
            names[operand] = len(names)
        return f"v{names[operand]}"

    put("in " + " ".join(f"{ref(v)}:{v.aval.short()}" for v in graph.inputs))
    for node in graph.nodes:
        params = tuple(
            (k, freeze(v, graph_key=fingerprint, other_key=_other_key))
            for k, v in sorted(node.params.items())
        )
        put(
            " ".join(f"{ref(v)}:{v.aval.short()}" for v in node.outputs)
            + f" = {node.primitive.name} {params!r} "
            + " ".join(ref(v) for v in node.inputs)
            # The recorded stage places the node (placement.py): programs
            # staged differently are different executables.
            + ("" if node.stage is None else f" @{node.stage}")
        )
    put("out " + " ".join(ref(v) for v in graph.outputs))
    return h.hexdigest()
