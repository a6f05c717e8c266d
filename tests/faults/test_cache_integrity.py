"""The on-disk executable cache: a changed entry is never used, a killed
writer's temporary file is cleaned up, entries are readable by the group."""

import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.compiler.cache import SUFFIX
from keras_ipu.device.compiler.cache import CacheWarning
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import REGISTRY

SCALE = np.float32(1.2345678)  # a constant whose bytes are easy to find


def _graph():
    x = Var(ShapedArray((4,), np.float32))
    y = Var(ShapedArray((4,), np.float32))
    graph = Graph()
    graph.inputs = [x]
    graph.nodes = [Node(REGISTRY["mul"], [x, Literal(np.full(4, SCALE))], {}, [y])]
    graph.outputs = [y]
    return graph


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={tmp_path}")
    return tmp_path


def _entries(directory):
    return [n for n in os.listdir(directory) if n.endswith(SUFFIX) and not n.startswith(".")]


def test_a_flipped_bit_in_a_stored_constant_is_recompiled(cache_dir):
    ExecutableCache().get(_graph())
    (name,) = _entries(cache_dir)
    path = cache_dir / name
    data = bytearray(path.read_bytes())
    at = bytes(data).find(SCALE.tobytes())
    assert at > 0
    data[at + 2] ^= 0x10  # 1.2345678 -> another float
    path.write_bytes(bytes(data))

    cache = ExecutableCache()
    with pytest.warns(CacheWarning, match="checksum") as caught:
        exe = cache.get(_graph())
    assert caught[0].filename == __file__  # the warning points at the caller
    assert cache.stats["disk_errors"] == 1 and cache.stats["compiles"] == 1
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(exe.run(x)[0], x * SCALE)
    # Replaced: the next process uses it.
    again = ExecutableCache()
    np.testing.assert_array_equal(again.get(_graph()).run(x)[0], x * SCALE)
    assert again.stats["disk_hits"] == 1


def test_entries_are_readable_by_the_group(cache_dir):
    old = os.umask(0o022)
    try:
        ExecutableCache().get(_graph())
    finally:
        os.umask(old)
    (name,) = _entries(cache_dir)
    mode = stat.S_IMODE(os.stat(cache_dir / name).st_mode)
    assert mode & stat.S_IRGRP and mode & stat.S_IROTH, oct(mode)


_KILLED_WRITER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import test_cache_integrity as t
    from keras_ipu.device.compiler import ExecutableCache

    def stuck(src, dst):  # the entry is written, the rename never comes
        print("written", flush=True)
        time.sleep(600)

    os.replace = stuck
    ExecutableCache().get(t._graph())
""")


def test_a_killed_writers_temporary_file_is_removed(cache_dir):
    here = os.path.dirname(__file__)
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER.format(tests=here)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        assert child.stdout.readline().strip() == "written"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    left = os.listdir(cache_dir)
    assert len(left) == 1 and left[0].startswith(".tmp-") and not _entries(cache_dir)
    # An old temporary file of another host's writer, and a live writer's.
    other_host = cache_dir / f".tmp-elsewhere-1-abcd-x{SUFFIX}"
    other_host.write_bytes(b"partial")
    os.utime(other_host, (0, 0))
    live = cache_dir / f".tmp-elsewhere-2-abcd-y{SUFFIX}"
    live.write_bytes(b"partial")

    cache = ExecutableCache()
    cache.get(_graph())
    assert cache.stats["compiles"] == 1
    assert sorted(os.listdir(cache_dir)) == sorted([live.name] + _entries(cache_dir))
