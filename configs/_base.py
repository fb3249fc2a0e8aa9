"""Shared pieces of the dataset configs: argument parsing, data and game sections.

Every `configs/<dataset>.py` calls `build(...)`, which returns one ConfigDict with
`data`, `game`, `seed` and one section per experiment that applies to the dataset
(`ami`, `dishonest`, `ldp_audit`, `fedmia`, `pastel`, `dp_audit`, `flower_audit`), each built by `configs/_<experiment>.py`,
plus the `defense` section (configs/_defense.py) when an experiment that honours it (`ami`,
`dishonest`) is present. (`fedmia` and `pastel` sweep their own defenses in their sections.)
"""

from __future__ import annotations

import importlib
from typing import Iterable

import ml_collections
from ml_collections import config_dict

from fl_privacy import catalog
from fl_privacy import validate

# The experiment sections a dataset config may carry, and those whose clients run the
# `defense` section's defense: from the one registration of experiments.
EXPERIMENTS = catalog.SECTIONS
DEFENDED = catalog.DEFENDED_SECTIONS


# The arguments a dataset config accepts after `:` (`configs/x.py:smoke,path=FILE`), and
# their types. Anything else is refused: a misspelt `smok` used to run the full job.
ARGS = {'smoke': bool, 'path': str, 'data_dir': str, 'setting': str}
# The passive-attack experiments' two offline settings (`setting=`): 'leaky' (the default: little
# data per client, so the undefended attacks are clearly above chance, as in the papers) and
# 'well_generalising' (the whole digits train split over the clients: attacks near chance, and
# what a defense does there is a finding too). Only the sections in SETTING_SECTIONS differ,
# and only on the datasets of SETTING_DATASETS (elsewhere the papers' settings are the defaults).
SETTINGS = ('leaky', 'well_generalising')
SETTING_SECTIONS = ('fedmia', 'pastel')
SETTING_DATASETS = ('digits', 'npz')
_TRUE = ('true', '1', 'yes')
_FALSE = ('false', '0', 'no')


class ConfigArgError(validate.ConfigError):
  """A `--config=FILE:ARG` argument that is unknown or of the wrong type."""

  def __init__(self, item: str, allowed: str, got):
    super().__init__(f'arg {item}', allowed, got)
    # One line that names what the user typed, not a config field (there is none yet).
    self.args = (f'--config=FILE:{item}: must be {allowed} (got {got!r})',)


_PLACEHOLDER = {'path': 'FILE', 'data_dir': 'DIR', 'setting': '|'.join(SETTINGS)}


def _usage(allowed: dict[str, type]) -> str:
  return ', '.join(f'{k}[=True|False]' if t is bool else f'{k}={_PLACEHOLDER.get(k, "VALUE")}'
                   for k, t in allowed.items())


def parse_arg(arg: str | None,
              allowed: dict[str, type] | tuple[str, ...] | None = None) -> dict:
  """Parses `configs/x.py:smoke,path=FILE` style arguments strictly, with types.

  A bare word is a boolean flag set to True (`smoke`); `key=value` gives a value of
  the key's type: booleans accept only true/false/1/0/yes/no (any case), so
  `smoke=False` is False. Unknown keys, a bare word for a string key, an empty
  value and a repeated key raise `ConfigArgError`.

  Args:
    arg: the text after `:` on the command line, or None.
    allowed: key -> type (bool or str), or a tuple of keys of `ARGS`; default `ARGS`.

  Returns:
    The given keys with typed values.

  Raises:
    ConfigArgError: an argument that is unknown or mistyped.

  >>> parse_arg('smoke,path=/a/b.npz')
  {'smoke': True, 'path': '/a/b.npz'}
  >>> parse_arg('smoke=False')
  {'smoke': False}
  >>> parse_arg('smok')
  Traceback (most recent call last):
  ...
  configs._base.ConfigArgError: --config=FILE:smok: must be one of smoke[=True|False], path=FILE, data_dir=DIR, setting=leaky|well_generalising (got 'smok')
  """
  if allowed is None:
    allowed = ARGS
  elif not isinstance(allowed, dict):
    allowed = {k: ARGS[k] for k in allowed}
  usage = 'one of ' + _usage(allowed)
  out: dict = {}
  if not arg:
    return out
  for item in arg.split(','):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition('=')
    key, value = key.strip(), value.strip()
    if key not in allowed:
      raise ConfigArgError(item, usage, key)
    if key in out:
      raise ConfigArgError(item, f'given once ({usage})', item)
    kind = allowed[key]
    if kind is bool:
      if not sep:
        out[key] = True
      elif value.lower() in _TRUE + _FALSE:
        out[key] = value.lower() in _TRUE
      else:
        raise ConfigArgError(item, f'{key} or {key}=True|False', value)
    else:
      if not sep or not value:
        raise ConfigArgError(
            item, f'{key}={_PLACEHOLDER.get(key, "VALUE")} with a non-empty value', item)
      out[key] = value
  return out


