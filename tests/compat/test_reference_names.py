"""Every name of Graphcore's Python API reference resolves under keras_ipu:
implemented, or raising NotImplementedError with a sentence saying why
(keras_ipu/_unavailable.py), and then listed in the README."""

import glob
import importlib
import os
import re
from pathlib import Path

import pytest

import reference_names

README = Path(__file__).resolve().parents[2] / "README.md"
README_SECTION = "### Names of the reference keras_ipu does not provide"

# Modules other issues bring, not on main when this test was written: a
# name under them that does not resolve yet is an expected failure naming
# the issue (once they land, the name must resolve like any other).
AWAITING = {
    "ipu_compiler": "issue 11 (the TensorFlow front end) brings it",
    "ipu_infeed_queue": "issue 11 (the TensorFlow front end) brings it",
    "ipu_outfeed_queue": "issue 11 (the TensorFlow front end) brings it",
    "loops": "issue 11 (the TensorFlow front end) brings it",
    "scopes": "issue 11 (the TensorFlow front end) brings it",
    "utils.export_dataset_to_file": "issue 11 (the TensorFlow front end) brings it",
    "utils.export_inputs_to_file": "issue 11 (the TensorFlow front end) brings it",
}

FOUND, LOST = reference_names.read_list()
NAMES = FOUND + LOST


def resolve(path):
    """The object at keras_ipu.<path> (submodules imported as needed)."""
    obj = importlib.import_module("keras_ipu")
    module_path = "keras_ipu"
    for part in path.split("."):
        module_path = f"{module_path}.{part}"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(module_path)
    return obj


def unavailable_owner(path):
    """(prefix, reason) of the first unavailable object on the path (a
    class not implemented covers its documented members), else None."""
    from keras_ipu._unavailable import path_of
    from keras_ipu._unavailable import reason_of

    parts = path.split(".")
    for k in range(1, len(parts) + 1):
        prefix = ".".join(parts[:k])
        try:
            obj = resolve(prefix)
        except (AttributeError, ImportError):
            return None
        reason = reason_of(obj)
        if reason is not None:
            return prefix, reason, path_of(obj)
    return None


def _awaiting(path):
    for prefix, why in AWAITING.items():
        if path == prefix or path.startswith(prefix + "."):
            return why
    return None


@pytest.mark.parametrize("path", NAMES)
def test_name_resolves(path):
    try:
        obj = resolve(path)
    except (AttributeError, ImportError) as error:
        why = _awaiting(path)
        if why is not None:
            pytest.xfail(f"keras_ipu.{path}: {why}")
        owner = unavailable_owner(path)
        if owner is not None:
            return  # a member of a class that is unavailable as a whole
        raise AssertionError(f"keras_ipu.{path} does not resolve: {error}") from None
    owner = unavailable_owner(path)
    if owner is None:
        return
    prefix, reason, _ = owner
    assert reason.endswith(".") and len(reason.split()) >= 4, (
        f"keras_ipu.{prefix}: the reason it is unavailable must be a sentence, got {reason!r}")
    if prefix == path:
        with pytest.raises(NotImplementedError, match=re.escape(reason)):
            obj()


def _unavailable_names():
    names = set()
    for path in NAMES:
        owner = unavailable_owner(path)
        if owner is not None:
            names.add(owner[2])
    return names


def _readme_names():
    text = README.read_text()
    assert README_SECTION in text, f"README.md has no section {README_SECTION!r}"
    section = text.split(README_SECTION, 1)[1]
    section = re.split(r"\n#{1,3} ", section, maxsplit=1)[0]
    return set(re.findall(r"^- `([\w.]+)`", section, flags=re.M))


def test_readme_lists_exactly_the_unavailable_names():
    in_code = _unavailable_names()
    in_readme = _readme_names()
    assert in_code - in_readme == set(), "unavailable but not listed in the README"
    assert in_readme - in_code == set(), "listed in the README but available (or unknown)"


def _reference_file():
    candidates = [os.environ.get("KERAS_IPU_REFERENCE", "")]
    for folder in README.parents:  # the project keeps it in shared/reference
        candidates += glob.glob(str(folder / "shared" / "reference" / "004_*.txt"))
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def test_list_matches_the_reference_text():
    path = _reference_file()
    if path is None:
        pytest.skip("the reference text is not here (set KERAS_IPU_REFERENCE to its 004_*.txt)")
    assert reference_names.extract(path.read_text()) == sorted(FOUND)
