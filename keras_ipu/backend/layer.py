"""The backend mixin of every Keras layer (`keras.layers.Layer` inherits it).

Keras gives each backend a place to hook into layers: JAX uses it for Flax
NNX modules, TensorFlow for tf.Module tracking. Eager execution on the host
needs nothing there, and a compiled step (issue 3) reads variables through
Keras' StatelessScope, not through the layer, so the mixin is empty for now.
It is the place for per-layer IPU state when layers get some (pipeline stage
assignment, recomputation checkpoints).
"""


class IPULayer:
    pass
