"""White-box Dirac-canary games against central DP mechanisms (the DP audit's attacks).

Nasr et al., "Tight Auditing of Differentially Private Machine Learning" (USENIX Security
2023, arXiv:2302.07956): the adversary reads every release the mechanism's declaration
composes; the canary is a Dirac gradient / update / input of norm `canary_norm` (above the clip
norm C, so the real clip must act) along coordinate 0, and every other contribution is known
to the adversary (`known_contributions`: fixed vectors on coordinates 1..d-1, clipped by the
mechanism like the canary). In-world vs out-world follows the declared relation: add/remove
(canary present vs absent) or replace-one (+canary vs -canary).

Every trial calls the library's real mechanism, so a bug in a clip or a noise scale shows.
The scores are the optimal (likelihood-ratio) statistics of each game: for Gaussian
compositions the sum of the canary coordinate; for Poisson-subsampled steps `poisson_llr`;
for LDP-SGD the report's sign along the canary. `audit_bounds` turns the in/out scores into
lower bounds of epsilon (`eval.auditing.audit_scores`) and `counted_bounds` / `best_bound` say
which of them bound the mechanism's epsilon.

The verdict (`privacy_violation`, `best_bound`) takes the largest of k counted bounds, so each
is computed at confidence 1 - (1 - c) / k (Bonferroni over the counted bounds, fixed by the
mechanism before the games are played): the verdict then holds at family-wise confidence c.
The maximum of k bounds each at c is guaranteed only at 1 - k (1 - c) (0.80 for four 95%
bounds). The per-bound values at c are reported beside it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.defenses import dp
from fl_privacy.eval import auditing
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import registry

MECHANISMS = ('dp_sgd_poisson', 'dp_sgd_shuffle', 'update_dp', 'central_dp', 'weak_dp',
              'gaussian', 'ldp_sgd')
# The lower bounds `audit_scores` returns, in the order the table shows them.
BOUNDS = ('epsilon_cp', 'epsilon_gdp', 'epsilon_one_run', 'epsilon_one_run_fdp')
# Mechanisms whose trade-off curve is not Gaussian (see `counted_bounds`).
NON_GAUSSIAN = ('dp_sgd_poisson', 'ldp_sgd')


# ------------------------------------------------------------------------------ games ---


def known_contributions(count: int, dim: int, clip_norm: float) -> np.ndarray:
  """The other rows the adversary knows: fixed vectors on coordinates 1..d-1.

  Norms spread from C/2 to 2C, so the mechanism's clip acts on some of them as well; they
  are orthogonal to the canary, so the canary coordinate carries only the canary and noise.
  """
  if count == 0:
    return np.zeros((0, dim), np.float32)
  rng = np.random.default_rng(12345)
  g = rng.normal(size=(count, dim))
  g[:, 0] = 0.0
  g /= np.linalg.norm(g, axis=1, keepdims=True)
  g *= clip_norm * np.linspace(0.5, 2.0, count)[:, None]
  return g.astype(np.float32)


def canary_vector(dim: int, norm: float, sign: float = 1.0) -> jax.Array:
  """sign x norm x e_1 (the Dirac canary)."""
  return jnp.zeros((dim,), jnp.float32).at[0].set(sign * norm)


def poisson_llr(x: jax.Array, q: float, shift: float, sigma: jax.Array) -> jax.Array:
  """sum_t log(1 - q + q exp((x_t D - D^2 / 2) / s^2)): the log-likelihood ratio of T
  Poisson-subsampled Gaussian steps (canary in with probability q, shift D, noise s) vs
  no canary; the optimal statistic of the add/remove game."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  return jnp.sum(jnp.logaddexp(jnp.log1p(-q), jnp.log(q) + a), axis=-1)


def fair_coin(world: Callable[..., jax.Array]):
  """A trial function: one game whose world (in or out) is a fair coin of the trial's key.

  Independent fair coins are what the one-run bounds of `auditing.audit_scores` assume
  (fixed numbers of in and out games would break them); n_in + n_out = trials.
  """
  def trial(key, index, *args):
    del index
    k_coin, k_game = jax.random.split(key)
    present = jax.random.bernoulli(k_coin)
    return {'present': present, 'score': world(k_game, present, *args)}
  return trial


