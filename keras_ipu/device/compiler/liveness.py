"""Liveness analysis: the last use of every value, and peak live bytes.

The executable drops its reference to a value right after its last use so
NumPy can reuse the memory; the peak is what the memory model starts from.
Graph inputs are live from the start; graph outputs until the end;
Literals (constants) are resident for the whole program and counted apart.
"""

import dataclasses

from keras_ipu.device.ir import Literal


@dataclasses.dataclass
class Liveness:
    # Var -> index of the last node reading it; len(nodes) for graph outputs;
    # the defining node's index (or -1 for an input) when never read.
    last_use: dict
    peak_bytes: int
    # Index of the node after which the peak is reached (-1: at the start).
    peak_at: int
    constant_bytes: int

    def dying_after(self, index):
        return [v for v, last in self.last_use.items() if last == index]


def analyze_liveness(graph):
    end = len(graph.nodes)
    last_use = {v: -1 for v in graph.inputs}
    constant_ids = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if type(v) is Literal:
                constant_ids[id(v.value)] = v.aval.nbytes or 0
            else:
                last_use[v] = i
        for v in node.outputs:
            last_use.setdefault(v, i)
    for v in graph.outputs:
        if type(v) is Literal:
            constant_ids[id(v.value)] = v.aval.nbytes or 0
        else:
            last_use[v] = end

    dying = {}
    for v, last in last_use.items():
        dying.setdefault(last, []).append(v)

    live = sum(v.aval.nbytes or 0 for v in graph.inputs)
    peak, peak_at = live, -1
    live -= sum(v.aval.nbytes or 0 for v in dying.get(-1, ()))
    for i, node in enumerate(graph.nodes):
        live += sum(v.aval.nbytes or 0 for v in node.outputs)
        if live > peak:
            peak, peak_at = live, i
        live -= sum(v.aval.nbytes or 0 for v in dying.get(i, ()))
    return Liveness(last_use, peak, peak_at, sum(constant_ids.values()))
