"""A compiled program as a GraphDef, for TensorBoard's Graphs tab.

Node names are the Keras layer path of the step and its primitive
("sequential/dense/dot_general_12"), so TensorBoard folds the program by
layer as it folds a TensorFlow model's graph; steps outside any layer sit
under their attribution ("metrics", "device loop") or at the top. Inputs
are grouped by memory category ("inputs/weights/arg_0", "inputs/stream
buffers/arg_9"), constants under "constants". A control-flow step's
sub-graphs (the device loop's training step is its scan's body) are
nested under "<step>_body" (or _cond, _branch_k), their own steps again
named by layer. Every node carries its output shapes (TensorBoard draws
them on the edges) and, as attributes, the Keras layer, and the predicted
cycles and bytes of the step.

Uses TensorBoard's own copy of the GraphDef protobuf (no TensorFlow).
"""

from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import profile

# numpy dtype name -> TensorFlow DataType number (types.proto).
TF_DTYPES = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5,
              "int8": 6, "int64": 9, "bool": 10, "bfloat16": 14, "uint16": 17,
              "float16": 19, "uint32": 22, "uint64": 23}


def _protos():
    from tensorboard.compat.proto import graph_pb2

    return graph_pb2


def _clean(text):
    """A name part TensorBoard accepts: no ':' (output separator), no
    leading '/'; spaces kept (TensorBoard shows them)."""
    return str(text).replace(":", "_").strip("/") or "_"


class _Writer:
    def __init__(self, graph_def, costs):
        self.graph_def = graph_def
        self.costs = costs  # id(step) -> (cycles, flops)
        self.names = set()

    def unique(self, name):
        base, k = name, 1
        while name in self.names:
            name = f"{base}_{k}"
            k += 1
        self.names.add(name)
        return name

    def node(self, name, op, inputs, avals, attrs):
        node = self.graph_def.node.add()
        node.name = name
        node.op = op
        node.input.extend(inputs)
        shapes = node.attr["_output_shapes"].list.shape
        for aval in avals:
            shape = shapes.add()
            for d in aval.shape:
                shape.dim.add().size = -1 if d is None else int(d)
        if avals:
            node.attr["T"].type = TF_DTYPES.get(str(avals[0].dtype), 0)
        for key, value in attrs.items():
            if value is None:
                continue
            if isinstance(value, int):
                node.attr[key].i = value
            elif isinstance(value, float):
                node.attr[key].f = value
            else:
                node.attr[key].s = str(value).encode()
        return node

    def program(self, program, prefix, categories=None, outer_inputs=None):
        """Nodes of `program` under `prefix`; returns nothing. `outer_inputs`:
        the names feeding a sub-graph's inputs (edges into the body)."""
        where = {}  # Var, or id of a constant's value -> "node:k"
        categories = categories or ("program inputs",) * len(program.inputs)
        for j, (var, category) in enumerate(zip(program.inputs, categories)):
            group = f"{prefix}inputs/{_clean(category)}" if not outer_inputs else f"{prefix}inputs"
            name = self.unique(f"{group}/arg_{j}")
            feed = [outer_inputs[j]] if outer_inputs and j < len(outer_inputs) else []
            self.node(name, "Input", feed, [var.aval], {"category": category})
            where[var] = name
        constants = {}
        for node in program.nodes:
            for v in node.inputs:
                if type(v) is Literal:
                    constants.setdefault(id(v.value), v.aval)
        for j, (key, aval) in enumerate(constants.items()):
            name = self.unique(f"{prefix}constants/const_{j}")
            self.node(name, "Const", [], [aval], {"bytes": int(aval.nbytes or 0)})
            where[key] = name
        for i, node in enumerate(program.nodes):
            layer = node.source or ""
            base = f"{prefix}{_clean(layer) + '/' if layer else ''}{node.primitive.name}_{i}"
            name = self.unique(base)
            keys = [id(v.value) if type(v) is Literal else v for v in node.inputs]
            inputs = [where[k] for k in keys if k in where]
            out_avals = [v.aval for v in node.outputs]
            self.node(name, node.primitive.name, inputs, out_avals, {
                "layer": layer or None, "step": i,
                "predicted_cycles": self.costs.get(id(node)),
                "output_bytes": int(sum(a.nbytes or 0 for a in out_avals)),
            })
            for k, var in enumerate(node.outputs):
                where[var] = name if k == 0 else f"{name}:{k}"
            for graph, sub_name in zip(subgraphs(node), _sub_names(node)):
                self.program(graph, f"{name}_{sub_name}/", None, outer_inputs=inputs)


def _sub_names(node):
    """Names of the sub-graphs of a control-flow node, in ir.subgraphs
    order: its params' names (a while loop's body and cond, a scan's body),
    a cond's branch_0, branch_1..."""
    names = []
    for param in node.primitive.subgraph_params:
        value = node.params[param]
        if isinstance(value, tuple):
            names += [f"branch_{g}" for g in range(len(value))]
        else:
            names.append(param.removesuffix("_graph"))
    return names


def graph_def(exe):
    """The tensorboard GraphDef of a compiled Executable (or Graph)."""
    pb = _protos()
    graph_def = pb.GraphDef()
    graph_def.versions.producer = 1
    program = memory_model.graph_of(exe)
    costs = {}
    try:
        pred = profile.prediction_of(exe)
        costs = {id(node): s.cycles for node, s in zip(program.nodes, pred.steps)}
    except (LookupError, TypeError, ValueError):
        pass  # a program the cost model cannot cost still has a graph
    _Writer(graph_def, costs).program(program, "", profile.input_categories(exe, program))
    return graph_def


class GraphSource:
    """What Keras' TensorBoard callback reads to write the train graph
    (`train_function._concrete_stateful_fn.graph`, for a tf.function): here
    the GraphDef of the program the device loop compiled last, as
    TensorFlow's GraphDef class (tf.summary.graph takes it as it is)."""

    def __init__(self, device_loop):
        self._device_loop = device_loop

    @property
    def graph(self):
        from tensorflow.core.framework import graph_pb2

        executables = self._device_loop.executables()
        if not executables:  # nothing compiled (yet): Keras must not fail for it
            return graph_pb2.GraphDef()
        return graph_pb2.GraphDef.FromString(graph_def(executables[-1]).SerializeToString())
