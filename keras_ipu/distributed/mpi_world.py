"""The MPI world of this process: the one module that talks to MPI.

Every collective here is an MPI nonblocking collective (mpi4py on the MPI
library of the `[mpi]` extra) waited for by polling, so that waiting can
notice what blocking MPI calls cannot:

- another instance failed: an uncaught exception in any instance prints its
  traceback, tells the other instances (a notice message naming its rank and
  the error) and ends the job with MPI_Abort, which the MPI launcher turns
  into the end of every process;
- another instance ended its program while this one waits for it in a
  collective (it exited, normally or with sys.exit, or stopped calling
  collectives): it sent a notice at exit, and the wait fails naming it;
- another instance on this host vanished (killed, crashed in C code): its
  process id no longer exists, and the wait fails naming it;
- nothing of the above, but the collective does not complete within
  KERAS_IPU_COLLECTIVE_TIMEOUT seconds (default 300): the wait fails.

Each of these raises a DistributedError in the waiting instance, which, left
uncaught, ends the job the same way. Every collective also checks first
that all instances call the same collective on the same shape and dtype
(a small allgather of signatures), and says which instance differs.

At exit an instance tells the others it is leaving, waits until every
instance reaches its own exit (no deadline: the others are working, failing
or waiting in a collective, and each of those ends), then finalises MPI.
"""

import atexit
import faulthandler
import json
import os
import sys
import threading
import time

import numpy as np

TIMEOUT_ENV = "KERAS_IPU_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
# How long a collective keeps progressing after an instance it waits for
# announced its exit: that instance may have sent its last contribution
# just before leaving, which the progress engine still has to deliver.
EXIT_GRACE_S = 2.0
# How often a waiting instance checks that its peers' processes still exist.
LIVENESS_PERIOD_S = 0.5
# Before MPI_Abort: time for the output to pass the MPI launcher, and for a
# failed instance's own abort to end an instance that stops because of it.
OUTPUT_DRAIN_S = 0.3
SECONDARY_ABORT_DELAY_S = 2.0
# Where keras_ipu.poprun collects each instance's error, for its summary.
STATUS_DIR_ENV = "KERAS_IPU_POPRUN_STATUS_DIR"

_FAILED, _EXITING = 1, 2
_SIGNATURE_BYTES = 160


class DistributedError(RuntimeError):
    """A multi-process job cannot go on."""


class InstanceFailedError(DistributedError):
    """Another instance failed, vanished or left while this one waited for it."""

    def __init__(self, message, rank):
        super().__init__(message)
        self.rank = rank


class CollectiveTimeoutError(DistributedError):
    """A collective did not complete within KERAS_IPU_COLLECTIVE_TIMEOUT seconds."""


def timeout_seconds():
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"{TIMEOUT_ENV}={text!r}: give the number of seconds a collective may wait "
            f"for the other instances (a positive number; default {DEFAULT_TIMEOUT_S:g})."
        )
    return value


