"""One pytree module for the device layer (autodiff, jit): None is an empty
subtree everywhere."""

import collections

import keras  # noqa: F401 (the ipu backend gives Tracers their operators)
import numpy as np
import pytest

from keras_ipu.device import autodiff
from keras_ipu.device import pytree
from keras_ipu.device.jit import jit

Pair = collections.namedtuple("Pair", "a b")


def test_round_trip_and_none_is_empty():
    tree = {"b": [1, None, (2, 3)], "a": Pair(4, {"z": 5})}
    leaves, treedef = pytree.flatten(tree)
    assert leaves == [4, 5, 1, 2, 3]  # dict keys sorted
    assert pytree.unflatten(treedef, leaves) == tree
    assert pytree.count_leaves(treedef) == 5
    assert pytree.flatten(None) == ([], None)
    hash(treedef)  # jit keys on it


def test_flatten_like_reads_none_as_a_zero_subtree():
    _, treedef = pytree.flatten((1, [2, 3]))
    assert pytree.flatten_like(treedef, (7, None)) == [7, None, None]
    with pytest.raises(ValueError, match="2 entries where the structure has 1"):
        pytree.flatten_like(pytree.flatten([1])[1], [1, 2])


def test_jit_and_autodiff_agree_about_none():
    f = jit(lambda x, nothing, y: (x * 2, None, y + 1))
    out = f(np.ones(2, np.float32), None, np.zeros(2, np.float32))
    assert out[1] is None and out[0].tolist() == [2, 2] and out[2].tolist() == [1, 1]
    g = autodiff.grad(lambda p: (p["w"] * p["w"]).sum() if p["n"] is None else 0.0)
    grads = g({"w": np.arange(3.0, dtype=np.float32), "n": None})
    assert grads["n"] is None and np.asarray(grads["w"]).tolist() == [0, 2, 4]
