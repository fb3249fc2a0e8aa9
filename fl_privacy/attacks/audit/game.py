"""The LDP audit game: secret bit, randomized client, distinguisher's guess.

One trial (Algorithms 3 and 4 of the LDP-audit paper, Matsumoto et al.): a fair
secret bit b picks which of the two crafted inputs the client holds (b = 0: x or
g1, b = 1: x' or g2); the client runs the mechanism with a fresh key; the
distinguisher guesses b. A point of the audit is many trials through
`fl_privacy.eval.runner.run_trials` (chunked, so 10^6 trials need one chunk's
memory), summarised by `summarize` into FP, FN, accuracy with Clopper-Pearson
intervals, the empirical epsilon of Eq. (3) and its one-sided 95% lower bound.

A lower bound above the mechanism's claimed epsilon is a privacy bug in the
mechanism (or in its claim); `summarize` sets `privacy_violation = 1` and the
experiment logs it as an error.

Trial functions are built by factories so that one compiled chunk program is
reused across the points that share it (the runner caches on the function).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.attacks.audit import distinguishers as dist
from fl_privacy.eval import auditing
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.mechanisms import ldp_sgd

MECHANISMS = ('ldp_sgd', 'bitrand', 'ome', 'gaussian')

PerExampleLoss = Callable[[Any, jax.Array, jax.Array], jax.Array]


def secret_bit(key: jax.Array) -> jax.Array:
  """The fair secret bit b of one trial, int32."""
  return jax.random.bernoulli(key).astype(jnp.int32)


def ldp_sgd_trial_fn(distinguisher: str, rule: str | None = None,
                     per_example_loss: PerExampleLoss | None = None,
                     unravel: Callable[[jax.Array], Any] | None = None):
  """A trial of the LDP-SGD audit (Algorithm 3 black-box, Algorithm 4 white-box).

  Args:
    distinguisher: 'white_box' (Eq. 5 on the report) or 'black_box' (sees
      theta_{t+1} only).
    rule: the black-box test, one of 'loss_decrease' (Eq. 4), 'loss_change'
      (Eq. 6), 'sign_sum' (Eq. 7); ignored for 'white_box'.
    per_example_loss: `(params, x, y) -> [n]` losses, for the loss-based rules.
    unravel: flat [d] vector -> the model's params pytree, for the same.

  Returns:
    `trial(key, index, g_pair, theta, x, y, epsilon, clip_norm, lr, radius)
    -> {'b', 'guess'}`: g_pair [2, d] the crafted gradients, theta [d] the flat
    global model, x [2, ...] / y [2] the probed inputs, and float32 scalars for
    the mechanism (epsilon, clip_norm) and the server (lr, radius; unused by
    the white-box test).
  """
  if distinguisher not in dist.DISTINGUISHERS:
    raise ValueError(f'unknown distinguisher {distinguisher!r}')
  loss_rules = {'loss_decrease': dist.loss_decrease,
                'loss_change': dist.loss_change}
  if distinguisher == 'black_box':
    if rule not in (*loss_rules, 'sign_sum'):
      raise ValueError(f'unknown black-box rule {rule!r}')
    if rule in loss_rules and (per_example_loss is None or unravel is None):
      raise ValueError(f'rule {rule!r} needs per_example_loss and unravel')

  def trial(key, index, g_pair, theta, x, y, epsilon, clip_norm, lr, radius):
    del index  # The key is already the trial's own.
    k_bit, k_client = jax.random.split(key)
    b = secret_bit(k_bit)
    report = ldp_sgd.randomize(k_client, g_pair[b], epsilon, clip_norm)
    if distinguisher == 'white_box':
      guess = dist.white_box(report, g_pair[0], g_pair[1])
    else:
      theta_next = ldp_sgd.server_update(theta, report[None], lr, radius,
                                         epsilon=epsilon, clip_norm=clip_norm)
      if rule == 'sign_sum':
        guess = dist.sign_sum(theta, theta_next)
      else:
        before = per_example_loss(unravel(theta), x, y)
        after = per_example_loss(unravel(theta_next), x, y)
        guess = loss_rules[rule](before, after)
    return {'b': b, 'guess': guess}

  trial.__name__ = f'ldp_sgd_{distinguisher}_{rule or "cosine"}'
  return trial


def subspace_coefficients(vectors) -> np.ndarray:
  """Coordinates `[m, k]` of m vectors `[m, d]` in an orthonormal basis of their span.

  Float64 Householder QR; directions with |R_jj| <= 1e-9 * max |R_ii| are
  dropped (an antipodal pair such as g2 = -g1 spans one dimension). A zero
  set of vectors keeps one dimension so that shapes stay valid.
  """
  a = np.asarray(vectors, np.float64)
  q, r = np.linalg.qr(a.T)  # a.T = q @ r, q [d, m], r [m, m]
  diag = np.abs(np.diag(r))
  keep = diag > 1e-9 * max(float(diag.max(initial=0.0)), 1e-300)
  if not keep.any():
    keep[0] = True
  return (a @ q[:, keep]).astype(np.float32)


def ldp_sgd_projected_white_box_trial_fn():
  """The white-box trial (Eq. 5) through `ldp_sgd.randomize_in_subspace`.

  Same outcome distribution as `ldp_sgd_trial_fn('white_box')`: the cosine test
  needs only <report, g1> and <report, g2>, whose joint law the subspace
  shortcut draws exactly (tests compare the two paths). O(1) per trial
  instead of O(d).

  Returns:
    `trial(key, index, coef_pair, epsilon, clip_norm, dim) -> {'b', 'guess'}`
    with coef_pair [2, k] from `subspace_coefficients([g1, g2])`.
  """
  def trial(key, index, coef_pair, epsilon, clip_norm, dim):
    del index
    k_bit, k_client = jax.random.split(key)
    b = secret_bit(k_bit)
    coords = ldp_sgd.randomize_in_subspace(k_client, coef_pair[b], epsilon,
                                           clip_norm, dim)
    return {'b': b, 'guess': dist.white_box(coords, coef_pair[0],
                                            coef_pair[1])}

  trial.__name__ = 'ldp_sgd_white_box_projected'
  return trial


def bits_trial_fn(randomize_bits: Callable[[jax.Array, jax.Array], jax.Array]):
  """A trial of a bitwise input mechanism against the likelihood-ratio test.

  Args:
    randomize_bits: `(key, bits [r, l] uint8) -> randomized bits` (the
      mechanism with its epsilon bound in).

  Returns:
    `trial(key, index, bits_pair, if_one, if_zero) -> {'b', 'guess'}`: the two
    inputs' encodings [2, r, l] and the per-bit log-ratios of
    `distinguishers.bit_log_ratios`.
  """
  def trial(key, index, bits_pair, if_one, if_zero):
    del index
    k_bit, k_mech = jax.random.split(key)
    b = secret_bit(k_bit)
    out = randomize_bits(k_mech, bits_pair[b])
    return {'b': b, 'guess': dist.likelihood_ratio_bits(out, if_one, if_zero)}

  return trial


def gaussian_trial_fn(add_noise: Callable[[jax.Array, jax.Array, Any],
                                          jax.Array]):
  """A trial of the Gaussian mechanism against the likelihood-ratio test.

  Args:
    add_noise: `(key, x, sigma) -> x + N(0, sigma^2 I)`.

  Returns:
    `trial(key, index, x_pair, sigma) -> {'b', 'guess'}`, x_pair [2, r].
  """
  def trial(key, index, x_pair, sigma):
    del index
    k_bit, k_mech = jax.random.split(key)
    b = secret_bit(k_bit)
    out = add_noise(k_mech, x_pair[b], sigma)
    guess = dist.likelihood_ratio_gaussian(out, x_pair[0], x_pair[1])
    return {'b': b, 'guess': guess}

  return trial


def error_counts(b: np.ndarray, guess: np.ndarray) -> dict[str, int]:
  """Counts of the game: n_neg (b = 0), n_pos (b = 1), fp, fn, correct.

  FP: the input was x (b = 0) but the guess was x'; FN: the input was x' but
  the guess was x (Section 3.1 of the LDP-audit paper).
  """
  b = np.asarray(b).astype(bool)
  guess = np.asarray(guess).astype(bool)
  return {'n_neg': int(np.sum(~b)), 'n_pos': int(np.sum(b)),
          'fp': int(np.sum(~b & guess)), 'fn': int(np.sum(b & ~guess)),
          'correct': int(np.sum(b == guess))}


def _eps_with_delta(fp: float, fn: float, delta: float) -> float:
  # The (eps, delta) form of Eq. (2): FP + e^eps FN >= 1 - delta (and mirrored).
  terms = [0.0]
  for a, c in ((fp, fn), (fn, fp)):
    num = 1.0 - delta - a
    if num > 0:
      terms.append(math.inf if c <= 0 else math.log(num / c))
  return max(terms)


def accuracy_bound(epsilon: float, delta: float = 0.0) -> float:
  """The best accuracy any test can have against an (eps, delta)-LDP mechanism.

  (e^eps + delta) / (1 + e^eps), from FP + e^eps FN >= 1 - delta with FP = FN;
  for delta = 0 this is Proposition 1's e^eps / (1 + e^eps), attained by the
  white-box test with the dummy gradient on LDP-SGD.
  """
  return (math.exp(epsilon) + delta) / (1.0 + math.exp(epsilon)) if (
      epsilon < 700) else 1.0


def summarize(b: np.ndarray, guess: np.ndarray, claimed_epsilon: float,
              delta: float = 0.0, confidence: float = 0.95,
              violation_confidence: float = 0.95,
              audit_delta: float | None = None) -> dict[str, float]:
  """The metrics of one audit point.

  Args:
    b: the secret bits of the trials.
    guess: the distinguisher's guesses.
    claimed_epsilon: the epsilon the mechanism claims.
    delta: the mechanism's delta (0 for pure LDP); the epsilon estimates then
      use FP + e^eps FN >= 1 - delta instead of Eq. (3).
    confidence: level of the intervals and of the one-sided lower bound.
    violation_confidence: level of the bound behind `privacy_violation`.

  Returns:
    Flat metrics: `fp`, `fn`, `acc` (each with `_ci_low`/`_ci_high`), the counts
    `n_neg`, `n_pos`, `fp_count`, `fn_count`, `eps_emp` (Eq. 3), `eps_emp_lower`
    (one-sided lower bound from one-sided Clopper-Pearson upper bounds on FP and
    FN, Bonferroni-combined), `eps_emp_upper` (the same from lower bounds on FP
    and FN). Each bound is one-sided at `confidence`, so together they are a
    two-sided bracket at level 1 - 2 (1 - confidence) (90% for 95%) of the
    epsilon this test attains, `eps_claimed`, `delta`, `acc_bound` (the best accuracy
    the claim allows) and `privacy_violation` (1.0 iff the lower bound at
    `violation_confidence` exceeds eps_claimed). With `audit_delta`, also the
    auditor's bounds on the same guesses (`eval.auditing.audit_scores` at that delta:
    `epsilon_cp`, `gdp_mu` and `epsilon_gdp` (Nasr et al. 2023), `epsilon_one_run`
    (Steinke et al. 2023)); the guesses are the scores, 0 or 1, so the one informative
    threshold (guess 1 = IN) is known before the data: the `'explicit'` threshold 1, every
    trial used, no correction, and `epsilon_cp` is the (eps, delta) form of
    `eps_emp_lower`.
  """
  c = error_counts(b, guess)
  n = c['n_neg'] + c['n_pos']
  m: dict[str, float] = {}
  m.update(stats.rate('fp', c['fp'], c['n_neg'], confidence))
  m.update(stats.rate('fn', c['fn'], c['n_pos'], confidence))
  m.update(stats.rate('acc', c['correct'], n, confidence))
  m.update(n_neg=c['n_neg'], n_pos=c['n_pos'], fp_count=c['fp'],
           fn_count=c['fn'])
  fp = c['fp'] / max(c['n_neg'], 1)
  fn = c['fn'] / max(c['n_pos'], 1)
  m['eps_emp'] = (_eps_with_delta(fp, fn, delta) if delta > 0 else
                  stats.empirical_epsilon(fp, fn))
  m['eps_emp_lower'] = epsilon_lower_bound(c, delta, confidence)
  # Upper end: one-sided lower bounds on FP and FN (Bonferroni), plugged into
  # the same formula. Each end holds with `confidence` on its own, so
  # [eps_emp_lower, eps_emp_upper] brackets the epsilon this test's true error
  # rates imply with 1 - 2 (1 - confidence): 90% at 95%, not 95%.
  each = 1.0 - (1.0 - confidence) / 2.0
  fp_lo = stats.clopper_pearson_one_sided(c['fp'], c['n_neg'], each, 'lower')
  fn_lo = stats.clopper_pearson_one_sided(c['fn'], c['n_pos'], each, 'lower')
  m['eps_emp_upper'] = (_eps_with_delta(fp_lo, fn_lo, delta) if delta > 0 else
                        stats.empirical_epsilon(fp_lo, fn_lo))
  m['eps_claimed'] = float(claimed_epsilon)
  m['delta'] = float(delta)
  m['acc_bound'] = accuracy_bound(float(claimed_epsilon), delta)
  # The flag may use a stricter (family-wise) level than the reported bound,
  # so that a sweep of many tight points does not raise false alarms at the 5%
  # rate of a single 95% bound.
  m['privacy_violation'] = float(
      epsilon_lower_bound(c, delta, violation_confidence) > claimed_epsilon)
  if audit_delta is not None and c['n_pos'] and c['n_neg']:
    # The guess as `error_counts` reads it (nonzero = IN), as 0/1 scores.
    bs, gs = np.asarray(b).astype(bool), np.asarray(guess).astype(bool).astype(np.float64)
    bounds = auditing.audit_scores(gs[bs], gs[~bs], delta=float(audit_delta),
                                   confidence=confidence, fdp=False,
                                   threshold_strategy='explicit', threshold=1.0)
    for k in ('epsilon_cp', 'gdp_mu', 'epsilon_gdp', 'epsilon_one_run', 'audit_delta'):
      m[k] = float(bounds[k])
  return m


def epsilon_lower_bound(counts: dict[str, int], delta: float,
                        confidence: float) -> float:
  """One-sided lower confidence bound on the epsilon a test's counts certify.

  One-sided Clopper-Pearson upper bounds on FP and FN at level
  1 - (1 - confidence) / 2 each (Bonferroni), plugged into Eq. (3) of the
  LDP-audit paper (`stats.empirical_epsilon_lower_bound`) or, for delta > 0,
  into its (eps, delta) form FP + e^eps FN >= 1 - delta.

  Args:
    counts: `error_counts` of the trials.
    delta: the mechanism's delta.
    confidence: overall one-sided level.
  """
  if delta > 0:
    each = 1.0 - (1.0 - confidence) / 2.0
    fp_hi = stats.clopper_pearson_one_sided(counts['fp'], counts['n_neg'], each)
    fn_hi = stats.clopper_pearson_one_sided(counts['fn'], counts['n_pos'], each)
    return _eps_with_delta(fp_hi, fn_hi, delta)
  return stats.empirical_epsilon_lower_bound(counts['fp'], counts['n_neg'],
                                             counts['fn'], counts['n_pos'],
                                             confidence)


def run_point(trial_fn, key: jax.Array, num_trials: int, *,
              chunk_size: int | None = None, args: tuple, claimed_epsilon: float,
              delta: float = 0.0, violation_confidence: float = 0.95,
              progress: bool = True, batch_bytes: int | None = None,
              audit_delta: float | None = None) -> dict[str, float]:
  """Runs `num_trials` trials of a game and summarizes them (`summarize`).

  `chunk_size` and `batch_bytes` go to `eval.runner.run_trials` (None = sized by bytes).
  """
  out = runner.run_trials(trial_fn, key, num_trials, chunk_size=chunk_size,
                          args=args, progress=progress, batch_bytes=batch_bytes)
  return summarize(out['b'], out['guess'], claimed_epsilon, delta,
                   violation_confidence=violation_confidence, audit_delta=audit_delta)
