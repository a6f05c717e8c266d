"""library_preload: shared libraries loaded with the interpreter lock
released, and TensorFlow's import reusing what the preload loaded."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from keras_ipu.device.compiler import library_preload

# A library whose static initialiser runs until the file `go` appears in
# $PRELOAD_TEST_DIR (at most 20 s), and notes whether it saw it: a
# Python thread can only create that file while the library is being
# loaded if the load does not hold the interpreter lock.
_WAITING_LIBRARY = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void touch(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}

__attribute__((constructor)) static void wait_for_go(void) {
    const char *dir = getenv("PRELOAD_TEST_DIR");
    char go[4096];
    if (!dir) return;
    snprintf(go, sizeof go, "%s/go", dir);
    touch(dir, "started");
    for (int i = 0; i < 2000; i++) {
        if (access(go, F_OK) == 0) { touch(dir, "saw_go"); return; }
        usleep(10000);
    }
}
"""


def _compiler():
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def test_preload_releases_the_interpreter_lock(tmp_path, monkeypatch):
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler to build the test library")
    (tmp_path / "wait.c").write_text(_WAITING_LIBRARY)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libwait_test.so"),
                    str(tmp_path / "wait.c")], check=True)
    monkeypatch.setenv("PRELOAD_TEST_DIR", str(tmp_path))
    loaded = []
    thread = threading.Thread(
        target=lambda: loaded.extend(library_preload.preload(str(tmp_path), "libwait*.so")))
    thread.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # This thread runs Python while the other is inside the initialiser.
    (tmp_path / "go").write_text("")
    thread.join(60)
    assert loaded == [str(tmp_path / "libwait_test.so")]
    assert (tmp_path / "saw_go").exists(), "the load held the interpreter lock"


def test_preload_skips_what_does_not_load(tmp_path):
    (tmp_path / "libbroken.so").write_text("not a library")
    assert library_preload.preload(str(tmp_path), "lib*.so") == []
    assert library_preload.preload(str(tmp_path / "missing"), "lib*.so") == []


_IMPORT_AFTER_PRELOAD = textwrap.dedent(
    """
    import sys
    from keras_ipu.device.compiler import tensorflow_runtime

    def bases():
        # Where each TensorFlow library is mapped: a second load would
        # map it again at another address.
        found = {}
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libtensorflow" in path:
                    start = int(line.split("-")[0], 16)
                    found[path] = min(found.get(path, start), start)
        return found

    tensorflow_runtime.preload_tensorflow_libraries()
    before = bases()
    print(sorted(p.rsplit("/", 1)[-1] for p in before))
    print("tensorflow" in sys.modules)
    import tensorflow as tf
    after = bases()
    print(after == before)
    print(float(tf.constant(2.0) + 1))
    """
)


def test_tensorflows_import_reuses_the_preloaded_libraries():
    pytest.importorskip("tensorflow")
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/self/maps (Linux)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", _IMPORT_AFTER_PRELOAD], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    assert lines[:4] == [
        "['libtensorflow_cc.so.2', 'libtensorflow_framework.so.2']",
        "False",  # loaded, not imported
        "True",  # the import mapped nothing of them again
        "3.0",
    ], out.stdout
