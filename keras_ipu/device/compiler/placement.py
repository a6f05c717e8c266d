"""Placement: the pipeline stage and the IPU every node of a program runs on.

    placement = Placement.of({"model/block1": 0, "model/block2": 1},
                             device_mapping=(0, 1))
    exe = compile_graph(graph, CompileOptions(placement=placement))

The pass (`place`, run by the pipeline after dead-code elimination and
before fusion) tags every node with `stage` and `ipu` (ir.Node), the way
nodes carry the Keras layer path they were traced in (`source`):

- A node traced inside trace.stage_scope(s) runs on stage s (a layer
  invocation's stage: a layer shared by two stages runs in each). Else a
  node whose layer path is, or lies under, a path of the placement takes
  its stage (the longest path wins). The backward nodes of a layer carry
  its path and stage (autodiff/reverse.py), so they run on its stage too.
- Any other node (the loss, the optimizer's updates, the metrics) runs
  where the values it reads are: on the home of the program inputs it
  reads (an input's home: the highest stage of the placed nodes reading
  it, inside the loops and branches it is handed to included), else on
  the stage of its largest operand's maker (of equal sizes, the later
  stage), else on the stage of the node before it. So a weight's
  update runs where the weight is, or where its gradient is made, not where
  a scalar it shares with every update comes from (the learning rate); the
  loss (which reads the model's output) on the last stage.
- A control-flow node with a placed layer path runs whole on its stage (its
  sub-graphs' nodes with it). Otherwise its sub-graphs are placed node by
  node; the node runs on the one stage they use, or, when they use several
  (the device loop's scan around a pipelined training step), on none: its
  `stage` and `ipu` are None and its sub-graphs' nodes carry the tags.

Stage s runs on IPU `device_mapping[s]` (default: IPU s).

Copies: a value made on one IPU and read on another crosses the IPU-Links
once per receiving IPU, as an `ipu_copy` node (primitives/inter_ipu.py)
inserted before its first reader there; every reader there reads the copy.
Program inputs, and the inputs of a sub-graph, are held by every IPU that
reads them (the host streams them to each): they are never copied. Not
modelled: a value made outside a loop and read inside its body on another
IPU, and a loop carry made on one IPU and read on another in the next
iteration (both move over the links on the IPU too).

Without a placement nothing is tagged: a one-IPU program, IPU 0
(`on_one_ipu` tags such a program for readers of placed programs).
"""

