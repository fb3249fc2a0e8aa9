"""Defenses as client hooks: any attack under any defense, chosen by name.

A layer between `fl` and `eval`: it imports only `validate`, `accounting`, `mechanisms` and
`fl`. Every defense is declared once in `registry.DEFENSES` (its parameters and their rules, the
hooks it uses, its accounting declaration, the adversary it protects against) and built as a
`fl.client.ClientHooks` by `make(name, **params)`; `combine(*hooks)` stacks several (e.g.
augmentation + sampling). The input mechanisms of `mechanisms.registry` are wrapped as hooks
too, so an experiment's config names any of them in `defense.name`:

| name | hook | parameters | guarantee (unit, relation, against) |
|---|---|---|---|
| `none` | - | - | - |
| `update_noise` | upload | `sigma` | none (no clipping) |
| `sparsify` | upload | `sparsity` p in (0, 1], `min_size` (1,000: FedMIA's; 0: plain top-k) | none |
| `quantize` | upload | `bits` in [1, 24] | none |
| `mixup` | batch | `alpha` > 0, `num_classes`, `public_code` | none |
| `augment` | batch | `level` 1-4, `pad`, `image_shape`, `jitter`, `value_range` | none |
| `sampling` | data | `fraction` in (0, 1] | none |
| `augment_sampling` | data, batch | augment's and `fraction` | none |
| `dp_sgd` | grad (+ Poisson batches) | `clip_norm`, `noise_multiplier`, `sampling` | record, add/remove (Poisson) or replace-one (shuffle), server |
| `update_dp` | upload | `clip_norm`, `noise_multiplier` | client, replace-one, server |
| `central_dp` | aggregate | `clip_norm`, `noise_multiplier` | client, replace-one, aggregate only |
| `weak_dp` | aggregate | as central_dp, calibrated per round | client, replace-one, aggregate only |
| `bitrand`, `ome`, `gaussian` | batch | the mechanism's (`epsilon`, ...; `sigma` for gaussian) | gaussian: record, replace-one, server |
| `ldp_sgd` | upload | `epsilon`, `clip_norm` | client, replace-one, server (pure eps) |

PASTEL's modules live beside them: `pastel` (the Jensen-Shannon regulariser, a `loss` hook
built by `pastel.make`, reading the held-out batch from the client's `aux`).

Bad parameters raise `validate.ConfigError` naming `<field_prefix>.<parameter>` (the config's
`defense.<field>`), before any work.
"""

from __future__ import annotations

import jax

from fl_privacy.defenses import data
from fl_privacy.defenses import dp
from fl_privacy.defenses import registry
from fl_privacy.defenses import update
from fl_privacy.defenses.registry import DEFENSES
from fl_privacy.defenses.registry import DP_DEFENSES
from fl_privacy.defenses.registry import NAMES
from fl_privacy.defenses.registry import Defense
from fl_privacy.defenses.registry import ldp_sgd_upload
from fl_privacy.defenses.registry import make
from fl_privacy.defenses.registry import spec
from fl_privacy.fl import client

ClientHooks = client.ClientHooks
IDENTITY = client.IDENTITY


def _chain_data(fns):
  def run(key, x, y, mask, aux):
    for i, fn in enumerate(fns):
      x, y, mask = fn(key if i == 0 else jax.random.fold_in(key, i), x, y, mask, aux)
    return x, y, mask
  return run


def _chain_loss(fns):
  def run(key, loss_fn, params, x, y, mask, aux):
    inner = loss_fn
    for i, fn in enumerate(fns):
      k = key if i == 0 else jax.random.fold_in(key, i)

      def wrapped(p, xb, yb, mb=None, fn=fn, k=k, inner=inner):
        return fn(k, inner, p, xb, yb, mb, aux)
      inner = wrapped
    return inner(params, x, y, mask)
  return run


def _chain_upload(fns):
  def run(key, delta, aux):
    for i, fn in enumerate(fns):
      delta = fn(key if i == 0 else jax.random.fold_in(key, i), delta, aux)
    return delta
  return run


def combine(*hooks: ClientHooks) -> ClientHooks:
  """One `ClientHooks` applying each of `hooks` in order at every hook point.

  `data`, `batch` and `upload` hooks run one after the other; `loss` hooks nest (the later
  wraps the earlier); at most one `grad`, one `aggregate`, one `batches` and one `report` hook
  may be given.
  The i-th non-identity hook at a point gets the point's key for i = 0 and `fold_in(key, i)`
  after, so `combine(h)` and `combine(h, IDENTITY)` equal `h` draw for draw.

  Raises:
    ValueError: two `grad`, two `aggregate`, two `batches` or two `report` hooks.
  """
  fields = {}
  for point in ('data', 'batch', 'upload', 'loss'):
    fns = [getattr(h, point) for h in hooks
           if getattr(h, point) is not getattr(IDENTITY, point)]
    if not fns:
      continue
    if len(fns) == 1:
      fields[point] = fns[0]
    elif point == 'loss':
      fields[point] = _chain_loss(fns)
    elif point == 'upload':
      fields[point] = _chain_upload(fns)
    else:
      fields[point] = _chain_data(fns)
  for point in ('grad', 'aggregate', 'batches', 'report'):
    fns = [getattr(h, point) for h in hooks if getattr(h, point) is not None]
    if len(fns) > 1:
      raise ValueError(f'at most one {point} hook can be combined (got {len(fns)})')
    if fns:
      fields[point] = fns[0]
  return ClientHooks(**fields)


from fl_privacy.defenses.configured import Configured  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.configured import configure  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.configured import validate_section  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.registry import Setting  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.configured import check_honoured  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses import configured  # pylint: disable=g-import-not-at-top,wrong-import-position
