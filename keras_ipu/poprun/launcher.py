"""The poprun-shaped launcher: options, the mpiexec command line, the summary.

Each instance gets Graphcore's POPDIST_* variables (the job's replicas, its
own replicas and their offset), is started through keras_ipu.poprun.instance
(which records how it ended), and the launcher, when mpiexec reports a
failure, names the first instance that failed and how.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

from keras_ipu.device.simulator import partition
from keras_ipu.distributed.mpi_world import STATUS_DIR_ENV
from keras_ipu.poprun.instance import ONLY_OUTPUT_ENV

_LOCAL_HOSTS = ("localhost", "127.0.0.1", os.uname().nodename)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m keras_ipu.poprun",
        description="Launch a program as several instances sharing the replicas of a "
        "simulated IPU Pod (Graphcore's poprun, on MPI).",
    )
    p.add_argument("--num-instances", type=int, default=1, help="processes to start")
    p.add_argument(
        "--num-replicas", type=int, default=None, help="replicas of the whole job (default: one per instance)"
    )
    p.add_argument("--ipus-per-replica", type=int, default=1, help="IPUs one replica spans")
    p.add_argument(
        "--only-output-from-instance", type=int, default=None, help="silence every other instance"
    )
    p.add_argument("--mpi-global-args", default="", help="extra arguments for mpiexec")
    p.add_argument(
        "--mpi-local-args", default="", help="extra arguments for each instance's part of the mpiexec command"
    )
    p.add_argument("--print-topology", choices=("yes", "no"), default="no")
    p.add_argument("-H", "--host", default=None, help="hosts (only this one is supported)")
    p.add_argument("-v", "--verbose", action="store_true", help="print the mpiexec command")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _fail(message):
    sys.stderr.write(f"keras_ipu.poprun: {message}\n")
    return 2


def _check(args):
    """A sentence saying what is wrong with the options, or None."""
    n, k = args.num_instances, args.ipus_per_replica
    r = n if args.num_replicas is None else args.num_replicas
    if n < 1:
        return f"--num-instances {n}: start at least one instance."
    if r < 1 or k < 1:
        return f"--num-replicas {r} --ipus-per-replica {k}: both must be at least 1."
    if r % n:
        return (
            f"--num-replicas {r} is not a multiple of --num-instances {n}: every instance "
            "runs the same number of replicas."
        )
    local_ipus = (r // n) * k
    if local_ipus & (local_ipus - 1):
        return (
            f"each instance would own {r // n} replica(s) x {k} IPU(s) = {local_ipus} IPUs; "
            "a device has a power-of-two number of IPUs (1, 2, 4, ...): change "
            "--num-replicas, --num-instances or --ipus-per-replica."
        )
    only = args.only_output_from_instance
    if only is not None and not 0 <= only < n:
        return f"--only-output-from-instance {only}: instances are numbered 0 to {n - 1}."
    if args.host:
        others = [h for h in args.host.split(",") if h.split(":")[0] not in _LOCAL_HOSTS]
        if others:
            return (
                f"--host {args.host}: keras_ipu.poprun starts every instance on this host "
                f"(remote hosts {others} are not supported); leave --host out."
            )
    if not args.program:
        return "give the program to run, e.g. python -m keras_ipu.poprun --num-instances 2 python train.py"
    return None


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if path is None:
        raise FileNotFoundError(
            "mpiexec was not found (next to this Python or on PATH): install the MPI "
            "extra with pip install 'keras_ipu[mpi]'."
        )
    return path


def _flavour(mpiexec):
    try:
        text = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    return "openmpi" if ("Open MPI" in text or "OpenRTE" in text or "prte" in text) else "hydra"


def build_command(args, mpiexec, flavour):
    n, k = args.num_instances, args.ipus_per_replica
    r = n if args.num_replicas is None else args.num_replicas
    local = r // n
    command = [mpiexec]
    if flavour == "openmpi":
        # Open MPI refuses root and more processes than cores unless told.
        command += ["--oversubscribe"]
        if os.geteuid() == 0:
            command += ["--allow-run-as-root"]
    command += shlex.split(args.mpi_global_args)
    program = [sys.executable, "-m", "keras_ipu.poprun.instance", "--", *args.program]
    for i in range(n):
        if i:
            command.append(":")
        env = {
            partition.REPLICA_INDEX_OFFSET: i * local,
            partition.LOCAL_INSTANCE_INDEX: i,
        }
        command += ["-n", "1"]
        for name, value in env.items():
            command += ["-x", f"{name}={value}"] if flavour == "openmpi" else ["-env", name, str(value)]
        command += shlex.split(args.mpi_local_args) + program
    environment = {
        partition.NUM_TOTAL_REPLICAS: str(r),
        partition.NUM_IPUS_PER_REPLICA: str(k),
        partition.NUM_LOCAL_REPLICAS: str(local),
        partition.UNIFORM_REPLICAS_PER_INSTANCE: "1",
    }
    if args.only_output_from_instance is not None:
        environment[ONLY_OUTPUT_ENV] = str(args.only_output_from_instance)
    return command, environment


def topology(num_instances, num_replicas):
    """poprun's --print-topology table: which replicas each instance runs."""
    local = num_replicas // num_instances
    rows = [("hosts", [os.uname().nodename]), ("instances", list(range(num_instances)))]
    rows.append(("replicas", [f"{i * local}-{(i + 1) * local - 1}" if local > 1 else str(i) for i in range(num_instances)]))
    width = max(len(str(v)) for _, values in rows for v in values) + 2
    lines = []
    for name, values in rows:
        cells = "|".join(str(v).center(width) for v in values)
        lines.append(f"| {name:<9} |{cells}|")
    return "\n".join(lines)


