import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.compiler.cache import SUFFIX
from keras_ipu.device.compiler.cache import CacheWarning
from keras_ipu.device.compiler.fingerprint import fingerprint


def _graph(scale=2.0, shape=(3,)):
    def body(b, x):
        return b.op("exp", b.op("mul", x, lit(scale, "float32")))

    return build([aval(shape)], body)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={tmp_path}")
    return tmp_path


def test_fingerprint_is_structural():
    assert fingerprint(_graph()) == fingerprint(_graph())  # fresh Vars
    assert fingerprint(_graph()) != fingerprint(_graph(scale=3.0))
    assert fingerprint(_graph()) != fingerprint(_graph(shape=(4,)))


def test_memory_cache_hits(monkeypatch):
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    cache = ExecutableCache()
    a = cache.get(_graph())
    b = cache.get(_graph())
    assert a is b
    assert cache.stats["compiles"] == 1 and cache.stats["memory_hits"] == 1
    c = cache.get(_graph(), CompileOptions(fuse_elementwise=False))
    assert c is not a and cache.stats["compiles"] == 2


def test_disk_entry_is_written_atomically_and_reused(cache_dir):
    first = ExecutableCache()
    exe = first.get(_graph())
    files = os.listdir(cache_dir)
    assert len(files) == 1 and files[0].endswith(SUFFIX)  # no temp file left
    second = ExecutableCache()  # a fresh process's empty memory cache
    again = second.get(_graph())
    assert second.stats["disk_hits"] == 1 and second.stats["compiles"] == 0
    x = np.array([0.0, 1.0, -1.0], np.float32)
    np.testing.assert_array_equal(again.run(x)[0], exe.run(x)[0])


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stale"])
def test_bad_entry_is_recompiled_with_a_warning(cache_dir, damage):
    ExecutableCache().get(_graph())
    (name,) = os.listdir(cache_dir)
    path = cache_dir / name
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x00not an executable")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        magic = b"keras_ipu executable\n"
        entry = pickle.loads(data[len(magic) + 32:])  # after the SHA-256
        entry["version"] = -1
        stale = pickle.dumps(entry)
        path.write_bytes(magic + hashlib.sha256(stale).digest() + stale)
    cache = ExecutableCache()
    with pytest.warns(CacheWarning, match="recompiling"):
        exe = cache.get(_graph())
    assert cache.stats["disk_errors"] == 1 and cache.stats["compiles"] == 1
    x = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(exe.run(x)[0], np.exp(2 * x), rtol=1e-6)
    # The entry was replaced: the next process hits it without warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = ExecutableCache()
        fresh.get(_graph())
    assert fresh.stats["disk_hits"] == 1


def test_unwritable_cache_dir_only_costs_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={blocker}/sub")
    cache = ExecutableCache()
    exe = cache.get(_graph())
    assert cache.stats["disk_write_errors"] == 1
    assert exe.run(np.zeros(3, np.float32))[0].tolist() == [1.0, 1.0, 1.0]


_SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    import numpy as np
    import keras
    from keras import ops
    from keras_ipu.device.compiler import CACHE
    from keras_ipu.device.jit import jit

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    @jit
    def forward(x, w):
        return ops.softmax(ops.relu(ops.matmul(x, w) + 1.0))

    x = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    w = np.linspace(1, -1, 8, dtype="float32").reshape(4, 2)
    out = forward(x, w)
    print(json.dumps({"stats": dict(CACHE.stats), "out": out.tolist()}))
    """
)


def test_second_process_hits_the_disk_cache(tmp_path):
    env = dict(os.environ)
    env["KERAS_BACKEND"] = "ipu"
    env["TF_POPLAR_FLAGS"] = f"--executable_cache_path={tmp_path}"

    def run():
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
            text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    first, log1 = run()
    second, log2 = run()
    assert first["stats"] == {"compiles": 1, "disk_writes": 1}
    assert second["stats"] == {"disk_hits": 1}
    assert "executable cache hit" in log2 and "executable cache hit" not in log1
    assert first["out"] == second["out"]
