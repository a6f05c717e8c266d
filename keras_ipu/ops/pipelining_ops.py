"""keras_ipu.ops.pipelining_ops: Graphcore's
`tensorflow.python.ipu.ops.pipelining_ops`: the pipelining options Keras
models take (PipelineSchedule, RecomputationMode, PipelineStageOptions) and
the functional pipeline of TensorFlow code (pipeline,
OptimizerFunctionOutput: keras_ipu/ops/functional_pipeline.py;
recomputation_checkpoint: keras_ipu/ops/recomputation_checkpoint.py).

The schedule and the recomputation mode change what the simulator predicts
(time and memory per IPU), never the values a pipeline computes.
"""

import enum
from functools import reduce  # noqa: F401 (in Graphcore's module namespace)

from keras_ipu.device.compiler import recompute as _recompute


class PipelineSchedule(enum.IntEnum):
    """How the stages of a pipeline share the IPUs' time.

    Grouped: the forward passes of all stages run together, then the
    backward passes (more activations stashed, less waiting: the default).
    Interleaved: a backward pass runs as soon as its forward pass made its
    activations (less memory, slower when forward and backward differ).
    Sequential: one stage at a time, as a sharded model (a debug mode).
    """

    Grouped = 0
    Interleaved = 1
    Sequential = 2


# The compiler's recomputation pass (device/compiler/recompute.py) takes
# these members: Auto, RecomputeThenBackpropagate,
# RecomputeAndBackpropagateInterleaved (Graphcore's values). A pipeline
# resolves Auto by its schedule (models/options.py), as Poplar does.
RecomputationMode = _recompute.RecomputationMode


class PipelineStageOptions:
    """Poplar options of the convolutions, matmuls and slices of one
    pipeline stage (forward, backward or weight update), as Graphcore's.
    The simulator's planner has no such options: they are checked and kept
    (and shown in reports), and change no prediction."""

    def __init__(self, convolution_options=None, matmul_options=None, slice_options=None):
        convolution_options = convolution_options if convolution_options else {}
        if not isinstance(convolution_options, dict):
            raise TypeError("PipelineStageOptions.convolution_options must be dictionary.")
        matmul_options = matmul_options if matmul_options else {}
        if not isinstance(matmul_options, dict):
            raise TypeError("PipelineStageOptions.matmul_options must be dictionary.")
        slice_options = slice_options if slice_options else {}
        if not isinstance(slice_options, dict):
            raise TypeError("PipelineStageOptions.slice_options must be dictionary.")
        self.convolution_options = dict(convolution_options)
        self.matmul_options = dict(matmul_options)
        self.slice_options = dict(slice_options)

    def __repr__(self):
        return (f"PipelineStageOptions(convolution_options={self.convolution_options}, "
                f"matmul_options={self.matmul_options}, slice_options={self.slice_options})")


# The functional (TensorFlow) pipeline API: keras_ipu/ops/functional_pipeline.py.
from keras_ipu.ops.functional_pipeline import OptimizerFunctionOutput  # noqa: E402
from keras_ipu.ops.functional_pipeline import pipeline  # noqa: E402
from keras_ipu.ops.recomputation_checkpoint import recomputation_checkpoint  # noqa: E402, F401
