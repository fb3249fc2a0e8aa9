"""The audit of a user's own Flower app from its recorded rounds (`CanaryRound`): the
threats' statistics, `audit_rounds` (one-run bounds), the rounds' file and the node
configs of a canary deployment (`audits.user_app` docstring).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from flwr.clientapp import ClientApp

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import user_app
from fl_privacy.report import atomic


@dataclasses.dataclass
class CanaryRound:
  """What the strategy kept of one training round (k canaries, num_null null directions).

  Attributes:
    server_round: Flower's round number r.
    sampled: bool [k], canary i was sent a train message.
    replied: bool [k], canary i's reply carried a model.
    num_messages: train messages the inner strategy sent (every node).
    before: float64 [k + num_null], the round's model projected on the directions.
    after: float64 [k + num_null], the aggregate the inner strategy returned, projected (the
      round's model again when it returned none).
    uploads: float64 [k], canary i's upload minus the round's model on v_i (NaN where none),
      or None when the `uploads` threat is off.
    model, aggregate: the flat models themselves (`keep_models` only).
  """
  server_round: int
  sampled: np.ndarray
  replied: np.ndarray
  num_messages: int
  before: np.ndarray
  after: np.ndarray
  uploads: np.ndarray | None = None
  model: np.ndarray | None = None
  aggregate: np.ndarray | None = None


# ----------------------------------------------------------------------------- the audit ---

def counted_bounds(threats: Sequence[str], gaussian: bool = True) -> tuple[str, ...]:
  """'<threat>/<bound>' of every bound the verdict takes the largest of (fixed by the threats
  and the mechanism's shape before any score: `canary_design.BOUNDS` per threat, the f-DP one only
  for a Gaussian mechanism)."""
  bounds = canary_design.BOUNDS if gaussian else canary_design.BOUNDS[:1]
  return tuple(f'{t}/{b}' for t in threats for b in bounds)


def max_certifiable(n_in: int, n_out: int, *, delta: float, confidence: float,
                    num_counted: int, gaussian: bool = True) -> float:
  """The largest epsilon these canaries can certify: the counted one-run bounds (each at
  1 - (1 - c) / num_counted, the 'split' threshold) on perfectly separated scores (every
  guess right). 0 where the split leaves a part without both worlds."""
  if not auditing.split_possible(int(n_in), int(n_out)):
    return 0.0
  each = 1.0 - (1.0 - float(confidence)) / int(num_counted)
  a = auditing.audit_scores(np.ones(int(n_in)), np.zeros(int(n_out)), delta=float(delta),
                            confidence=each, fdp=bool(gaussian))
  return float(max(a['epsilon_one_run'], a['epsilon_one_run_fdp'] if gaussian else 0.0))


def statistics(rounds: Sequence[CanaryRound], num_canaries: int, threats: Sequence[str]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
  """({threat: canary scores [k]}, {threat: null scores}, participation [T, k]) (module
  docstring). Every canary sampled every round: the sums as they are; else each canary over
  its own rounds, standardised (`canary_stats._sampled_scores` with equal rounds)."""
  k = int(num_canaries)
  part = np.stack([r.sampled for r in rounds])
  before = np.stack([r.before for r in rounds])
  after = np.stack([r.after for r in rounds])
  deltas = after - before
  t = len(rounds)
  every = bool(part.all())
  counts = part.sum(axis=0)
  taken = counts > 0
  root = np.sqrt(np.maximum(counts, 1))
  last = after[-1] - before[0]
  canary, null = {}, {}
  if 'all_iterates' in threats:
    if every:
      canary['all_iterates'] = deltas[:, :k].sum(axis=0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0)
    else:
      canary['all_iterates'] = np.where(taken, (deltas[:, :k] * part).sum(axis=0) / root, 0.0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0) / math.sqrt(t)
  if 'last_iterate' in threats:
    scale = 1.0 if every else math.sqrt(t)
    canary['last_iterate'] = np.where(taken, last[:k] / scale, 0.0)
    null['last_iterate'] = last[k:] / scale
  if 'uploads' in threats:
    ups = np.stack([r.uploads for r in rounds])
    own = np.where(part & np.isfinite(ups), ups, 0.0).sum(axis=0)
    canary['uploads'] = own if every else np.where(taken, own / root, 0.0)
  return canary, null, part


def _sampling(rounds: Sequence[CanaryRound], part: np.ndarray) -> str:
  if part.all():
    return canary_design.SAMPLING_NONE
  if len({r.num_messages for r in rounds}) == 1:
    return canary_design.SAMPLING_FIXED_SIZE
  return user_app.SAMPLING_VARYING


def audit_rounds(rounds: Sequence[CanaryRound], *, seed: int, num_canaries: int, delta: float,
                 confidence: float, threats: Sequence[str] = user_app.DEFAULT_THREATS,
                 gaussian: bool = True, stated: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
  """The one-run audit of recorded rounds against the stated claim.

  Returns:
    Per threat `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (LOWER bounds, each at
    `bound_confidence`), `/n_in`, `/n_out`, `/adversary`, the fit's `/fit_mu`, `/epsilon_fit`
    (ESTIMATES, with bootstrap intervals at c), `/n_null`, `/fit_n_in`; `best_bound`,
    `privacy_violation` (best_bound above the stated epsilon: 1.0 / 0.0, NaN without a claim),
    `max_certifiable`, `counted_bounds`, `verdict_confidence` (c, family-wise),
    `bound_confidence`, `unit`, `relation`, `adversary`, `sampling`, rounds per canary,
    `lost_canary_replies` (sampled, no model back: they carry no signal), `n_in`, `n_out`,
    `num_canaries`, `num_rounds`, `num_null`, `seed`, `delta`, `threshold_strategy`, and the
    stated claim's fields (`stated_epsilon`, `stated_delta`, `stated_epsilon_source`, ...).
  """
  if not rounds:
    raise ValueError('no recorded round to audit')
  k = int(num_canaries)
  threats = tuple(t for t in user_app.THREATS if t in threats)
  if 'uploads' in threats and any(r.uploads is None for r in rounds):
    raise ValueError("the 'uploads' threat needs the canaries' uploads, which these rounds "
                     'did not keep')
  included = np.asarray([user_app.canary_coin(seed, i) for i in range(k)])
  if included.sum() < 2 or (~included).sum() < 2:
    raise ValueError(f'{int(included.sum())} of {k} canaries included: the one-run bounds need '
                     'at least two in each world (more canaries, or another seed)')
  counted = counted_bounds(threats, gaussian)
  each = 1.0 - (1.0 - float(confidence)) / len(counted)
  scores, null, part = statistics(rounds, k, threats)
  taken = part.any(axis=0)
  replied = np.stack([r.replied for r in rounds])
  counts = part.sum(axis=0)
  m: dict[str, Any] = dict(
      unit=user_app.UNIT, relation=user_app.RELATION, adversary=canary_design.ADVERSARY,
      sampling=_sampling(rounds, part), num_canaries=k, num_rounds=len(rounds),
      num_null=int(rounds[0].before.size - k), seed=int(seed), delta=float(delta),
      n_in=int(included.sum()), n_out=int((~included).sum()),
      threshold_strategy=user_app.THRESHOLD_STRATEGY, counted_bounds=','.join(counted),
      verdict_confidence=float(confidence), bound_confidence=each,
      confidence=float(confidence), rounds_per_canary_min=int(counts.min()),
      rounds_per_canary_median=float(np.median(counts)),
      rounds_per_canary_max=int(counts.max()), canaries_never_sampled=int(np.sum(~taken)),
      lost_canary_replies=int(np.sum(part & ~replied)))
  fit_rng = user_app._rng(seed, user_app._FIT_INDEX, user_app._FIT)
  for threat in threats:
    s = scores[threat]
    m.update(canary_stats.threat_metrics(
        threat, s, included, taken, null.get(threat, s[~included & taken]), delta=delta,
        each=each, confidence=float(confidence), rng=fit_rng,
        threshold_strategy=user_app.THRESHOLD_STRATEGY, fdp=gaussian))
    m[f'{threat}/adversary'] = user_app.READERS[threat]
  best = max([float(m[c]) for c in counted if not math.isnan(m[c])] + [0.0])
  m['best_bound'] = best
  m['max_certifiable'] = max_certifiable(m['n_in'], m['n_out'], delta=delta,
                                         confidence=confidence, num_counted=len(counted),
                                         gaussian=gaussian)
  m.update(stated or dict(stated_epsilon=math.nan, stated_delta=math.nan,
                          stated_epsilon_source='none'))
  eps = float(m['stated_epsilon'])
  m['privacy_violation'] = math.nan if math.isnan(eps) else float(best > eps * (1 + 1e-9))
  return m


# ------------------------------------------------------------------------------ the files ---

def save_rounds(path: str | os.PathLike, rounds: Sequence[CanaryRound],
                meta: Mapping[str, Any]) -> None:
  """The recorded rounds as one .npz (atomically), with `meta` as JSON (`load_rounds`)."""
  arrays = {'meta': np.asarray(json.dumps(dict(meta), sort_keys=True)),
            'server_round': np.asarray([r.server_round for r in rounds], np.int64),
            'num_messages': np.asarray([r.num_messages for r in rounds], np.int64)}
  for name in ('sampled', 'replied', 'before', 'after'):
    arrays[name] = np.stack([getattr(r, name) for r in rounds])
  if rounds and rounds[0].uploads is not None:
    arrays['uploads'] = np.stack([r.uploads for r in rounds])
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  atomic.atomic_write_bytes(path, buffer.getvalue())


def load_rounds(path: str | os.PathLike) -> tuple[dict[str, Any], list[CanaryRound]]:
  """(meta, rounds) of a `save_rounds` file: `audit_rounds(rounds, seed=meta['seed'],
  num_canaries=meta['num_canaries'], ...)` audits them again offline."""
  with np.load(path, allow_pickle=False) as f:
    a = {k: f[k] for k in f.files}
  rounds = [CanaryRound(server_round=int(a['server_round'][t]), sampled=a['sampled'][t],
                        replied=a['replied'][t], num_messages=int(a['num_messages'][t]),
                        before=a['before'][t], after=a['after'][t],
                        uploads=a['uploads'][t] if 'uploads' in a else None)
            for t in range(len(a['server_round']))]
  return json.loads(str(a['meta'])), rounds


def client_apps(app: ClientApp, num_real: int, canary_configs: Sequence[Mapping[str, Any]]
                ) -> tuple[list[ClientApp], list[dict[str, Any]]]:
  """(apps, node_configs) for an `InProcessGrid` rehearsal of the recipe: `num_real` nodes
  running the user's `app` (wrapped by `with_canaries`), then one node per canary config,
  the same wrapped app (their node config makes them canaries)."""
  wrapped = user_app.with_canaries(app)
  configs = [{} for _ in range(int(num_real))] + [dict(c) for c in canary_configs]
  return [wrapped] * len(configs), configs


def canary_node_configs(num_canaries: int, *, seed: int, canary_norm: float, clip_norm: float,
                        **extra: Any) -> list[dict[str, Any]]:
  """The node configs of k canary SuperNodes (`extra`: further keys, e.g. `num-examples`, or
  `canary-metrics`, the same on each); `node_config_text` writes one for `--node-config`."""
  return [{user_app.INDEX_KEY: i, user_app.SEED_KEY: user_app._check_seed(seed),
           user_app.NORM_KEY: float(canary_norm), user_app.CLIP_KEY: float(clip_norm), **extra}
          for i in range(int(num_canaries))]


def node_config_text(config: Mapping[str, Any]) -> str:
  """`--node-config` text of one node config (TOML values: strings quoted)."""
  def value(v):
    if isinstance(v, bool):
      return 'true' if v else 'false'
    if isinstance(v, (int, float, np.integer, np.floating)):
      return repr(v.item() if hasattr(v, 'item') else v)
    return json.dumps(str(v))
  return ' '.join(f'{k}={value(v)}' for k, v in config.items())