import dataclasses

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import map_subgraphs
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var
from keras_ipu.device.ir import output_tag
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a program runs: the stage of each Keras layer path (a layer
    and everything under it) and the IPU of each stage. Hashable: it is part
    of CompileOptions and so of the executable cache key."""

    stages: tuple  # ((layer path, stage), ...), sorted by path
    device_mapping: tuple = None  # IPU of stage s; None: IPU s

    @classmethod
    def of(cls, assignment, device_mapping=None):
        """From {layer path: stage} (empty when the trace recorded the
        stages: trace.stage_scope) and the IPU of each stage."""
        if not isinstance(assignment, dict):
            raise ValueError(
                f"A placement maps Keras layer paths to pipeline stages, e.g. "
                f"{{'model/dense_1': 0, 'model/dense_2': 1}}; got {assignment!r}."
            )
        for path, stage in assignment.items():
            if not isinstance(path, str) or not path:
                raise ValueError(
                    f"Placement {assignment!r}: {path!r} is not a layer path; use "
                    "the names Keras gives layers, joined by '/' (model/dense_1)."
                )
            _check_index(stage, f"the stage of {path!r}")
        mapping = None
        if device_mapping is not None:
            mapping = tuple(device_mapping)
            for s, ipu in enumerate(mapping):
                _check_index(ipu, f"device_mapping[{s}]")
            top = max(assignment.values(), default=-1)
            if top >= len(mapping):
                raise ValueError(
                    f"Stage {top} has no IPU: device_mapping {list(mapping)} lists "
                    f"{len(mapping)} stages. Give one IPU per stage, 0 to {top}."
                )
        return cls(tuple(sorted((p.rstrip("/"), s) for p, s in assignment.items())),
                   mapping)

    def stage_of(self, source):
        """The stage of a node traced in layer path `source`, or None."""
        if not source:
            return None
        best = None
        for path, stage in self.stages:
            if source == path or source.startswith(path + "/"):
                if best is None or len(path) > len(best[0]):
                    best = (path, stage)
        return None if best is None else best[1]

    def ipu_of(self, stage):
        if self.device_mapping is None:
            return stage
        if stage >= len(self.device_mapping):
            raise ValueError(
                f"Stage {stage} has no IPU: device_mapping {list(self.device_mapping)} "
                f"lists {len(self.device_mapping)} stages. Give one IPU per stage."
            )
        return self.device_mapping[stage]


def _check_index(value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is {value!r}: use a non-negative int.")


def place(graph, placement):
    """`graph` with every node tagged (stage, ipu) and the inter-IPU copies
    inserted, sub-graphs included (see the module doc)."""
    first = _first_stage(graph, placement)
    if first is None:
        sources = sorted(_sources(graph))[:5]
        raise ValueError(
            f"No node of the program runs in a layer of the placement "
            f"{dict(placement.stages)} or in a stage_scope: the program's layer "
            f"paths are e.g. {sources or '(none recorded)'}. Place those paths "
            "(or their parents)."
        )
    return _Placer(placement).graph(graph, first)


def on_one_ipu(graph, ipu=0):
    """`graph` with every node, sub-graphs included, on stage 0 of IPU
    `ipu`: a program that is not pipelined, as predict_sharded reads it."""
    return _Placer(Placement((), (ipu,))).whole(graph, 0)


def restaged(graph, stages):
    """`graph` (not yet placed) with the stage recorded on each node,
    sub-graphs included, renamed: s becomes stages[s]. A trace with every
    layer invocation in a stage of its own, split into pipeline stages
    (the automatic pipeline split tries several splits of one trace)."""
    return with_stages(graph, lambda node: None if node.stage is None else stages[node.stage])


def with_stages(graph, stage_of):
    """`graph` (not yet placed) with each node's recorded stage replaced by
    stage_of(node), sub-graphs included (a TensorFlow program's stages from
    its op names: frontends/tensorflow/stages.py)."""
    nodes = []
    for node in graph.nodes:
        new = copy_node(node, node.inputs,
                        map_subgraphs(node, lambda g: with_stages(g, stage_of)))
        new.stage = stage_of(node)
        nodes.append(new)
    return rebuilt(graph, nodes, {})


def _sources(graph):
    for node in graph.nodes:
        if node.source:
            yield node.source
        for sub in subgraphs(node):
            yield from _sources(sub)


def _first_stage(graph, placement):
    for node in graph.nodes:
        stage = node.stage if node.stage is not None else placement.stage_of(node.source)
        if stage is not None:
            return stage
        for sub in subgraphs(node):
            stage = _first_stage(sub, placement)
            if stage is not None:
                return stage
    return None


def _tagged(node, stage, ipu, params=None):
    new = copy_node(node, node.inputs, params)
    new.stage, new.ipu = stage, ipu
    return new


class _Placer:
    def __init__(self, placement):
        self.placement = placement

    def whole(self, graph, stage):
        """`graph` with every node, sub-graphs included, on `stage`."""
        ipu = self.placement.ipu_of(stage)
        nodes = [
            _tagged(node, stage, ipu,
                    map_subgraphs(node, lambda g: self.whole(g, stage)))
            for node in graph.nodes
        ]
        return rebuilt(graph, nodes, {})

    def graph(self, graph, before):
        """`graph` placed node by node; `before`: the stage of what runs
        before it (for its first nodes if they read nothing placed)."""
        placement = self.placement
        explicit = [node.stage if node.stage is not None else placement.stage_of(node.source)
                    for node in graph.nodes]
        # Inputs live where the placed nodes reading them run.
        home = _input_homes(graph, placement)
        made_on = {}  # value made by a node of this graph -> its stage
        nodes = []
        for node, stage in zip(graph.nodes, explicit):
            if stage is not None and node.primitive.subgraph_params:
                new = _tagged(node, stage, placement.ipu_of(stage),
                              map_subgraphs(node, lambda g, s=stage: self.whole(g, s)))
            elif node.primitive.subgraph_params:
                new = self.control_flow(node, before)
            else:
                if stage is None:
                    stage = _by_dataflow(node, home, made_on, before)
                new = _tagged(node, stage, placement.ipu_of(stage))
            for k, v in enumerate(new.outputs):
                s = output_tag(new, k, "stage")
                if s is not None:
                    made_on[v] = s
            if new.stage is not None:
                before = new.stage
            nodes.append(new)
        return _with_copies(rebuilt(graph, nodes, {}))

    def control_flow(self, node, before):
        """A control-flow node without a placed layer path: its sub-graphs
        placed node by node; on their one stage, or spanning (None)."""
        params = map_subgraphs(node, lambda g: self.graph(g, before))
        new = copy_node(node, node.inputs, params)
        stages = set()
        for sub in subgraphs(new):
            stages |= recorded_stages(sub)
        if len(stages) == 1:
            (stage,) = stages
            return _tagged(new, stage, self.placement.ipu_of(stage))
        if not stages:
            return _tagged(new, before, self.placement.ipu_of(before))
        return new  # spanning: stage and ipu None


def _input_homes(graph, placement):
    """{input of `graph`: the highest stage of the placed nodes reading it},
    the readers inside the sub-graphs it is handed to included (a weight
    handed to the micro-batch loop lives where its layer runs in there)."""
    inputs = set(graph.inputs)
    home = {}
    for node in graph.nodes:
        stage = node.stage if node.stage is not None else placement.stage_of(node.source)
        reads = {}
        if stage is not None:
            reads = {v: stage for v in node.inputs if v in inputs}
        elif node.primitive.subgraph_params and node.primitive.subgraph_operands is not None:
            feeds = node.primitive.subgraph_operands(node.params)
            for sub, positions in zip(subgraphs(node), feeds):
                inner = _input_homes(sub, placement) if positions else {}
                for x, p in zip(sub.inputs, positions or ()):
                    v = node.inputs[p]
                    if v in inputs and x in inner:
                        reads[v] = max(reads.get(v, inner[x]), inner[x])
        for v, s in reads.items():
            home[v] = max(home.get(v, s), s)
    return home


def _by_dataflow(node, home, made_on, before):
    """The stage of a node nothing places (see the module doc)."""
    homes = [home[v] for v in node.inputs if type(v) is Var and v in home]
    if homes:
        return max(homes)
    made = [(v.aval.nbytes or 0, made_on[v]) for v in node.inputs
            if type(v) is Var and v in made_on]
    return max(made)[1] if made else before


def recorded_stages(graph):
    found = set()
    for node in graph.nodes:
        if node.stage is not None:
            found.add(node.stage)
        else:
            for sub in subgraphs(node):
                found |= recorded_stages(sub)
    return found


def _with_copies(graph):
    """`graph` with an ipu_copy node before the first reader, on each other
    IPU, of every value a node of it made."""
    home = {}  # Var -> IPU holding it
    copies = {}  # (Var, IPU) -> the copy's Var
    nodes = []
    for node in graph.nodes:
        where = node.ipu
        if where is not None:
            inputs = []
            for v in node.inputs:
                src = home.get(v) if type(v) is Var else None
                if src is None or src == where:
                    inputs.append(v)
                    continue
                copy = copies.get((v, where))
                if copy is None:
                    copy = Var(v.aval)
                    copies[(v, where)] = copy
                    nodes.append(Node(ipu_copy_p, [v], {"src": src, "dst": where}, [copy],
                                      node.source, node.stage, where))
                inputs.append(copy)
            if inputs != node.inputs:
                node = copy_node(node, inputs)
        nodes.append(node)
        for k, v in enumerate(node.outputs):
            held = output_tag(node, k, "ipu")
            if held is not None:
                home[v] = held
    out = Graph()
    out.inputs = list(graph.inputs)
    out.nodes = nodes
    out.outputs = list(graph.outputs)
    return out
