"""sharding: reading and propagating the `_XlaSharding` marks ipu_shard
puts on a TensorFlow graph's ops."""

import warnings

import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import sharding  # noqa: E402


def build():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(1.0, name="a")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with ipu.scopes.ipu_shard(1):
                b = tf.add(a, 2.0, name="b")
        with g.colocate_with(b.op):
            c = tf.identity(b, name="c")
        d = tf.multiply(c, 3.0, name="d")
    return g, a, b, c, d


def test_marks_are_read_and_follow_colocation():
    g, a, b, c, d = build()
    assert sharding.has_attr(b.op, "_XlaSharding") and not sharding.has_attr(a.op, "_XlaSharding")
    assert sharding.get_sharding(b.op) == [1]
    assert sharding.get_sharding(c.op) is None
    assert sharding.get_shard_from_colocation(c.op) == b.op.get_attr("_XlaSharding")
    sharding.propagate_sharding(g)
    assert sharding.get_sharding(c.op) == [1]
    assert sharding.get_sharding(d.op) is None  # not co-located with anything


def test_dependencies_are_the_ancestors():
    g, a, b, c, d = build()
    names = {op.name for op in sharding.dependencies([d])}
    assert {"a", "b", "c", "d"} <= names
    assert "d" not in {op.name for op in sharding.dependencies([b.op])}
