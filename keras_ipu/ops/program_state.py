"""Variables that are a compiled program's own working state.

Some of Graphcore's operations keep state between iterations that Poplar
holds in device buffers of the program, not in TensorFlow variables: the
gradient accumulators and micro-batch counter of GradientAccumulation-
OptimizerV2 and of a pipeline (and its accumulated outfeed), a FIFO's ring
buffer. keras_ipu keeps them in TensorFlow variables (the compiled program
reads and writes them like any other), and marks them here so that what
exports a program can tell them from the user's variables: an application
executable (application_compile_op) carries them inside, starting from
their value at compile time and kept between the runtime's runs, where
Graphcore's executable has no input for them.
"""

_MARK = "_keras_ipu_program_state"


def mark(*variables):
    """Mark `variables` (tf.Variables) as program state; returns them."""
    for variable in variables:
        setattr(variable, _MARK, True)
    return variables


def is_program_state(variable):
    return bool(getattr(variable, _MARK, False))
