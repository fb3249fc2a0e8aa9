"""RMIA (Zarifzadeh et al., "Low-Cost High-Power Membership Inference Attacks", ICML 2024,
arXiv:2312.03262) adapted to FedAvg recordings, server-side.

For a target model theta (the target client's upload of a round), a candidate x and a
population sample z (data the server holds: by default the rows no client holds, owner -1),
the pairwise likelihood ratio is

  LR_theta(x, z) = (Pr(x | theta) / Pr(x)) / (Pr(z | theta) / Pr(z))

(Sect. 2 of the paper, unverified; Bayes' rule turns Pr(theta | x) / Pr(theta | z) into this
form), and

  Score_MIA(x; theta) = Pr_{z ~ population}[LR_theta(x, z) >= gamma]

(the paper's Eq. (3) as we number the arXiv version, unverified; the Sect. numbers below are
unverified too). Pr(x | theta) = p_y = softmax(z)_y of the true label, taken from the logit
margin m = z_y - logsumexp_{j != y} z_j that the recording holds (`margin`, as LiRA's phi):
log p_y = -log(1 + exp(-m)) in float64 (`loss_from_margin`), exact where the float32
cross-entropy rounds to 0 and would make every confident model's p exactly 1. The reference
models are the
other clients' uploads of the same round: Pr_OUT(x) is their mean of Pr(x | theta'), and
Pr(x) is the paper's offline approximation (Sect. 3 and its appendix on the offline attack,
unverified),
which models Pr_IN(x) as a linear function a Pr_OUT(x) + (1 - a) of Pr_OUT(x):

  Pr(x) = ((1 + a) Pr_OUT(x) + (1 - a)) / 2,   0 <= a <= 1,

so `a = 1` is Pr(x) = Pr_OUT(x), the plain average over the reference models. The same
formula gives Pr(z). A candidate that is itself a population sample is not compared with
itself (z == x is left out of the population, which then has one element fewer).

Rounds are combined by averaging the per-round scores (`combine_rounds`), as FedMIA's
Eq. (12) (Zhu et al., CVPR 2025). Everything is computed with log probabilities (log p =
-loss), so tiny probabilities do not underflow.

Ties: the score is a fraction of a finite population (n_z samples), so many entries can share
the top score (every population sample beaten in every round). The metrics' ROC puts tied
scores at one threshold (`eval.metrics.roc_curve`), so a TPR at low FPR never counts a tie
broken in the members' favour; `evaluate` reports the number of entries tied at the top
(`top_tied`, of them non-members `top_tied_negatives`) and the population size
(`rmia_population`) beside the rates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from fl_privacy.attacks.passive import fedmia
from fl_privacy.attacks.passive import lira



def loss_from_margin(margin) -> np.ndarray:
  """-log p_y = log(1 + exp(-m)) from the logit margin m = z_y - logsumexp_{j != y} z_j.

  p_y = sigmoid(m) (softmax of the true label against the others' logsumexp), computed as
  logaddexp(0, -m) in float64: no cancellation at any m (about exp(-m) for large m, -m for
  very negative m).
  """
  return np.logaddexp(0.0, -np.asarray(margin, np.float64))


def recording_loss(recording: dict[str, np.ndarray]) -> np.ndarray:
  """-log Pr(x | theta), the cross-entropy, of every (round, client, query) of a recording,
  from its `margin` in float64 (`loss_from_margin`): what every loss-reading attack scores
  (`scores.signed_measurement`), never the recorded float32 loss; `lira.phi` refuses a
  recording without margins."""
  return loss_from_margin(lira.phi(recording))


def log_marginal(ref_loss, a: float = 1.0) -> np.ndarray:
  """log Pr(x) from the reference models' losses: log(((1 + a) Pr_OUT(x) + (1 - a)) / 2).

  RMIA's offline approximation of Pr(x) (module docstring), with Pr_OUT(x) the mean over the
  reference models of exp(-loss). Accurate at both ends: with u = mean(1 - exp(-loss)) (each
  term by expm1), Pr(x) = 1 - (1 + a) u / 2, so where that is above 1/2 log Pr(x) =
  log1p(-(1 + a) u / 2), exact for confident models whose losses are 1e-20 (a log-sum-exp
  there would round log Pr(x) to 0 and tie every such query); elsewhere the log-sum-exp of
  -loss, exact for losses whose exp underflows.

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
  far = log_out if a == 1.0 else np.logaddexp(math.log((1.0 + a) / 2.0) + log_out,
                                               math.log((1.0 - a) / 2.0))
  # 1 - Pr(x) = (1 + a) / 2 * mean(1 - p), each 1 - p = -expm1(-loss) without cancellation.
  miss = (1.0 + a) / 2.0 * np.mean(-np.expm1(-ref_loss), axis=0)
  near = np.log1p(-np.minimum(miss, 0.5))
  return np.where(miss < 0.5, near, far)


def pairwise_scores(log_ratio_x, log_ratio_z, gamma: float = 1.0,
                    self_index=None) -> np.ndarray:
  """Score_MIA(x) = fraction of population z with LR(x, z) >= gamma (RMIA's Eq. (3),
  unverified).

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
    loss: [R, K, Q] -log Pr(x | theta) of K clients' uploads on Q queries at R rounds
      (`recording_loss`).
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
    recording: arrays with `margin` [R, K, Q] (`recording_loss`).
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
  per_query = query_scores(recording_loss(recording), target, population, gamma=gamma, a=a)
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
  num_clients = lira.phi(recording).shape[1]
  parts = [round_scores(recording, owner, k, gamma=gamma, a=a, population=population)
           for k in range(num_clients)]
  return dict(scores=np.concatenate([p['scores'] for p in parts], axis=1),
              labels=np.concatenate([p['labels'] for p in parts]),
              target=np.concatenate([np.full(p['labels'].size, k, np.int32)
                                     for k, p in enumerate(parts)]))
