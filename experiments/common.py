"""Shared scaffolding of the experiment scripts: flags, validation, store, Ctrl-C.

A registered experiment (`fl_privacy.catalog`) is one line: `common.run('fedmia')` runs its
pipeline (`fl_privacy.pipelines.base`: validate_config, prepare, plan, figures, SUMMARY).
Lower down, any module can define two functions and hand them to `main`::

  def prepare(config) -> state:    # validate (ConfigError) and load data;
    ...                            # must not write anything
  def sweep(config, state, store, key) -> None:
    for p in ...:                  # one results point per swept value
      common.run_point(store, {'p': p}, lambda: compute(p))

  if __name__ == '__main__':
    common.main('toy_game', prepare, sweep, summary=SUMMARY)

Flags: `--config` (an ml_collections config file, default `configs/digits.py`
of this repository or the experiment's `default_config`; fields are overridable
as `--config.game.chunk_size=4096`), `--workdir` (default
`./runs/<name>-<UTC timestamp>`), `--seed` (overrides `config.seed`; the stored
config holds the seed actually used), `--quiet` (no progress line, no summary).

Output: while the sweep runs, a status line on stderr (point k of N, trials/s,
elapsed, ETA; only when stderr is a terminal: `fl_privacy.report.progress`);
at the end, on stdout, the table of the experiment's headline metrics per point
and where the results and figures are (`fl_privacy.report.summary`).

Compilation: JAX's persistent compilation cache is enabled before `prepare`
(`fl_privacy.eval.compile_cache`; `game.compile_cache`: None = the user cache dir
or `$FL_PRIVACY_COMPILE_CACHE`, 'workdir' = `<workdir>/jax_cache`, '' = off), so
a second run of an experiment loads its XLA programs instead of compiling them.

Exit status: 0 on success (and for `--help`, which lists the flags and where the
config fields are documented); 2 with one line `error: ...` on stderr, before any
data is loaded or anything written, when the command line is wrong (a config file
that does not exist or is not a config (`ConfigFileError`), an unknown or mistyped
`:arg`, an unknown override field or section, an override of a field the config file
built from its arguments (`BUILT_FIELDS`), an override of the wrong type, an unknown
flag, a config that lacks the experiment's section, an empty `--workdir=`, a workdir
that is a file or cannot be written, a seed outside int64), when the
config is invalid (`ConfigError`), the data is unavailable or malformed
(`DataUnavailableError`, `DataFileError`, `FileNotFoundError`) or the workdir
holds results of another config (`ResumeError`). 130 on Ctrl-C, after a message
naming the saved points and the workdir to resume with.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import importlib.util
import logging as std_logging
import os
import sys
from typing import Any, Callable
import warnings

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from fl_privacy import catalog
from fl_privacy import validate
from fl_privacy.eval import compile_cache
from fl_privacy.eval.stats import rate  # re-exported for experiments
from fl_privacy.pipelines import ahead
from fl_privacy.report import ResultsStore
from fl_privacy.report import describe_params
from fl_privacy.report import progress
from fl_privacy.report import summary as summary_lib
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
    'folder are looked up in the repository. `python -m configs` lists the configs and '
    'the experiment sections each carries.',
    lock_config=False)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run folder for results.json/results.csv/figures; '
    're-using one resumes its sweep. Default: ./runs/<name>-<timestamp>.')
_SEED = flags.DEFINE_integer('seed', None, 'Overrides config.seed.')
_QUIET = flags.DEFINE_bool(
    'quiet', False, 'No progress line and no summary table (log lines only). The progress '
    'line is drawn only when stderr is a terminal anyway.')

__all__ = ['main', 'run_point', 'rate', 'REPO_ROOT', 'DEFAULT_CONFIG']

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


# The config section each experiment reads (`experiments.<name>` -> `config.<section>`), from
# the one registration of experiments.
SECTIONS = {name: e.section for name, e in catalog.EXPERIMENTS.items()}
_HELP_FLAGS = ('-h', '--help', '-help', '--helpshort', '--helpfull', '-?')


def _expected_errors() -> tuple[type[BaseException], ...]:
  """Errors that mean "bad config or missing data", reported as exit status 2."""
  errors: tuple[type[BaseException], ...] = (validate.ConfigError,
                                             FileNotFoundError)
  try:
    from fl_privacy.data import DataFileError  # pylint: disable=g-import-not-at-top
    from fl_privacy.data import DataUnavailableError  # pylint: disable=g-import-not-at-top
  except ImportError:
    return errors
  return errors + (DataUnavailableError, DataFileError)


def _repo_path(value: str) -> str:
  path, sep, arg = value.partition(':')
  if (path and not os.path.isabs(path) and not os.path.exists(path) and
      os.path.exists(os.path.join(REPO_ROOT, path))):
    return os.path.join(REPO_ROOT, path) + sep + arg
  return value


def resolve_config_arg(argv: list[str], default: str | None = None) -> list[str]:
  """Makes `--config` explicit and resolvable from any current folder.

  Adds `--config=<default>` (`<repo>/configs/digits.py` unless `default` names
  another file) when no `--config` is given, and
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
    out.insert(1, f'--config={default or DEFAULT_CONFIG}')
  return out


