"""The executable cache: in memory, and on disk when TF_POPLAR_FLAGS holds
--executable_cache_path=DIR (as Graphcore's SDK does).

The key is a hash of (format version, a digest of the compiler's source,
graph fingerprint, input avals, compile options); the options hold the IPU
target (version and tiles) and the floating-point behaviour, so an
executable compiled for another IPU is never reused. Disk entries are written to a temporary file in DIR and
renamed into place, so a reader never sees half an entry. A corrupt or
stale entry is recompiled (and overwritten) with a warning, never a crash.
`stats` counts what happened; a log line on the "keras_ipu.compiler"
logger reports every disk hit.
"""

import collections
import hashlib
import logging
import os
import pickle
import tempfile
import warnings

from keras_ipu.device import flags as poplar_flags
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler.executable import FORMAT_VERSION
from keras_ipu.device.compiler.fingerprint import fingerprint
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.pipeline import compile_graph

logger = logging.getLogger("keras_ipu.compiler")

SUFFIX = ".ipu_exe"
_MAGIC = b"keras_ipu executable\n"


class CacheWarning(UserWarning):
    pass


_COMPILER_DIGEST = []


def compiler_digest():
    """A hash of the compiler's own source: entries written by another
    version of the passes are never reused (they key differently)."""
    if not _COMPILER_DIGEST:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(here)):
            if name.endswith(".py"):
                with open(os.path.join(here, name), "rb") as f:
                    h.update(name.encode() + b"\x00" + f.read())
        _COMPILER_DIGEST.append(h.hexdigest()[:16])
    return _COMPILER_DIGEST[0]


def cache_key(graph, options):
    avals = " ".join(v.aval.short() for v in graph.inputs)
    text = (
        f"{FORMAT_VERSION}|{compiler_digest()}|{fingerprint(graph)}|{avals}|"
        f"{options.cache_key()}"
    )
    return hashlib.sha256(text.encode()).hexdigest()


def cache_dir():
    """DIR of --executable_cache_path in TF_POPLAR_FLAGS, or None."""
    path = poplar_flags.read_flags(print_help=False).executable_cache_path
    return path or None


class ExecutableCache:
    def __init__(self, capacity=256):
        self.capacity = capacity
        self._memory = collections.OrderedDict()
        self.stats = collections.Counter()

    def clear(self):
        self._memory.clear()
        self.stats.clear()

    def get(self, graph, options=None, name=None):
        """The Executable of `graph` (compiled, or from the cache) for the
        configured IPU; `name` names it in reports and logs."""
        context = device_checks.compile_context()
        options = device_checks.resolve_options(options or CompileOptions(), context)
        key = cache_key(graph, options)
        directory = cache_dir()
        path = os.path.join(directory, key + SUFFIX) if directory else None
        exe = self._memory.get(key)
        if exe is not None:
            self._memory.move_to_end(key)
            self.stats["memory_hits"] += 1
            if path is not None and not os.path.exists(path):
                # Compiled before this cache directory was configured (a
                # PRE_COMPILE run fills the cache with what it uses).
                self._store(path, key, exe)
            return exe
        if path is not None and os.path.exists(path):
            exe = self._load(path, key)
            if exe is not None:
                device_checks.announce(exe, context)
        if exe is None:
            exe = compile_graph(graph, options, name=name)
            self.stats["compiles"] += 1
            if path is not None:
                self._store(path, key, exe)
        self._memory[key] = exe
        if len(self._memory) > self.capacity:
            self._memory.popitem(last=False)
        return exe

    def _load(self, path, key):
        try:
            with open(path, "rb") as f:
                if f.read(len(_MAGIC)) != _MAGIC:
                    raise ValueError("not a keras_ipu executable")
                entry = pickle.load(f)
            if entry.get("version") != FORMAT_VERSION or entry.get("key") != key:
                raise ValueError(
                    f"stale entry (format {entry.get('version')}, this "
                    f"keras_ipu writes {FORMAT_VERSION})"
                )
            exe = entry["executable"]
        except Exception as e:  # noqa: BLE001 - any bad entry is recompiled
            self.stats["disk_errors"] += 1
            warnings.warn(
                f"The cached executable {path} cannot be used ({e}); "
                "recompiling and replacing it.",
                CacheWarning,
                stacklevel=4,
            )
            return None
        self.stats["disk_hits"] += 1
        logger.info("executable cache hit: %s", path)
        return exe

    def _store(self, path, key, exe):
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            data = pickle.dumps(
                {"version": FORMAT_VERSION, "key": key, "executable": exe},
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=SUFFIX)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC)
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except Exception as e:  # noqa: BLE001 - caching is an optimisation
            self.stats["disk_write_errors"] += 1
            logger.warning("executable not cached in %s: %s", directory, e)
            return
        self.stats["disk_writes"] += 1


# The process-wide cache jit uses.
CACHE = ExecutableCache()
