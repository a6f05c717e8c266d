"""Builds keras_ipu's C extensions (keras_ipu/device/native/*.c: SOURCES)
while pip installs the project, so the install stays one command.

Each extension is optional: without a C compiler, or if a compile fails,
the install goes on with a warning and keras_ipu runs the NumPy kernels it
replaces (keras_ipu.device.native says which are in use). No setuptools: the
compiler and flags are the ones the running Python was built with
(sysconfig), plus our own.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCES = tuple(
    os.path.join("keras_ipu", "device", "native", name)
    for name in ("_elementwise.c", "_scatter_add.c", "_product_pool.c", "_pooling.c",
                 "_im2col.c", "_rows.c")
)
# -ffp-contract=off: a*b+c must round twice, as NumPy's separate ufuncs do.
# No -march: the built file may be cached by pip and used on another CPU.
# -pthread: the product pool's threads (C11 atomics, hence -std=c11).
FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-std=c11",
         "-pthread"]


def _compiler():
    configured = shlex.split(sysconfig.get_config_var("CC") or "")
    if configured and shutil.which(configured[0]):
        return configured
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def build_extension(root, source):
    """Compile the extension of `source` (relative to `root`) next to it.
    Returns its path, or None (with the reason on stderr) when it could not
    be built."""
    source = os.path.join(root, source)
    target = source[: -len(".c")] + sysconfig.get_config_var("EXT_SUFFIX")
    compiler = _compiler()
    if compiler is None:
        print("keras_ipu: no C compiler found; the NumPy kernels will be used",
              file=sys.stderr)
        return None
    include = sysconfig.get_paths()["include"]
    temporary = target + ".tmp"
    command = [*compiler, *FLAGS, f"-I{include}", source, "-o", temporary]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        print(f"keras_ipu: C extension not built ({error}); the NumPy kernels "
              "will be used", file=sys.stderr)
        return None
    if done.returncode != 0:
        print("keras_ipu: C extension not built; the NumPy kernels will be used.\n"
              f"{' '.join(command)}\n{done.stderr}", file=sys.stderr)
        return None
    os.replace(temporary, target)  # a half-written .so is never importable
    return target


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        for source in SOURCES:
            target = build_extension(self.root, source)
            if target is None:
                continue
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            if version != "editable":
                # The editable install imports it from the source tree.
                build_data["force_include"][target] = os.path.relpath(target, self.root)
