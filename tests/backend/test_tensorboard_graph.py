"""The compiled program as a GraphDef for TensorBoard's Graphs tab: nodes
named by Keras layer path and primitive, sub-graphs nested, edges and
shapes; and Keras' TensorBoard(write_graph=True) writing it under ipu."""

import glob
import os

import keras
import numpy as np

from keras_ipu.report import graph_def as gd

from test_tensorboard_profile import tiny_executable


def _small_model():
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(4, activation="relu", name="hidden"),
        keras.layers.Dense(2, activation="softmax", name="out"),
    ], name="net")
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss="sparse_categorical_crossentropy", steps_per_execution=2)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.random((16, 6), np.float32), rng.integers(0, 2, 16).astype("int32")


def test_graph_def_names_nodes_by_layer_and_primitive():
    exe = tiny_executable()
    g = gd.graph_def(exe)
    names = [n.name for n in g.node]
    assert names[0] == "inputs/program inputs/arg_0"
    steps = [n for n in g.node if not n.name.startswith(("inputs/", "constants/"))]
    assert all(n.name.split("/")[-1].startswith(n.op + "_") for n in steps)
    assert all(n.attr["predicted_cycles"].i > 0 for n in steps)
    if len(steps) == 2:  # unfused
        assert [n.name for n in steps] == ["model/act/exp_0", "model/residual/add_1"]
        assert list(steps[1].input) == ["model/act/exp_0", "inputs/program inputs/arg_0"]
    # Every edge comes from a node of the graph; shapes are on the nodes.
    known = set(names)
    assert all(i.split(":")[0] in known for n in g.node for i in n.input)
    assert [d.size for d in steps[-1].attr["_output_shapes"].list.shape[0].dim] == [64]


def test_the_train_step_graph_folds_by_layer_with_the_loop_body_nested():
    model = _small_model()
    x, y = _data()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    (exe,) = model.train_function.device_loop.executables()
    g = gd.graph_def(exe)
    names = [n.name for n in g.node]
    categories = {n.name.split("/")[1] for n in g.node if n.name.startswith("inputs/")}
    assert categories == {"weights", "optimizer state", "metric state", "stream buffers"}
    (scan,) = [n for n in g.node if n.op == "scan"]
    assert scan.name.startswith("device loop/")
    body = [n for n in names if n.startswith(scan.name + "_body/")]
    layers = {n[len(scan.name + "_body/"):].rsplit("/", 1)[0] for n in body}
    assert {"net/hidden", "net/out", "metrics"} <= layers
    assert any(layer.startswith("sgd") for layer in layers)
    known = set(names)
    assert all(i.split(":")[0] in known for n in g.node for i in n.input)


def test_keras_tensorboard_writes_the_graph_under_ipu(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _small_model()
    x, y = _data()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(str(tmp_path), write_graph=True)])
    graphs = []
    for path in glob.glob(os.path.join(tmp_path, "train", "events.out.tfevents.*")):
        acc = EventAccumulator(path)
        acc.Reload()
        if acc.Tags()["graph"]:
            graphs.append(acc.Graph())
    (graph,) = graphs
    assert any(n.name.endswith("/net/hidden/dot_general_0") or "/net/hidden/" in n.name
               for n in graph.node)
