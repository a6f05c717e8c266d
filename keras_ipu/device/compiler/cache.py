"""The executable cache: in memory, and on disk when TF_POPLAR_FLAGS holds
--executable_cache_path=DIR (as Graphcore's SDK does).

The key is a hash of (format version, a digest of the compiler's source,
graph fingerprint, input avals, compile options); the options hold the IPU
target (version and tiles) and the floating-point behaviour, so an
executable compiled for another IPU is never reused.

Disk entries are written whole or not at all (keras_ipu._atomic_files:
a temporary file in DIR renamed into place), with the permissions a plain
file gets (readable by the group under the usual umask: a cache shared by
a team). Each entry carries a SHA-256 checksum of its content: an entry
changed after it was written (a flipped bit, a truncated copy) is treated
like any corrupt or stale entry: a warning, a recompile, the entry
replaced; never a crash, never a silently different program. The first
use of DIR in a process removes the temporary files of writers that were
killed before their rename. (The checksum finds damage, not tampering: an
entry is a pickle, so DIR must be writable only by people you trust.)

`stats` counts what happened; a log line on the "keras_ipu.compiler"
logger reports every disk hit.
"""

import collections
import hashlib
import logging
import os
import pickle
import warnings

from keras_ipu import _atomic_files
from keras_ipu.device import user_code
from keras_ipu.device import flags as poplar_flags
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler.executable import FORMAT_VERSION
from keras_ipu.device.compiler.fingerprint import fingerprint
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.pipeline import compile_graph
from keras_ipu.device.config import system_config

logger = logging.getLogger("keras_ipu.compiler")

SUFFIX = ".ipu_exe"
_MAGIC = b"keras_ipu executable\n"
_CHECKSUM = hashlib.sha256  # of the pickled entry, stored after _MAGIC
_CHECKSUM_SIZE = _CHECKSUM().digest_size


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
    def __init__(self, capacity=256, disk=True):
        self.capacity = capacity
        # False: never reads or writes --executable_cache_path (programs
        # compiled to be measured, not run).
        self.disk = disk
        self._memory = collections.OrderedDict()
        self.stats = collections.Counter()
        self._swept = set()  # directories whose orphans were removed

    def clear(self):
        self._memory.clear()
        self.stats.clear()

    def peek(self, key):
        """The Executable stored under `key` in memory, or None; not a use
        (the order in which programs are dropped stays)."""
        return self._memory.get(key)

    def lookup(self, key):
        """The Executable stored under `key` in memory (None when it was
        never compiled or has been dropped); counts as a use."""
        exe = self._memory.get(key)
        if exe is not None:
            self._memory.move_to_end(key)
        return exe

    def get(self, graph, options=None, name=None):
        """The Executable of `graph` (compiled, or from the cache) for the
        configured IPU; `name` names it in reports and logs."""
        return self.get_keyed(graph, options, name)[1]

    def get_keyed(self, graph, options=None, name=None):
        """(key, Executable): get(), with the key `lookup` finds it by."""
        context = system_config.configuration()
        options = device_checks.resolve_options(options or CompileOptions(), context)
        key = cache_key(graph, options)
        directory = cache_dir() if self.disk else None
        path = os.path.join(directory, key + SUFFIX) if directory else None
        if directory and directory not in self._swept:
            self._swept.add(directory)
            removed = _atomic_files.remove_orphans(directory, SUFFIX)
            if removed:
                logger.info("executable cache %s: removed %d temporary file(s) "
                            "of killed writers", directory, len(removed))
        exe = self._memory.get(key)
        if exe is not None:
            self._memory.move_to_end(key)
            self.stats["memory_hits"] += 1
            if path is not None and not os.path.exists(path):
                # Compiled before this cache directory was configured (a
                # PRE_COMPILE run fills the cache with what it uses).
                self._store(path, key, exe)
            return key, exe
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
        return key, exe

    def _load(self, path, key):
        try:
            with open(path, "rb") as f:
                if f.read(len(_MAGIC)) != _MAGIC:
                    raise ValueError("not a keras_ipu executable")
                checksum = f.read(_CHECKSUM_SIZE)
                data = f.read()
            if _CHECKSUM(data).digest() != checksum:
                raise ValueError(
                    "its checksum does not match its content: the file was "
                    "changed or cut short after it was written"
                )
            entry = pickle.loads(data)
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
                stacklevel=user_code.stacklevel(),
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
            _atomic_files.write_bytes(
                path, (_MAGIC, _CHECKSUM(data).digest(), data),
                mode=_atomic_files.default_mode(),
            )
        except Exception as e:  # noqa: BLE001 - caching is an optimisation
            self.stats["disk_write_errors"] += 1
            logger.warning("executable not cached in %s: %s", directory, e)
            return
        self.stats["disk_writes"] += 1


# The process-wide cache jit uses.
CACHE = ExecutableCache()
