"""The programs fit / evaluate / predict compile for a pipelined model are
placed on its IPUs (compiler/placement.py): per-IPU memory on the
executable and in the profile report, inter-IPU copies in it. (That the placed pipeline trains as
gradient accumulation does: test_accumulation_and_pipelining.py.)"""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.ir import ipus_of
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.simulator import profile

from ipu_keras_helpers import configure
from ipu_keras_helpers import two_stage_pipeline


def _model():
    configure(2)
    return two_stage_pipeline()


def _data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(32, 16)).astype("float32"),
            rng.normal(size=(32, 8)).astype("float32"))


def test_fit_evaluate_predict_programs_of_a_pipeline_run_on_its_ipus():
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    model.evaluate(x, y, batch_size=4, verbose=0)
    model.predict(x, batch_size=4, verbose=0)
    for function in (model.train_function, model.test_function, model.predict_function):
        (exe,) = function.device_loop.executables()
        assert exe.ipus == (0, 1)
        assert sorted(exe.memory_by_ipu) == [0, 1]
        assert ipus_of(exe.graph) == (0, 1)
        copies = [n for n in _all_nodes(exe.graph) if n.primitive.name == "ipu_copy"]
        assert copies, "a value crosses from stage 0's IPU to stage 1's"
    # The profile report has one memory entry per IPU.
    (exe,) = model.train_function.device_loop.executables()
    report = profile.build_report(exe)
    # A step trains on 4 micro-batches of 4 samples: samples/s counts 16.
    assert report["cycles"]["batch_size"] == 16
    assert report["cycles"]["samples_per_second"] == pytest.approx(
        16 / report["cycles"]["step_seconds"])
    assert [entry["ipu"] for entry in report["memory"]["ipus"]] == [0, 1]
    assert len(report["memory"]["tiles"]) == 2
    # Its inputs are the model's state by kind and the infeed, as for any
    # Keras program (not "program inputs").
    held = {c for entry in report["memory"]["ipus"] for c in entry["categories"]}
    assert {"weights", "optimizer state", "stream buffers"} <= held
    assert "program inputs" not in held
    # Every cycle has a name: the loop over the micro-batches and the
    # accumulators are "gradient accumulation", not "(no layer)".
    layers = {x["layer"]: x["cycles"] for x in report["cycles"]["layers"]}
    assert "(no layer)" not in layers and layers["gradient accumulation"] > 0


def _all_nodes(graph):

    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _all_nodes(sub)
