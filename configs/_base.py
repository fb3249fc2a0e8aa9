"""Shared pieces of the dataset configs: argument parsing, data and game sections.

Every `configs/<dataset>.py` calls `build(...)`, which returns one ConfigDict with
`data`, `game`, `seed` and one section per experiment that applies to the dataset
(`ami`, `dishonest`, `ldp_audit`), each built by `configs/_<experiment>.py`.
"""

from __future__ import annotations

import importlib
from typing import Iterable

import ml_collections
from ml_collections import config_dict

# Which experiment sections each dataset config carries.
EXPERIMENTS = ('ami', 'dishonest', 'ldp_audit')


def parse_arg(arg: str | None) -> dict[str, str | bool]:
  """Parses `configs/x.py:smoke,path=FILE` style arguments into a dict.

  A bare word becomes `True` (e.g. `smoke`); `key=value` keeps the string value.
  """
  out: dict[str, str | bool] = {}
  if not arg:
    return out
  for item in arg.split(','):
    item = item.strip()
    if not item:
      continue
    if '=' in item:
      key, value = item.split('=', 1)
      out[key.strip()] = value.strip()
    else:
      out[item] = True
  return out


def data_section(name: str, **fields) -> ml_collections.ConfigDict:
  """The `data` section; see `fl_privacy.data.load` for the meaning of each field."""
  section = ml_collections.ConfigDict()
  section.name = name
  section.data_dir = None
  section.path = None
  section.attribute = 'Smiling'
  section.image_size = None
  section.max_examples = None
  for key, value in fields.items():
    section[key] = value
  return section


def build(dataset: str, arg: str | None, *, data: ml_collections.ConfigDict,
          experiments: Iterable[str], chunk_size: int | None = None
          ) -> ml_collections.ConfigDict:
  """Assembles a dataset config.

  Args:
    dataset: the config's dataset key (passed to every experiment's `section`).
    arg: the string after `:` on the command line (`smoke`, `path=...`).
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
  smoke = bool(opts.get('smoke', False))
  config = ml_collections.ConfigDict()
  config.dataset = dataset
  config.smoke = smoke
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
    config[name] = module.section(dataset, smoke)
  return config
