import pytest

from keras_ipu.device.config import system_config


@pytest.fixture(autouse=True)
def fresh_ipu_system(monkeypatch):
    """Each test starts and ends with no configured system and no TF_POPLAR_FLAGS."""
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    system_config.reset_ipu_configuration()
    yield
    system_config.reset_ipu_configuration()
