"""Runs Keras' own test files (shipped inside the installed keras package)
against the "ipu" backend, as part of `pytest tests`.

tests/conftest.py registers this module as a pytest plugin. When pytest
reaches the directory tests/keras_conformance it gets a `KerasTestsDirectory`
collector, which yields this directory's own test files and then one
`pytest.Module` per Keras test file selected by `KERAS_TEST_FILES`. Those
modules are imported from site-packages, exactly as Keras ships them.

Node ids look like
    tests/keras_conformance/keras/src/ops/numpy_test.py::NumpyDtypeTest::test_add
They name the Keras file but are not paths on disk, so select with `-k`
and `--keras-tests`, not by pasting a node id:
    pytest tests/keras_conformance --keras-tests ops/numpy_test.py -k test_add

The rules Keras' own (unshipped) conftest applies are applied here too:
`requires_trainable_backend` tests are skipped until training works
(`TRAINING_SUPPORTED`), `multi_device` tests are skipped. Tests listed in
known_failures.txt are marked xfail(strict=False) with the listed reason (a
listed file that fails to import is skipped with it). `--keras-file-counts`
prints a per-file table of outcomes at the end.
"""

import collections
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import pytest

# Keras test files run by the conformance suite, as globs relative to
# keras/src. Each milestone adds the directories it makes pass.
KERAS_TEST_FILES = (
    "ops/*_test.py",
    "backend/common/*_test.py",
    "backend/tests/*_test.py",
    "random/*_test.py",
    "layers/**/*_test.py",
    "models/**/*_test.py",
    "trainers/**/*_test.py",
    "optimizers/**/*_test.py",
    "losses/**/*_test.py",
    "metrics/**/*_test.py",
    "callbacks/**/*_test.py",
    "saving/**/*_test.py",
    "distribution/*_test.py",
)

# Flip to True when fit/train_on_batch work on the ipu backend: the
# `requires_trainable_backend` tests then run instead of being skipped.
TRAINING_SUPPORTED = True
TRAINING_SKIP_REASON = (
    "requires_trainable_backend: training on the ipu backend arrives with "
    "the compiler (issue 3)"
)
MULTI_DEVICE_SKIP_REASON = (
    "multi_device: Keras marks these for a JAX process with several devices; "
    "keras.distribution on the ipu backend is tested in tests/distribute"
)

# Keras test files written for the backends Keras ships, loaded with what
# Keras itself would add for one more backend (no file in site-packages is
# changed):
# - a module-level `if backend() == ...` chain that picks a backend class and
#   raises ImportError for any other backend gets an `elif ... == "ipu"`
#   branch (the hook does the same to Keras' own modules);
# - a dict literal keyed by backend names (a per-backend table of values,
#   e.g. device names) gets an "ipu" entry equal to the "jax" one: the ipu
#   backend follows JAX's conventions (stateless steps, "cpu:0" devices);
# - in the test functions listed in KERAS_TEST_JAX_PORTS, the branch of a
#   `backend() == "jax"` chain that builds a training step with jax.jit and
#   jax.grad is copied into an `elif ... == "ipu"` branch using keras_ipu's
#   jit and grad (the same stateless step, our tracer instead of JAX's);
# - in the test functions listed in KERAS_TEST_JAX_BRANCHES, a
#   `backend() == "jax"` test that picks the stateless variant of a custom
#   train/test step holds for "ipu" too, for the same reason.
KERAS_TEST_BRANCHES = {
    "keras.src.trainers.trainer_test": (
        "from keras_ipu.backend.trainer import IPUTrainer as Trainer\n"
    ),
}
KERAS_TEST_TABLES = frozenset({"keras.src.trainers.trainer_test"})
KERAS_TEST_JAX_BRANCHES = {
    "keras.src.trainers.trainer_test": (
        "test_fit_with_custom_train_step",
        "test_evaluate_with_custom_test_step",
    ),
}
KERAS_TEST_JAX_PORTS = {
    "keras.src.layers.core.dense_test": ("test_quantize_float8",),
    "keras.src.layers.core.einsum_dense_test": ("test_quantize_float8",),
}
# - in the test functions listed in KERAS_TEST_EXPORTING, a tuple of the
#   backends that export SavedModels ("tensorflow", "jax", "torch") gets
#   "ipu": the ipu backend exports them too (keras_ipu/backend/export.py).
KERAS_TEST_EXPORTING = {
    "keras.src.models.model_test": ("test_export_error",),
}
_EXPORTING_BACKENDS = ("tensorflow", "jax", "torch")
# - the test classes listed in KERAS_TEST_JAX_DISTRIBUTION, which Keras skips
#   with `skipif(backend() != "jax")` because only JAX had a distribution_lib
#   behind keras.distribution, run under "ipu" too: the ipu backend has one
#   (keras_ipu/backend/distribution_lib.py). Left skipped:
#   MultiProcessInitializeTest (its tearDown clears os.environ, which the
#   rest of a pytest worker's run needs) and the multi_device class.
KERAS_TEST_JAX_DISTRIBUTION = {
    "keras.src.distribution.distribution_lib_test": (
        "DataParallelDistributionTest", "ModelParallelDistributionTest"),
}
_PATCHED_TEST_MODULES = (
    frozenset(KERAS_TEST_BRANCHES)
    | KERAS_TEST_TABLES
    | frozenset(KERAS_TEST_JAX_BRANCHES)
    | frozenset(KERAS_TEST_JAX_PORTS)
    | frozenset(KERAS_TEST_EXPORTING)
    | frozenset(KERAS_TEST_JAX_DISTRIBUTION)
)
# jax.<name> -> keras_ipu's equivalent, for ported branches.
_JAX_EQUIVALENTS = {
    "jit": ("keras_ipu.device.jit", "jit"),
    "grad": ("keras_ipu.device.autodiff", "grad"),
}


