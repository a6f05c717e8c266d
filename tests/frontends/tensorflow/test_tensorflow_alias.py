"""Zero-edit porting: `from tensorflow.python import ipu` is keras_ipu.

The import hook (keras_ipu/_hook.py, installed by the .pth file) maps
`tensorflow.python.ipu[.X]` to `keras_ipu[.X]`. Stock TensorFlow has no
such module, so nothing of TensorFlow's is shadowed; KERAS_IPU_TF_HOOK=0
turns the alias off. Each check runs in a fresh interpreter (the .pth runs
at start-up).
"""

import json
import os
import subprocess
import sys

CHECK = r"""
import json, sys
from tensorflow.python import ipu
import keras_ipu
from tensorflow.python.ipu import ipu_outfeed_queue, config
from tensorflow.python.ipu.ipu_infeed_queue import IPUInfeedQueue
import tensorflow.python.ipu.loops as loops
from tensorflow.python.ipu.utils import reset_ipu_seed
import tensorflow as tf
print(json.dumps({
    "same": ipu is keras_ipu,
    "outfeed": ipu_outfeed_queue.__name__,
    "config": config.__name__,
    "infeed": IPUInfeedQueue.__module__,
    "loops": loops is keras_ipu.loops,
    "spec": keras_ipu.__spec__.name,
    "aliases": sorted(n for n in sys.modules if n.startswith("tensorflow.python.ipu")),
    "tf_has_ipu_attr": hasattr(tf, "ipu"),
}))
"""


def _run(code, **env):
    # A hang guard: a script importing TensorFlow took 55-75 s beside the
    # whole suite (pytest -n 2 at load 5-8).
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))
    return proc


