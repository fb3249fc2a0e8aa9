"""The interface every experiment pipeline satisfies, and the one sweep that drives them.

A pipeline is a module (registered in `fl_privacy.catalog`) with:

- `NAME`: the experiment's name; `SUMMARY`: its headline columns
  (`fl_privacy.report.summary.Table`s), logged per saved point and printed at the end.
- `validate_config(config) -> None`: every check that needs no data (ConfigError naming the field);
  loads nothing and writes nothing.
- `prepare(config) -> state`: `validate_config`, then the checks that need the data, then the data
  (and anything else every point shares). Writes nothing.
- `plan(config, state, store, key) -> list[Point]`: the sweep's points in order, each its
  params and how to compute it. Work the points share (a training several attacks score) is
  done lazily by the first point that needs it, so a resumed sweep whose points are all saved
  does none of it.
- `figures(config, state, store, key) -> None`: tables and figures from the stored points
  (and the run's artifacts), written atomically into `store.workdir`.
- optionally `unused_fields(config) -> {dotted field: why}`: fields of its section this
  config's run does not read (e.g. the input mechanisms' fields when LDP-SGD is audited).
  `experiments.common` refuses a command-line override of one (exit status 2, one line naming
  it) rather than record a value that did not run; `unused(pipeline, config)` reads it, with
  the `defense` section's fields the experiment's clients do not run (`defense_unused`: all
  of them where `catalog` says the experiment is not `defended`) and the `data` section's
  dataset-specific fields another dataset does not read (`data_unused`).

`sweep(pipeline, config, state, store, key)` runs the plan through `report.run_point`
(a saved point is read back, not recomputed), then `figures`. The scaffolding of
`experiments/common.py` does the rest (flags, exit statuses, the store, Ctrl-C).
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from fl_privacy import catalog
from fl_privacy import data as data_lib
from fl_privacy import validate
from fl_privacy.defenses import registry
from fl_privacy.report import progress
from fl_privacy.report import run_point


@dataclasses.dataclass(frozen=True)
class Point:
  """One point of a sweep.

  Attributes:
    params: the point's flat params (its identity in the results store).
    compute: `() -> (metrics, n)`, called only when the store lacks the point.
    unit: what `n` counts ('trials', 'runs', 'examples', 'scores', ...).
    after: `(metrics) -> None`, called with the point's metrics whether computed now or read
      back (e.g. a figure's data a resumed point must still have, a violation to log).
  """
  params: Mapping[str, Any]
  compute: Callable[[], tuple[Mapping[str, Any], int]]
  unit: str = 'trials'
  after: Callable[[Mapping[str, Any]], None] | None = None


@runtime_checkable
class Pipeline(Protocol):
  """What `experiments.common.run` needs of an experiment's pipeline (module docstring)."""

  NAME: str
  SUMMARY: Any

  def validate_config(self, config) -> None:
    ...

  def prepare(self, config) -> Any:
    ...

  def plan(self, config, state, store, key) -> list[Point]:
    ...

  def figures(self, config, state, store, key) -> None:
    ...


def unused(pipeline, config) -> dict[str, str]:
  """The pipeline's `unused_fields(config)` (or {} when it declares none) and the fields of the
  `defense` section its clients do not run (`defense_unused`)."""
  fn = getattr(pipeline, 'unused_fields', None)
  name = getattr(pipeline, 'NAME', None)
  out = defense_unused(config, name) if name in catalog.EXPERIMENTS else {}
  out.update(data_unused(config))
  out.update(fn(config) if fn is not None else {})
  return out


def train_test(config) -> tuple[Any, Any]:
  """The `train` and `test` splits of `config.data` (`data.load`), for the pipelines that train
  on one and evaluate on the other; a dataset without both is refused
  (`validate.ConfigError` naming `data.name`)."""
  splits = data_lib.load(config.data)
  validate.require('train' in splits and 'test' in splits, 'data.name',
                   'a dataset with train and test splits', config.data.name)
  return splits['train'], splits['test']


def data_unused(config) -> dict[str, str]:
  """`unused_fields` entries of the `data` section: `attribute` (the CelebA label) on any other
  dataset. {} without a section."""
  data = config.get('data') if hasattr(config, 'get') else None
  if data is None or not hasattr(data, 'keys') or 'attribute' not in data:
    return {}
  name = data.get('name')
  if name == 'celeb_a':
    return {}
  return {'data.attribute': f"read only by data.name='celeb_a' (the data is {name!r})"}


def defense_reads(section) -> set[str]:
  """The fields of a `defense` section (configs/_defense.py) that `defenses.configure` reads
  for the defense it names: `name`, the named defense's own parameters, and for a DP defense
  its claim's `delta`, `accountant`, `participation` and `target_epsilon`, with
  `noise_multiplier` only when no target is set (the accountant then finds the multiplier)."""
  name = section.name
  d = registry.DEFENSES[name]
  reads = {'name'} | {f for f in d.params.values() if registry.FIELDS[f].section}
  if name in registry.DP_DEFENSES:
    reads |= {'delta', 'accountant', 'participation', 'target_epsilon'}
    if section.get('target_epsilon') is not None:
      reads.discard('noise_multiplier')
  return reads


def defense_unused(config, experiment: str) -> dict[str, str]:
  """`unused_fields` entries of the `defense` section for `experiment`: every field but `name`
  where its clients run no defense of the section (`catalog` `defended=False`; the pipeline's
  own check refuses a `name` other than 'none'), else the fields the named defense does not
  read (`defense_reads`). {} without a section or for a name validation refuses."""
  if 'defense' not in config or not hasattr(config.defense, 'keys'):
    return {}
  section = config.defense
  fields = [f for f in leaf_fields(section, 'defense') if f != 'defense.name']
  if not catalog.get(experiment).defended:
    why = (f'experiments.{experiment} runs no defense of the defense section (it sweeps or '
           'audits its own, or none)')
    return {f: why for f in fields}
  name = section.get('name')
  if not isinstance(name, str) or name not in registry.DEFENSES:
    return {}
  reads = defense_reads(section)
  own = ', '.join(sorted(reads - {'name'})) or 'no field'
  why = f'read only by other defenses (defense.name is {name!r}, which reads {own})'
  out = {f: why for f in fields if f.split('.', 1)[1] not in reads}
  if 'defense.noise_multiplier' in out and name in registry.DP_DEFENSES:
    out['defense.noise_multiplier'] = ('left to the accountant: defense.target_epsilon is set '
                                       'and the noise multiplier is calibrated to it')
  return out


def leaf_fields(section, prefix: str) -> list[str]:
  """Every leaf field under a config `section`, dotted from `prefix` (a command-line override
  names a leaf), for `unused_fields` declaring a whole section."""
  out = []
  for k in section.keys():
    v = section[k]
    out += leaf_fields(v, f'{prefix}.{k}') if hasattr(v, 'keys') else [f'{prefix}.{k}']
  return out


def load(name: str) -> ModuleType:
  """The pipeline module of experiment `name` (`catalog.get(name).pipeline`), checked.

  Raises:
    KeyError: an unknown experiment.
    TypeError: a module that lacks part of `Pipeline` or whose NAME is not `name`.
  """
  module = importlib.import_module(catalog.get(name).pipeline)
  if not isinstance(module, Pipeline):
    missing = [a for a in ('NAME', 'SUMMARY', 'validate_config', 'prepare', 'plan', 'figures')
               if not hasattr(module, a)]
    raise TypeError(f'{module.__name__} is not a pipeline: it lacks {missing}')
  if module.NAME != name:
    raise TypeError(f'{module.__name__}.NAME is {module.NAME!r}, registered as {name!r}')
  return module


def sweep(pipeline, config, state, store, key) -> None:
  """Runs every point of `pipeline.plan` the store lacks, then `pipeline.figures`."""
  points = list(pipeline.plan(config, state, store, key))
  progress.plan(len(points))
  for p in points:
    metrics = run_point(store, p.params, p.compute, unit=p.unit)
    if p.after is not None:
      p.after(metrics)
  pipeline.figures(config, state, store, key)
