"""Exact and near-duplicate images: within each split, and test images found in train.

The dishonest-server paper traced every failure of its detector to duplicate images (14 exact
groups in CIFAR-100 train, 82 in CelebA, test images repeated in train, often with another
label). This lists them with `fl_privacy.data.duplicates`, so a false positive of
`experiments.dishonest_mia` can be looked up.

  python -m experiments.duplicates                                   # digits, seconds
  python -m experiments.duplicates --config=configs/cifar100.py:data_dir=DIR
  python -m experiments.duplicates --config.dishonest.near_threshold=0   # exact only

Writes `duplicates.json` (every group: indices and labels) and `duplicates.txt` (readable)
beside results.json, whose points are (scope, kind) with the number of groups, of examples in
them, and of groups whose labels disagree. Near duplicates are connected components of
"L2 distance of [0, 1] pixels <= dishonest.near_threshold" and include the exact ones.
Fields: configs/_dishonest.py (`duplicate_splits`, `near_threshold`).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from experiments import common
from fl_privacy import data as data_lib
from fl_privacy import validate
from fl_privacy.data import duplicates
from fl_privacy.report import atomic

NAME = 'duplicates'
SPLITS = ('train', 'test', 'validation')
LISTING = 'duplicates.json'
TEXT = 'duplicates.txt'


def prepare(config) -> dict:
  """Validates the fields this script reads, then loads the splits to search."""
  data_lib.validate_data_config(config.data)
  names = validate.subset_of(config, 'dishonest.duplicate_splits', SPLITS)
  validate.in_range(config, 'dishonest.near_threshold', 0.0, math.inf)
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


def sweep(config, state, store, key) -> None:
  del key  # deterministic
  path = os.path.join(store.workdir, LISTING)
  try:
    with open(path, encoding='utf-8') as f:
      listing = json.load(f)
  except FileNotFoundError:
    listing = {}
  threshold = float(config.dishonest.near_threshold)
  kinds = ('exact', 'near') if threshold > 0 else ('exact',)
  for split, ref in scopes(state['names']):
    name = scope_name(split, ref)
    for kind in kinds:
      params = dict(scope=name, kind=kind)
      saved = store.get(params) is not None
      if saved and kind in listing.get(name, {}):
        continue

      def compute(split=split, ref=ref, kind=kind, name=name):
        groups = find(state['splits'], split, ref, kind, threshold)
        listing.setdefault(name, {})[kind] = groups
        atomic.atomic_write_text(path, json.dumps(listing, indent=1))
        return summarize(groups), len(state['splits'][split])

      if saved:  # the point is stored but its listing was lost: rebuild the listing only
        compute()
      else:
        common.run_point(store, params, compute)
  atomic.atomic_write_text(os.path.join(store.workdir, TEXT), text_listing(config, listing))


if __name__ == '__main__':
  common.main(NAME, prepare, sweep)
