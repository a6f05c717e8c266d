"""Files written whole or not at all.

A file is written under a temporary name in its own directory, flushed to
disk, given the permissions a plain `open(path, "w")` would give (or those
of the file it replaces), and renamed over the target: a reader, or the
next run after a crash or a kill, finds the old file or the new one, never
half of one. The executable cache and the ipu backend's model saves
(.keras, .weights.h5, ModelCheckpoint, BackupAndRestore's
training_metadata.json, through the import hook) use it.

A writer killed before the rename leaves its temporary file behind. The
name says who wrote it (`.tmp-<host>-<pid>-...`), so `remove_orphans`
deletes those of writers that are gone (same host, process no longer
alive) and any older than an hour (another host's, which cannot be
asked).

Stdlib only: the import hook uses it in every process that saves a model.
"""

import contextlib
import os
import socket
import time
import uuid

PREFIX = ".tmp-"
ORPHAN_AGE_SECONDS = 3600.0


def _host():
    return socket.gethostname().replace("-", "_") or "host"


def temporary_name(path):
    """The temporary name of `path`'s next write: same directory, same
    ending (Keras checks `.keras` / `.weights.h5`), the writer's host and
    pid first."""
    directory, base = os.path.split(os.path.abspath(path))
    tag = f"{PREFIX}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    return os.path.join(directory, tag + base)


_UMASK = []


def _umask():
    if not _UMASK:
        value = None
        try:  # Linux: read it without changing it (os.umask is process-wide)
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("Umask:"):
                        value = int(line.split()[1], 8)
                        break
        except OSError:
            pass
        if value is None:
            value = os.umask(0o022)
            os.umask(value)
        _UMASK.append(value)
    return _UMASK[0]


def default_mode():
    """The permissions `open(path, "w")` gives a new file (0o666 less the
    umask: 0o644 or 0o664 usually, readable by the group)."""
    return 0o666 & ~_umask()


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp, path, mode):
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = default_mode()
    os.chmod(tmp, mode)
    _fsync(tmp)
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_path(path, mode=None, keep_new_on_error=False):
    """Yields a temporary path to write `path`'s new content to; when the
    block ends without an exception it replaces `path`, otherwise it is
    removed. `mode`: the new file's permissions (default: the replaced
    file's, or `default_mode()` for a new file). `keep_new_on_error`: when
    the block raises and `path` did not exist, what was written is put
    there anyway (what a writer in place leaves; nothing is replaced)."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        _publish(tmp, path, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            if keep_new_on_error and os.path.exists(tmp) and not os.path.exists(path):
                _publish(tmp, path, mode)
            else:
                os.unlink(tmp)
        raise


def write_bytes(path, chunks, mode=None):
    """Write the bytes of `chunks` (bytes or an iterable of bytes) to
    `path` atomically."""
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = (chunks,)
    with atomic_path(path, mode=mode) as tmp:
        with open(tmp, "xb") as f:
            for chunk in chunks:
                f.write(chunk)


@contextlib.contextmanager
def open_atomically(path, mode="w", fallback=open):
    """`open(path, mode)` for writing a whole file atomically: the file
    object writes a temporary file renamed over `path` when the block ends
    without an exception (removed otherwise). Paths that are not one local
    file, and modes that do not replace the file ("a", "r+"), go to
    `fallback(path, mode)` (Keras' file_utils.File for remote paths)."""
    if not (mode.startswith("w") and _is_local_path(path)):
        with fallback(path, mode) as f:
            yield f
        return
    with atomic_path(path) as tmp:
        with open(tmp, "x" + mode[1:]) as f:
            yield f


def _writer_gone(name, host):
    """Whether the writer named in a temporary file name has ended (only
    answerable for this host's processes)."""
    parts = name[len(PREFIX):].split("-", 2)
    if len(parts) < 3 or parts[0] != host:
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def remove_orphans(directory, suffix="", max_age=ORPHAN_AGE_SECONDS):
    """Delete the temporary files in `directory` (ending in `suffix`) whose
    writer is gone or that are older than `max_age` seconds; returns their
    names. Errors (a file another process removed first, no permission)
    are ignored: cleaning up is a courtesy."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _host()
    now = time.time()
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(suffix)):
            continue
        path = os.path.join(directory, name)
        try:
            old = now - os.stat(path).st_mtime > max_age
            if old or _writer_gone(name, host):
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue
    return removed


def writes_atomically(save, writes_one_file=None):
    """`save(obj, filepath, ...)` made atomic: the file is written under a
    temporary name in its directory and renamed over `filepath` when
    `save` returns, so a kill or an error during the save leaves the
    previous file whole (and no temporary file once the next save of that
    name runs). A save that raises where no file was leaves what Keras
    leaves there on every backend (the file as far as it got; Keras' own
    saving tests check it). Calls that write something else than one local
    file (a file object, a remote path, a directory or shards, as
    `writes_one_file(args, kwargs)` says) run as they are."""
    import functools

    @functools.wraps(save)
    def atomic_save(obj, filepath, *args, **kwargs):
        if not _is_local_path(filepath) or (
            writes_one_file is not None and not writes_one_file(args, kwargs)
        ):
            return save(obj, filepath, *args, **kwargs)
        path = os.fspath(filepath)
        directory, base = os.path.split(os.path.abspath(path))
        remove_orphans(directory, "-" + base)
        with atomic_path(path, keep_new_on_error=True) as tmp:
            return save(obj, tmp, *args, **kwargs)

    atomic_save.writes_atomically = True
    return atomic_save


def _is_local_path(filepath):
    if isinstance(filepath, bytes) or not isinstance(filepath, (str, os.PathLike)):
        return False  # a file object, an open h5py.File, ...
    path = os.fspath(filepath)
    if "://" in path:  # gs://, s3://, hf://, ...
        return False
    try:
        from keras.src.utils import file_utils

        return not file_utils.is_remote_path(path)
    except ImportError:  # pragma: no cover - outside Keras
        return True
