"""Front ends: programs written for other frameworks, imported into the
keras_ipu IR and compiled for the simulated IPU (tensorflow/: TensorFlow
functions through XLA HLO)."""
