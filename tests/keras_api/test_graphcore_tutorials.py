"""The referee: Graphcore's TensorFlow 2 Keras tutorials and model-parallelism
tech-note scripts (graphcore/examples) run under KERAS_BACKEND=ipu after
the porting contract's import edits only (graphcore_port.py), with small
synthetic MNIST-shaped data in place of the download. Each passes as
Graphcore's own tests of it pass: exit status 0 and, where their test looks
for it, "Program ran successfully" in the output.

Each script trains a small model for minutes on a 2-core machine, so the
runs are asked for: set KERAS_IPU_GRAPHCORE_EXAMPLES to a checkout of
graphcore/examples (or the git directory of a mirror, e.g. the one
`fetch github:graphcore/examples` makes); without it they skip (the test of
the port's edits always runs)."""

import pytest

import graphcore_port

KERAS = "tutorials/tutorials/tensorflow2/keras/"
TECH_NOTE = "tutorials/tech_notes_code/model_parallelism/tensorflow2_code/"

# Synthetic data sizes (train, test): the scripts size steps_per_execution
# from the data, so they must divide as MNIST's 60000/10000 do (batch 64;
# the pipelining demo's test data takes 2 replicas x accumulation 8
# batches; batch 80 for the completed example).
_DEMO_DATA = {"GRAPHCORE_PORT_TRAIN": "1024", "GRAPHCORE_PORT_TEST": "256"}
_PIPELINING_DEMO_DATA = {"GRAPHCORE_PORT_TRAIN": "1024", "GRAPHCORE_PORT_TEST": "1024"}
_EXAMPLE_DATA = {"GRAPHCORE_PORT_TRAIN": "1280", "GRAPHCORE_PORT_TEST": "480"}
_COMPLETED_EXAMPLE = [KERAS + "completed_example/" + name
                      for name in ("main.py", "model.py", "utils.py")]

# (test id, repository paths, script, arguments, data, success line)
CASES = [
    ("demo_ipu", [KERAS + "completed_demos/completed_demo_ipu.py"],
     "completed_demo_ipu.py", [], _DEMO_DATA, "Program ran successfully"),
    ("demo_faster", [KERAS + "completed_demos/completed_demo_faster.py"],
     "completed_demo_faster.py", [], _DEMO_DATA, "Program ran successfully"),
    ("demo_replicated", [KERAS + "completed_demos/completed_demo_replicated.py"],
     "completed_demo_replicated.py", [], _DEMO_DATA, "Program ran successfully"),
    ("demo_pipelining", [KERAS + "completed_demos/completed_demo_pipelining.py"],
     "completed_demo_pipelining.py", [], _PIPELINING_DEMO_DATA, "Program ran successfully"),
    ("example_cpu", _COMPLETED_EXAMPLE, "main.py", [], _EXAMPLE_DATA,
     "Program ran successfully"),
    ("example_ipu", _COMPLETED_EXAMPLE, "main.py", ["--use-ipu"], _EXAMPLE_DATA,
     "Program ran successfully"),
    ("example_pipelining", _COMPLETED_EXAMPLE, "main.py", ["--use-ipu", "--pipelining"],
     _EXAMPLE_DATA, "Program ran successfully"),
    # A 1-IPU pipeline of a PopnnLSTM split by RecomputationCheckpoints under
    # RecomputeAndBackpropagateInterleaved (a shorter sequence than its
    # default 2048: synthetic data, same shapes otherwise).
    ("recompute_lstm",
     ["tutorials/feature_examples/tensorflow2/recomputation_checkpoints/recompute_lstm.py"],
     "recompute_lstm.py", ["--seq-len", "64"], {}, None),
] + [
    (name, [TECH_NOTE + name + ".py"], name + ".py", [], {}, None)
    for name in ("training_pipelining", "training_pipelining_sequential",
                 "inference_pipelining", "inference_pipelining_sequential",
                 "inference_pipelining_set_pipeline_stage")
]


