"""CTCInferenceLayer under KERAS_BACKEND=tensorflow, run as a script (the
test session runs the ipu backend): eagerly (Keras' TensorFlow ctc_decode,
TensorFlow's decoder) and compiled through the TensorFlow front end (the
device's beam search). Prints one JSON object on its last line."""

import json
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import bridge
    from keras_ipu.layers import CTCInferenceLayer

    time, batch, classes = 6, 2, 4
    log_probs = tf.nn.log_softmax(np.random.default_rng(5).normal(
        size=(time, batch, classes)).astype("float32") * 2).numpy()
    lengths = np.array([6, 4], "int32")
    layer = CTCInferenceLayer(blank_index=0, beam_width=16, top_paths=2)
    eager = [t.numpy().tolist() for t in layer(log_probs, lengths)]
    compiled = bridge(tf.function(lambda d, n: layer(d, n), jit_compile=True))
    on_ipu = [t.numpy().tolist() for t in compiled(tf.constant(log_probs), tf.constant(lengths))]
    print(json.dumps({"eager": eager, "ipu": on_ipu}))


if __name__ == "__main__":
    main()
