"""LiRA (Carlini et al., "Membership Inference Attacks From First Principles", IEEE S&P 2022,
arXiv:2112.03570) adapted to FedAvg recordings, server-side.

The statistic of a (round, client, query) is the logit-scaled confidence of the true label,
phi = log(p / (1 - p)), computed from the logits as the margin z_y - logsumexp_{j != y} z_j
(the LiRA paper's stable form, Sect. VI-A (unverified); recorded as `margin` by
`fl.queries.measure` and `margin_in` by `fl.shadow`). phi from the float32 cross-entropy
would lose digits from a margin of about 10 (12.76 for 12.80 at 15) and, once the loss rounds
to 0 (a margin of about 17), jump to whatever clip stands in for it; the margin is exact to
float32 rounding of the logits at every margin. `phi` reads it and refuses a recording made
before margins were recorded (re-record it; the FedMIA pipeline re-trains such recordings,
`pipelines.fedmia_online.stale`).
The models are the clients' uploads of a round; for a target client the "OUT" (shadow) models
of a query are the other clients' uploads of the same round.

- Offline (`offline_scores`; the paper's offline attack, Algorithm 1 without the IN lines,
  and its one-sided test, Eq. (4) (unverified)): per query and round fit N(mu_out,
  sigma_out^2) to the shadows' phi and score the target's phi by Lambda = 1 - Pr[Z > phi] =
  Phi((phi - mu_out) / sigma_out), Z ~ N(mu_out, sigma_out^2): the complement of the p-value
  under "OUT", so that higher = member, in [0, 1]. This is the per-round term FedMIA
  (`fedmia`) uses with other measurements.
- Online (`online_scores`; Algorithm 1 with its IN lines, the Gaussian likelihood ratio of
  Sect. IV (section unverified)): log N(phi; mu_in, sigma_in^2) - log N(phi; mu_out,
  sigma_out^2) per query and round, the IN measurements those of models the server trains
  itself: it re-runs the protocol's local round from the global model w_t on shadow sets of
  the clients' size from the data it holds with the query inserted (`fl.shadow`; the
  recording's `margin_in` [R, M, Q], `in_measurements`), the OUT ones the other clients'
  uploads, as offline.
- `fixed_variance=True` (the paper's "fixed variance" for few shadow models, Sect. VI-B
  (unverified)): global variances instead of per-query ones. Offline: one sigma_out per round
  for all queries. Online: one sigma_in and one sigma_out per round for all queries, each
  estimated from its own measurements (IN from the IN models, OUT from the shadows); the
  means stay per query. (An earlier version pooled a single sigma over IN and OUT; the paper
  keeps the two apart, and a shared sigma makes the ratio linear in phi, discarding the
  difference in spread that the test uses; it is not kept.)

Rounds are combined by averaging the per-round scores (`combine_rounds`), as FedMIA's Eq. (12)
(Zhu et al., CVPR 2025) combines its per-round Phi. The online per-round score is the log
likelihood ratio itself, not a transform of it: the average of per-round log ratios is the
log likelihood ratio of the R rounds taken as independent, divided by R (a monotone map of
the joint test's statistic, so the ROC is the Neyman-Pearson one under that independence);
a bounded transform such as Phi would weigh a round's strong evidence like a weak one's.

Variance estimator: the unbiased sample variance (ddof 1) of the values of a query, or with
`fixed_variance` the pooled sum of squared deviations from each query's own mean divided by
sum_q (m_q - 1) (separately for IN and OUT); both plus `VARIANCE_FLOOR` so that equal values
do not divide by zero. (The authors' code uses np.std, ddof 0, and for the fixed variance the
spread of all values around their global mean, which also counts the spread between queries;
we do not.) Means are sample means (the authors' offline code uses medians).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from fl_privacy.attacks.passive import fedmia


VARIANCE_FLOOR = 1e-8


def phi(recording: dict[str, np.ndarray], name: str = 'margin') -> np.ndarray:
  """LiRA's phi of a recording: its logit margins `name` ('margin' [R, K, Q] of the uploads,
  'margin_in' [R, M, Q] of the IN models) as float64.

  Raises:
    ValueError: the recording has no margins (recorded before they were; re-record it).
  """
  if name not in recording:
    raise ValueError(f'the loss-reading attacks, LiRA and RMIA read the logit margins `{name}` '
                     '(fl.queries.measure, fl.shadow); this recording has none (made before '
                     'they were recorded): re-record it')
  return np.asarray(recording[name], np.float64)


def _fit(values: np.ndarray, mask: np.ndarray, fixed_variance: bool
         ) -> tuple[np.ndarray, np.ndarray]:
  """Per-column mean and variance of the masked rows of `values` [..., m, n].

  Returns (mean [..., n], variance [..., n] or [..., 1] with `fixed_variance`), the variance
  unbiased (ddof 1) per column or pooled over the columns (module docstring), plus
  VARIANCE_FLOOR.
  """
  count = mask.sum(axis=-2)
  if (count < 1).any():
    raise ValueError('every query needs at least one shadow')
  mu = np.where(mask, values, 0.0).sum(axis=-2) / count
  sq = np.where(mask, (values - mu[..., None, :]) ** 2, 0.0).sum(axis=-2)
  if fixed_variance:
    dof = (count - 1).sum(axis=-1, keepdims=True)
    if (dof < 1).any():
      raise ValueError('the fixed variance needs a query with at least two shadows')
    var = sq.sum(axis=-1, keepdims=True) / dof
  else:
    if (count < 2).any():
      raise ValueError('a per-query variance needs at least two shadows per query; '
                       'use fixed_variance=True')
    var = sq / (count - 1)
  return mu, var + VARIANCE_FLOOR


def offline_scores(values, target: int, shadow_mask=None,
                   fixed_variance: bool = False) -> np.ndarray:
  """Per-round offline LiRA scores Phi((phi_target - mu_out) / sigma_out) of every query.

  The LiRA paper's offline attack (Algorithm 1 without its IN lines; Eq. (4), the one-sided
  test, unverified): Lambda = 1 - Pr[Z > phi_target], Z ~ N(mu_out, sigma_out^2) fitted to the
  OUT models (here the non-target clients), per query and round. Higher = member; average
  rounds with `combine_rounds`.

  Args:
    values: [R, K, Q] statistic (phi, the logit margin) of K clients' uploads on Q queries
      at R rounds; higher = member. A [K, Q] array is one round.
    target: the row of the target client.
    shadow_mask: optional bool [K, Q] (or [R, K, Q]): which rows are shadows of each query (the
      target's row is never one). Default: every non-target row.
    fixed_variance: one global sigma_out per round pooled over all queries (the paper's
      fixed variance, Sect. VI-B, unverified) instead of one per query.

  Returns:
    [R, Q] scores in [0, 1] ([Q] for a [K, Q] input).
  """
  v = np.asarray(values, np.float64)
  single = v.ndim == 2
  if single:
    v = v[None]
  _, k, _ = v.shape
  if not 0 <= target < k:
    raise ValueError(f'target {target} is not a row of {k} clients')
  mask = np.ones(v.shape[1:], bool) if shadow_mask is None else np.asarray(shadow_mask, bool)
  mask = np.broadcast_to(mask, v.shape).copy()
  mask[:, target] = False
  mu, var = _fit(v, mask, fixed_variance)
  out = special.ndtr((v[:, target] - mu) / np.sqrt(var))
  return out[0] if single else out


def online_scores(phi_target, phi_in, phi_out, fixed_variance: bool = False) -> np.ndarray:
  """Online LiRA: log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2), one round.

  The LiRA paper's online attack (Algorithm 1 with its IN lines; the Gaussian likelihood
  ratio, Sect. IV, unverified; not its Eq. (4), which is the offline one-sided test), in log
  space (higher = member). Means per query; variances per query, or with `fixed_variance`
  the paper's global sigma_in and sigma_out (Sect. VI-B, unverified): one IN variance pooled
  over the queries' IN measurements and one OUT variance pooled over their OUT measurements
  (each around its query's own mean; module docstring).

  Args:
    phi_target: [Q] the target model's statistic.
    phi_in: [n_in, Q] statistic of IN models (trained with the query).
    phi_out: [n_out, Q] statistic of OUT models.
    fixed_variance: global sigma_in and sigma_out.

  Returns:
    [Q] log likelihood ratios.
  """
  x = np.asarray(phi_target, np.float64)
  phi_in = np.asarray(phi_in, np.float64)
  phi_out = np.asarray(phi_out, np.float64)
  if phi_in.ndim != 2 or phi_out.ndim != 2 or x.ndim != 1:
    raise ValueError('online_scores takes phi_target [Q], phi_in [n_in, Q], phi_out [n_out, Q]')
  mu_in, var_in = _fit(phi_in, np.ones(phi_in.shape, bool), fixed_variance)
  mu_out, var_out = _fit(phi_out, np.ones(phi_out.shape, bool), fixed_variance)
  return _log_normal(x, mu_in, var_in) - _log_normal(x, mu_out, var_out)


def in_measurements(recording: dict[str, np.ndarray]) -> np.ndarray:
  """phi of every query under the server's IN models, [R, M, Q] (the recording's
  `margin_in`, as phi of the uploads is their `margin`).

  Raises:
    ValueError: the recording has no `margin_in` (recorded without IN models, or before IN
      margins were recorded; online LiRA cannot be scored from it, re-record with
      `in_models` > 0).
  """
  if 'margin_in' not in recording:
    raise ValueError('online LiRA needs the IN measurements `margin_in` of a recording made '
                     'with in_models > 0 (fl.recording.train_recorded); this one has none')
  return phi(recording, 'margin_in')


def _log_normal(x, mu, var):
  """log N(x; mu, var)."""
  return -0.5 * (np.log(2 * np.pi * var) + (x - mu) ** 2 / var)


# Rounds combine as FedMIA's Eq. (12): one definition for every multi-round attack.
combine_rounds = fedmia.mean_over_rounds


def round_scores(recording: dict[str, np.ndarray], owner, target: int, *,
                 fixed_variance: bool = False, exclude_owner: bool = False) -> dict[str, Any]:
  """Per-round offline LiRA scores of one target's members and non-members.

  phi = the recording's `margin` (`phi`); the shadows of a query are the other clients'
  uploads (`offline_scores`). A non-member query owned by another client j has j's upload as
  an IN measurement among its shadows, which the server cannot tell apart;
  `exclude_owner=True` removes it (an oracle: it uses `owner`).

  Args:
    recording: arrays with `margin` [R, K, Q].
    owner: [Q] owning client of each query, -1 for test queries.
    target: the target client k.
    fixed_variance: `offline_scores`'s global sigma.
    exclude_owner: drop the owner's row from the shadows of its query.

  Returns:
    dict with `scores` [R, n] (members first, then non-members, as `scores.round_scores`) and
    `labels` [n] (1 member).
  """
  phi_ = phi(recording)
  owner = np.asarray(owner)
  num_clients = phi_.shape[1]
  mask = None
  if exclude_owner:
    mask = owner[None, :] != np.arange(num_clients)[:, None]
  per_query = offline_scores(phi_, target, mask, fixed_variance)
  # `scores.target_views` (aligned); scores imports this module, so not called from here.
  members, nonmembers = np.flatnonzero(owner == target), np.flatnonzero(owner != target)
  labels = np.r_[np.ones(members.size, np.int8), np.zeros(nonmembers.size, np.int8)]
  return dict(scores=per_query[:, np.concatenate([members, nonmembers])], labels=labels)


def pooled_round_scores(recording: dict[str, np.ndarray], owner, *,
                        fixed_variance: bool = False,
                        exclude_owner: bool = False) -> dict[str, np.ndarray]:
  """`round_scores` of every client as target, concatenated in client order.

  The shape of `scores.pooled_round_scores`: `evaluate.score_metrics(combine_rounds(
  out['scores']), out['labels'], out['target'])` gives the pooled metrics.

  Returns:
    dict: `scores` [R, N], `labels` [N], `target` [N].
  """
  num_clients = phi(recording).shape[1]
  parts = [round_scores(recording, owner, k, fixed_variance=fixed_variance,
                        exclude_owner=exclude_owner) for k in range(num_clients)]
  return dict(scores=np.concatenate([p['scores'] for p in parts], axis=1),
              labels=np.concatenate([p['labels'] for p in parts]),
              target=np.concatenate([np.full(p['labels'].size, k, np.int32)
                                     for k, p in enumerate(parts)]))
