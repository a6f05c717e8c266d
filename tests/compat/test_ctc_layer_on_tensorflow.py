"""keras_ipu.layers.CTCInferenceLayer in tf.keras code compiled through the
TensorFlow front end: Keras' TensorFlow decoder has no XLA kernel, so on
the front end the layer runs the device's beam search (as
nn_ops.ctc_beam_search_decoder); its outputs equal the eager layer's
(TensorFlow's decoder) with a beam wide enough for both searches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")


def test_the_compiled_layer_gives_the_eager_layers_outputs():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    script = Path(__file__).parent / "ctc_layer_on_tensorflow.py"
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (probs, lengths, labels), (want_probs, want_lengths, want_labels) = out["ipu"], out["eager"]
    np.testing.assert_allclose(probs, want_probs, rtol=1e-4)
    assert lengths == want_lengths and labels == want_labels
    assert np.asarray(labels).shape == (2, 2, 6)
