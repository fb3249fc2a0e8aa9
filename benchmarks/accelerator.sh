#!/usr/bin/env bash
# The benchmarks on an accelerator, in one pass under a deadline, most telling first.
#
#   bash benchmarks/accelerator.sh OUT_DIR [DEADLINE_SECONDS]   # default 480
#   STEPS="fedmia_measure conv_in_loop" bash benchmarks/accelerator.sh OUT_DIR   # some steps
#
# Each step runs in its own process (a fresh JAX; the main job starts from an empty
# compilation cache, so its first time is a first run's and its second a warm one's) and gets
# at most what is left of the deadline. OUT_DIR/summary.txt holds each step's exit status,
# wall seconds and last line (a benchmark's JSON); OUT_DIR/logs.tar.gz the whole logs. A step
# that fails or runs out of time does not stop the others. Sizes are the defaults except where
# a flag below says otherwise: the peak-RSS children of ldp_audit and game_runner measure host
# memory, which says little on an accelerator, so one chunk each is kept. GPU memory is
# allocated as needed (XLA_PYTHON_CLIENT_PREALLOCATE=false): those children run beside their
# parent.
set -u
out=${1:?usage: accelerator.sh OUT_DIR [DEADLINE_SECONDS]}
deadline=$(( $(date +%s) + ${2:-480} ))
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
work=$(mktemp -d)

step() {  # step NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2; shift 2
  [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]] && return
  local left=$(( deadline - $(date +%s) ))
  (( left < cap )) && cap=$left
  if (( cap < 10 )); then echo "$name skipped (deadline)" >>"$out/summary.txt"; return; fi
  local t0=$(date +%s.%N)
  timeout -k 5 "$cap" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  printf '%s rc=%d wall=%.1fs cap=%ds\n' "$name" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" "$cap" \
    >>"$out/summary.txt"
  tail -n 1 "$work/$name.log" >>"$out/summary.txt"
}

step env 60 "$py" -c 'import jax, flax, optax, numpy, sys; print(sys.version.split()[0], "jax",
jax.__version__, "flax", flax.__version__, "optax", optax.__version__, "numpy",
numpy.__version__, jax.devices())'
[[ -z "${STEPS:-}" ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$out/summary.txt" 2>&1
export FL_PRIVACY_COMPILE_CACHE="$work/cc"  # empty: the first run is a cold one
step ami_main 150 "$py" -m experiments.ami --workdir="$work/ami"
step ami_main_warm 90 "$py" -m experiments.ami --workdir="$work/ami2"
step ami_game 90 "$py" -m benchmarks.ami_game
step ldp_audit 90 "$py" -m benchmarks.ldp_audit --memory_chunks=10000
step dishonest_runs 60 "$py" -m benchmarks.dishonest_runs
step game_runner 60 "$py" -m benchmarks.game_runner --memory_chunks=1024
step fedmia_measure 180 "$py" -m benchmarks.fedmia_measure --models=mlp --chunks=1024
step pastel_mlp 90 "$py" -m benchmarks.pastel_train --models=mlp --repeats=1
step conv_in_loop 90 "$py" -m benchmarks.conv_in_loop
step pastel_resnet 150 "$py" -m benchmarks.pastel_train --models=resnet --repeats=1
# Last, as they are the longest: STEPS="training_audit training_audit_warm" runs them alone.
step training_audit 480 "$py" -m experiments.training_audit --workdir="$work/ta"
step training_audit_warm 300 "$py" -m experiments.training_audit --workdir="$work/ta2"
tar -C "$work" -czf "$out/logs.tar.gz" --exclude=cc --exclude=ami --exclude=ami2 --exclude=ta --exclude=ta2 .
cat "$out/summary.txt"