def _config_value(argv: list[str]) -> str:
  """The (resolved) `--config` value of `argv`; the last one wins, as in absl."""
  value = DEFAULT_CONFIG
  for i, a in enumerate(argv):
    if a == '--':
      break
    if a.startswith('--config='):
      value = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      value = argv[i + 1]
  return value


class ConfigFileError(ValueError):
  """A `--config` file that is not a dataset config: not Python, or without `get_config`."""


def load_config_file(path: str, arg: str | None):
  """Loads `path`'s `get_config(arg)` as absl's config flag does (without overrides).

  Raises:
    ConfigFileError: the file is not a Python module (no `.py`, or a syntax error) or defines
      no `get_config` (e.g. a section module, `configs/_ami.py`).
    validate.ConfigError: `get_config` refused its argument.
  """
  shown = os.path.relpath(path, REPO_ROOT) if path.startswith(REPO_ROOT) else path
  allowed = ('must be a config file: a Python module defining get_config(arg), e.g. '
             'configs/digits.py')
  spec = importlib.util.spec_from_file_location(
      '_fl_privacy_config_' + os.path.splitext(os.path.basename(path))[0], path)
  if spec is None or spec.loader is None:
    raise ConfigFileError(f'--config={shown}: {allowed} (got a file that is not a .py module)')
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigFileError(f'--config={shown}: {allowed} (got a file Python cannot read: '
                          f'{type(e).__name__} at line {e.lineno}: {e.msg})') from e
  except Exception as e:  # pylint: disable=broad-except  # the user's file fails on import
    first = (str(e).splitlines() or [''])[0]
    raise ConfigFileError(f'--config={shown}: {allowed} (got a module that fails on import: '
                          f'{type(e).__name__}: {first})') from e
  get_config = getattr(module, 'get_config', None)
  if not callable(get_config):
    what = ('a section module (configs/_<experiment>.py: its `section` is assembled by a '
            'dataset config)' if hasattr(module, 'section') else 'a module without get_config')
    raise ConfigFileError(f'--config={shown}: {allowed} (got {what})')
  return get_config(arg) if arg else get_config()


def _config_files() -> list[str]:
  files = sorted(glob.glob(os.path.join(REPO_ROOT, 'configs', '*.py')))
  return [f for f in files if not os.path.basename(f).startswith('_')]


def _configs_with(section: str) -> list[str]:
  """The repository's config files that carry `section`, as `configs/<name>.py`."""
  out = []
  for path in _config_files():
    try:
      config = load_config_file(path, None)
    except Exception:  # pylint: disable=broad-except
      continue  # a broken config is not a suggestion
    if section in config:
      out.append(os.path.relpath(path, REPO_ROOT))
  return out


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
  """(`--config.a.b...` as typed, dotted path `a.b`) of every config override."""
  out = []
  for a in argv[1:]:
    if a == '--':
      break
    for prefix in ('--config.', '--noconfig.'):
      if a.startswith(prefix):
        path = a[len(prefix):].split('=', 1)[0]
        out.append((a, path))
  return out


# Top-level fields a config file sets from its arguments (`configs/_base.py: build`): they
# record what the sections were built for, so an override would record what did not run
# (`--config.setting=foo` ran the leaky sections and recorded 'foo').
BUILT_FIELDS = {
    'smoke': 'given as --config=FILE:smoke[=True|False] (the sections\' sizes are built from '
             'it)',
    'setting': 'given as --config=FILE:setting=leaky|well_generalising (the sections are built '
               'from it)',
    'dataset': 'the config file\'s own (pick another config file, see python -m configs)',
}


