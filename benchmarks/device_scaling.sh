#!/usr/bin/env bash
# Issue 16's many-core measurement, in at most about 6 minutes of wall time,
# on a lent machine that has Python and jax but no keras, no TensorFlow and
# no network (the 16-core device machine of benchmarks/README.md):
#
#   bash benchmarks/device_scaling.sh            # results in $OUT (or /tmp/device_scaling)
#
# What it needs beside the checkout: wheels in .whl/ (ignored by git) for
# what that machine lacks: keras (our pinned version) with what it imports
# (namex, optree and its typing_extensions, absl-py, rich with
# markdown-it-py, mdurl and pygments, h5py for the saved weights), and
# hatchling with packaging, pathspec, pluggy, trove-classifiers and tomlkit
# (to build our C kernel the way `pip install` builds it): a venv of
# Python 3.12 with only jax, numpy and threadpoolctl lacked each of them
# (issue 16, twenty-second pass, s22tidy). benchmarks/README.md, "Measuring
# on another machine", has the download command.
#
# Steps:
#  1. the wheels go into $SITE (on PYTHONPATH), keras_ipu is pip-installed
#     from this checkout (`--ignore-requires-python`: our pin says < 3.12
#     and that machine has 3.12; the pin itself is not changed), which runs
#     hatch_build.py (the C kernel) and installs the import hook;
#  2. thread_scaling.py: ipu and jax, MLP / CNN / transformer / LSTM at
#     batch 128 with SGD, then Keras' demo_functional at batch 32 with Adam,
#     each at default threads (nothing pinned, no thread variables) and on
#     1, 2, 4, 8 and 16 cores (all cores when the machine has fewer or more),
#     defaults and the two ends first so that a cut run keeps them.
#  0. with PROFILES=1, before 2: host_threads.py (the pool's round trip and
#     the models' products on 1..16 threads) and step_profile.py's wall
#     time per kernel of the MLP, CNN, transformer (batch 128, SGD) and
#     demo_functional (batch 32, Adam) steps, on one thread
#     (KERAS_IPU_HOST_THREADS=1) and with default threads; then
#     step_profile.py --run-loop (demo_functional, the MLP with Adam):
#     the step in program order against independent kernels at once.
# COUNTS (e.g. default,1,16,4) replaces the thread counts of stage 2.
# KERAS_IPU_PRODUCT_POOL=0 in the environment measures the products without
# the C pool (the Python pool, OpenBLAS' threads from 4 threads up).
# Without TensorFlow the ipu backend's default engine (auto) cannot reach
# XLA: ipu's numbers here are its NumPy/C engine's.
#
# Cut to fit the time: 10 steps per epoch and 2 timed epochs for the batch
# 128 models (30 and 3 by default), 20 steps and 2 timed epochs for
# demo_functional; each stage gets what is left of BUDGET_S under `timeout`
# (the profiles at most PROFILE_S, the batch-128 curve all but DEMO_S),
# and thread_scaling.py rewrites its JSON after each thread count.

set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_scaling}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl}
BUDGET_S=${BUDGET_S:-345}
# Seconds kept back for the later stages, so that a slow earlier stage cannot
# leave the demo_functional curve (or the whole curve, after PROFILES) empty.
DEMO_S=${DEMO_S:-90}
PROFILE_S=${PROFILE_S:-120}
STEPS=${STEPS:-10}
# More fit_throughput options for both stages (--quick: a smoke test of this script).
FIT_ARGS=${FIT_ARGS:-}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1

left() { local s=$((BUDGET_S - SECONDS - ${1:-0})); echo $((s > 1 ? s : 1)); }

echo "== install ($(date -u +%T))"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
    --ignore-requires-python --no-cache-dir . || exit 1

CORES=$("$PY" -c "import os; print(len(os.sched_getaffinity(0)))")
if [ -z "${COUNTS:-}" ]; then
    COUNTS=default,1,$CORES
    for n in 2 4 8 16; do
        if [ "$n" -lt "$CORES" ]; then COUNTS=$COUNTS,$n; fi
    done
