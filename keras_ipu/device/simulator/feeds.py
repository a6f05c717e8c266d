"""What the infeed and the outfeed hold on the IPU.

A Keras fit's program takes its steps' batches stacked on leading axes (the
steps of one execution, then the micro-batches of one step) and loops over
them: the device loop, and within a step the micro-batch loop of gradient
accumulation or pipelining. Its logs come back stacked per step. On an IPU
those stacks never exist: the batches come through the infeed and the logs
go through the outfeed, one element at a time, and the IPU holds only the
tensor each element is copied into (cost_model.FEED_ELEMENTS_ON_IPU,
[TFFEED]; the prefetch_depth buffers of the data stream are on the host).

So, of the inputs the compiling caller says the infeed feeds (Feeds.inputs),
one read only as the stacked operand of loops (a scan's xs) is held as one
element: the slice the innermost such loop takes. Of the outputs it returns
through the outfeed (Feeds.outputs), one made as the stacked result of a
loop (a scan's ys) and read by nothing else is held as the element one
iteration makes. Any other fed value is held whole (a program that reads
the whole stack needs it on the IPU).
"""

import dataclasses

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.control_flow import scan_p
from keras_ipu.device.simulator import cost_model


@dataclasses.dataclass(frozen=True)
class Feeds:
    """Positions of the program inputs the infeed feeds and of the outputs
    returned through the outfeed (negative positions count from the end)."""

    inputs: tuple = ()
    outputs: tuple = ()

    @classmethod
    def of_workload(cls, n_inputs, n_outputs, infeed_inputs, resident_outputs=()):
        """The Feeds of a program whose inputs `infeed_inputs` come from the
        infeed: its outputs other than `resident_outputs` (the state it keeps
        on the IPU) go back through the outfeed, as a Keras fit's logs do."""
        kept = {j % n_outputs for j in resident_outputs} if n_outputs else set()
        return cls(tuple(j % n_inputs for j in infeed_inputs) if n_inputs else (),
                   tuple(j for j in range(n_outputs) if j not in kept))


def feeds_of(exe, workload):
    """The Feeds of an Executable `exe` under its workload (the compiling
    caller's device_checks.workload): the inputs it names "stream buffers"
    are the infeed's (a Keras fit's stacked batches: trainer_ops/
    device_loop.py), and then its outputs other than the resident ones (the
    state it keeps) go back through the outfeed; None without such inputs."""
    workload = workload or {}
    categories = workload.get("input_categories") or ()
    fed = tuple(j for j, kind in enumerate(categories) if kind == "stream buffers")
    if not fed:
        return None
    return Feeds.of_workload(len(exe.in_avals), len(exe.out_avals), fed,
                             workload.get("resident_outputs") or ())


def _readers(graph):
    found = {}
    for node in graph.nodes:
        for k, v in enumerate(node.inputs):
            found.setdefault(v, []).append((node, k))
    return found


def _streamed_in(graph, var):
    """The aval of the element a loop takes of `var` (an input of `graph`)
    each iteration, innermost loops first; None if anything reads it
    otherwise."""
    readers = _readers(graph).get(var)
    if not readers:
        return None
    elements = []
    for node, k in readers:
        if node.primitive is not scan_p:
            return None
        n_carry, n_xs = node.params["n_carry"], node.params["n_xs"]
        if not n_carry <= k < n_carry + n_xs:
            return None
        body = node.params["body"]
        inner = body.inputs[k]
        elements.append(_streamed_in(body, inner) or inner.aval)
    return max(elements, key=lambda a: a.nbytes or 0)


def _streamed_out(graph, var):
    """The aval of the element one iteration of the loop making `var` (an
    output of `graph`) makes, innermost loops first; None if `var` is not a
    loop's stacked result, or something in `graph` reads it."""
    if var in _readers(graph):
        return None
    for node in graph.nodes:
        if var in node.outputs:
            k = node.outputs.index(var)
            if node.primitive is not scan_p or k < node.params["n_carry"]:
                return None
            body = node.params["body"]
            inner = body.outputs[k]
            if type(inner) is not Var:  # a constant stacked
                return inner.aval
            return _streamed_out(body, inner) or inner.aval
    return None


def _buffer(element):
    """What the IPU holds of a stream of `element`s."""
    n = cost_model.FEED_ELEMENTS_ON_IPU
    return element if n == 1 else ShapedArray((n,) + element.shape, element.dtype)


def held_avals(graph, feeds):
    """{Var: the aval the IPU holds of it} for the fed inputs and outputs of
    `graph` streamed one element at a time (the module doc); every other
    value is held whole (its own aval)."""
    if feeds is None:
        return {}
    out = {}
    for j in feeds.inputs:
        v = graph.inputs[j]
        element = _streamed_in(graph, v)
        if element is not None:
            out[v] = _buffer(element)
    for j in feeds.outputs:
        v = graph.outputs[j]
        element = _streamed_out(graph, v) if type(v) is Var else None
        if element is not None and v not in out:
            out[v] = _buffer(element)
    return out
