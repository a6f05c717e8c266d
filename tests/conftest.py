"""Test-session setup shared by every test under tests/.

The whole suite tests the "ipu" backend, so KERAS_BACKEND is forced to "ipu"
here, before anything imports keras. A plain setdefault is not enough: a
shell with KERAS_BACKEND=tensorflow would silently run the suite (and Keras'
own tests) on TensorFlow. Tests that need another backend (the reference
runs in tests/models, the hook tests) start a subprocess with its own env.
"""

import importlib.util
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ["KERAS_BACKEND"] = "ipu"
# The suite checks the NumPy engine, the reference, deterministically (the
# default "auto" would move programs that run long enough to XLA in the
# background, by their timing). tests/compiler/test_xla_engine.py tests the
# XLA engine and the tiered default; `KERAS_IPU_ENGINE=xla pytest ...` runs
# any test file on XLA.
os.environ.setdefault("KERAS_IPU_ENGINE", "numpy")

if "keras" in sys.modules:  # a plugin imported keras before this file ran
    from keras.src.backend import backend as _keras_backend

    if _keras_backend() != "ipu":
        raise RuntimeError(
            f"keras was imported with backend {_keras_backend()!r} before "
            "tests/conftest.py could select 'ipu' (a pytest plugin imports "
            "keras at start-up). Run with KERAS_BACKEND=ipu."
        )


def _load_conformance_plugin():
    # Loaded by file path so that it works whatever --import-mode says and
    # without making tests/ a package.
    path = Path(__file__).parent / "keras_conformance" / "plugin.py"
    spec = importlib.util.spec_from_file_location(
        "keras_ipu_conformance_plugin", path
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_conformance = sys.modules.get("keras_ipu_conformance_plugin") or (
    _load_conformance_plugin()
)


def pytest_addoption(parser):
    _conformance.add_options(parser)


def pytest_configure(config):
    # Registered as a global plugin (not as hooks of this conftest) because
    # Keras' test files live in site-packages, outside tests/, where the
    # hooks of this conftest would not be called for them.
    if not config.pluginmanager.is_registered(_conformance):
        config.pluginmanager.register(_conformance, "keras_conformance")
    config.addinivalue_line(
        "markers",
        "numpy_engine: checks the NumPy engine's own kernels (NumPy's exact "
        "bits, in-place writes of donated arrays); skipped when the suite "
        "runs with KERAS_IPU_ENGINE=xla",
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KERAS_IPU_ENGINE") != "xla":
        return
    import pytest

    skip = pytest.mark.skip(reason="checks the NumPy engine's own kernels")
    for item in items:
        if item.get_closest_marker("numpy_engine"):
            item.add_marker(skip)


_TESTS = str(Path(__file__).parent) + os.sep
# Per module of tests/ imported so far: the names of its NumPy generators.
_generators = {}


def _test_module_generators():
    """The NumPy generators (np.random.Generator) the modules under tests/
    hold at module level."""
    for name in sys.modules.keys() - _generators.keys():
        module = sys.modules[name]
        path = getattr(module, "__file__", None) or ""
        _generators[name] = [] if not path.startswith(_TESTS) else [
            k for k, v in vars(module).items() if isinstance(v, np.random.Generator)]
    for name, names in _generators.items():
        module = sys.modules.get(name)
        for k in names:
            value = getattr(module, k, None)
            if isinstance(value, np.random.Generator):
                yield value


@pytest.fixture(autouse=True)
def _random_state_of_its_own(request):
    """Each test draws the same random numbers whatever ran before it in its
    worker: pytest-xdist hands tests to the workers as they come free, so
    that order changes from run to run (last session a test failed 36 times
    in 200 on the state its module's generator was left in). The module
    generators of tests/ start again from their seeds; Python's and NumPy's
    global generators (Keras draws unseeded initializers' seeds from
    Python's) from fixed ones; Keras' global seed generator (unseeded
    dropout and random ops) is made again from those. Keras' own tests keep
    Keras' setup (its TestCase's)."""
    if not request.node.nodeid.startswith(_conformance.NODEID_PREFIX):
        for rng in _test_module_generators():
            seeds = rng.bit_generator.seed_seq
            if getattr(seeds, "entropy", None) is not None:
                rng.bit_generator.state = type(rng.bit_generator)(seeds).state
        random.seed(0)
        np.random.seed(0)
        if "keras" in sys.modules:
            from keras.src.backend.common import global_state

            global_state.set_global_attribute("global_seed_generator", None)
    yield


_SYSTEM_CONFIG = "keras_ipu.device.config.system_config"


def _system_put_back():
    """Put the IPU system installed before back after (only where something
    else was installed: the module is not imported for that)."""
    module = sys.modules.get(_SYSTEM_CONFIG)
    before = module.configured_system() if module is not None else None
    yield
    module = sys.modules.get(_SYSTEM_CONFIG)
    if module is not None and module.configured_system() is not before:
        module.install_system(before)


@pytest.fixture(autouse=True, scope="module")
def _ipu_system_of_its_module():
    """What a module's fixtures configured stays for its tests and goes with
    the module."""
    yield from _system_put_back()


@pytest.fixture(autouse=True)
def _ipu_system_of_its_own():
    """Each test finds the IPU system its module left, whatever the tests
    before it in its worker configured: session 13's CI failed where a test
    that configured 2 IPUs and no reset ran before one that counted
    replicas (IPUStrategy.run runs one per IPU)."""
    yield from _system_put_back()


@pytest.fixture
def configure_ipus():
    """configure_ipus(n): the IPU system is one device of n IPUs (a
    pipeline or a sharded program needs one IPU per shard: Graphcore's
    compiler refuses a device whose IPUs its shards do not divide); the
    configuration is reset after the test."""
    from keras_ipu.config import IPUConfig
    from keras_ipu.device.config import system_config

    def configure(n):
        cfg = IPUConfig()
        cfg.auto_select_ipus = n
        cfg.configure_ipu_system()
        return cfg

    yield configure
    system_config.reset_ipu_configuration()


@pytest.fixture
def pool_not_backing_off(monkeypatch):
    """The host pools' back-off (device/native/threads.py) reset: a split
    runs on its threads even after late splits of earlier tests on a busy
    machine."""
    from keras_ipu.device.native import threads

    monkeypatch.setattr(threads, "_backoff", 0.0)
    monkeypatch.setattr(threads, "_late", 0)
    monkeypatch.setattr(threads, "_blocks_backoff", 0.0)


@pytest.fixture
def long_backoff(pool_not_backing_off, monkeypatch):
    """The back-off reset and a minute long once it starts (it is 0.1 s):
    a test checking that the runs after late splits are not split stays
    inside it however long a busy machine pauses the test between them;
    the state is put back afterwards."""
    from keras_ipu.device.native import threads

    monkeypatch.setattr(threads, "_resume_at", 0.0)
    monkeypatch.setattr(threads, "_blocks_resume_at", 0.0)
    monkeypatch.setattr(threads, "BACKOFF_SECONDS", 60.0)
