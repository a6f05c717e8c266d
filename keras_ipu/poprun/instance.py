"""What keras_ipu.poprun's mpiexec starts for each instance: the program,
as a child whose end is recorded.

    python -m keras_ipu.poprun.instance -- PROGRAM [ARGS...]

The program inherits everything (environment, the MPI launcher's file
descriptors, stdin); this process waits for it, forwards SIGINT and SIGTERM
to it, and writes `instance-<rank>.exit` into the launcher's status
directory: the exit code or signal, when, and whether the launcher was
stopping it. The program dies with this process (PR_SET_PDEATHSIG), so an
instance that the MPI launcher kills leaves nothing behind. The instance's
exit status is the program's (128 + N for signal N, as a shell reports it).
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from keras_ipu.device.simulator import partition
from keras_ipu.distributed.mpi_world import STATUS_DIR_ENV

ONLY_OUTPUT_ENV = "KERAS_IPU_POPRUN_ONLY_OUTPUT_FROM"
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the MPI launcher still ends the program on failure


def _write_status(rank, returncode, stopped):
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    record = {
        "code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "time": time.time(),
        "stopped": stopped,
    }
    path = os.path.join(directory, f"instance-{rank}.exit")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m keras_ipu.poprun.instance -- PROGRAM [ARGS...]\n")
        return 2
    rank, _ = partition.mpi_rank_and_size()
    only = os.environ.get(ONLY_OUTPUT_ENV)
    quiet = only not in (None, "") and int(only) != rank
    output = subprocess.DEVNULL if quiet else None
    child = subprocess.Popen(
        argv, close_fds=False, stdout=output, stderr=output, preexec_fn=_die_with_parent
    )
    stopped = False

    def forward(signum, frame):
        nonlocal stopped
        stopped = True
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    returncode = child.wait()
    _write_status(rank, returncode, stopped)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
