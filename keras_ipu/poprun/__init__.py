"""keras_ipu.poprun: a launcher shaped like Graphcore's poprun.

    python -m keras_ipu.poprun --num-instances 2 --num-replicas 4 \\
        [--ipus-per-replica 1] python train.py

starts the instances with the mpiexec of the MPI library of the `[mpi]`
extra, each told its share of the job in POPDIST_* variables (read with
keras_ipu.popdist), and, when an instance fails, names it and how it failed.
"""

