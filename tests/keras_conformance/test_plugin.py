"""The conformance plugin itself: known-failures parsing, file selection,
outcome counting, and a real pytest run over one small Keras test file."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

plugin = sys.modules["keras_ipu_conformance_plugin"]
ROOT = Path(__file__).parents[2]


def test_known_failures_parse():
    text = """
    # a comment

    ops/numpy_test.py::NumpyDtypeTest::test_add | bfloat16 | not yet
    core_test.py::CoreOpsCorrectnessTest::test_scan | scan is missing
    """
    assert plugin.parse_known_failures(text) == [
        ("ops/numpy_test.py::NumpyDtypeTest::test_add", "bfloat16 | not yet"),
        ("core_test.py::CoreOpsCorrectnessTest::test_scan", "scan is missing"),
    ]


@pytest.mark.parametrize(
    "line",
    ["ops/numpy_test.py::test_add", "ops/numpy_test.py::test_add |", "ops/x |   ", " | a reason"],
)
def test_known_failure_without_reason_is_an_error(line):
    with pytest.raises(plugin.KnownFailuresError, match=r"known_failures.txt:2: .*has no"):
        plugin.parse_known_failures("# header\n" + line)


def test_shipped_known_failures_file_parses():
    entries = plugin.load_known_failures(plugin.KNOWN_FAILURES_FILE)
    assert all(pattern and reason for pattern, reason in entries)


def test_configured_files_exist_in_keras():
    src = plugin.keras_src_dir()
    files = plugin.select_keras_test_files(src, plugin.KERAS_TEST_FILES)
    rels = {f.relative_to(src).as_posix() for f in files}
    assert "ops/numpy_test.py" in rels
    assert "backend/common/variables_test.py" in rels
    assert "backend/tests/compute_output_spec_test.py" in rels
    assert "random/random_test.py" in rels
    assert all(r.endswith("_test.py") for r in rels)
    # Every pattern selects something: a typo would silently drop files.
    for pattern in plugin.KERAS_TEST_FILES:
        assert plugin.select_keras_test_files(src, [pattern]), pattern


def report(when, outcome, wasxfail=None):
    r = SimpleNamespace(
        when=when,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        nodeid="tests/keras_conformance/keras/src/ops/core_test.py::T::test_x",
    )
    if wasxfail is not None:
        r.wasxfail = wasxfail
    return r


@pytest.mark.parametrize(
    "when, outcome, wasxfail, expected",
    [
        ("setup", "passed", None, None),
        ("call", "passed", None, "passed"),
        ("call", "failed", None, "failed"),
        ("call", "skipped", None, "skipped"),
        ("call", "skipped", "reason", "xfailed"),
        ("call", "passed", "reason", "xpassed"),
        ("setup", "skipped", None, "skipped"),
        ("setup", "failed", None, "error"),
        ("teardown", "failed", None, "error"),
        ("teardown", "passed", None, None),
    ],
)
def test_classify(when, outcome, wasxfail, expected):
    assert plugin.classify(report(when, outcome, wasxfail)) == expected


def test_file_counts_table():
    counts = plugin.FileCounts()
    counts.add(report("call", "passed"))
    counts.add(report("call", "failed"))
    counts.add(report("setup", "skipped"))
    table = counts.table()
    assert table[0] == "| file | passed | failed | error | skipped | xfailed | xpassed |"
    assert table[2] == "| keras/src/ops/core_test.py | 1 | 1 | 0 | 1 | 0 | 0 |"
    assert table[-1] == "| total | 1 | 1 | 0 | 1 | 0 | 0 |"


def run_pytest(tmp_path, *args, known_failures=""):
    kf = tmp_path / "known_failures.txt"
    kf.write_text(known_failures)
    env = dict(os.environ, KERAS_IPU_KNOWN_FAILURES=str(kf), KERAS_BACKEND="tensorflow")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/keras_conformance", "-p", "no:xdist",
         "-q", "-rsx", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_marks_known_failures_and_prints_counts(tmp_path):
    # KERAS_BACKEND=tensorflow in the environment: the suite must still run
    # on ipu (tests/conftest.py forces it).
    proc = run_pytest(
        tmp_path,
        "--keras-tests", "backend/common/name_scope_test.py",
        "--keras-file-counts",
        "-k", "test_stacking or test_deduplication",
        known_failures="name_scope_test.py::NameScopeTest::test_stacking | listed on purpose\n",
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "| keras/src/backend/common/name_scope_test.py | 1 | 0 | 0 | 0 | 0 | 1 |" in out
    assert "1 passed" in out and "1 xpassed" in out


def test_run_rejects_known_failure_without_reason(tmp_path):
    proc = run_pytest(
        tmp_path,
        "--keras-tests", "backend/common/name_scope_test.py",
        "--collect-only",
        known_failures="name_scope_test.py::NameScopeTest::test_stacking\n",
    )
    assert proc.returncode != 0
    assert "has no reason" in proc.stdout + proc.stderr


def test_collection_of_the_configured_set_and_skip_markers(tmp_path):
    proc = run_pytest(
        tmp_path,
        "--keras-tests", "ops/core_test.py",
        "-k", "CoreOpsBehaviorTests or CoreOpsCallsTests or test_plugin",
        "--co",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests/keras_conformance/keras/src/ops/core_test.py::" in proc.stdout
    assert "tests/keras_conformance/test_plugin.py::test_classify" in proc.stdout


def test_training_tests_run_now_that_training_works(tmp_path):
    assert plugin.TRAINING_SUPPORTED is True
    proc = run_pytest(
        tmp_path,
        "--keras-tests", "ops/core_test.py",
        "-k", "test_stop_gradient and not test_plugin",
        "-rs",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "requires_trainable_backend" not in proc.stdout
    # 5 tests, one of them marked requires_trainable_backend: none skipped.
    summary = proc.stdout.strip().splitlines()[-1]
    assert "5 passed" in summary and "skipped" not in summary, proc.stdout[-3000:]


def test_an_entry_ending_in_dollar_matches_only_at_the_end():
    nodeid = "tests/keras_conformance/keras/src/ops/linalg_test.py::QrOpTest::test_jvp"
    assert plugin._matches("QrOpTest::test_jvp$", nodeid)
    assert not plugin._matches("QrOpTest::test_jvp$", nodeid + "_symbolic")
    assert plugin._matches("QrOpTest::test_jvp", nodeid + "_symbolic")


def _fail_import(name):
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_missing_reference_library_is_recognised_only_in_the_test_file():
    with pytest.raises(ModuleNotFoundError) as info:
        _fail_import("torch")
    assert plugin._missing_reference_library(info, __file__) == "torch"
    # Raised from elsewhere (say, the backend): a real failure.
    assert plugin._missing_reference_library(info, plugin.__file__) is None
    with pytest.raises(ModuleNotFoundError) as info:
        _fail_import("scipy")
    assert plugin._missing_reference_library(info, __file__) is None


def test_missing_optional_keras_dependency_is_recognised():
    with pytest.raises(ModuleNotFoundError) as info:
        _fail_import("grain")
    assert plugin._missing_reference_library(info, __file__) == "grain"
    with pytest.raises(ImportError) as info:
        raise ImportError(
            "OrbaxCheckpoint requires the 'orbax-checkpoint' package. You can "
            "install it via pip install orbax-checkpoint"
        )
    assert plugin._missing_reference_library(info, plugin.__file__) == "orbax-checkpoint"
    with pytest.raises(ImportError) as info:
        raise ImportError("Foo requires the 'scipy' package.")
    assert plugin._missing_reference_library(info, __file__) is None


def _executed(tree):
    """The namespace of a transformed module's tree, run."""
    import ast

    namespace = {}
    exec(compile(ast.fix_missing_locations(tree), "<t>", "exec"), namespace)
    return namespace


