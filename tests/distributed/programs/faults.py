"""Run by tests/distributed/test_multiprocess.py: instance 1 misbehaves
(argv[1] says how) while instance 0 keeps calling collectives; instance 0
writes what it saw last into OUT_DIR (argv[2])."""

import os
import signal
import sys
import time

import numpy as np

from keras_ipu import distributed as hvd

mode, out = sys.argv[1], sys.argv[2]
if mode == "before_mpi" and os.environ.get("PMI_RANK") == "1":
    sys.exit(0)  # ends before MPI starts: instance 0 waits in MPI_Init
hvd.init()
x = np.ones(8, np.float32)
hvd.allreduce(x)
if hvd.rank() == 1:
    time.sleep(0.3)
    if mode == "raise":
        raise ValueError("instance 1 gives up")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit":
        sys.exit(3)
    if mode == "hang":
        time.sleep(120)
    if mode == "mismatch":
        hvd.broadcast(np.zeros(5), 0)
for step in range(1000):
    with open(os.path.join(out, f"progress-{hvd.rank()}"), "w") as f:
        f.write(str(step))
    hvd.allreduce(x)
    time.sleep(0.01)
