"""Shared pieces of the dataset configs: argument parsing, data and game sections.

Every `configs/<dataset>.py` calls `build(...)`, which returns one ConfigDict with
`data`, `game`, `seed` and one section per experiment that applies to the dataset
(`ami`, `dishonest`, `ldp_audit`, `fedmia`, `pastel`), each built by `configs/_<experiment>.py`,
plus the `defense` section (configs/_defense.py) when an experiment that honours it (`ami`,
`dishonest`) is present.
"""

from __future__ import annotations

import importlib
from typing import Iterable

import ml_collections

# Which experiment sections each dataset config carries.
EXPERIMENTS = ('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel')
# Experiments whose clients run the `defense` section's defense.
DEFENDED = ('ami', 'dishonest')


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
          experiments: Iterable[str], chunk_size: int = 1000) -> ml_collections.ConfigDict:
  """Assembles a dataset config.

  Args:
    dataset: the config's dataset key (passed to every experiment's `section`).
    arg: the string after `:` on the command line (`smoke`, `path=...`).
    data: the data section.
    experiments: names of the experiment sections this dataset supports.
    chunk_size: trials per jitted chunk (`game.chunk_size`); memory scales with it.
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
  config.game.chunk_size = 250 if smoke else chunk_size
  for name in experiments:
    if name not in EXPERIMENTS:
      raise ValueError(f'unknown experiment section {name!r}; known: {EXPERIMENTS}')
    module = importlib.import_module(f'configs._{name}')
    config[name] = module.section(dataset, smoke)
  if any(name in DEFENDED for name in experiments):
    config.defense = importlib.import_module('configs._defense').section(dataset, smoke)
  return config