def _ported_to_ipu(body, where):
    """A copy of a jax branch's statements using keras_ipu's jit and grad:
    `import jax` dropped, jax.<name> -> _ipu_<name>, the imports added."""
    import ast
    import copy

    body = [
        b for b in copy.deepcopy(body)
        if not (isinstance(b, ast.Import) and b.names[0].name == "jax")
    ]
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        for field, value in ast.iter_fields(node):
            if not (
                isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and value.value.id == "jax"
            ):
                continue
            if value.attr not in _JAX_EQUIVALENTS:
                raise ValueError(
                    f"{where}: jax.{value.attr} has no keras_ipu equivalent; "
                    "this branch cannot be ported"
                )
            setattr(node, field, ast.Name(f"_ipu_{value.attr}", ast.Load()))
    imports = [
        ast.parse(f"from {module} import {attr} as _ipu_{name}").body[0]
        for name, (module, attr) in _JAX_EQUIVALENTS.items()
    ]
    return imports + body


def port_jax_branches(tree, function_names):
    """In the named functions, each if-chain with a `backend() == "jax"`
    link gets a copy of that link as `elif backend() == "ipu"`, with jax.jit
    and jax.grad replaced by keras_ipu's; returns how many were ported.
    A branch using any other jax name cannot be ported (ValueError)."""
    import ast
    import copy

    from keras_ipu._hook import _chain
    from keras_ipu._hook import is_backend_compare

    ported = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in function_names:
            continue
        ifs = [n for n in ast.walk(fn) if isinstance(n, ast.If)]
        elifs = {id(link) for n in ifs for link in _chain(n)[1:]}
        for stmt in ifs:
            links = _chain(stmt)
            jax_links = [
                link for link in links if is_backend_compare(link.test, {"jax"})
            ]
            if id(stmt) in elifs or not jax_links:
                continue
            test = copy.deepcopy(jax_links[0].test)
            test.comparators = [ast.Constant("ipu")]
            body = _ported_to_ipu(jax_links[0].body, fn.name)
            links[-1].orelse = [ast.If(test=test, body=body, orelse=links[-1].orelse)]
            ported += 1
    return ported


def take_jax_branches(tree, function_names):
    """In the named functions (at any depth), `<...>backend() == "jax"`
    becomes `<...>backend() in ("jax", "ipu")`; returns how many changed."""
    import ast

    from keras_ipu._hook import is_backend_compare

    changed = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in function_names:
            continue
        for node in ast.walk(fn):
            if is_backend_compare(node, {"jax"}):
                node.ops = [ast.In()]
                node.comparators = [
                    ast.Tuple([ast.Constant("jax"), ast.Constant("ipu")], ast.Load())
                ]
                changed += 1
    return changed


