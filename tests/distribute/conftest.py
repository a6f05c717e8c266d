import os
import sys

import keras
import pytest

from keras_ipu.device.config import system_config

# The Keras API tests' shared helpers (ipu_keras_helpers: configure).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "keras_api"))


@pytest.fixture(autouse=True)
def fresh_system_and_no_distribution():
    """Each test starts and ends on the default IPU system, outside any
    keras.distribution."""
    system_config.reset_ipu_configuration()
    keras.distribution.set_distribution(None)
    yield
    keras.distribution.set_distribution(None)
    system_config.reset_ipu_configuration()
