"""What the IPU layers share: their registration for `.keras` files and
Graphcore's error for the Keras arguments they keep only for API
compatibility."""

import keras

# Registered as "keras_ipu>ClassName", so saving and loading a model that
# uses them needs only `import keras_ipu.layers`.
PACKAGE = "keras_ipu"


def serializable(cls):
    return keras.saving.register_keras_serializable(package=PACKAGE)(cls)


def check_unsupported(layer, value, arg_name, method="__init__"):
    """Graphcore's NotImplementedError (its text, with our module's name) for
    an argument the IPU layer accepts, for API consistency with its Keras
    namesake, but does not implement."""
    if value:
        name = type(layer).__name__
        raise NotImplementedError(
            f"keras_ipu.layers.{name} does not support "
            f"{method} argument {arg_name}. It is included for API consistency "
            f"with keras.{name}."
        )