def test_backend_tables_get_the_jax_entry_for_ipu():
    import ast

    tree = ast.parse(
        "T = {'tensorflow': 'CPU:0', 'jax': 'cpu:0', 'torch': 'cpu'}\n"
        "U = {'jax': 1}\n"
    )
    assert plugin.add_ipu_to_backend_tables(tree) == 1
    namespace = _executed(tree)
    assert namespace["T"]["ipu"] == "cpu:0"
    assert "ipu" not in namespace["U"]


def test_listed_functions_take_the_jax_branch_and_others_do_not():
    import ast

    source = (
        "def backend():\n    return 'ipu'\n"
        "def picked():\n    return 'stateless' if backend() == 'jax' else 'stateful'\n"
        "def other():\n    return 'stateless' if backend() == 'jax' else 'stateful'\n"
    )
    tree = ast.parse(source)
    assert plugin.take_jax_branches(tree, ("picked",)) == 1
    namespace = _executed(tree)
    assert namespace["picked"]() == "stateless"
    assert namespace["other"]() == "stateful"


def test_listed_jax_only_classes_run_and_others_stay_skipped():
    import ast

    source = (
        "def backend():\n    return 'ipu'\n"
        "def skipif(condition):\n    return lambda cls: (cls, condition)\n"
        "@skipif(backend() != 'jax')\nclass Listed: pass\n"
        "@skipif(backend() != 'jax')\nclass Other: pass\n"
    )
    tree = ast.parse(source)
    assert plugin.run_jax_only_classes(tree, ("Listed",)) == 1
    namespace = _executed(tree)
    assert namespace["Listed"][1] is False  # not skipped under ipu
    assert namespace["Other"][1] is True


def test_trainer_test_module_loads_with_the_ipu_trainer():
    import importlib

    module = importlib.import_module("keras.src.trainers.trainer_test")
    from keras_ipu.backend.trainer import IPUTrainer

    assert module.Trainer is IPUTrainer


def test_jax_training_branch_is_ported_with_keras_ipu_jit_and_grad():
    import ast

    source = (
        "def backend():\n    return 'ipu'\n"
        "def test_step():\n"
        "    if backend() == 'tensorflow':\n        f = None\n"
        "    elif backend() == 'jax':\n"
        "        import jax\n"
        "        f = jax.jit(jax.grad(lambda w: (w * w).sum()))\n"
        "    return f\n"
    )
    tree = ast.parse(source)
    assert plugin.port_jax_branches(tree, ("test_step",)) == 1
    namespace = _executed(tree)
    grad_fn = namespace["test_step"]()
    np_grad = np.asarray(grad_fn(np.array([1.0, -2.0], np.float32)))
    np.testing.assert_allclose(np_grad, [2.0, -4.0])

    other = ast.parse(
        "def test_step():\n"
        "    if backend() == 'jax':\n        import jax\n        f = jax.vmap(g)\n"
    )
    with pytest.raises(ValueError, match="jax.vmap"):
        plugin.port_jax_branches(other, ("test_step",))