fi

{
    echo "cores $CORES, counts $COUNTS, $(nproc) online"
    grep -m1 "model name" /proc/cpuinfo
    KERAS_BACKEND=ipu "$PY" - <<'EOF'
import sys, numpy, jax, keras, keras_ipu.device.native as native
from threadpoolctl import threadpool_info
from keras_ipu.device.native import threads
print("python", sys.version.split()[0], "numpy", numpy.__version__,
      "jax", jax.__version__, "keras", keras.__version__,
      "keras_ipu C kernel", native.available(),
      "C product pool", threads.product_pool_takes(0, "float32"))
print("wide splits", threads.wide_splits(), "at", threads.max_threads(), "threads")
for pool in threadpool_info():
    print(pool["internal_api"], pool.get("version"), pool["num_threads"], "threads,",
          pool.get("threading_layer"), pool.get("architecture"))
EOF
} 2>&1 | tee "$OUT/env.txt"

if [ "${PROFILES:-0}" = 1 ]; then
    # What the profiles may leave for the curves: all but PROFILE_S seconds.
    KEEP=$((BUDGET_S - SECONDS - PROFILE_S))
    echo "== host_threads.py ($(date -u +%T), $(left) s left)"
    timeout "$(left $KEEP)" "$PY" benchmarks/host_threads.py --repeats 20 \
        --out "$OUT/host_threads.json"
    for spec in "mlp 128 sgd" "cnn 128 sgd" "transformer 128 sgd" "demo_functional 32 adam"; do
        set -- $spec
        for cap in 1 default; do
            echo "== step_profile.py $1, threads $cap ($(date -u +%T), $(left) s left)" \
                | tee -a "$OUT/profiles.txt"
            if [ "$cap" = 1 ]; then export KERAS_IPU_HOST_THREADS=1; else unset KERAS_IPU_HOST_THREADS; fi
            timeout "$(left $KEEP)" "$PY" benchmarks/step_profile.py --model "$1" \
                --batch-size "$2" --optimizer "$3" --repeats 5 --clock wall \
                >> "$OUT/profiles.txt" 2>&1
        done
    done
    # What running independent kernels at once buys there (the whole step in
    # program order against the run loop's, alternating, same bits checked).
    for spec in "demo_functional 32 adam" "mlp 128 adam"; do
        set -- $spec
        echo "== step_profile.py --run-loop $1, default threads ($(date -u +%T), $(left) s left)" \
            | tee -a "$OUT/profiles.txt"
        timeout "$(left $KEEP)" "$PY" benchmarks/step_profile.py --model "$1" \
            --batch-size "$2" --optimizer "$3" --repeats 30 --run-loop \
            >> "$OUT/profiles.txt" 2>&1
    done
    unset KERAS_IPU_HOST_THREADS
fi

echo "== batch 128, SGD ($(date -u +%T), $(left) s left, $DEMO_S kept for the next stage)"
timeout "$(left "$DEMO_S")" "$PY" benchmarks/thread_scaling.py --threads "$COUNTS" \
    --backends ipu,jax --models mlp,cnn,transformer,lstm \
    --steps "$STEPS" --timed-epochs 2 --timeout 200 \
    --out "$OUT/scaling_b128_sgd.json" $FIT_ARGS
echo "rc $?"

echo "== demo_functional, batch 32, Adam ($(date -u +%T), $(left) s left)"
if [ "$(left)" -gt 20 ]; then
    timeout "$(left)" "$PY" benchmarks/thread_scaling.py --threads "$COUNTS" \
        --backends ipu,jax --models demo_functional --batch-size 32 \
        --optimizer adam --steps 20 --timed-epochs 2 --timeout 120 \
        --out "$OUT/scaling_demo_b32_adam.json" $FIT_ARGS
    echo "rc $?"
fi
echo "== done ($(date -u +%T), ${SECONDS} s)"