def run_jax_only_classes(tree, class_names):
    """In the decorators of the named classes, `<...>backend() != "jax"`
    becomes `<...>backend() not in ("jax", "ipu")`; returns how many changed."""
    import ast

    changed = 0
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or cls.name not in class_names:
            continue
        for node in (n for d in cls.decorator_list for n in ast.walk(d)):
            if (isinstance(node, ast.Compare) and len(node.ops) == 1
                    and isinstance(node.ops[0], ast.NotEq)
                    and isinstance(node.left, ast.Call)
                    and getattr(node.comparators[0], "value", None) == "jax"):
                node.ops = [ast.NotIn()]
                node.comparators = [
                    ast.Tuple([ast.Constant("jax"), ast.Constant("ipu")], ast.Load())
                ]
                changed += 1
    return changed


def add_ipu_to_exporting_backends(tree, function_names):
    """In the named functions, each tuple literal equal to
    _EXPORTING_BACKENDS gets "ipu"; returns how many changed."""
    import ast

    changed = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in function_names:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Tuple) and tuple(
                    getattr(e, "value", None) for e in node.elts) == _EXPORTING_BACKENDS:
                node.elts.append(ast.Constant("ipu"))
                changed += 1
    return changed


def add_ipu_to_backend_tables(tree):
    """Adds `"ipu": <the "jax" value>` to every dict literal whose keys
    include "jax" and "tensorflow"; returns how many it changed."""
    import ast

    changed = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
        if "jax" in keys and "tensorflow" in keys and "ipu" not in keys:
            node.keys.append(ast.Constant("ipu"))
            node.values.append(node.values[keys.index("jax")])
            changed += 1
    return changed


def patch_keras_test_module(tree, module_name):
    """Applies the additions above that concern `module_name`."""
    from keras_ipu._hook import add_chain_branch

    if module_name in KERAS_TEST_BRANCHES:
        add_chain_branch(tree, module_name, KERAS_TEST_BRANCHES[module_name])
    if module_name in KERAS_TEST_TABLES and not add_ipu_to_backend_tables(tree):
        raise RuntimeError(
            f"{module_name} no longer has a per-backend table; remove it "
            "from KERAS_TEST_TABLES"
        )
    ports = KERAS_TEST_JAX_PORTS.get(module_name, ())
    if ports and port_jax_branches(tree, ports) < len(ports):
        raise RuntimeError(
            f"{module_name}: a function of {ports} no longer has a jax "
            "branch to port; update KERAS_TEST_JAX_PORTS"
        )
    exporting = KERAS_TEST_EXPORTING.get(module_name, ())
    if exporting and add_ipu_to_exporting_backends(tree, exporting) < len(exporting):
        raise RuntimeError(
            f"{module_name}: a function of {exporting} no longer lists the "
            "exporting backends; update KERAS_TEST_EXPORTING"
        )
    classes = KERAS_TEST_JAX_DISTRIBUTION.get(module_name, ())
    if classes and run_jax_only_classes(tree, classes) < len(classes):
        raise RuntimeError(
            f"{module_name}: a class of {classes} is no longer skipped for "
            "backends other than jax; update KERAS_TEST_JAX_DISTRIBUTION"
        )
    names = KERAS_TEST_JAX_BRANCHES.get(module_name, ())
    if names and take_jax_branches(tree, names) < len(names):
        raise RuntimeError(
            f"{module_name}: a function of {names} no longer has a "
            "`backend() == \"jax\"` test; update KERAS_TEST_JAX_BRANCHES"
        )


def keras_test_finder():
    """The import hook's finder, loading the Keras test modules named above
    with patch_keras_test_module applied."""
    from keras_ipu._hook import IPUBackendFinder

    return IPUBackendFinder(
        {name: patch_keras_test_module for name in _PATCHED_TEST_MODULES}
    )


