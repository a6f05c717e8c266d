"""Keras layers made for the IPU: Graphcore's `ipu_tensorflow_addons.keras.layers`
(and `tensorflow.python.ipu.keras.layers`) on KERAS_BACKEND=ipu.

Every layer is registered for `.keras` files ("keras_ipu>Name").
"""

from keras_ipu.layers.ctc import CTCInferenceLayer
from keras_ipu.layers.ctc import CTCLoss
from keras_ipu.layers.ctc import CTCPredictionsLayer
from keras_ipu.layers.dropout import Dropout
from keras_ipu.layers.embedding import Embedding
from keras_ipu.layers.normalization import GroupNorm
from keras_ipu.layers.normalization import GroupNormalization
from keras_ipu.layers.normalization import InstanceNorm
from keras_ipu.layers.normalization import InstanceNormalization
from keras_ipu.layers.normalization import LayerNorm
from keras_ipu.layers.normalization import LayerNormalization
from keras_ipu.layers.recomputation import RecomputationCheckpoint
from keras_ipu.layers.replicas import AssumeEqualAcrossReplicas
from keras_ipu.layers.rnn import GRU
from keras_ipu.layers.rnn import LSTM
from keras_ipu.layers.rnn import PopnnGRU
from keras_ipu.layers.rnn import PopnnLSTM
from keras_ipu.layers.serial_dense import SerialDense

__all__ = [
    "AssumeEqualAcrossReplicas",
    "CTCInferenceLayer",
    "CTCLoss",
    "CTCPredictionsLayer",
    "Dropout",
    "Embedding",
    "GRU",
    "GroupNorm",
    "GroupNormalization",
    "InstanceNorm",
    "InstanceNormalization",
    "LSTM",
    "LayerNorm",
    "LayerNormalization",
    "PopnnGRU",
    "PopnnLSTM",
    "RecomputationCheckpoint",
    "SerialDense",
]
