"""Which IPUStrategy is in scope.

`with strategy.scope():` pushes the strategy on this thread's stack;
Keras models created meanwhile get the IPU extensions (models/extension.py)
and remember the strategy, as Graphcore's IPUStrategy does. Entering the
scope of a different strategy inside one fails with TensorFlow's message.
This module is imported by every model's constructor: it stays light.
"""

import contextlib
import threading

from keras_ipu.device.thread_stack import ThreadStack

_strategies = ThreadStack()
_local = threading.local()


def current_strategy():
    """The strategy whose scope the calling thread is in, or None."""
    return _strategies.top()


@contextlib.contextmanager
def strategy_scope(strategy):
    current = _strategies.top()
    if current is not None and current is not strategy:
        raise ValueError(
            f"Mixing different tf.distribute.Strategy objects: {strategy} is "
            f"not {current}"
        )
    with _strategies.pushed(strategy):
        yield strategy


def current_pipeline_stage():
    """The stage of the innermost PipelineStage context, or None."""
    return getattr(_local, "pipeline_stage", None)


def set_pipeline_stage(stage):
    _local.pipeline_stage = stage


def on_model_created(model):
    """Called by every Keras model's constructor under the ipu backend: a
    model made in an IPUStrategy scope, or while a keras.distribution is
    set (keras_distribution.py), gets the IPU extensions."""
    strategy = current_strategy()
    if strategy is None:
        strategy = _keras_distribution_strategy()
    if strategy is None:
        return
    strategy._patch_keras_extension(model)


def _keras_distribution_strategy():
    from keras.src.backend.common import global_state

    distribution = global_state.get_global_attribute("distribution")
    if distribution is None:
        return None
    # Imported only when a distribution is set: this module stays light.
    from keras_ipu.distribute.keras_distribution import KerasDistributionStrategy

    return KerasDistributionStrategy(distribution)
