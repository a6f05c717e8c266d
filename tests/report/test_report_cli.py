"""`python -m keras_ipu.report DIR` end to end, in subprocesses."""

import json
import os
import re
import struct
import subprocess
import sys

import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.simulator import profile

from compiler_graphs import aval
from compiler_graphs import build


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "keras_ipu.report", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def tiny_executable():
    def body(b, x):
        a = b.op("exp", x, source="model/act")
        s = b.op("add", a, x, source="model/residual")
        return b.op("reduce_sum", s, axes=(0,), source="model/pool")

    return compile_graph(build([aval((256,))], body), CompileOptions(fuse_elementwise=False))


@pytest.fixture
def report_dir(tmp_path):
    options = profile.report_options(
        {profile.ENV_VAR: '{"autoReport.all":"true","autoReport.directory":"%s"}' % tmp_path},
        config=object())
    exe = tiny_executable()
    paths = [profile.write_executable_report(exe, options, name=n)
             for n in ("train_step", "predict_step")]
    return tmp_path, paths


def test_summary_table_and_pictures(report_dir):
    directory, paths = report_dir
    proc = run_cli(directory)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    with open(paths[0]) as f:
        report = json.load(f)
    cyc, ipu = report["cycles"], report["memory"]["ipus"][0]
    # Overview: one row per report, with the predicted cycles per step.
    assert re.search(r"train_step \(\w+\)\s+3\s+ipu2", out), out
    assert re.search(r"predict_step \(\w+\)\s+3\s+ipu2", out), out
    assert f"{cyc['cycles_per_step']:,.0f}" in out
    assert "peak at step 2: reduce_sum in model/pool" in out
    assert (f"fullest tile {ipu['fullest_tile']}: "
            f"{ipu['fullest_tile_bytes'] / 1024:.1f} KiB") in out
    assert "by category: program inputs 1.0 KiB" in out
    assert "not always live 1.0 KiB" in out and f"{ipu['total'] / 2**20:.1f} MiB" in out
    assert "top ops by cycles" in out and "model/residual" in out

    pictures = directory / "report_pictures"
    pngs = sorted(p for p in os.listdir(pictures) if p.endswith(".png"))
    kinds = ("memory_ipu0", "liveness", "cycles_by_layer", "timeline")
    assert len(pngs) == 2 * len(kinds)
    for kind in kinds:
        assert sum(f".{kind}.png" in p for p in pngs) == 2
    for p in pngs:
        data = (pictures / p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert 800 <= width <= 1200 and 100 <= height <= 700

    page = (pictures / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    # Self-contained: every image inline, nothing fetched from elsewhere,
    # the data the views hover over inside the page.
    assert page.count('src="data:image/png;base64,') == len(pngs)
    assert not re.search(r'(src|href)="(?!data:)', page)
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page
    assert page.count('class="report"') == 2
    assert 'data-view="tiles"' in page and 'data-view="timeline"' in page
    assert "train_step" in page and "Memory per tile" in page


def test_out_directory_and_no_pictures(report_dir, tmp_path):
    directory, _ = report_dir
    out = tmp_path / "elsewhere"
    assert run_cli(directory, "--out", out).returncode == 0
    assert (out / "index.html").exists()
    proc = run_cli(directory, "--no-pictures", "--top", "1")
    assert proc.returncode == 0
    assert "Wrote" not in proc.stdout


def test_directory_without_reports_says_how_to_make_them(tmp_path):
    proc = run_cli(tmp_path)
    assert proc.returncode == 1
    assert "no profile reports" in proc.stderr
    assert "POPLAR_ENGINE_OPTIONS='{\"autoReport.all\":\"true\"" in proc.stderr
    assert run_cli(tmp_path / "missing").returncode == 2


def test_unreadable_reports_are_skipped_with_a_reason(report_dir):
    directory, paths = report_dir
    (directory / f"broken{profile.SUFFIX}").write_text("{not json")
    with open(paths[1]) as f:
        old = json.load(f)
    old["format_version"] = 99
    (directory / f"old{profile.SUFFIX}").write_text(json.dumps(old))
    proc = run_cli(directory, "--no-pictures")
    assert proc.returncode == 0
    assert "broken" in proc.stderr and "cannot read it as JSON" in proc.stderr
    assert "report format 99" in proc.stderr


def test_help():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "DIR" in proc.stdout and "POPLAR_ENGINE_OPTIONS" in proc.stdout


def test_a_fused_step_counts_for_its_layer_once():
    """Elementwise ops of one layer fused into one step: the cycles by layer
    name the layer, not "model/act+model/act+model/act"."""
    def body(b, x):
        a = b.op("exp", x, source="model/act")
        a = b.op("tanh", a, source="model/act")
        a = b.op("add", a, x, source="model/act")
        return b.op("reduce_sum", a, axes=(0,), source="model/pool")

    exe = compile_graph(build([aval((256,))], body))
    report = profile.build_report(exe)
    assert any("fused" in o["op"] for o in report["cycles"]["ops"])
    assert sorted(x["layer"] for x in report["cycles"]["layers"]) == ["model/act", "model/pool"]
    # One IPU: all the cycles are its own.
    assert report["cycles"]["ipus"] == [{"ipu": 0, "cycles": report["cycles"]["total"]}]
