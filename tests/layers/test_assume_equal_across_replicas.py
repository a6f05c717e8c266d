"""AssumeEqualAcrossReplicas: the values and gradients pass through; the
marker reaches the compiled program for the replication pass to read."""

import keras
import numpy as np

from keras_ipu import layers
from keras_ipu.device.jit import jit
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.ir import ShapedArray
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

X = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)


def test_values_pass_through_and_the_marker_is_in_the_program():
    layer = layers.AssumeEqualAcrossReplicas(inplace=True)
    np.testing.assert_array_equal(np.asarray(layer(X)), X)
    graph, _ = trace_flat(lambda x: [layer(x)], [ShapedArray(X.shape, X.dtype)])
    (node,) = graph.nodes
    assert node.primitive.name == "assume_equal_across_replicas"
    assert node.params == {"inplace": True}
    both = jit(lambda a, b: layer([a, b]))(X, X + 1)
    np.testing.assert_array_equal(both[1], X + 1)


def test_trains_like_the_model_without_it(tmp_path):
    def model(marked):
        keras.utils.set_random_seed(0)
        inp = keras.Input((4,))
        x = keras.layers.Dense(3)(inp)
        if marked:
            x = layers.AssumeEqualAcrossReplicas()(x)
        m = keras.Model(inp, keras.layers.Dense(1)(x))
        m.compile(optimizer="sgd", loss="mse")
        m.fit(X, X[:, :1], epochs=2, verbose=0)
        return m

    marked, plain = model(True), model(False)
    for a, b in zip(marked.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    saved_and_loaded(marked, tmp_path, X)
    assert config_round_trip(layers.AssumeEqualAcrossReplicas(inplace=True)).inplace