def _import_mpi(timeout):
    try:
        import mpi4py
    except ImportError:
        raise ImportError(
            "Multi-process training needs mpi4py and an MPI library: install them with "
            "pip install 'keras_ipu[mpi]' (mpi4py and MPICH's wheel)."
        ) from None
    # This module finalises MPI itself, after its exit handshake (see _World.exit).
    mpi4py.rc.finalize = False
    # MPI_Init waits for every process of the job to start MPI, holding the
    # GIL: only faulthandler's own thread can end a wait for an instance that
    # never comes (it exited first). It prints where this process waited.
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        from mpi4py import MPI
    finally:
        faulthandler.cancel_dump_traceback_later()
    return MPI


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped) is gone for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class _World:
    def __init__(self, MPI):
        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.aborting = False
        self.finalized = False
        self.exited = {}  # rank -> time its exit notice arrived
        self.calls = 0
        self.timeout = timeout_seconds()
        self._pending_sends = []
        self.peers = []  # (host, pid) of every rank, once known
        self._last_liveness = time.monotonic()
        # Notices travel on a communicator of their own, so they never match
        # a collective's messages.
        self.notices = self._dup(world)
        self.comm = self._dup(world)
        host = os.uname().nodename
        self.peers = self.gather_objects((host, os.getpid()), "start-up")
        self.local_ranks = [r for r, (h, _) in enumerate(self.peers) if h == host]

    def _dup(self, comm):
        new, request = comm.Idup()
        self.wait(request, "start-up")
        return new

    # -- waiting -------------------------------------------------------------
    def wait(self, request, what, deadline=True):
        start = time.monotonic()
        limit = start + self.timeout if deadline else None
        pause = 0.0
        while not request.Test():
            now = time.monotonic()
            self._check_notices(what, start, now)
            if now - self._last_liveness > LIVENESS_PERIOD_S:
                self._last_liveness = now
                self._check_peers_alive(what)
            if limit is not None and now > limit:
                raise CollectiveTimeoutError(
                    f"Instance {self.rank} of {self.size} waited {self.timeout:g} s in "
                    f"{what} and the other instances did not all join it: one of them is "
                    "stuck, or runs a different sequence of collectives. Raise "
                    f"{TIMEOUT_ENV} (now {self.timeout:g} s) if an instance legitimately "
                    "works longer than that between collectives."
                )
            time.sleep(pause)
            pause = min(2 * pause + 1e-5, 1e-3 if deadline else 1e-2)

    def _check_notices(self, what, start, now):
        if not hasattr(self, "notices"):
            return
        status = self.MPI.Status()
        while self.notices.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
            source, tag = status.Get_source(), status.Get_tag()
            text = self.notices.recv(source=source, tag=tag)
            if tag == _FAILED:
                raise InstanceFailedError(
                    f"Instance {source} of {self.size} failed: {text}. Instance "
                    f"{self.rank} stops too (it was in {what}).",
                    source,
                )
            self.exited.setdefault(source, now)
        for rank, since in sorted(self.exited.items()):
            if now - max(since, start) > EXIT_GRACE_S:
                raise InstanceFailedError(
                    f"Instance {rank} of {self.size} ended its program while instance "
                    f"{self.rank} waits for it in {what}: every instance must run the "
                    "same collectives in the same order (see instance "
                    f"{rank}'s output for why it ended).",
                    rank,
                )

    def _check_peers_alive(self, what):
        if not self.peers:
            return
        for rank in self.local_ranks:
            if rank == self.rank or rank in self.exited:
                continue
            pid = self.peers[rank][1]
            if not _process_exists(pid):
                raise InstanceFailedError(
                    f"Instance {rank} of {self.size} (process {pid}) is gone: it was "
                    f"killed or crashed without a Python error while instance {self.rank} "
                    f"waited for it in {what}.",
                    rank,
                )

    # -- collectives -----------------------------------------------------------
    def _check_signature(self, what, signature):
        """Every instance must call the same collective on the same shape and dtype."""
        self.calls += 1
        mine = f"{signature} (collective #{self.calls})".encode()[:_SIGNATURE_BYTES]
        send = np.zeros(_SIGNATURE_BYTES, np.uint8)
        send[: len(mine)] = np.frombuffer(mine, np.uint8)
        everyone = np.empty((self.size, _SIGNATURE_BYTES), np.uint8)
        self.wait(self.comm.Iallgather(send, everyone), what)
        texts = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in everyone]
        differing = [r for r, t in enumerate(texts) if t != texts[0]]
        if differing:
            listing = "; ".join(f"instance {r}: {t}" for r, t in enumerate(texts))
            raise DistributedError(
                f"The instances called different collectives ({listing}): every instance "
                "must run the same collectives, on tensors of the same shape and dtype, "
                "in the same order."
            )

    def allreduce(self, array, op, what):
        self._check_signature(what, f"{what} of {array.dtype}{list(array.shape)}")
        result = np.empty_like(array)
        self.wait(self.comm.Iallreduce(array, result, op=op), what)
        return result

    def broadcast(self, array, root, what):
        self._check_signature(what, f"{what} from {root} of {array.dtype}{list(array.shape)}")
        buffer = np.array(array, copy=True, order="C")
        self.wait(self.comm.Ibcast(buffer, root=root), what)
        return buffer

    def allgather(self, array, what):
        rest = list(array.shape[1:])
        self._check_signature(what, f"{what} of {array.dtype}[?, {rest}]")
        rows = np.empty(self.size, np.int64)
        self.wait(self.comm.Iallgather(np.array([array.shape[0]], np.int64), rows), what)
        per_row = int(np.prod(rest, dtype=np.int64))
        counts = [int(n) * per_row for n in rows]
        result = np.empty((int(rows.sum()), *rest), array.dtype)
        self.wait(self.comm.Iallgatherv(array, (result, counts)), what)
        return result

    def barrier(self, what="barrier"):
        self._check_signature(what, what)
        self.wait(self.comm.Ibarrier(), what)

    def gather_objects(self, value, what):
        """A small Python value from every instance (pickled; for metadata only)."""
        self._check_signature(what, what)
        lengths = np.empty(self.size, np.int64)
        import pickle

        payload = np.frombuffer(pickle.dumps(value), np.uint8)
        self.wait(self.comm.Iallgather(np.array([payload.size], np.int64), lengths), what)
        data = np.empty(int(lengths.sum()), np.uint8)
        self.wait(self.comm.Iallgatherv(payload, (data, [int(n) for n in lengths])), what)
        out, at = [], 0
        for n in lengths:
            out.append(pickle.loads(data[at : at + int(n)].tobytes()))
            at += int(n)
        return out

    # -- failure and exit ------------------------------------------------------
    def _notify(self, tag, text):
        for rank in range(self.size):
            if rank != self.rank:
                self._pending_sends.append(self.notices.isend(text, dest=rank, tag=tag))

    def fail(self, exc):
        """Tell the others this instance failed with `exc`, then end the job."""
        if self.aborting:
            return
        self.aborting = True
        secondary = isinstance(exc, InstanceFailedError)
        description = f"{type(exc).__name__}: {exc}"
        _write_status(self.rank, description, exc.rank if secondary else None)
        if not secondary:
            sys.stderr.write(
                f"keras_ipu.distributed: instance {self.rank} of {self.size} failed "
                f"({description}); stopping every instance (MPI_Abort).\n"
            )
            self._notify(_FAILED, description)
            # Give the notices a moment to leave (they are small, sent eagerly).
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline and not self.MPI.Request.Testall(
                self._pending_sends
            ):
                time.sleep(0.001)
        sys.stderr.flush()
        sys.stdout.flush()
        # MPI_Abort tears the job down at once, and output still on its way
        # through the MPI launcher is lost: let it drain. An instance that
        # only stops because of another waits for that one's abort, so that
        # the first failure's traceback is what the user sees.
        time.sleep(SECONDARY_ABORT_DELAY_S if secondary else OUTPUT_DRAIN_S)
        self.MPI.COMM_WORLD.Abort(1)

    def exit(self):
        """At interpreter exit: announce it, wait for every instance's exit, finalise."""
        if self.aborting or self.finalized:
            return
        self._notify(_EXITING, "exit")
        request = self.notices.Ibarrier()
        pause = 0.0
        status = self.MPI.Status()
        while not request.Test():
            while self.notices.Iprobe(
                source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status
            ):
                source, tag = status.Get_source(), status.Get_tag()
                text = self.notices.recv(source=source, tag=tag)
                if tag == _FAILED:
                    self.aborting = True
                    sys.stderr.write(
                        f"keras_ipu.distributed: instance {source} failed ({text}) while "
                        f"instance {self.rank} was exiting.\n"
                    )
                    sys.stderr.flush()
                    self.MPI.COMM_WORLD.Abort(1)
            time.sleep(pause)
            pause = min(2 * pause + 1e-5, 1e-2)
        # Every notice was sent before its sender entered the barrier: collect them.
        while self.notices.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
            self.notices.recv(source=status.Get_source(), tag=status.Get_tag())
        self.MPI.Request.Waitall(self._pending_sends)
        self.finalized = True
        self.MPI.Finalize()


def _write_status(rank, description, blames):
    """For keras_ipu.poprun's summary: this instance's error, and the
    instance it blames when it only stops because of another one."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    try:
        path = os.path.join(directory, f"instance-{rank}.error")
        with open(path + ".tmp", "w") as f:
            json.dump({"error": description, "blames": blames}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # the summary is a convenience; the traceback is already printed


_lock = threading.RLock()
_world = None


def world():
    """The MPI world of this process, initialising MPI on first use."""
    global _world
    with _lock:
        if _world is None:
            MPI = _import_mpi(timeout_seconds())
            _world = _World(MPI)
            _install_handlers(_world)
        return _world


def is_initialized():
    return _world is not None


def _install_handlers(w):
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        if w.size > 1:
            w.fail(exc)

    sys.excepthook = excepthook
    atexit.register(w.exit)


def sum_over_instances(array, what="cross-replica all-reduce"):
    """The elementwise sum of `array` over every instance of the job (the
    instances' part of a compiled all-reduce; see simulator/replicas.py)."""
    w = world()
    array = np.asarray(array, order="C")
    wire = array.astype(np.float32) if array.dtype.name == "bfloat16" else array
    return w.allreduce(wire, w.MPI.SUM, what).astype(array.dtype, copy=False)
