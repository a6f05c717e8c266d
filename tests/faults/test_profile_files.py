"""Profile files (reports, XSpace) are written whole or not at all, with
the permissions the user's umask gives, like every other file we write."""

import os
import stat

import pytest

from keras_ipu import _atomic_files
from keras_ipu.device.simulator import profile
from keras_ipu.report import xspace


class _Unserializable:
    def SerializeToString(self):
        raise RuntimeError("the serializer fails half way")


def test_a_failed_xspace_write_leaves_nothing(tmp_path):
    path = tmp_path / "host.xplane.pb"
    with pytest.raises(RuntimeError, match="half way"):
        xspace.write_xspace(str(path), _Unserializable())
    assert os.listdir(tmp_path) == []


def test_a_failed_report_write_leaves_nothing(tmp_path):
    report = {"program": {"name": "step", "fingerprint": "f00d"},
              "bad": object()}
    with pytest.raises(TypeError):
        profile.write_report(report, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_report_file_follows_the_umask(tmp_path, monkeypatch):
    # _atomic_files reads the process's umask once (os.umask is process-wide
    # and not thread-safe to probe); a user's umask of 077 is that value.
    monkeypatch.setattr(_atomic_files, "_UMASK", [0o077])
    report = {"program": {"name": "step", "fingerprint": "f00d"}}
    path = profile.write_report(report, str(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == [os.path.basename(path)]
