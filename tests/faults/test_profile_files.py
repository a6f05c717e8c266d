"""Profile files (reports, XSpace) are written whole or not at all, with
the permissions the user's umask gives, like every other file we write."""

import os
import stat

import pytest

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


def test_a_report_file_follows_the_umask(tmp_path):
    report = {"program": {"name": "step", "fingerprint": "f00d"}}
    old = os.umask(0o077)
    try:
        path = profile.write_report(report, str(tmp_path))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == [os.path.basename(path)]