def trial_fn(mechanism: str, *, dimension: int, clip_norm: float, canary_norm: float,
             batch_size: int, num_examples: int, epochs: int, rounds: int, num_clients: int,
             ldp_reports: int, sigma: float | None = None) -> Callable[..., Any]:
  """The mechanism's `trial_fn(key, index, strength) -> {'present': bool, 'score': float}`.

  Args:
    mechanism: one of `MECHANISMS`.
    dimension: d, the length of every contribution.
    clip_norm: C, the mechanism's clip norm.
    canary_norm: the canary's norm in units of C (>= 1).
    batch_size, num_examples, epochs: DP-SGD's batch, dataset size and epochs.
    rounds, num_clients: the federated mechanisms' rounds and clients.
    ldp_reports: LDP-SGD's number of reports.
    sigma: the Gaussian input randomizer's noise scale (only for 'gaussian', where it is
      baked into the randomizer and `strength` is ignored).

  Returns:
    The trial function; `strength` is the traced noise multiplier actually run or, for
    ldp_sgd, the epsilon per report actually run (one compilation per mechanism).
  """
  d, c = int(dimension), float(clip_norm)
  canary = float(canary_norm) * c
  if mechanism in ('dp_sgd_poisson', 'dp_sgd_shuffle'):
    b = int(batch_size)
    others = jnp.asarray(known_contributions(b - 1, d, c))
    poisson = mechanism == 'dp_sgd_poisson'
    steps = epochs * (num_examples // batch_size) if poisson else int(epochs)
    q = float(batch_size) / float(num_examples)

    def world(key, present, z):
      def step(t):
        k_sample, k_noise = jax.random.split(jax.random.fold_in(key, t))
        if poisson:   # add/remove: the canary joins each step with probability q
          row = canary_vector(d, canary)
          used = jnp.logical_and(present, jax.random.bernoulli(k_sample, q))
        else:         # replace-one: the canary's step holds +canary or -canary
          row = canary_vector(d, canary, 1.0) * jnp.where(present, 1.0, -1.0)
          used = jnp.asarray(True)
        batch = jnp.concatenate([row[None], others])
        mask = jnp.concatenate([used[None].astype(jnp.float32), jnp.ones((b - 1,))])
        # Poisson batches divide by the expected batch size, as the dp_sgd defense does;
        # times b, the step's noisy sum.
        g = dp.private_gradient(k_noise, batch, mask, c, z, denominator=float(b))
        return g[0] * b
      x = jax.vmap(step)(jnp.arange(steps))
      if poisson:
        return poisson_llr(x, q, c, z * c)
      return jnp.sum(x)
    return fair_coin(world)

  if mechanism == 'update_dp':
    rounds = int(rounds)

    def world(key, present, z):
      delta = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      ups = jax.vmap(lambda t: dp.clip_and_noise_update(jax.random.fold_in(key, t), delta,
                                                        c, z))(jnp.arange(rounds))
      return jnp.sum(ups[:, 0])
    return fair_coin(world)

  if mechanism in ('central_dp', 'weak_dp'):
    k = int(num_clients)
    rounds = int(rounds) if mechanism == 'central_dp' else 1
    others = jnp.asarray(known_contributions(k - 1, d, c))
    weights = jnp.asarray(np.linspace(1.0, 2.0, k), jnp.float32)  # sizes; DP-FedAvg ignores

    def world(key, present, z):
      row = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      uploads = jnp.concatenate([row[None], others])
      agg = jax.vmap(lambda t: dp.dp_fedavg(jax.random.fold_in(key, t), uploads, weights,
                                            c, z))(jnp.arange(rounds))
      return jnp.sum(agg[:, 0]) * k   # K x the mean: the noisy sum of clipped uploads
    return fair_coin(world)

  if mechanism == 'gaussian':
    randomize = registry.randomizer('gaussian', sigma=float(sigma))

    def world(key, present, z):
      del z  # sigma is the randomizer's own (built from the calibrated z)
      x = canary_vector(d, c) * jnp.where(present, 1.0, 0.0)
      return randomize(key, x)[0]
    return fair_coin(world)

  if mechanism == 'ldp_sgd':
    reports = int(ldp_reports)

    def world(key, present, eps):
      g = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      r = jax.vmap(lambda t: ldp_sgd.randomize(jax.random.fold_in(key, t), g, eps, c))(
          jnp.arange(reports))
      return jnp.sum(jnp.sign(r[:, 0]))
    return fair_coin(world)
  raise ValueError(f'unknown mechanism {mechanism!r}')


# ----------------------------------------------------------------------------- bounds ---


def counted_bounds(mechanism: str) -> tuple[str, ...]:
  """The bounds of `BOUNDS` that are lower bounds of this mechanism's epsilon.

  `epsilon_gdp` and `epsilon_one_run_fdp` test Gaussian trade-off curves
  (`fl_privacy.eval.auditing`): lower bounds for the Gaussian compositions only. The
  Poisson-subsampled Gaussian and LDP-SGD's randomized response have other curves, on which
  they may exceed the true epsilon, so they are reported there but not counted.
  """
  if mechanism in NON_GAUSSIAN:
    return ('epsilon_cp', 'epsilon_one_run')
  return BOUNDS


VERDICT_RULE = 'bonferroni_counted'


def verdict_bound_confidence(confidence: float, mechanism: str, profile: bool = False) -> float:
  """The confidence of each counted test behind the verdict: 1 - (1 - c) / k, k =
  len(`counted_bounds(mechanism)`) (+ 1 with the `profile` test), so that the verdict holds at
  family-wise confidence c (Bonferroni; the family is fixed by the mechanism, not the data)."""
  return 1.0 - (1.0 - float(confidence)) / (len(counted_bounds(mechanism)) + int(profile))


def audit_bounds(in_scores, out_scores, *, delta: float, confidence: float,
                 fdp: bool = True) -> dict:
  """`auditing.audit_scores` (lower bounds of epsilon, each at `confidence`) as flat metrics."""
  found = auditing.audit_scores(in_scores, out_scores, delta=delta, confidence=confidence,
                                fdp=fdp)
  return {k: (int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else
              float(v) if isinstance(v, (float, np.floating)) else v)
          for k, v in found.items()}


def best_bound(metrics: dict, mechanism: str) -> float:
  """The largest finite counted bound AT THE VERDICT'S LEVEL (0 when none is).

  Reads `verdict_<bound>` (each counted bound at `verdict_bound_confidence`), never the
  per-bound values at the reported confidence: the largest of those is not a bound at that
  confidence.
  """
  vals = [float(metrics[f'verdict_{k}']) for k in counted_bounds(mechanism)
          if f'verdict_{k}' in metrics]
  vals = [v for v in vals if math.isfinite(v)]
  return max(vals + [0.0])


PROFILE_GRID = tuple(np.round(np.linspace(0.0, 2.0, 41), 3))


def claim_metrics(in_scores: np.ndarray, out_scores: np.ndarray, mechanism: str,
                  claimed_epsilon: float, *, delta: float, confidence: float,
                  pld_epsilon: float | None = None,
                  claimed_delta: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
  """The audit of one claim: `audit_bounds`, the verdict's bound and the verdict.

  The bounds are reported at `confidence` each (as `audit_bounds` names them). The verdict
  is at family-wise `confidence`: the counted bounds are computed again, each at
  `verdict_bound_confidence` = 1 - (1 - confidence) / k for the k = len(`counted_bounds`)
  bounds it takes the largest of (Bonferroni; the same games and the same threshold split),
  stored as `verdict_<bound>`; `best_bound` is their largest and `privacy_violation` is 1
  when it exceeds the claim. Without the correction, the largest of four 95% bounds could
  exceed the truth with probability up to 20%.

  Args:
    in_scores, out_scores: the games' scores in the canary's in and out worlds.
    mechanism: one of `MECHANISMS` (which bounds count, `counted_bounds`).
    claimed_epsilon: the claim; `privacy_violation` is 1 when `best_bound` exceeds it.
    delta, confidence: of the bounds; `confidence` is the verdict's family-wise level.
    pld_epsilon: the claim under the PLD accountant, when there is one: `tightness_pld` is
      the best bound against the mechanism's (near) exact epsilon, the audit's own slack
      without the RDP accountant's.
    claimed_delta: the claim's whole privacy profile, epsilons -> deltas (the accountant's,
      `accounting.delta_curve`). For the mechanisms whose curve is not Gaussian
      (`NON_GAUSSIAN`: the Poisson-subsampled Gaussian, randomized response) the Gaussian-
      curve bounds cannot count, and a single (epsilon, delta) point is a weak test; with the
      profile, `auditing.profile_violation` (the empirical delta(epsilon) lower bounds above
      the claimed profile at some epsilon of `PROFILE_GRID` x the claim) counts as one more
      test of the family: `profile_violation`, `profile_excess`, `profile_epsilon`.

  Returns:
    The bounds (each at `confidence`), `verdict_<bound>` per counted bound, then
    `tightness_pld` (with `pld_epsilon`), `best_bound`, `tightness`, `privacy_violation`,
    `verdict_rule` ('bonferroni_counted'), `verdict_confidence` (family-wise: `confidence`),
    `verdict_bound_confidence`, `counted_bounds`, `epsilon_gdp_if_gaussian` (the GDP bound at
    `confidence`, only where it is one: Gaussian curves), `confidence`, `score_in_mean`,
    `score_out_mean`.
  """
  counted = counted_bounds(mechanism)
  profile = claimed_delta is not None and mechanism in NON_GAUSSIAN
  each = verdict_bound_confidence(confidence, mechanism, profile)
  metrics = audit_bounds(in_scores, out_scores, delta=delta, confidence=confidence)
  verdict = audit_bounds(in_scores, out_scores, delta=delta, confidence=each,
                         fdp='epsilon_one_run_fdp' in counted)
  metrics.update({f'verdict_{k}': verdict[k] for k in counted})
  best = best_bound(metrics, mechanism)
  flagged = best > claimed_epsilon
  if profile:
    grid = np.asarray(PROFILE_GRID) * float(claimed_epsilon)
    metrics.update(auditing.profile_violation(in_scores, out_scores, claimed_delta, grid,
                                              confidence=each))
    flagged = flagged or metrics['profile_violation'] == 1.0
    counted = counted + ('profile',)
  if pld_epsilon is not None:
    metrics['tightness_pld'] = best / float(pld_epsilon)
  metrics.update(best_bound=best, tightness=best / claimed_epsilon,
                 privacy_violation=float(flagged),
                 verdict_rule=VERDICT_RULE, verdict_confidence=float(confidence),
                 verdict_bound_confidence=each,
                 counted_bounds=','.join(counted),
                 epsilon_gdp_if_gaussian=(metrics['epsilon_gdp']
                                          if mechanism not in NON_GAUSSIAN else float('nan')),
                 confidence=float(confidence),
                 score_in_mean=float(np.mean(in_scores)),
                 score_out_mean=float(np.mean(out_scores)))
  return metrics
