"""The IPU extensions of a Keras model made in an IPUStrategy scope.

As Graphcore's IPUStrategy does (keras_extensions.py of its TensorFlow),
the model's class is swapped for a subclass of it with the extension
methods mixed in, under the same name; a model made outside any scope
keeps its class.
"""


def attach(model, strategy):
    """Give `model` (being constructed) the IPU extensions of `strategy`."""
    model._ipu_strategy = strategy
