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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))
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