# Zero-edit porting (the import hook's aliases: keras.ipu, tf.estimator, ...):
# scripts run as Graphcore wrote them, under KERAS_BACKEND=tensorflow
# through the TensorFlow front end.
ESTIMATOR = "tutorials/feature_examples/tensorflow2/ipu_estimator/"
RECOMPILATION = "tutorials/tech_notes_code/recompilation/tensorflow2/TF2_recompilation.py"
UNEDITED = [
    ("unedited_demo_pipelining", [KERAS + "completed_demos/completed_demo_pipelining.py"],
     "completed_demo_pipelining.py", [], _PIPELINING_DEMO_DATA, "Program ran successfully"),
    ("unedited_training_pipelining", [TECH_NOTE + "training_pipelining.py"],
     "training_pipelining.py", [], {}, None),
    # The recompilation tech note: IPUStrategy.run of a tf.function with the
    # executable cache (--executable_cache_path), a constant fed as an
    # argument; its first result is (a + b + a + c) x 10 by hand.
    ("unedited_recompilation", [RECOMPILATION], "TF2_recompilation.py", [], {},
     "Caching/warm up test:\t tf.Tensor([[30. 80.]]"),
] + [
    # The estimator tutorials: one IPU, two replicas (CrossReplicaOptimizer),
    # a two-IPU pipeline (num_shards=2).
    (f"unedited_{script[:-3]}",
     [ESTIMATOR + name for name in (script, "data.py", "model.py", "utils.py")],
     script, ["--epochs", "1"] + extra,
     {"GRAPHCORE_PORT_TRAIN": "64", "GRAPHCORE_PORT_TEST": test}, "Validation accuracy")
    # The pipeline rounds its test steps (images / batch 16) down to a
    # multiple of the accumulation count, which two Grouped stages need to be
    # a multiple of 4: 64 test images and a count of 4, not its default 8.
    for script, extra, test in (
        ("cifar10_ipu_estimator.py", [], "32"),
        ("cifar10_ipu_estimator_replica.py", [], "32"),
        ("cifar10_ipu_pipeline_estimator.py", ["--gradient-accumulation-count", "4"], "64"))
]


def test_the_port_is_the_contracts_edits():
    source = (
        "import tensorflow.keras as keras\n"
        "from tensorflow.python import ipu\n"
        "from tensorflow.python.ipu import config\n"
        "from tensorflow.python.ipu.ops import pipelining_ops\n"
        "from tensorflow.keras import ipu\n"
        "from tensorflow.keras import layers\n"
        "from tensorflow import keras\n"
        "from ipu_tensorflow_addons.keras.layers import Dropout\n"
        "with keras.ipu.PipelineStage(0):\n"
        "    m = tf.keras.Model()\n"
    )
    assert graphcore_port.port(source) == (
        "import keras\n"
        "import keras_ipu as ipu\n"
        "from keras_ipu import config\n"
        "from keras_ipu.ops import pipelining_ops\n"
        "from keras_ipu import keras as ipu\n"
        "from keras import layers\n"
        "import keras\n"
        "from keras_ipu.layers import Dropout\n"
        "with ipu.keras.PipelineStage(0):\n"
        "    m = keras.Model()\n"
    )
    # A script that only says tf.keras gets `import keras`.
    assert graphcore_port.port("import tensorflow as tf\nm = tf.keras.Sequential()\n") == (
        "import keras\nimport tensorflow as tf\nm = keras.Sequential()\n")


@pytest.mark.parametrize(
    "paths, script, args, data, success",
    [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_graphcore_tutorial_runs_ported(tmp_path, paths, script, args, data, success):
    copy = graphcore_port.examples_copy()
    if copy is None:
        pytest.skip("Graphcore's tutorials run when KERAS_IPU_GRAPHCORE_EXAMPLES "
                    "names a copy of graphcore/examples (minutes each)")
    graphcore_port.write_ported(copy, paths, tmp_path)
    result = graphcore_port.run_ported(tmp_path, script, args, timeout=900, env=data)
    assert result.returncode == 0, result.stdout[-6000:]
    if success:
        assert success in result.stdout, result.stdout[-6000:]


@pytest.mark.parametrize(
    "paths, script, args, data, success",
    [case[1:] for case in UNEDITED], ids=[case[0] for case in UNEDITED])
def test_graphcore_script_runs_unedited_on_tensorflow(tmp_path, paths, script, args, data,
                                                      success):
    copy = graphcore_port.examples_copy()
    if copy is None:
        pytest.skip("Graphcore's tutorials run when KERAS_IPU_GRAPHCORE_EXAMPLES "
                    "names a copy of graphcore/examples (minutes each)")
    graphcore_port.write_ported(copy, paths, tmp_path, edit=False)
    result = graphcore_port.run_ported(tmp_path, script, args, timeout=900,
                                       env=dict(data, TF_CPP_MIN_LOG_LEVEL="2"),
                                       backend="tensorflow")
    assert result.returncode == 0, result.stdout[-6000:]
    if success:
        assert success in result.stdout, result.stdout[-6000:]