def _check_override(config, typed: str, path: str, config_file: str) -> str | None:
  """Why the override `typed` (dotted `path`) names no field of `config`, or a field the
  config file built from its arguments (`BUILT_FIELDS`), or None."""
  if path in BUILT_FIELDS:
    return str(validate.ConfigError(path, BUILT_FIELDS[path], typed))
  node, walked = config, []
  for part in path.split('.'):
    name = part.split('[', 1)[0]  # `a.b[0]`: check the field `b`
    keys = tuple(node.keys()) if hasattr(node, 'keys') else ()
    if name not in keys:
      where = 'config' + ''.join('.' + w for w in walked)
      what = 'a section or field' if not walked else 'a field'
      return str(validate.ConfigError(
          '.'.join(walked + [name]),
          f'{what} of {where} in {config_file} (one of {", ".join(sorted(keys))})',
          typed))
    node = node[name]
    walked.append(name)
  return None


def check_command_line(name: str, argv: list[str]) -> str | None:
  """Checks the command line before absl parses it; the one-line error, or None.

  Catches what absl and ml_collections would report as a traceback (exit 1) or
  not at all: a config file that does not exist, an unknown or mistyped
  `:arg` (`configs._base.ConfigArgError`), a config without the experiment's
  section, and an override of a field or section the config does not have.

  Args:
    name: the experiment (`SECTIONS` maps it to the section it reads).
    argv: the command line after `resolve_config_arg`.
  """
  value = _config_value(argv)
  path, _, arg = value.partition(':')
  if not os.path.isfile(path):
    files = ', '.join(os.path.relpath(f, REPO_ROOT) for f in _config_files())
    return (f'--config={value}: must be an existing config file, e.g. one of {files} '
            f'(got no such file {path!r})')
  try:
    config = load_config_file(path, arg or None)
  except (validate.ConfigError, ConfigFileError) as e:
    return str(e)
  shown = os.path.relpath(path, REPO_ROOT) if path.startswith(REPO_ROOT) else path
  section = SECTIONS.get(name)
  if section is not None and section not in config:
    carriers = ', '.join(_configs_with(section)) or 'none'
    present = tuple(k for k in config.keys() if k in SECTIONS.values())
    return str(validate.ConfigError(
        section, f'present for experiments.{name}: {shown} has no {section!r} section; '
        f'configs that carry one: {carriers}', f'sections {present}'))
  for typed, dotted in _overrides(argv):
    problem = _check_override(config, typed, dotted, shown)
    if problem:
      return problem
  return None


def refuse_unused(unused: dict[str, str], argv: list[str] | None = None) -> None:
  """Raises `ConfigError` for a command-line override of a field the run does not read.

  Args:
    unused: dotted field -> why the run does not read it (`pipelines.base.unused`).
    argv: the command line (default `sys.argv`).
  """
  for typed, dotted in _overrides(sys.argv if argv is None else argv):
    field = dotted.split('[', 1)[0]
    if field in unused:
      raise validate.ConfigError(field, f'left at its default: {unused[field]} (an override '
                                 'would be recorded as if it ran)', typed)


def check_workdir(workdir: str) -> str | None:
  """Why `workdir` cannot hold the run's results, or None; creates nothing.

  It must be a folder that can be written, or a path that does not exist yet
  whose nearest existing ancestor is a writable folder (it is created later).
  """
  shown = f'--workdir={workdir}'
  if os.path.exists(workdir):
    if not os.path.isdir(workdir):
      return f'{shown}: must be a folder or a new path (got an existing file)'
    if not os.access(workdir, os.W_OK | os.X_OK):
      return f'{shown}: must be a folder that can be written (got a read-only folder)'
    return None
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f'{shown}: must be a folder or a new path (got a path under the file {parent})'
  if not os.access(parent, os.W_OK | os.X_OK):
    return (f'{shown}: must be a folder that can be created (got a path under the '
            f'read-only folder {parent})')
  return None


