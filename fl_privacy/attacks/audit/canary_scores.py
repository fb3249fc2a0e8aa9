"""What the adversary of a training audit reads of each canary, and its score.

The trainings of `attacks.audit.canary_training` give per canary what every adversary could
read (`Scores`); a threat (`THREATS`) picks what its adversary does read and scores it
(`threat_scores`; higher = IN):

- `all_steps` (gradient canaries of DP-SGD): DP-SGD's own adversary, which sees every noisy
  step and knows every other example's clipped gradient (Nasr, Hayes, Steinke, Balle,
  Tramer, Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private Machine
  Learning", USENIX Security 2023, arXiv:2302.07956). A trace of every local step
  (`fl.local.Step`) gives, on each canary's coordinate, the step's noisy sum minus the other
  rows' clipped gradients: the canary's own clipped gradient when the step drew it, plus that
  coordinate's noise. Scored by the likelihood ratio of the Poisson-subsampled Gaussian
  (`step_llr`), or, for shuffled batches, whose claim (no amplification) covers an adversary
  who knows the batches, summed over the steps that hold the canary. Each score is a function
  of the canary's coin, its own inclusion draws and its own coordinate's noise: independent
  trials.
- `all_iterates`: every release the declaration's adversary reads at every round: each upload
  of the canary's client when it is the server (for DP-SGD: one upload per round, the sum of
  its steps), each round's aggregate for a reader of the aggregate.
- `last_iterate`: only the final model w_T against w_0.

Scores: the projection of each release on the canary's direction summed over rounds (the
server knows who took part and sums the rounds its canary did; an aggregate reader does not,
and under participation sampling uses the likelihood ratio of the subsampled mixture,
`mixture_llr`), for input canaries the loss decrease on the wrong label.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

THREATS = ('all_steps', 'all_iterates', 'last_iterate')


def mixture_llr(x: jax.Array, q: float, shift: jax.Array, sigma: jax.Array) -> jax.Array:
  """Per-round log-likelihood ratio of +shift vs -shift, each present with probability q in
  Gaussian noise sigma: log(1 - q + q e^{(x D - D^2/2)/s^2}) - log(1 - q + q e^{(-x D -
  D^2/2)/s^2}); the optimal statistic of a replace-one canary under Poisson-like
  participation (for q = 1 it is 2 x D / s^2, proportional to x). Summed over the last axis."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  b = (-x * shift - 0.5 * shift**2) / sigma**2
  lq, l1q = jnp.log(q), jnp.log1p(-q) if q < 1 else -jnp.inf
  return jnp.sum(jnp.logaddexp(l1q, lq + a) - jnp.logaddexp(l1q, lq + b), axis=-1)


def step_llr(x: jax.Array, q: float, shift: float, sigma: float) -> jax.Array:
  """log(1 - q + q e^{(x D - D^2/2)/s^2}) elementwise: one step's log-likelihood ratio of an
  add/remove canary drawn with probability q (shift D) against its absence, in noise s (the
  Poisson-subsampled Gaussian; for q = 1, (x D - D^2/2) / s^2)."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  if q >= 1:
    return a
  return jnp.logaddexp(jnp.log1p(-q), jnp.log(q) + a)


class Scores(NamedTuple):
  """What the trainings gave the adversaries, per canary (replicates concatenated): the sum
  over the rounds it took part in of the server-read projections of its own uploads
  (`uploads` [m]), the per-round aggregate projections w_t - w_{t+1} (`aggregates` [T, m]),
  the real clients' clipped uploads projected and summed per round (`known` [T, m], what a
  white-box reader of the aggregate subtracts), the participants per round of the canary's
  training (`participants` [T, m]), the last iterate's projection w_0 - w_T (`last` [m]; the
  loss decrease for input canaries), the `all_steps` score (`steps` [m]) and the per-step
  moments behind it (`step_moments` [m, 3]: sum of L, of L^2, and the client's live steps,
  every step for Poisson batches: `canary_statistics.subsampled_fit_epsilon` reads them), for
  Poisson batches the per-step readings themselves (`step_readings` [m, T x S]: round by
  round, each round's E x S local steps, NaN on the steps the canary's client did not take;
  `poisson_mle.audit` reads them; None for other trainings), and each training's final test
  accuracy (`test_accuracy` [R], NaN without a test split)."""
  uploads: np.ndarray
  aggregates: np.ndarray
  known: np.ndarray
  participants: np.ndarray
  last: np.ndarray
  test_accuracy: np.ndarray
  steps: np.ndarray | None = None
  step_moments: np.ndarray | None = None
  step_readings: np.ndarray | None = None


def threat_scores(scores: Scores, threat: str, adversary: str, *, participation: float,
                  shift: float | None = None, sigma: float | None = None,
                  known: bool = False) -> np.ndarray:
  """The scores [m] of the adversary `adversary` ('server' or 'aggregate') under `threat`.

  all_steps: the per-step reading of gradient canaries (`Scores.steps`).
  all_iterates: the server reads its canaries' uploads (summed over the rounds each took
  part in); a reader of the aggregate reads every round's aggregate: with `known`, the
  white-box reader of DP's definition, who knows every other client's contribution, takes
  k_t x aggregate minus the real participants' clipped uploads (what is left on a canary's
  direction is its own clipped update and the noise); it sums them over rounds, or under
  participation sampling (participation < 1, `shift` and `sigma` of that difference
  given) scores them by `mixture_llr`.
  last_iterate: w_0 - w_T projected (the loss decrease for input canaries).
  """
  if threat == 'last_iterate':
    return np.asarray(scores.last, np.float64)
  if threat == 'all_steps':
    if scores.steps is None:
      raise ValueError('all_steps needs the per-step reading of gradient canaries')
    return np.asarray(scores.steps, np.float64)
  if threat != 'all_iterates':
    raise ValueError(f'threat must be one of {THREATS} (got {threat!r})')
  if adversary == 'server':
    return np.asarray(scores.uploads, np.float64)
  agg = np.asarray(scores.aggregates, np.float64)
  if known:
    agg = agg * np.asarray(scores.participants, np.float64) - scores.known
  if participation < 1 and shift is not None and sigma is not None and sigma > 0:
    return np.asarray(mixture_llr(jnp.asarray(agg.T), float(participation), float(shift),
                                  float(sigma)), np.float64)
  return agg.sum(axis=0)


__all__ = ['THREATS', 'mixture_llr', 'step_llr', 'Scores', 'threat_scores']
