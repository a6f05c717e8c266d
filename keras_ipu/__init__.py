"""keras_ipu: Keras 3 on a simulated Graphcore IPU.

The public namespace is shaped like `tensorflow.python.ipu`; submodules are
imported lazily so that `import keras_ipu` stays light (no TensorFlow).
"""

__version__ = "0.1.0"