def usage(name: str, default: str | None = None) -> str:
  """What `--help` prints: the experiment's docstring, the flags, where fields live."""
  section = SECTIONS.get(name)
  doc = (sys.modules['__main__'].__doc__ or '').strip()
  fields = (f'configs/_{section}.py (function `section`)' if section not in (None, 'toy')
            else 'the config file\'s docstring')
  lines = [doc, ''] if doc else []
  lines += [
      f'usage: python -m experiments.{name} [--config=FILE[:ARGS]] [--workdir=DIR] '
      '[--seed=N] [--quiet] [--config.SECTION.FIELD=VALUE ...]',
      '',
      'flags:',
      f'  --config=FILE[:ARGS]  a config file (default '
      f'{os.path.relpath(default or DEFAULT_CONFIG, REPO_ROOT)}; list: python -m configs);'
      ' ARGS: smoke[=True|False], path=FILE (npz), data_dir=DIR (TFDS),'
      ' setting=leaky|well_generalising (fedmia, pastel on digits/npz), comma-separated',
      '  --workdir=DIR         results folder; re-using one resumes its sweep '
      '(default ./runs/<experiment>-<UTC time>)',
      '  --seed=N              overrides config.seed',
      '  --quiet               no progress line (drawn only on a terminal) and no summary table',
      f'  --config.{section or "SECTION"}.FIELD=VALUE   overrides one config field '
      f'(unknown fields are refused)',
      '',
      f'config fields of this experiment: {fields}; data fields: configs/_base.py;',
      'datasets and commands: BUILD.md; expected results: docs/experiments/<name>.md.',
  ]
  return '\n'.join(lines)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with its errors as one line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def default_workdir(name: str) -> str:
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y%m%d-%H%M%S')
  return os.path.join('runs', f'{name}-{stamp}')


def _apply_seed(config) -> int:
  """The run seed (`--seed` or `config.seed`), written back into the config."""
  if _SEED.value is not None:
    config.seed = int(_SEED.value)
  seed = config.get('seed')
  return SEED_RULE.check('seed', seed)


# Seeds reach numpy and JAX as int64 (`jax.random.key`, `np.int64`): larger ones overflowed
# after the results files were opened.
SEED_RULE = validate.Rule('an integer in [-2**63, 2**63 - 1] (seeds are int64; or pass --seed)',
                          lambda v: isinstance(v, int) and not isinstance(v, bool) and
                          -2**63 <= v < 2**63)


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


class _Hold(std_logging.Handler):
  """Keeps the log records of the start of a run (see `held_logs`)."""

  def __init__(self):
    super().__init__()
    self.records: list[std_logging.LogRecord] = []
    self.dropped = False

  def emit(self, record):
    self.records.append(record)

  def drop(self) -> None:
    """The inputs were bad: what was held is not shown, so the error line stands alone."""
    self.dropped = True


@contextlib.contextmanager
def held_logs():
  """Holds log records and Python warnings until the block ends, then shows them.

  A bad-input run must print one line; without this it first printed JAX's backend probing
  ("Unable to initialize backend 'tpu'"), the compile-cache INFO line and any warning of the
  data loading. Holding (rather than lowering the verbosity) keeps those lines, in order, for
  a run whose inputs pass; `hold.drop()` discards them for one that stops with exit status 2.
  An unexpected exception shows them too: they may explain it.
  """
  root = std_logging.getLogger()
  handlers = list(root.handlers)
  hold = _Hold()
  for h in handlers:
    root.removeHandler(h)
  root.addHandler(hold)
  try:
    with warnings.catch_warnings(record=True) as caught:
      yield hold
  finally:
    root.removeHandler(hold)
    for h in handlers:
      root.addHandler(h)
    if not hold.dropped:
      for record in hold.records:
        root.callHandlers(record)
      for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def _start(name: str, prepare: Callable[[Any], Any], config, workdir: str):
  """Checks the inputs, loads the data, opens the store: (error, seed, state, store).

  `error` is the one-line message of a bad input (None when all passed); nothing is written
  before the store is opened, which is the last step.
  """
  problem = check_workdir(workdir)
  if problem:
    return problem, None, None, None
  try:
    ahead.enabled()  # $FL_PRIVACY_AHEAD, read by the pipelines that train ahead
  except ValueError as e:
    return str(e), None, None, None
  cache = _compile_cache_setting(config)
  if cache != 'workdir':  # 'workdir' waits for the store: nothing is written before it
    compile_cache.enable(compile_cache.resolve(cache))
  try:
    seed = _apply_seed(config)
    state = prepare(config)
  except _expected_errors() as e:
    return str(e), None, None, None
  try:
    store = ResultsStore(workdir, name, config)
  except ResumeError as e:
    return str(e), None, None, None
  if cache == 'workdir':
    compile_cache.enable(compile_cache.resolve(cache, workdir))
  return None, seed, state, store


