#!/usr/bin/env bash
# Mutation testing of one module against its own tests (mutmut 3, `pip install -e '.[dev]'`).
#
#   tools/mutation.sh fl_privacy/eval/stats.py                    # tests/*/test_stats*.py
#   tools/mutation.sh fl_privacy/fl/local.py tests/fl/test_local.py tests/fl/test_fedavg_optimizer_state.py
#
# mutmut plants one small bug at a time (an operator, a constant, a dropped argument) in
# MODULE and reruns the given tests; a mutant the tests still pass "survived". The run
# happens in a scratch copy of the repository (MUTATION_WORKDIR, default a new temporary
# folder, kept and printed at the end), so the working tree stays clean. The last lines are
# the score (killed / total) and the surviving mutants; `cd <workdir> && mutmut show NAME`
# prints one as a diff. MUTMUT_MAX_CHILDREN sets the parallel workers (default: all cores);
# MUTATION_TIMEOUT caps the run in seconds. A mutant whose tests take longer than
# (their normal duration + MUTATION_TIMEOUT_CONSTANT s, default 30) x MUTATION_TIMEOUT_MULTIPLIER
# (default 15) counts as a timeout (killed).
#
# JAX: XLA is multithreaded, and a process forked after JAX has compiled hangs at its next
# compile. So the mutants run in mutmut's fork-server mode: the server imports only third-party
# packages (mutation_preload.txt; no JAX backend yet) and each mutant's tests run in a fresh fork
# of it, which compiles its own programs. A persistent JAX compilation cache in the scratch
# folder (jax_cache) makes the unchanged programs a disk read after the first mutant.
# MUTATION_ISOLATION=fork (mutmut's default: fork the process that ran the tests) is only for
# tests that compile nothing new. The pytest plugin mutation_reset.py (scratch copy only)
# clears fl_privacy's functools caches, the runner's trial-size cache and JAX's trace caches
# before every test of a mutation run: otherwise mutmut ties a cached or jitted function (the
# runner's chunk program, `fixed_point.encode`) only to the first test that called it, and runs
# only that test against its mutants. mutmut does not mutate decorated functions at all, so
# library functions are jitted or cached by rebinding (`f = jax.jit(f, ...)`), not decorators.
set -euo pipefail

module=${1:?usage: tools/mutation.sh fl_privacy/<module>.py [test files ...]}
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -f "$repo/$module" ] || { echo "error: $module: no such module in $repo" >&2; exit 2; }
if [ $# -eq 0 ]; then
  stem=$(basename "$module" .py)
  mapfile -t found < <(cd "$repo" && ls tests/*/test_"$stem"*.py 2>/dev/null)
  [ ${#found[@]} -gt 0 ] || { echo "error: no tests/*/test_$stem*.py; name the tests" >&2; exit 2; }
  set -- "${found[@]}"
fi

work=${MUTATION_WORKDIR:-$(mktemp -d -t mutation.XXXXXX)}
mkdir -p "$work"
for item in fl_privacy tests configs experiments setup.cfg pyproject.toml; do
  cp -r "$repo/$item" "$work/"
done
{
  echo
  echo '[mutmut]'
  echo 'source_paths = fl_privacy'
  echo "only_mutate = $module"
  echo 'also_copy ='
  echo '    configs'
  echo '    experiments'
  echo '    mutation_reset.py'
  echo 'pytest_add_cli_args_test_selection ='
  for t in "$@"; do echo "    $t"; done
  echo "timeout_multiplier = ${MUTATION_TIMEOUT_MULTIPLIER:-15}"
  echo "timeout_constant = ${MUTATION_TIMEOUT_CONSTANT:-30}"
  echo "process_isolation = ${MUTATION_ISOLATION:-forkserver}"
  echo 'forkserver_warmup = import'
  echo "preload_modules_file = $work/mutation_preload.txt"
  echo 'pytest_add_cli_args ='
  echo '    -p'
  echo '    no:cacheprovider'
  echo '    -p'
  echo '    mutation_reset'
} >> "$work/setup.cfg"
printf '%s\n' numpy scipy scipy.stats scipy.special pytest absl.logging ml_collections jax \
  jax.numpy optax flax.linen > "$work/mutation_preload.txt"
cat > "$work/mutation_reset.py" <<'PY'
"""pytest plugin (mutation runs only): forget fl_privacy's cached results before each test."""
import functools
import os
import sys


def _reset():
  for name, module in list(sys.modules.items()):
    if not name.startswith('fl_privacy') or module is None:
      continue
    for value in list(vars(module).values()):
      if isinstance(value, functools._lru_cache_wrapper):
        value.cache_clear()
  runner = sys.modules.get('fl_privacy.eval.runner')
  if runner is not None:
    runner._TRIAL_BYTES.clear()
  jax = sys.modules.get('jax')
  if jax is not None:
    # A jitted library function (fixed_point.encode, queries._measure, ...) runs its Python
    # body only when traced; without this only the first test to trace it is tied to it.
    jax.clear_caches()


def pytest_runtest_setup(item):
  # Before every test of a mutation run (stats, clean run, mutants): a function whose result
  # an earlier test cached (the runner's compiled chunk program) is called again, so mutmut
  # ties it to every test that uses it, and a mutant cannot hide behind a cached result.
  del item
  if os.environ.get('MUTANT_UNDER_TEST'):
    _reset()
PY

cd "$work"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$work/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# The test session's compile flags (conftest.py, which the scratch copy does not carry).
export XLA_FLAGS=${XLA_FLAGS:---xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1}
# MUTATION_TIMEOUT (seconds) stops a long run early; unrun mutants show as "not checked".
# MUTATION_NAMES (space-separated, globs allowed) limits the run to those mutants.
# shellcheck disable=SC2086
timeout "${MUTATION_TIMEOUT:-0}" python -m mutmut run \
  ${MUTMUT_MAX_CHILDREN:+--max-children "$MUTMUT_MAX_CHILDREN"} ${MUTATION_NAMES:-} \
  > run.log 2>&1 || true
python -m mutmut results --all true > results.txt 2>&1 || true
python - "$module" <<'PY'
import collections, re, sys
rows = [l.strip() for l in open('results.txt') if ':' in l]
status = collections.Counter(l.rsplit(':', 1)[1].strip() for l in rows)
total = sum(status.values())
killed = status.get('killed', 0) + status.get('timeout', 0)
checked = total - status.get('not checked', 0)
print(f'{sys.argv[1]}: {killed}/{checked} checked mutants killed, {total} in all '
      f'({dict(status)})')
for l in rows:
  if l.rsplit(':', 1)[1].strip() not in ('killed', 'timeout', 'not checked'):
    print('  ', l)
PY
echo "workdir: $work"
