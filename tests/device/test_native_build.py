"""The install builds every C extension where a C compiler is
(hatch_build.py). A compile that fails only warns, so that an install on a
machine without a compiler still works on the NumPy kernels; these tests
make the same failure on a machine with a compiler fail here instead of
silently slowing every kernel down (in session 13 an extension compiled to
nothing and only a bit-level test of another kernel noticed)."""

import importlib
import pathlib
import re
import shutil
import sysconfig

import pytest

from keras_ipu.device import native
from keras_ipu.device.flags import env_switch

NATIVE = pathlib.Path(native.__file__).parent
HATCH_BUILD = pathlib.Path(__file__).resolve().parents[2] / "hatch_build.py"
C_SOURCES = sorted(p.name for p in NATIVE.glob("_*.c"))


def _compiler_present():
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return any(shutil.which(name) for name in (cc, "cc", "gcc", "clang"))


def test_the_build_hook_lists_every_c_source():
    if not HATCH_BUILD.exists():
        pytest.skip("hatch_build.py is not beside the tests (an installed copy)")
    listed = set(re.findall(r'"(_[A-Za-z0-9_]+\.c)"', HATCH_BUILD.read_text()))
    assert C_SOURCES, f"no C source found in {NATIVE}"
    missing = sorted(set(C_SOURCES) - listed)
    assert not missing, (
        f"{missing} in {NATIVE} would never be compiled: add them to SOURCES in "
        f"{HATCH_BUILD.name}")


@pytest.mark.parametrize("source", C_SOURCES)
def test_each_extension_is_built_where_a_compiler_is(source):
    if not env_switch("KERAS_IPU_NATIVE"):
        pytest.skip("KERAS_IPU_NATIVE=0 turns the extensions off")
    if not _compiler_present():
        pytest.skip("no C compiler on this machine")
    name = f"{native.__name__}.{source[:-len('.c')]}"
    try:
        importlib.import_module(name)
    except ImportError as error:
        pytest.fail(
            f"{name} was not built or does not load ({error}). Reinstall "
            "(pip install -e .) and read the compiler's message that "
            "hatch_build.py printed.")
