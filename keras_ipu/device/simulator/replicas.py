"""Running one replica's program on several simulated IPUs at once.

Poplar compiles a replicated program once and runs the same code on every
replica's IPUs (SPMD); replicas meet only in collective operations
(all-reduce of gradients, cross_replica_sum). The simulator does the same:
`run_replicated(fn, per_replica_args)` calls `fn` once per replica, each in
its own host thread, and a collective kernel (primitives/collective.py)
called by a replica waits at a barrier until every replica of its group has
deposited its operand. Every replica then receives its own copy of the same
result, reduced in replica order (bitwise identical on every replica, as a
deterministic all-reduce is on the IPU, so replicas that apply the same
update keep identical weights).

Outside `run_replicated` there is one replica and a collective returns its
operand (a sum over one replica).

A replica that fails aborts the group: the others leave the barrier with
`ReplicaAborted` and the first failure is raised, naming its replica.
"""

import functools
import threading

import numpy as np

from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import partition as _partition

# Seconds a replica waits for the others at a collective before giving up:
# only a replica stuck in an endless kernel makes the others wait this long.
BARRIER_TIMEOUT_S = 600.0


class ReplicaAborted(RuntimeError):
    """Another replica of the group failed: this one stops too."""


class ReplicaGroup:
    """The `n` replicas of one replicated run, and the rendezvous of their
    collectives."""

    def __init__(self, n):
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"A replica group has at least one replica, got {n!r}.")
        self.n = n
        self._barrier = threading.Barrier(n, timeout=BARRIER_TIMEOUT_S)
        self._operands = [None] * n
        self._results = [None] * n

    def _wait(self):
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise ReplicaAborted(
                "another replica failed; this replica stopped with it"
            ) from None

    def abort(self):
        self._barrier.abort()

    def all_reduce(self, index, value, op, group_size):
        """Reduce `value` over the replicas of `index`'s group (consecutive
        groups of `group_size`, as Graphcore's replica_group_size): "sum" or
        "mean". Every replica of the group gets its own copy."""
        self._operands[index] = value
        self._wait()
        if index == 0:
            # One replica reduces for all: the 2-core host has no cycles to
            # spare for n identical sums. Fixed order: identical bits everywhere.
            for start in range(0, self.n, group_size):
                members = self._operands[start:start + group_size]
                total = _across_instances(
                    functools.reduce(np.add, members), op, group_size, group_size == self.n
                )
                total = np.asarray(total, dtype=members[0].dtype)
                for k in range(start, start + group_size):
                    self._results[k] = total
        self._wait()
        # A private copy: the replica's program may update it in place. The
        # shared results are overwritten only after every replica has
        # deposited its next operand, i.e. finished reading this one.
        return np.array(self._results[index])


    def exchange(self, index, value, combine):
        """The collectives that move data (reduce-scatter, all-gather,
        all-to-all, permute): every replica deposits `value`; then each
        computes its own result, combine(operands of every replica, in
        replica order), a new array, before any replica goes on (so none
        changes an operand another still reads)."""
        self._operands[index] = value
        self._wait()
        result = np.array(combine(list(self._operands)))
        self._wait()
        return result


def _across_instances(total, op, count, whole_group):
    """Finish an all-reduce whose local part summed `count` replicas into
    `total`: in a multi-process job (multi_replica_distribution) a group of
    every local replica spans every instance, whose partial sums MPI adds
    (the gateway's part of the reduction); a mean divides by the global
    count."""
    instances, _ = system_config.configured_instances()
    if instances > 1 and whole_group:
        total = _partition.sum_over_instances(np.asarray(total))
        count *= instances
    if op == "mean":
        total = total / np.asarray(count, dtype=np.asarray(total).dtype)
    return total


def reduce_alone(value, op):
    """The all-reduce of a program that runs one replica per instance."""
    return np.asarray(_across_instances(np.asarray(value), op, 1, True), dtype=np.asarray(value).dtype)


_local = threading.local()


def current():
    """(group, replica index) of the calling replica thread, or None."""
    return getattr(_local, "replica", None)


def replica_index():
    """The global index of the calling replica: its index in this process's
    replicated run (0 outside one), after the replicas of the instances
    before this one in a multi-process job."""
    here = current()
    local = 0 if here is None else here[1]
    instances, _ = system_config.configured_instances()
    return local + (_partition.current().replica_index_offset if instances > 1 else 0)


def run_replicated(fn, per_replica_args):
    """`[fn(*args) for args in per_replica_args]`, every call in its own
    thread as one replica of a group, so that their collectives meet."""
    per_replica_args = list(per_replica_args)
    n = len(per_replica_args)
    if n == 1:
        return [fn(*per_replica_args[0])]
    group = ReplicaGroup(n)
    results = [None] * n
    errors = [None] * n

    def replica(index, args):
        _local.replica = (group, index)
        try:
            results[index] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller
            errors[index] = e
            group.abort()
        finally:
            _local.replica = None

    threads = [
        threading.Thread(target=replica, args=(i, a), name=f"ipu-replica-{i}")
        for i, a in enumerate(per_replica_args)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next(
        (i for i, e in enumerate(errors) if e is not None and not isinstance(e, ReplicaAborted)),
        next((i for i, e in enumerate(errors) if e is not None), None),
    )
    if first is not None:
        error = errors[first]
        if n > 1 and hasattr(error, "add_note"):
            error.add_note(f"(raised by replica {first} of {n})")
        raise error
    return results
