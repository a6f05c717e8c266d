"""Host transfers inside a program: data streams (infeeds, outfeeds) and
host regions (code that runs on the host in the middle of a program).
The gradient of a host region is a host region
(autodiff/control_flow.py, with the other primitives running sub-graphs).

- stream_from_host(token; stream, component, shape, dtype) -> (token, x):
  the next value of a host data stream (an infeed dequeue).
- stream_to_host(token, x; stream, component) -> token: x sent to a host
  data stream (an outfeed enqueue).
- host_region(token, *xs; graph, name) -> (token, *ys): `graph` run by the
  host (TensorFlow's outside compilation): xs go to the host, ys come back.

Each takes and returns the effect token of the program that uses it (see
frontends/tensorflow/importer.py), so every transfer runs once, in program
order, and no compiler pass removes, merges or folds one. The stream's
host side is found by id in keras_ipu.device.host_streams when the program
runs. Their cost is the PCIe transfer of the bytes moved
(cost_model.host_transfer_seconds); a host region adds no IPU compute.
"""

import numpy as np

from keras_ipu.device import host_streams
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive


def _next_token(token):
    with np.errstate(over="ignore"):
        return np.asarray(np.asarray(token) + 1, np.asarray(token).dtype)


def _token_aval(token):
    if token.ndim != 0 or token.dtype.kind not in "iu":
        raise TypeError(
            f"host transfers take an integer scalar effect token, got {token.short()}."
        )
    return ShapedArray((), token.dtype)


def _from_host_rule(token, *, stream, component, shape, dtype):
    return (_token_aval(token), ShapedArray(tuple(shape), np.dtype(dtype)))


def _from_host(token, *, stream, component, shape, dtype):
    value = host_streams.get(stream).receive(component, tuple(shape), np.dtype(dtype))
    value = np.asarray(value)
    if value.shape != tuple(shape) or value.dtype != np.dtype(dtype):
        raise ValueError(
            f"Host data stream {stream} (component {component}) gave an array "
            f"{value.dtype}{list(value.shape)} where the program was compiled "
            f"for {np.dtype(dtype)}{list(shape)}. Every element a stream feeds "
            "must have the shape and dtype of the first one (batch with "
            "drop_remainder=True)."
        )
    return _next_token(token), value


stream_from_host_p = Primitive(
    "stream_from_host", _from_host_rule, _from_host, multiple_results=True,
    nondiff="data read from the host",
    doc="The next value of a host data stream (infeed).",
)


def _to_host_rule(token, x, *, stream, component):
    return _token_aval(token)


def _to_host(token, x, *, stream, component):
    host_streams.get(stream).send(component, np.array(x, copy=True))
    return _next_token(token)


stream_to_host_p = Primitive(
    "stream_to_host", _to_host_rule, _to_host,
    nondiff="data written to the host",
    doc="Send a value to a host data stream (outfeed).",
)


def _region_rule(token, *xs, graph, name):
    inputs = [v.aval for v in graph.inputs]
    got = [token] + list(xs)
    if len(inputs) != len(got) or any(
            a.shape != b.shape or a.dtype != b.dtype for a, b in zip(inputs, got)):
        raise TypeError(
            f"host_region {name!r}: its graph takes "
            f"({', '.join(a.short() for a in inputs)}), got "
            f"({', '.join(a.short() for a in got)})."
        )
    return tuple(v.aval for v in graph.outputs)


def _region(token, *xs, graph, name):
    outs = eval_graph(graph, token, *xs)
    return tuple(np.asarray(o) for o in outs)


host_region_p = Primitive(
    "host_region", _region_rule, _region, multiple_results=True,
    subgraph_params=("graph",), result_graphs=("graph",),
    subgraph_operands=lambda params: [list(range(len(params["graph"].inputs)))],
    doc="A graph run by the host in the middle of a program (outside compilation).",
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402


def _stream_cost(ins, outs, **params):
    """Bytes over the host link: what arrives (from_host) or leaves."""
    moved_in = sum(_cost.nbytes(a) for a in ins[1:])
    moved_out = sum(_cost.nbytes(a) for a in outs[1:])
    return _cost.Cost(0, 0, moved_in, moved_out, "stream", None)


stream_from_host_p.cost = _stream_cost
stream_to_host_p.cost = _stream_cost
host_region_p.cost = _stream_cost