KNOWN_FAILURES_FILE = Path(__file__).with_name("known_failures.txt")
# Another known-failures file, for the plugin's own tests.
KNOWN_FAILURES_ENV = "KERAS_IPU_KNOWN_FAILURES"
HERE = Path(__file__).parent
NODEID_PREFIX = "tests/keras_conformance/keras/src/"
FILE_COUNTS_ENV = "KERAS_IPU_FILE_COUNTS"


# --------------------------------------------------------------------------
# Selection of Keras test files


def keras_src_dir():
    # find_spec on the top-level package does not import keras, so this
    # works before the backend is chosen.
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        raise pytest.UsageError(
            "keras is not installed: the Keras conformance tests run the test "
            "files shipped inside the keras package. Install the project with "
            "`pip install -e .[test]`."
        )
    return Path(list(spec.submodule_search_locations)[0]) / "src"


def select_keras_test_files(src_dir, patterns):
    """Files under `src_dir` matching any glob in `patterns`, sorted, unique."""
    found = set()
    for pattern in patterns:
        found.update(p for p in src_dir.glob(pattern) if p.is_file())
    return sorted(found)


# --------------------------------------------------------------------------
# Known failures


class KnownFailuresError(ValueError):
    pass


def parse_known_failures(text, source="known_failures.txt"):
    """Returns [(nodeid_substring, reason)] from the known-failures format.

    One `nodeid-substring | reason` per line; blank lines and lines starting
    with # are ignored. The separator is the first " | ".
    """
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = line.partition(" | ")
        pattern, reason = pattern.strip(), reason.strip()
        if not sep and line.endswith("|"):
            pattern, reason = line[:-1].strip(), ""
        if not pattern or not reason:
            raise KnownFailuresError(
                f"{source}:{lineno}: {line!r} has no "
                f"{'reason' if pattern else 'test id'}. Every entry is "
                "`nodeid-substring | reason`, e.g. "
                "`ops/numpy_test.py::NumpyDtypeTest::test_add | "
                "bfloat16 not supported`."
            )
        entries.append((pattern, reason))
    return entries


def load_known_failures(path=None):
    chosen = path or os.environ.get(KNOWN_FAILURES_ENV)
    path = Path(chosen or KNOWN_FAILURES_FILE)
    if not path.exists():
        if chosen:
            raise pytest.UsageError(f"known-failures file {path} does not exist")
        return []
    try:
        return parse_known_failures(path.read_text(), source=str(path))
    except KnownFailuresError as e:
        raise pytest.UsageError(str(e)) from None


# --------------------------------------------------------------------------
# Collection


def skip_if_backend(given_backend, reason):
    from keras.src.backend import backend

    return pytest.mark.skipif(backend() == given_backend, reason=reason)


# Some Keras test files do `from conftest import skip_if_backend`, i.e. they
# import the conftest.py at the root of Keras' repository, which the keras
# package does not ship. While such a file is imported, "conftest" names
# this stand-in (sys.modules["conftest"] is otherwise whichever of our
# conftest.py files pytest loaded last).
_KERAS_CONFTEST = types.ModuleType("conftest", "Stand-in for Keras' repo conftest")
_KERAS_CONFTEST.skip_if_backend = skip_if_backend


# Keras' tests import other frameworks to compute reference values: jax
# (at module level in ops/math_test.py and ops/image_test.py, inside many
# dtype tests; the test extras install it) and torch (a few nn/variables
# tests; not installed: a CPU build is not on PyPI's default index). When
# the test file itself fails to import one of these, the file or test is
# skipped with that reason instead of failing: the environment lacks a
# reference, the backend did nothing wrong.
REFERENCE_LIBRARIES = frozenset({"jax", "jaxlib", "torch", "flax", "openvino"})
# Optional dependencies of Keras itself whose tests need them installed:
# grain (a data-loading library, pulls in jax-only packages) and
# orbax-checkpoint (the OrbaxCheckpoint callback, built on jax and
# tensorstore). Not installed by the test extras; their tests are skipped.
OPTIONAL_KERAS_DEPENDENCIES = frozenset({"grain", "orbax"})
SKIPPABLE_LIBRARIES = REFERENCE_LIBRARIES | OPTIONAL_KERAS_DEPENDENCIES
# keras.src.utils.module_utils.LazyModule's message for a missing optional
# dependency: "OrbaxCheckpoint requires the 'orbax-checkpoint' package ..."
_LAZY_MODULE_MESSAGE = re.compile(r"requires the '([\w.-]+)' package")


