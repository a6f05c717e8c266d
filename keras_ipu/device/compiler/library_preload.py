"""Loading shared libraries with the interpreter lock released.

Python loads an extension module, and every shared library it links,
while holding the GIL: `dlopen` reads the files, relocates them and runs
their static initialisers, and no other thread of the process runs Python
meanwhile. For TensorFlow that is one block of seconds: its
`libtensorflow_cc.so.2` (788 MB) and `libtensorflow_framework.so.2` took
1.4 s of the import's 16.6 s on this 2-core machine at load 6
(`python -X importtime`: `_pywrap_cpu_feature_guard`, the first module
that links them), 4.7 s of wall time (0.4 s of CPU: mostly reading the
file) at load 10. In the auto engine's background compile, at nice 19,
that block is a priority inversion: the training thread waits for the
lock held by a thread the scheduler hardly runs (issue 16: the main
thread stalled 6-7 s at load 11).

A foreign function called through ctypes runs with the GIL released, so
`preload` calls libc's own `dlopen` on the libraries first: the training
thread keeps running Python while they load. The import that follows finds
them loaded (the dynamic linker matches a needed library by its soname)
and does not load them again. They are opened `RTLD_NOW | RTLD_LOCAL`, as
an extension module's dependencies are (Python's default dlopen flags):
all relocations done here, outside the lock, and no symbol of theirs made
global for libraries loaded later. The handles are never closed: the
libraries stay loaded, as the import would leave them.
"""

import ctypes
import glob
import os


def _dlopen():
    """libc's dlopen through ctypes (the GIL released during the call),
    or None where there is none (not glibc/POSIX)."""
    for name in (None, "libdl.so.2"):
        try:
            fn = ctypes.CDLL(name).dlopen
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
        return fn
    return None


def preload(directory, pattern):
    """Loads the shared libraries in `directory` whose names match the glob
    `pattern` (sorted by name), each with the GIL released; returns the
    paths loaded. One that fails to load is skipped: the import that needs
    it reports the failure in its own words."""
    dlopen = _dlopen()
    if dlopen is None:
        return []
    flags = getattr(os, "RTLD_NOW", 2) | getattr(os, "RTLD_LOCAL", 0)
    loaded = []
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), pattern))):
        if dlopen(os.fsencode(path), flags):
            loaded.append(path)
    return loaded