def test_tensorflow_python_ipu_is_keras_ipu():
    proc = _run(CHECK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["same"] and got["loops"]
    assert got["outfeed"] == "keras_ipu.ipu_outfeed_queue"
    assert got["config"] == "keras_ipu.config"
    assert got["infeed"] == "keras_ipu.ipu_infeed_queue"
    assert got["spec"] == "keras_ipu"  # keras_ipu keeps its own identity
    # Only names under tensorflow.python.ipu are aliases; TensorFlow's own
    # namespace gains nothing.
    assert all(n == "tensorflow.python.ipu" or n.startswith("tensorflow.python.ipu.")
               for n in got["aliases"])
    assert not got["tf_has_ipu_attr"]


def test_the_alias_can_be_turned_off():
    proc = _run("from tensorflow.python import ipu", KERAS_IPU_TF_HOOK="0")
    assert proc.returncode != 0
    assert "cannot import name 'ipu'" in proc.stderr


def test_unknown_submodules_are_not_found():
    proc = _run("import tensorflow.python.ipu.no_such_module")
    assert "No module named 'tensorflow.python.ipu.no_such_module'" in proc.stderr


TRAINER_CHECK = r"""
import json
import keras
from keras_ipu import ipu_strategy
from keras.src.backend.tensorflow import trainer
strategy = ipu_strategy.IPUStrategy()
with strategy.scope():
    inside = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
outside = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
print(json.dumps({"inside": getattr(inside, "_ipu_tf_strategy", None) is strategy,
                  "outside": hasattr(outside, "_ipu_tf_strategy"),
                  "patched": trainer.__loader__.__class__.__name__ == "_PatchingLoader"}))
"""


def test_tensorflow_trainer_patch_under_the_tensorflow_backend():
    """Under KERAS_BACKEND=tensorflow a model made in an IPUStrategy scope is
    attached to it (its fit/evaluate/predict compile through the front end);
    others are left alone; KERAS_IPU_TF_HOOK=0 leaves Keras as it is."""
    on = _run(TRAINER_CHECK, KERAS_BACKEND="tensorflow")
    assert on.returncode == 0, on.stderr[-3000:]
    assert json.loads(on.stdout.strip().splitlines()[-1]) == {
        "inside": True, "outside": False, "patched": True}
    off = _run(TRAINER_CHECK, KERAS_BACKEND="tensorflow", KERAS_IPU_TF_HOOK="0")
    assert off.returncode == 0, off.stderr[-3000:]
    assert json.loads(off.stdout.strip().splitlines()[-1]) == {
        "inside": False, "outside": False, "patched": False}


ALIASES_CHECK = r"""
import json
import keras as real_keras
# Imported after keras, tensorflow.keras is a second module of its own.
import tensorflow.keras as keras
import tensorflow as tf
from tensorflow.keras import ipu as tf_keras_ipu
import keras_ipu.keras
import keras_ipu.layers
import keras_ipu.optimizers
import keras_ipu.popdist.tensorflow
import ipu_tensorflow_addons.keras.layers as addons_layers
from ipu_tensorflow_addons.keras import optimizers as addons_optimizers
from ipu_tensorflow_addons.keras.layers import Dropout
import popdist
import popdist.tensorflow
from ipu_tensorflow_addons.v1 import layers as v1_layers
from keras_ipu.ipu_estimator import IPUEstimatorSpec

def error(fn, kind):
    try:
        fn()
    except kind as e:
        return str(e)
    return None

spec = tf.estimator.EstimatorSpec(mode=tf.estimator.ModeKeys.TRAIN, loss=1.0, train_op=2.0)
print(json.dumps({
    "keras.ipu": keras.ipu is keras_ipu.keras and real_keras.ipu is keras_ipu.keras,
    "from tensorflow.keras import ipu": tf_keras_ipu is keras_ipu.keras,
    "PipelineStage": keras.ipu.PipelineStage is keras_ipu.keras.PipelineStage,
    "addons layers": addons_layers is keras_ipu.layers and Dropout is keras_ipu.layers.Dropout,
    "addons optimizers": addons_optimizers is keras_ipu.optimizers,
    "popdist": popdist is keras_ipu.popdist,
    "popdist.tensorflow": popdist.tensorflow is keras_ipu.popdist.tensorflow,
    "v1": error(lambda: v1_layers.PopnnLSTM(8), NotImplementedError),
    "spec": [isinstance(spec, IPUEstimatorSpec), spec.mode, spec.loss],
    "other estimator names": error(lambda: tf.estimator.Estimator, AttributeError),
    "keras untouched": [real_keras.layers.Dense.__module__,
                        error(lambda: real_keras.no_such_name, AttributeError)],
}))
"""


def test_graphcore_module_names_resolve_to_keras_ipu():
    """keras.ipu (Graphcore's Keras fork), ipu_tensorflow_addons, popdist and
    tf.estimator's model-function names, with no import edit."""
    proc = _run(ALIASES_CHECK, KERAS_BACKEND="tensorflow")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("keras.ipu", "from tensorflow.keras import ipu", "PipelineStage",
                 "addons layers", "addons optimizers", "popdist", "popdist.tensorflow"):
        assert got[name] is True, name
    assert "TensorFlow 1 graph-mode Popnn RNN layers" in got["v1"]
    # An IPUEstimatorSpec (tf.estimator's keeps its export_outputs too).
    assert got["spec"] == [True, "train", 1.0]
    assert got["other estimator names"].startswith(
        "tf.estimator.Estimator: TensorFlow 2.16 removed tf.estimator.")
    assert "ipu.ipu_estimator.IPUEstimator" in got["other estimator names"]
    # Keras keeps its own modules and errors.
    assert got["keras untouched"] == [
        "keras.src.layers.core.dense", "module 'keras' has no attribute 'no_such_name'"]


def test_keras_ipu_under_the_ipu_backend():
    proc = _run("import keras, keras_ipu.keras\n"
                "assert keras.ipu is keras_ipu.keras\n"
                "assert keras.ipu.PipelineStage.__module__ == 'keras_ipu.models.pipeline_stage'\n",
                KERAS_BACKEND="ipu")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_aliases_are_off_with_the_hook():
    code = ("import importlib, json, keras, tensorflow as tf\n"
            "def fails(fn):\n"
            "    try:\n"
            "        fn()\n"
            "    except (ImportError, AttributeError):\n"
            "        return True\n"
            "    return False\n"
            "print(json.dumps([fails(lambda: keras.ipu), fails(lambda: tf.estimator),\n"
            "                  fails(lambda: importlib.import_module('popdist')),\n"
            "                  fails(lambda: importlib.import_module('ipu_tensorflow_addons'))]))\n")
    proc = _run(code, KERAS_BACKEND="tensorflow", KERAS_IPU_TF_HOOK="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True, True]


def test_an_installed_package_of_the_name_wins(tmp_path):
    """In Graphcore's SDK environment the real popdist and
    ipu_tensorflow_addons stay what is imported."""
    for name in ("popdist", "ipu_tensorflow_addons"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("REAL = True\n")
    proc = _run("import popdist, ipu_tensorflow_addons\n"
                "assert popdist.REAL and ipu_tensorflow_addons.REAL\n",
                PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