def _missing_reference_library(excinfo, test_file):
    """The reference library `test_file` failed to import, or None."""
    exc = excinfo.value
    if type(exc) is ImportError:
        lazy = _LAZY_MODULE_MESSAGE.search(str(exc))
        if lazy and lazy.group(1).split("-")[0] in OPTIONAL_KERAS_DEPENDENCIES:
            return lazy.group(1)
        return None
    if not isinstance(exc, ModuleNotFoundError):
        return None
    if (exc.name or "").partition(".")[0] not in SKIPPABLE_LIBRARIES:
        return None
    frames = [e for e in excinfo.traceback if not str(e.path).startswith("<frozen")]
    if frames and Path(frames[-1].path) == Path(test_file):
        return exc.name
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    if hasattr(report, "wasxfail"):
        return
    name = _missing_reference_library(call.excinfo, item.path)
    if name is not None:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: this Keras test needs {name!r} (a reference library "
            "or an optional Keras dependency), which is not installed",
        )


class KerasTestModule(pytest.Module):
    def _getobj(self):
        saved = sys.modules.get("conftest")
        sys.modules["conftest"] = _KERAS_CONFTEST
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as e:
            missing = e.__cause__
            if (
                isinstance(missing, ModuleNotFoundError)
                and (missing.name or "").split(".")[0] in SKIPPABLE_LIBRARIES
            ):
                pytest.skip(
                    f"this Keras test file imports {missing.name!r} (a "
                    "reference library or an optional Keras dependency), "
                    f"which is not installed; `pip install {missing.name}` "
                    "to run it",
                    allow_module_level=True,
                )
            # A file that cannot be imported has no tests to mark xfail; an
            # entry naming the file skips it instead.
            for pattern, reason in self.config.stash.get(_KNOWN_FAILURES, []):
                if pattern in self.nodeid:
                    pytest.skip(f"known failure: {reason}", allow_module_level=True)
            raise
        finally:
            if saved is None:
                sys.modules.pop("conftest", None)
            else:
                sys.modules["conftest"] = saved


class KerasTestsDirectory(pytest.Directory):
    """tests/keras_conformance: its own test files, then Keras' test files."""

    def collect(self):
        ihook = self.ihook
        for entry in sorted(self.path.iterdir()):
            if entry.name == "__pycache__":
                continue
            if ihook.pytest_ignore_collect(collection_path=entry, config=self.config):
                continue
            if entry.is_dir():
                col = ihook.pytest_collect_directory(path=entry, parent=self)
                if col is not None:
                    yield col
            elif entry.is_file():
                yield from ihook.pytest_collect_file(file_path=entry, parent=self)

        src_dir = keras_src_dir()
        patterns = self.config.getoption("keras_tests") or KERAS_TEST_FILES
        files = select_keras_test_files(src_dir, patterns)
        if not files:
            raise pytest.UsageError(
                f"no Keras test file under {src_dir} matches {list(patterns)}; "
                "patterns are globs relative to keras/src, e.g. "
                "ops/numpy_test.py"
            )
        for path in files:
            rel = path.relative_to(src_dir).as_posix()
            yield KerasTestModule.from_parent(
                self,
                path=path,
                name=f"keras/src/{rel}",
                nodeid=NODEID_PREFIX + rel,
            )


