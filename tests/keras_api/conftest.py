import pytest

from keras_ipu.device.config import system_config


@pytest.fixture(autouse=True)
def fresh_ipu_system(monkeypatch):
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    system_config.reset_ipu_configuration()
    yield
    system_config.reset_ipu_configuration()
