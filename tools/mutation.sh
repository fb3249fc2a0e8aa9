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
# MUTATION_TIMEOUT caps the run in seconds.
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
  echo 'pytest_add_cli_args_test_selection ='
  for t in "$@"; do echo "    $t"; done
  echo 'pytest_add_cli_args ='
  echo '    -p'
  echo '    no:cacheprovider'
} >> "$work/setup.cfg"

cd "$work"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
# MUTATION_TIMEOUT (seconds) stops a long run early; unrun mutants show as "not checked".
timeout "${MUTATION_TIMEOUT:-0}" python -m mutmut run \
  ${MUTMUT_MAX_CHILDREN:+--max-children "$MUTMUT_MAX_CHILDREN"} > run.log 2>&1 || true
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