def add_options(parser):
    group = parser.getgroup("keras_conformance", "Keras conformance tests")
    group.addoption(
        "--keras-tests",
        action="append",
        default=None,
        metavar="GLOB",
        help=(
            "Keras test files to run instead of the configured set, as globs "
            "relative to keras/src (repeatable), e.g. --keras-tests "
            "ops/numpy_test.py"
        ),
    )
    group.addoption(
        "--keras-file-counts",
        action="store_true",
        default=False,
        help=(
            "print pass/fail/skip counts per test file at the end (also "
            f"enabled by {FILE_COUNTS_ENV}=1)"
        ),
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires_trainable_backend: the test trains (fit/train_on_batch)",
    )
    config.addinivalue_line(
        "markers", "multi_device: the test needs several devices"
    )
    config.stash[_KNOWN_FAILURES] = load_known_failures()
    if not config.stash.get(_TEST_FINDER, None):
        config.stash[_TEST_FINDER] = keras_test_finder()
        sys.meta_path.insert(0, config.stash[_TEST_FINDER])
    if config.getoption("keras_file_counts") or os.environ.get(FILE_COUNTS_ENV):
        config.stash[_FILE_COUNTS] = _state["counts"] = FileCounts()


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path, parent):
    if path == HERE:
        return KerasTestsDirectory.from_parent(parent, path=path)
    return None


def _matches(entry, nodeid):
    """An entry matches a node id it is part of; an entry ending in `$`
    matches only at the end (a test whose name begins another's)."""
    if entry.endswith("$"):
        return nodeid.endswith(entry[:-1])
    return entry in nodeid


def pytest_collection_modifyitems(config, items):
    training_skip = pytest.mark.skip(reason=TRAINING_SKIP_REASON)
    multi_device_skip = pytest.mark.skip(reason=MULTI_DEVICE_SKIP_REASON)
    known = config.stash.get(_KNOWN_FAILURES, [])
    used = set()
    for item in items:
        if not TRAINING_SUPPORTED and "requires_trainable_backend" in item.keywords:
            item.add_marker(training_skip)
        if "multi_device" in item.keywords:
            item.add_marker(multi_device_skip)
        matches = [(p, r) for p, r in known if _matches(p, item.nodeid)]
        if matches:
            item.add_marker(pytest.mark.xfail(reason=matches[0][1], strict=False))
            used.update(p for p, _ in matches)
    config.stash[_USED_KNOWN_FAILURES] = used


# --------------------------------------------------------------------------
# Per-file counts


_KNOWN_FAILURES = pytest.StashKey[list]()
_USED_KNOWN_FAILURES = pytest.StashKey[set]()
_FILE_COUNTS = pytest.StashKey["FileCounts"]()
_TEST_FINDER = pytest.StashKey[object]()

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def classify(report):
    """The outcome a report contributes to its test, or None."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpassed" if xfail else "passed"
        if report.skipped:
            return "xfailed" if xfail else "skipped"
        return "failed"
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "xfailed" if xfail else "skipped"
    return None


class FileCounts:
    def __init__(self):
        self.counts = collections.defaultdict(collections.Counter)

    def add(self, report):
        outcome = classify(report)
        if outcome is not None:
            path = report.nodeid.split("::", 1)[0]
            if path.startswith("tests/keras_conformance/keras/"):
                path = path[len("tests/keras_conformance/") :]
            self.counts[path][outcome] += 1

    def table(self):
        header = "| file | " + " | ".join(OUTCOMES) + " |"
        lines = [header, "|" + "---|" * (len(OUTCOMES) + 1)]
        total = collections.Counter()
        for path in sorted(self.counts):
            c = self.counts[path]
            total.update(c)
            lines.append(
                f"| {path} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |"
            )
        lines.append(
            "| total | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |"
        )
        return lines


# pytest_runtest_logreport gets no config: the counter of this process.
_state = {}


def pytest_runtest_logreport(report):
    # With xdist this runs in the controller too, on the workers' reports.
    counts = _state.get("counts")
    if counts is not None:
        counts.add(report)


def pytest_terminal_summary(terminalreporter, config):
    counts = config.stash.get(_FILE_COUNTS, None)
    if counts is None or not counts.counts:
        return
    terminalreporter.section("per-file counts")
    for line in counts.table():
        terminalreporter.write_line(line)
    known = config.stash.get(_KNOWN_FAILURES, [])
    # Under xdist the controller does not collect, so it cannot tell.
    used = config.stash.get(_USED_KNOWN_FAILURES, None)
    if used is None:
        return
    unused = [p for p, _ in known if p not in used]
    if unused and not config.getoption("keyword"):
        terminalreporter.write_line(
            f"known_failures.txt entries matching no collected test: {unused}"
        )
