"""Which recomputation the training program of a model compiles with
(CompileOptions.recomputation, the pass in device/compiler/recompute.py).

As on the IPU, recomputation is on only when the configured IPUConfig has
`allow_recompute = True`. A model that is not pipelined then gets the
compiler's default (CONFIGURED: Auto, which recomputes segment by segment
between RecomputationCheckpoint layers). A pipelined model uses the
`recomputation_mode` of set_pipelining_options (Auto resolved by the
schedule, unsupported pairs refused with Poplar's message, options.py),
and every stage recomputes from its own stored inputs. Recomputation
changes memory and time, never values.
"""

from keras_ipu.device.config import system_config
from keras_ipu.device.compiler.options import CONFIGURED


def allow_recompute():
    """IPUConfig.allow_recompute of the configured system."""
    return bool(system_config.configuration().allow_recompute)


def training_recomputation(model):
    """CompileOptions.recomputation for `model`'s training program."""
    if not model._ipu_is_pipelined():
        return CONFIGURED
    if not allow_recompute():
        return None
    return model._ipu_options.recomputation_mode