def _read(directory, name):
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read()
    except OSError:
        return None


def _replicas(index, local):
    if local == 1:
        return f"replica {index}"
    return f"replicas {index * local}-{(index + 1) * local - 1}"


def summarise(directory, num_instances, num_replicas):
    """The sentence naming the instance that failed first, or None.

    An instance that raised wrote its error (keras_ipu.distributed); one
    that stopped because of another names that one; the instance wrapper
    recorded how each program ended, and when.
    """
    local = num_replicas // num_instances
    ended, finished, errors = [], [], {}
    for i in range(num_instances):
        text = _read(directory, f"instance-{i}.exit")
        if text is not None:
            record = json.loads(text)
            failed = record["signal"] is not None or record["code"] not in (0, None)
            if failed and not record["stopped"]:
                ended.append((record["time"], i, record))
            elif not failed:
                finished.append((record["time"], i))
        text = _read(directory, f"instance-{i}.error")
        if text is not None:
            errors[i] = json.loads(text)
    raised = [i for i, e in sorted(errors.items()) if e["blames"] is None]
    if raised:
        index = raised[0]
        return (
            f"instance {index} ({_replicas(index, local)}) raised {errors[index]['error']}; "
            "the other instances were stopped."
        )
    if ended:
        when, index, record = min(ended)
        if record["signal"] is not None:
            try:
                name = signal.Signals(record["signal"]).name
            except ValueError:
                name = "unknown"
            how = f"was killed by signal {record['signal']} ({name})"
        else:
            how = f"exited with code {record['code']}"
        earlier = [
            f"instance {i} had ended its program (code 0) {when - t:.1f} s before"
            for t, i in sorted(finished)
            if t < when
        ]
        note = f" ({'; '.join(earlier)}: the others waited for it)" if earlier else ""
        return (
            f"instance {index} ({_replicas(index, local)}) {how}{note}; the other "
            "instances were stopped."
        )
    if errors:
        index, error = min(errors.items())
        blamed = error["blames"]
        return (
            f"instance {blamed} ({_replicas(blamed, local)}) stopped taking part; instance "
            f"{index} reported: {error['error']}"
        )
    return None


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    problem = _check(args)
    if problem:
        return _fail(problem)
    try:
        mpiexec = _mpiexec()
    except FileNotFoundError as e:
        return _fail(str(e))
    num_replicas = args.num_instances if args.num_replicas is None else args.num_replicas
    command, environment = build_command(args, mpiexec, _flavour(mpiexec))
    if args.print_topology == "yes":
        print(topology(args.num_instances, num_replicas), flush=True)
    if args.verbose:
        print("keras_ipu.poprun: running " + shlex.join(command), flush=True)
    with tempfile.TemporaryDirectory(prefix="keras_ipu_poprun_") as status:
        env = dict(os.environ, **environment, **{STATUS_DIR_ENV: status})
        process = subprocess.Popen(command, env=env)

        def forward(signum, frame):
            process.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            returncode = process.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if returncode == 0:
            return 0
        summary = summarise(status, args.num_instances, num_replicas)
    if summary:
        sys.stderr.write(f"keras_ipu.poprun: {summary}\n")
    else:
        sys.stderr.write(f"keras_ipu.poprun: mpiexec ended with status {returncode}.\n")
    return returncode if returncode > 0 else 1