def data_section(name: str, **fields) -> ml_collections.ConfigDict:
  """The `data` section; see `fl_privacy.data.load` for the meaning of each field."""
  section = ml_collections.ConfigDict()
  section.name = name
  # Placeholders rather than None so that `--config.data.max_examples=500` can set them:
  # ml_collections refuses to override a field whose value is a bare None.
  section.data_dir = config_dict.placeholder(str)
  section.path = config_dict.placeholder(str)
  section.attribute = 'Smiling'
  section.image_size = config_dict.placeholder(int)
  section.max_examples = config_dict.placeholder(int)
  for key, value in fields.items():
    section[key] = value
  return section


def _setting(dataset: str, opts: dict) -> str:
  """The `setting=` argument, checked: one of SETTINGS, and given only where it changes
  something; 'paper' for the other datasets, whose sections run the papers' settings."""
  setting = opts.get('setting', SETTINGS[0])
  if setting not in SETTINGS:
    raise ConfigArgError(f'setting={setting}', 'one of ' + ', '.join(SETTINGS), setting)
  if 'setting' in opts and dataset not in SETTING_DATASETS:
    raise ConfigArgError(
        f'setting={setting}', f'given only with the configs of {", ".join(SETTING_DATASETS)} '
        f'(the {dataset} config runs the papers\' settings)', setting)
  return setting if dataset in SETTING_DATASETS else 'paper'


def _check_location(data: ml_collections.ConfigDict, opts: dict) -> None:
  """`path=` only for the npz data, `data_dir=` only for TFDS data: a location the loader does
  not read ran the config's own data and recorded the unused path."""
  readers = {'path': ('npz',), 'data_dir': None}  # None: the TFDS datasets
  local = ('digits', 'npz', 'synthetic')
  for key, names in readers.items():
    if key not in opts:
      continue
    ok = data.name in names if names else data.name not in local
    if not ok:
      where = ('configs/npz.py' if names else 'the configs of TFDS datasets (cifar10, mnist, ...)')
      raise ConfigArgError(f'{key}={opts[key]}', f'given only with {where} (the {data.name} '
                           f'data reads no {key})', opts[key])


def build(dataset: str, arg: str | None, *, data: ml_collections.ConfigDict,
          experiments: Iterable[str], chunk_size: int | None = None
          ) -> ml_collections.ConfigDict:
  """Assembles a dataset config.

  Args:
    dataset: the config's dataset key (passed to every experiment's `section`).
    arg: the string after `:` on the command line (`smoke`, `path=...`,
      `setting=leaky|well_generalising`); parsed strictly by `parse_arg` (unknown or
      mistyped arguments raise `ConfigArgError`, and so do `path` for data other than npz
      and `data_dir` for data other than TFDS: the loader would not read them). `setting`
      (SETTINGS, default 'leaky') goes to the sections of SETTING_SECTIONS and is stored as
      `config.setting` ('paper' on the datasets outside SETTING_DATASETS).
    data: the data section.
    experiments: names of the experiment sections this dataset supports.
    chunk_size: trials per jitted chunk (`game.chunk_size`); None lets the runner size
      chunks by bytes.

  The `game` section (read by `fl_privacy.eval.runner.options`; none of its fields changes
  a result, only speed and memory):
    chunk_size: trials per jitted call, an explicit override; None (default) = 64 groups of
      the byte-sized width (`eval/runner.py`). Memory is bounded by two chunks.
    batch_bytes: working-set budget of one vmapped group of trials; None = the backend's
      default (`runner.DEFAULT_BATCH_BYTES`: 8 MiB on CPU, the measured cache knee; 1 GiB on
      accelerators) or `$FL_PRIVACY_BATCH_BYTES`.
    compile_cache: directory of JAX's persistent compilation cache; None = `$FL_PRIVACY_
      COMPILE_CACHE` or the user cache dir (`~/.cache/fl_privacy/jax`); 'workdir' = under
      the run's workdir; '' = off.
  """
  opts = parse_arg(arg)
  smoke = opts.get('smoke', False)
  setting = _setting(dataset, opts)
  _check_location(data, opts)
  config = ml_collections.ConfigDict()
  config.dataset = dataset
  config.smoke = smoke
  config.setting = setting
  config.seed = 0
  config.data = data
  if opts.get('path'):
    config.data.path = str(opts['path'])
  if opts.get('data_dir'):
    config.data.data_dir = str(opts['data_dir'])
  config.game = ml_collections.ConfigDict()
  config.game.chunk_size = config_dict.placeholder(int) if chunk_size is None else chunk_size
  config.game.batch_bytes = config_dict.placeholder(int)
  config.game.compile_cache = config_dict.placeholder(str)
  for name in experiments:
    if name not in EXPERIMENTS:
      raise ValueError(f'unknown experiment section {name!r}; known: {EXPERIMENTS}')
    module = importlib.import_module(f'configs._{name}')
    extra = {'setting': setting} if name in SETTING_SECTIONS else {}
    config[name] = module.section(dataset, smoke, **extra)
  if any(name in DEFENDED for name in experiments):
    config.defense = importlib.import_module('configs._defense').section(dataset, smoke)
  return config
