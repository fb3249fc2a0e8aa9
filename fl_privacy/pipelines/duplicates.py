"""The duplicate-image listing pipeline, as library code.

`python -m experiments.duplicates` runs this pipeline (`pipelines.base`);
the script's docstring says how to run it and what it writes. The search itself is
`fl_privacy.data.duplicates`; this module picks the scopes (within each split, then each split
in the first), counts the groups of each scope and writes `duplicates.json` and
`duplicates.txt`.
"""

from __future__ import annotations

import json
import math
import os

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import validate
from fl_privacy.data import duplicates
from fl_privacy.pipelines import base
from fl_privacy.report import atomic
from fl_privacy.report import summary

NAME = 'duplicates'
SPLITS = ('train', 'test', 'validation')
LISTING = 'duplicates.json'
TEXT = 'duplicates.txt'

# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('Duplicate groups', (
    summary.param('scope'), summary.param('kind'), summary.metric('groups', 'groups'),
    summary.metric('examples', 'examples'), summary.metric('label_mismatch', 'labels differ')))


def validate_config(config) -> tuple[str, ...]:
  """Checks the fields this pipeline reads; returns the splits to search."""
  data_lib.validate_data_config(config.data)
  if 'defense' in config:
    defenses.check_honoured(config.defense, 'duplicates', ('none',), 'it searches the data '
                            'for duplicates; nothing trains under a defense')
  names = validate.subset_of(config, 'dishonest.duplicate_splits', SPLITS)
  # A split searched against itself lists every image as its own duplicate.
  validate.require(len(set(names)) == len(names), 'dishonest.duplicate_splits',
                   f'distinct splits of {SPLITS}', config.dishonest.duplicate_splits)
  validate.in_range(config, 'dishonest.near_threshold', 0.0, math.inf)
  return names


def unused_fields(config) -> dict[str, str]:
  """The `dishonest` fields this search does not read (`base.unused`): all but
  `duplicate_splits` and `near_threshold` belong to `experiments.dishonest_mia`."""
  return {f: 'read only by experiments.dishonest_mia (this search reads duplicate_splits and '
          'near_threshold)' for f in base.leaf_fields(config.dishonest, 'dishonest')
          if f not in ('dishonest.duplicate_splits', 'dishonest.near_threshold')}


def prepare(config) -> dict:
  """Validates the fields this pipeline reads, then loads the splits to search."""
  names = validate_config(config)
  splits = data_lib.load(config.data)
  for name in names:
    validate.require(name in splits, 'dishonest.duplicate_splits',
                     f'splits of {config.data.name}: a subset of {tuple(splits)}', names)
  return dict(splits={n: splits[n] for n in names}, names=tuple(names))


def scopes(names: tuple[str, ...]) -> list[tuple[str, str | None]]:
  """(searched split, reference split or None): within each split, then each in the first."""
  return [(n, None) for n in names] + [(n, names[0]) for n in names[1:]]


def scope_name(split: str, ref: str | None) -> str:
  return split if ref is None else f'{split}_in_{ref}'


def find(splits, split: str, ref: str | None, kind: str, threshold: float) -> list[dict]:
  """Groups of one scope: {'indices', 'labels'} within a split, or {'query', 'matches'}."""
  ds = splits[split]
  limit = 0.0 if kind == 'exact' else threshold
  if ref is None:
    groups = (duplicates.exact_groups(ds.x) if kind == 'exact'
              else duplicates.near_groups(ds.x, limit))
    return [dict(indices=g.tolist(), labels=ds.y[g].tolist()) for g in groups]
  other = splits[ref]
  return [dict(query=int(i), query_label=int(ds.y[i]), matches=js.tolist(),
               match_labels=other.y[js].tolist())
          for i, js in duplicates.cross_matches(ds.x, other.x, limit)]


def summarize(groups: list[dict]) -> dict[str, int]:
  """Counts: groups, examples involved, groups whose labels disagree."""
  def labels(g):
    return set(g['labels']) if 'labels' in g else {g['query_label'], *g['match_labels']}

  def size(g):
    return len(g['indices']) if 'indices' in g else 1 + len(g['matches'])

  return dict(groups=len(groups), examples=sum(size(g) for g in groups),
              label_mismatch=sum(len(labels(g)) > 1 for g in groups))


def text_listing(config, listing: dict) -> str:
  """The listing as readable text."""
  lines = [f'Duplicates in {config.data.name} (near: L2 of [0, 1] pixels <= '
           f'{config.dishonest.near_threshold})', '']
  for name, kinds in listing.items():
    for kind, groups in kinds.items():
      counts = summarize(groups)
      lines.append(f'{name} / {kind}: {counts["groups"]} groups, {counts["examples"]} examples, '
                   f'{counts["label_mismatch"]} with differing labels')
      for g in groups:
        if 'indices' in g:
          members = ', '.join(f'{i}:{y}' for i, y in zip(g['indices'], g['labels']))
        else:
          members = (f'{g["query"]}:{g["query_label"]} <- ' +
                     ', '.join(f'{i}:{y}' for i, y in zip(g['matches'], g['match_labels'])))
        lines.append(f'  {members}')
      lines.append('')
  return '\n'.join(lines) + '\n'


def plan(config, state, store, key) -> list[base.Point]:
  """Every (scope, kind); computing one adds its groups to duplicates.json, and a point that
  is stored but whose listing was lost gets its listing rebuilt (its `after`)."""
  del key  # deterministic
  listing = atomic.read_json(os.path.join(store.workdir, LISTING), {})
  threshold = float(config.dishonest.near_threshold)
  kinds = ('exact', 'near') if threshold > 0 else ('exact',)
  points = []
  for split, ref in scopes(state['names']):
    name = scope_name(split, ref)
    for kind in kinds:
      def compute(split=split, ref=ref, kind=kind, name=name):
        groups = find(state['splits'], split, ref, kind, threshold)
        listing.setdefault(name, {})[kind] = groups
        atomic.atomic_write_text(os.path.join(store.workdir, LISTING),
                                 json.dumps(listing, indent=1))
        return summarize(groups), len(state['splits'][split])

      def after(_, kind=kind, name=name, compute=compute):
        if kind not in listing.get(name, {}):
          compute()

      points.append(base.Point(dict(scope=name, kind=kind), compute, 'examples', after))
  return points


def figures(config, state, store, key) -> None:
  """duplicates.txt, from duplicates.json."""
  del state, key
  listing = atomic.read_json(os.path.join(store.workdir, LISTING), {})
  atomic.atomic_write_text(os.path.join(store.workdir, TEXT), text_listing(config, listing))