def _run(name: str, prepare: Callable[[Any], Any],
         sweep: Callable[[Any, Any, ResultsStore, jax.Array], None],
         summary=None) -> int:
  config = _CONFIG.value
  store = None
  workdir = None
  try:
    if _WORKDIR.value is not None and not _WORKDIR.value.strip():
      return _error('--workdir=: must be a folder path; leave the flag out for the default '
                    f'./runs/{name}-<UTC time> (got an empty value)')
    workdir = _WORKDIR.value or default_workdir(name)
    with held_logs() as hold:
      problem, seed, state, store = _start(name, prepare, config, workdir)
      if problem:
        hold.drop()
    if problem:
      return _error(problem)
    logging.info('%s: workdir %s, %d point(s) already saved, seed %d', name,
                 workdir, len(store.points), seed)
    tracker = progress.Progress(name, summary=summary,
                                enabled=not _QUIET.value and _is_terminal(sys.stderr))
    with progress.activate(tracker):
      try:
        sweep(config, state, store, jax.random.key(seed))
      except validate.ConfigError as e:
        return _error(str(e))
    store.finish()
    logging.info('%s: done, %d point(s) in %s', name, len(store.points),
                 store.json_path)
    if not _QUIET.value:
      print(final_report(summary, store, tracker), flush=True)
    return 0
  except KeyboardInterrupt:
    return _interrupted(store, workdir)


def _is_terminal(stream) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


def final_report(summary, store: ResultsStore, tracker: progress.Progress) -> str:
  """The end-of-run text: the headline table, then where the results and figures are."""
  parts = [f'{store.experiment}: {len(store.points)} point(s) in '
           f'{summary_lib.format_duration(tracker.clock() - tracker.t_start)}']
  table = summary_lib.render(summary, store.points, resumed=tracker.resumed)
  if table:
    parts.append(table)
  parts.append(summary_lib.outputs(store.workdir))
  return '\n\n'.join(parts)


def main(name: str, prepare: Callable[[Any], Any],
         sweep: Callable[[Any, Any, ResultsStore, jax.Array], None],
         summary=None, default_config: str | None = None) -> None:
  """Parses flags and runs an experiment: validate, prepare, store, sweep, finish.

  Args:
    name: experiment name (results.json `experiment`, default workdir prefix).
    prepare: `config -> state`; validates the config (raising ConfigError) and
      loads data. Nothing may be written before it returns.
    sweep: `(config, state, store, key) -> None`; runs the sweep points, skipping
      those `store.get` already has (see `run_point`).
    summary: the experiment's headline columns (`fl_privacy.report.summary.Table`s),
      logged per saved point and printed as a table at the end.
    default_config: the config used without `--config` (default `configs/digits.py`),
      relative to the repository.
  """
  default = os.path.join(REPO_ROOT, default_config) if default_config else None
  argv = resolve_config_arg(sys.argv, default)
  if any(a in _HELP_FLAGS for a in argv[1:]):
    print(usage(name, default))
    sys.exit(0)
  problem = check_command_line(name, argv)
  if problem:
    sys.exit(_error(problem))
  sys.argv = argv
  app.run(lambda argv: _leftovers(argv) or (initialize_distributed(),
                                              _run(name, prepare, sweep, summary))[1],
          flags_parser=_parse_flags)


def run(name: str) -> None:
  """`main` for experiment `name` of `fl_privacy.catalog`: its pipeline (`pipelines.base`),
  headline columns and default config. A pipeline whose optional extra is missing
  (`validate.MissingExtraError`, e.g. Flower) exits with status 2 and the error's first line."""
  from fl_privacy.pipelines import base  # pylint: disable=g-import-not-at-top
  try:
    pipeline = base.load(name)
  except validate.MissingExtraError as e:
    # An optional extra the pipeline needs is missing (fl_privacy.flower: Flower); the error
    # names the install command. One line, exit status 2, as a config error. Any other
    # ImportError is a bug and keeps its traceback.
    sys.exit(_error(f'experiments.{name}: {str(e).splitlines()[0]}'))
  def prepare(config):
    refuse_unused(base.unused(pipeline, config))
    return pipeline.prepare(config)

  main(name, prepare,
       lambda config, state, store, key: base.sweep(pipeline, config, state, store, key),
       summary=pipeline.SUMMARY, default_config=catalog.get(name).default_config)


def _leftovers(argv: list[str]) -> int:
  """Exit status 2 for words absl left unparsed (a typo'd flag without `--`), else 0."""
  if len(argv) > 1:
    return _error(f'{argv[1]}: must be a flag (--config, --workdir, --seed, --quiet, '
                  f'--config.SECTION.FIELD=VALUE; see --help) (got {len(argv) - 1} '
                  f'unexpected argument(s) {argv[1:]})')
  return 0
