"""Graphcore's TensorFlow 2 Keras tutorials as the referee: read a script
from a copy of graphcore/examples (never committed here), apply the
porting contract's import edits (DESIGN.md, "Porting contract"), and run it
under KERAS_BACKEND=ipu with small synthetic data in place of the datasets
it downloads; or run it with no edit at all under KERAS_BACKEND=tensorflow
(zero-edit porting: the import hook's aliases).

Where the copy is: $KERAS_IPU_GRAPHCORE_EXAMPLES (a checkout, or the git
directory of a mirror). Without it the runs skip.
"""

import os
import pathlib
import re
import subprocess
import sys

# The contract's edits, in order (a later rule sees the earlier's output).
_EDITS = [
    (r"^(\s*)from tensorflow\.python import ipu\b", r"\1import keras_ipu as ipu"),
    (r"^(\s*)from tensorflow\.python\.ipu(\.[\w.]+)? import ", r"\1from keras_ipu\2 import "),
    (r"^(\s*)import tensorflow\.keras as keras\b", r"\1import keras"),
    (r"^(\s*)from tensorflow import keras\b", r"\1import keras"),
    (r"^(\s*)from tensorflow\.keras import ipu$", r"\1from keras_ipu import keras as ipu"),
    (r"^(\s*)from tensorflow\.keras(\.[\w.]+)? import ", r"\1from keras\2 import "),
    (r"\btf\.keras\.ipu\.", "ipu.keras."),
    (r"(?<![\w.])keras\.ipu\.", "ipu.keras."),
    (r"\btf\.keras\.", "keras."),
    (r"^(\s*)from ipu_tensorflow_addons\.keras import layers\b", r"\1from keras_ipu import layers"),
    (r"^(\s*)from ipu_tensorflow_addons\.keras\.layers import ", r"\1from keras_ipu.layers import "),
    (r"^(\s*)import ipu_tensorflow_addons\.keras\.layers as ", r"\1import keras_ipu.layers as "),
]


def port(source):
    """`source` after the porting contract's mechanical edits. A script
    that used `tf.keras.X` or `keras.ipu.X` without importing keras or
    ipu gets the import (the contract's `keras.X` / `ipu.keras.X` need
    them)."""
    text = source
    for pattern, replacement in _EDITS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    header = []
    if re.search(r"(?<![\w.])keras\.", text) and not re.search(
            r"^\s*import keras\b", text, re.MULTILINE):
        header.append("import keras")
    if re.search(r"(?<![\w.])ipu\.keras\.", text) and not re.search(
            r"^\s*(import keras_ipu as ipu|from keras_ipu import keras as ipu)\b",
            text, re.MULTILINE):
        header.append("import keras_ipu as ipu")
    return "".join(line + "\n" for line in header) + text


def examples_copy():
    """(kind, path) of the graphcore/examples copy: ("tree", checkout) or
    ("git", git directory); None when there is none."""
    configured = os.environ.get("KERAS_IPU_GRAPHCORE_EXAMPLES")
    if not configured:
        return None
    root = pathlib.Path(configured)
    if (root / "tutorials").is_dir():
        return "tree", root
    if (root / "HEAD").is_file() and (root / "objects").is_dir():
        return "git", root
    raise FileNotFoundError(
        f"KERAS_IPU_GRAPHCORE_EXAMPLES={configured!r} is neither a checkout of "
        "graphcore/examples (no tutorials/ folder) nor a git directory of one; "
        "point it at one, or unset it to skip Graphcore's tutorials.")


def read_example(copy, path):
    kind, root = copy
    if kind == "tree":
        return (root / path).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(root), "show", f"HEAD:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


# Run before the ported script (its own module, sitecustomize-style):
# keras.datasets downloads become synthetic data of the same shapes and
# types (MNIST: uint8 28x28 images; IMDB: word-index lists with labels;
# CIFAR-10: uint8 32x32x3 images, labels of shape (n, 1)) and of the sizes
# given by the environment, at keras.datasets and at the tf.keras path
# (keras._tf_keras.keras.datasets) unedited scripts import.
SYNTHETIC_DATA = '''
import os
import numpy as np
import keras


def _synthetic_mnist(path="mnist.npz"):
    n_train = int(os.environ.get("GRAPHCORE_PORT_TRAIN", "2048"))
    n_test = int(os.environ.get("GRAPHCORE_PORT_TEST", "512"))
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 256, size=(10, 28, 28))

    def sample(n):
        y = rng.integers(0, 10, n).astype("uint8")
        noise = rng.integers(-40, 41, size=(n, 28, 28))
        return np.clip(templates[y] + noise, 0, 255).astype("uint8"), y

    return sample(n_train), sample(n_test)


def _synthetic_imdb(path="imdb.npz", num_words=None, skip_top=0, maxlen=None, seed=113,
                    start_char=1, oov_char=2, index_from=3, **kwargs):
    n_train = int(os.environ.get("GRAPHCORE_PORT_TRAIN", "2048"))
    n_test = int(os.environ.get("GRAPHCORE_PORT_TEST", "512"))
    rng = np.random.default_rng(seed)
    words = num_words or 20000

    def sample(n):
        y = rng.integers(0, 2, n).astype("int64")
        lengths = rng.integers(20, 200, n)
        x = [[start_char] + list(rng.integers(index_from + 1, words, length) // (1 + label))
             for length, label in zip(lengths, y)]
        x = np.array(x, dtype=object)
        return x, y

    return sample(n_train), sample(n_test)


def _synthetic_cifar10():
    n_train = int(os.environ.get("GRAPHCORE_PORT_TRAIN", "2048"))
    n_test = int(os.environ.get("GRAPHCORE_PORT_TEST", "512"))
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 256, size=(10, 32, 32, 3))

    def sample(n):
        y = rng.integers(0, 10, (n, 1)).astype("uint8")
        noise = rng.integers(-40, 41, size=(n, 32, 32, 3))
        return np.clip(templates[y[:, 0]] + noise, 0, 255).astype("uint8"), y

    return sample(n_train), sample(n_test)


_SYNTHETIC = {"mnist": _synthetic_mnist, "imdb": _synthetic_imdb, "cifar10": _synthetic_cifar10}
for _name, _fn in _SYNTHETIC.items():
    getattr(keras.datasets, _name).load_data = _fn
if keras.backend.backend() == "tensorflow":
    import importlib

    for _name, _fn in _SYNTHETIC.items():
        importlib.import_module(f"keras._tf_keras.keras.datasets.{_name}").load_data = _fn
'''


def write_ported(copy, paths, directory, edit=True):
    """Write the ported scripts of `paths` (repository paths) into
    `directory` by their base names (as they are with edit=False), and
    `graphcore_synthetic.py`; returns the directory."""
    directory = pathlib.Path(directory)
    for path in paths:
        source = read_example(copy, path)
        (directory / pathlib.PurePosixPath(path).name).write_text(
            port(source) if edit else source)
    (directory / "graphcore_synthetic.py").write_text(SYNTHETIC_DATA)
    return directory


def run_ported(directory, script, args=(), timeout=600, env=None, backend="ipu"):
    """Run `script` (in `directory`) under KERAS_BACKEND=`backend` with the
    synthetic data; returns the CompletedProcess (stdout and stderr
    together)."""
    runner = (
        "import runpy, sys; import graphcore_synthetic; "
        f"sys.argv = [{script!r}] + {list(args)!r}; "
        f"runpy.run_path({script!r}, run_name='__main__')"
    )
    environment = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(directory))
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", runner], cwd=directory, env=environment, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
