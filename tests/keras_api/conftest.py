import pytest

from keras_ipu.device.simulator import system as sim


@pytest.fixture(autouse=True)
def fresh_ipu_system(monkeypatch):
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    sim.clear_system()
    yield
    sim.clear_system()
