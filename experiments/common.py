"""Shared scaffolding of the experiment scripts: flags, validation, store, Ctrl-C.

An experiment module defines two functions and hands them to `main`::

  def prepare(config) -> state:    # validate (ConfigError) and load data;
    ...                            # must not write anything
  def sweep(config, state, store, key) -> None:
    for p in ...:                  # one results point per swept value
      common.run_point(store, {'p': p}, lambda: compute(p))

  if __name__ == '__main__':
    common.main('toy_game', prepare, sweep)

Flags: `--config` (an ml_collections config file, default `configs/digits.py`
of this repository; fields are overridable as `--config.game.chunk_size=4096`),
`--workdir` (default `./runs/<name>-<UTC timestamp>`), `--seed` (overrides
`config.seed`; the stored config holds the seed actually used).

Compilation: JAX's persistent compilation cache is enabled before `prepare`
(`fl_privacy.eval.compile_cache`; `game.compile_cache`: None = the user cache dir
or `$FL_PRIVACY_COMPILE_CACHE`, 'workdir' = `<workdir>/jax_cache`, '' = off), so
a second run of an experiment loads its XLA programs instead of compiling them.

Exit status: 0 on success; 2 with one line `error: ...` on stderr when the config
is invalid (`ConfigError`), the data is unavailable (`DataUnavailableError`,
`FileNotFoundError`) or the workdir holds results of another config
(`ResumeError`); in the first two cases nothing is written. 130 on Ctrl-C, after a
message naming the saved points and the workdir to resume with.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from fl_privacy import validate
from fl_privacy.eval import compile_cache
from fl_privacy.eval.stats import rate  # re-exported for experiments
from fl_privacy.report import ResultsStore
from fl_privacy.report import describe_params
from fl_privacy.report import run_point  # re-exported for experiments
from fl_privacy.report import ResumeError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'configs', 'digits.py')

# The default is filled in by `main` (not here): absl parses a flag's default
# when the flag is defined, and loading a config at import time would make every
# experiment fail whenever that one default config is broken or slow.
_CONFIG = config_flags.DEFINE_config_file(
    'config', default=None,
    help_string='Config file (configs/<dataset>.py[:arg]); default '
    f'{DEFAULT_CONFIG}. Relative paths that do not exist from the current '
    'folder are looked up in the repository.',
    lock_config=False)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run folder for results.json/results.csv/figures; '
    're-using one resumes its sweep. Default: ./runs/<name>-<timestamp>.')
_SEED = flags.DEFINE_integer('seed', None, 'Overrides config.seed.')

__all__ = ['main', 'run_point', 'rate', 'REPO_ROOT', 'DEFAULT_CONFIG']

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


def _expected_errors() -> tuple[type[BaseException], ...]:
  """Errors that mean "bad config or missing data", reported as exit status 2."""
  errors: tuple[type[BaseException], ...] = (validate.ConfigError,
                                             FileNotFoundError)
  try:
    from fl_privacy.data import DataUnavailableError  # pylint: disable=g-import-not-at-top
  except ImportError:
    return errors
  return errors + (DataUnavailableError,)


def _repo_path(value: str) -> str:
  path, sep, arg = value.partition(':')
  if (path and not os.path.isabs(path) and not os.path.exists(path) and
      os.path.exists(os.path.join(REPO_ROOT, path))):
    return os.path.join(REPO_ROOT, path) + sep + arg
  return value


def resolve_config_arg(argv: list[str]) -> list[str]:
  """Makes `--config` explicit and resolvable from any current folder.

  Adds `--config=<repo>/configs/digits.py` when no `--config` is given, and
  rewrites a relative `--config=PATH[:arg]` (or `--config PATH`) that does not
  exist from here to the repository's file, so `--config=configs/toy.py` works
  from any folder.
  """
  out = list(argv[:1])
  given = False
  i = 1
  while i < len(argv):
    a = argv[i]
    if a == '--':
      out.extend(argv[i:])
      break
    if a.startswith('--config='):
      given = True
      a = '--config=' + _repo_path(a[len('--config='):])
    elif a == '--config' and i + 1 < len(argv):
      given = True
      out.extend([a, _repo_path(argv[i + 1])])
      i += 2
      continue
    out.append(a)
    i += 1
  if not given:
    out.insert(1, f'--config={DEFAULT_CONFIG}')
  return out


def default_workdir(name: str) -> str:
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y%m%d-%H%M%S')
  return os.path.join('runs', f'{name}-{stamp}')


def _apply_seed(config) -> int:
  """The run seed (`--seed` or `config.seed`), written back into the config."""
  if _SEED.value is not None:
    config.seed = int(_SEED.value)
  seed = config.get('seed')
  validate.require(isinstance(seed, int) and not isinstance(seed, bool),
                   'seed', 'an integer (or pass --seed)', seed)
  return seed


def _error(message: str) -> int:
  print(f'error: {message}', file=sys.stderr)
  return EXIT_CONFIG


def _interrupted(store: ResultsStore | None, workdir: str | None) -> int:
  if store is None:
    print('interrupted before any point was saved', file=sys.stderr)
    return EXIT_INTERRUPTED
  points = store.points
  lines = [f'interrupted: {len(points)} point(s) saved in {store.workdir}']
  lines += [f'  {describe_params(p["params"])}' for p in points]
  lines.append(f'resume with: --workdir={workdir}')
  print('\n'.join(lines), file=sys.stderr)
  return EXIT_INTERRUPTED


DISTRIBUTED_ENV = ('FL_PRIVACY_COORDINATOR', 'FL_PRIVACY_NUM_PROCESSES', 'FL_PRIVACY_PROCESS_ID')


def initialize_distributed() -> bool:
  """Joins a multi-process run when the environment asks for one; returns whether it did.

  `FL_PRIVACY_COORDINATOR=host:port` with `FL_PRIVACY_NUM_PROCESSES` and
  `FL_PRIVACY_PROCESS_ID` start `jax.distributed.initialize` with those values;
  `FL_PRIVACY_DISTRIBUTED=1` calls it without arguments (Cloud TPU, SLURM, Open MPI fill them
  in). On CPU the processes exchange outcomes through gloo collectives. Must run before any
  other JAX call; every process then runs its share of every chunk and process 0 writes.
  """
  coordinator = os.environ.get(DISTRIBUTED_ENV[0])
  if not coordinator and os.environ.get('FL_PRIVACY_DISTRIBUTED') != '1':
    return False
  # Only the CPU backend reads this; accelerators use their own collectives.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if coordinator:
    jax.distributed.initialize(coordinator_address=coordinator,
                               num_processes=int(os.environ[DISTRIBUTED_ENV[1]]),
                               process_id=int(os.environ[DISTRIBUTED_ENV[2]]))
  else:
    jax.distributed.initialize()
  logging.info('process %d of %d', jax.process_index(), jax.process_count())
  return True


def _compile_cache_setting(config) -> str | None:
  """`game.compile_cache` (see configs/_base.py); None when the config has no such field."""
  game = config.get('game')
  return None if game is None else game.get('compile_cache')


def _run(name: str, prepare: Callable[[Any], Any],
         sweep: Callable[[Any, Any, ResultsStore, jax.Array], None]) -> int:
  config = _CONFIG.value
  store = None
  workdir = None
  try:
    cache = _compile_cache_setting(config)
    if cache != 'workdir':  # 'workdir' waits for the store: nothing is written before it
      compile_cache.enable(compile_cache.resolve(cache))
    try:
      seed = _apply_seed(config)
      state = prepare(config)
    except _expected_errors() as e:
      return _error(str(e))
    workdir = _WORKDIR.value or default_workdir(name)
    try:
      store = ResultsStore(workdir, name, config)
    except ResumeError as e:
      return _error(str(e))
    if cache == 'workdir':
      compile_cache.enable(compile_cache.resolve(cache, workdir))
    logging.info('%s: workdir %s, %d point(s) already saved, seed %d', name,
                 workdir, len(store.points), seed)
    try:
      sweep(config, state, store, jax.random.key(seed))
    except validate.ConfigError as e:
      return _error(str(e))
    store.finish()
    logging.info('%s: done, %d point(s) in %s', name, len(store.points),
                 store.json_path)
    return 0
  except KeyboardInterrupt:
    return _interrupted(store, workdir)


def main(name: str, prepare: Callable[[Any], Any],
         sweep: Callable[[Any, Any, ResultsStore, jax.Array], None]) -> None:
  """Parses flags and runs an experiment: validate, prepare, store, sweep, finish.

  Args:
    name: experiment name (results.json `experiment`, default workdir prefix).
    prepare: `config -> state`; validates the config (raising ConfigError) and
      loads data. Nothing may be written before it returns.
    sweep: `(config, state, store, key) -> None`; runs the sweep points, skipping
      those `store.get` already has (see `run_point`).
  """
  sys.argv = resolve_config_arg(sys.argv)
  app.run(lambda argv: (initialize_distributed(), _run(name, prepare, sweep))[1])
