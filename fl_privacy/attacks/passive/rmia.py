"""RMIA (Zarifzadeh et al., "Low-Cost High-Power Membership Inference Attacks", ICML 2024,
arXiv:2312.03262) adapted to FedAvg recordings, server-side.

For a target model theta (the target client's upload of a round), a candidate x and a
population sample z (data the server holds: by default the recording's test rows, owner -1),
the pairwise likelihood ratio is

  LR_theta(x, z) = (Pr(x | theta) / Pr(x)) / (Pr(z | theta) / Pr(z))

(Sect. 2 of the paper; Bayes' rule turns Pr(theta | x) / Pr(theta | z) into this form), and

  Score_MIA(x; theta) = Pr_{z ~ population}[LR_theta(x, z) >= gamma]

(the paper's Eq. (3) as we number the arXiv version; equation numbers not checked against the
camera-ready). Pr(x | theta) = p = exp(-loss) of the true label. The reference models are the
other clients' uploads of the same round: Pr_OUT(x) is their mean of Pr(x | theta'), and
Pr(x) is the paper's offline approximation (Sect. 3 and its appendix on the offline attack),
which models Pr_IN(x) as a linear function a Pr_OUT(x) + (1 - a) of Pr_OUT(x):

  Pr(x) = ((1 + a) Pr_OUT(x) + (1 - a)) / 2,   0 <= a <= 1,

so `a = 1` is Pr(x) = Pr_OUT(x), the plain average over the reference models. The same
formula gives Pr(z). A candidate that is itself a population sample is not compared with
itself (z == x is left out of the population, which then has one element fewer).

Rounds are combined by averaging the per-round scores (`combine_rounds`), as FedMIA's
Eq. (12) (Zhu et al., CVPR 2025). Everything is computed with log probabilities (log p =
-loss), so tiny probabilities do not underflow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from fl_privacy.attacks.passive import fedmia



def log_marginal(ref_loss, a: float = 1.0) -> np.ndarray:
  """log Pr(x) from the reference models' losses: log(((1 + a) Pr_OUT(x) + (1 - a)) / 2).

  RMIA's offline approximation of Pr(x) (module docstring), with Pr_OUT(x) the mean over the
  reference models of exp(-loss).

  Args:
    ref_loss: [m, n] losses of m reference models on n samples.
    a: the offline parameter in [0, 1]; 1 gives Pr(x) = Pr_OUT(x).

  Returns:
    [n] log Pr(x).
  """
  if not 0.0 <= a <= 1.0:
    raise ValueError(f'a must be in [0, 1] (got {a})')
  ref_loss = np.asarray(ref_loss, np.float64)
  if ref_loss.ndim != 2 or ref_loss.shape[0] < 1:
    raise ValueError(f'ref_loss must be [m >= 1, n] (got shape {ref_loss.shape})')
  log_out = special.logsumexp(-ref_loss, axis=0) - math.log(ref_loss.shape[0])
  if a == 1.0:
    return log_out
  return np.logaddexp(math.log((1.0 + a) / 2.0) + log_out, math.log((1.0 - a) / 2.0))


def pairwise_scores(log_ratio_x, log_ratio_z, gamma: float = 1.0,
                    self_index=None) -> np.ndarray:
  """Score_MIA(x) = fraction of population z with LR(x, z) >= gamma (RMIA's Eq. (3)).

  With r = log Pr(. | theta) - log Pr(.), LR(x, z) = exp(r_x - r_z), so LR(x, z) >= gamma iff
  r_z <= r_x - log(gamma); counted by a binary search over the sorted r_z.

  Args:
    log_ratio_x: [n] r of the candidates.
    log_ratio_z: [n_z] r of the population.
    gamma: the threshold on LR, > 0 (the paper uses values >= 1).
    self_index: optional [n] int: the position of candidate x in the population, -1 where x is
      not a population sample; that z is left out (the population of x has n_z - 1 samples).

  Returns:
    [n] scores in [0, 1], higher = member.
  """
  if not gamma > 0:
    raise ValueError(f'gamma must be positive (got {gamma})')
  rx = np.asarray(log_ratio_x, np.float64)
  rz = np.asarray(log_ratio_z, np.float64)
  threshold = rx - math.log(gamma)
  count = np.searchsorted(np.sort(rz), threshold, side='right').astype(np.float64)
  size = np.full(rx.shape, float(rz.size))
  if self_index is not None:
    self_index = np.asarray(self_index)
    own = self_index >= 0
    # The same comparison as the search's (z <= threshold), so the removed pair is the one
    # that was counted.
    count[own] -= rz[self_index[own]] <= threshold[own]
    size[own] -= 1
  if (size < 1).any():
    raise ValueError('the population needs at least one sample besides the candidate')
  return count / size


# Rounds combine as FedMIA's Eq. (12): one definition for every multi-round attack.
combine_rounds = fedmia.mean_over_rounds


def query_scores(loss, target: int, population, *, gamma: float = 1.0,
                 a: float = 1.0) -> np.ndarray:
  """Per-round RMIA scores of every query against one target client.

  Args:
    loss: [R, K, Q] losses of K clients' uploads on Q queries at R rounds.
    target: the row of the target client; the other rows are the reference models.
    population: int indices of the population queries (at least two).
    gamma: `pairwise_scores`'s threshold.
    a: `log_marginal`'s offline parameter.

  Returns:
    [R, Q] scores.
  """
  loss = np.asarray(loss, np.float64)
  num_rounds, num_clients, num_queries = loss.shape
  if num_clients < 2:
    raise ValueError('RMIA needs at least one reference client besides the target')
  population = np.asarray(population, np.int64)
  self_index = np.full(num_queries, -1, np.int64)
  self_index[population] = np.arange(population.size)
  out = np.empty((num_rounds, num_queries))
  for t in range(num_rounds):
    ratio = -loss[t, target] - log_marginal(np.delete(loss[t], target, axis=0), a)
    out[t] = pairwise_scores(ratio, ratio[population], gamma, self_index)
  return out


def round_scores(recording: dict[str, np.ndarray], owner, target: int, *, gamma: float = 1.0,
                 a: float = 1.0, population=None) -> dict[str, Any]:
  """Per-round RMIA scores of one target's members and non-members.

  Args:
    recording: arrays with `loss` [R, K, Q].
    owner: [Q] owning client of each query, -1 for test queries.
    target: the target client k.
    gamma: `pairwise_scores`'s threshold.
    a: `log_marginal`'s offline parameter.
    population: int indices of the population queries; default the test queries (owner -1).

  Returns:
    dict with `scores` [R, n] (members first, then non-members, as `scores.round_scores`) and
    `labels` [n] (1 member).
  """
  owner = np.asarray(owner)
  if population is None:
    population = np.flatnonzero(owner == -1)
  per_query = query_scores(recording['loss'], target, population, gamma=gamma, a=a)
  # `scores.target_views` (aligned); scores imports this module, so not called from here.
  members, nonmembers = np.flatnonzero(owner == target), np.flatnonzero(owner != target)
  labels = np.r_[np.ones(members.size, np.int8), np.zeros(nonmembers.size, np.int8)]
  return dict(scores=per_query[:, np.concatenate([members, nonmembers])], labels=labels)


def pooled_round_scores(recording: dict[str, np.ndarray], owner, *, gamma: float = 1.0,
                        a: float = 1.0, population=None) -> dict[str, np.ndarray]:
  """`round_scores` of every client as target, concatenated in client order.

  The shape of `scores.pooled_round_scores`: `evaluate.score_metrics(combine_rounds(
  out['scores']), out['labels'], out['target'])` gives the pooled metrics.

  Returns:
    dict: `scores` [R, N], `labels` [N], `target` [N].
  """
  num_clients = np.asarray(recording['loss']).shape[1]
  parts = [round_scores(recording, owner, k, gamma=gamma, a=a, population=population)
           for k in range(num_clients)]
  return dict(scores=np.concatenate([p['scores'] for p in parts], axis=1),
              labels=np.concatenate([p['labels'] for p in parts]),
              target=np.concatenate([np.full(p['labels'].size, k, np.int32)
                                     for k, p in enumerate(parts)]))
