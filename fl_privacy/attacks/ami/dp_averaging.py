"""Averaging away DP-SGD noise on the chosen neuron over rounds (Appendix E of the AMI paper).

Nguyen et al. (AISTATS 2023), Appendix E: a client that adds Gaussian noise
N(0, sigma^2 C^2), sigma = sqrt(2 ln(1.25 / delta)) / epsilon (Abadi et al.), to its clipped
gradient leaks the chosen neuron's gradient g_t over rounds: the server averages the noisy
values over P rounds and over K chosen neurons, and the average's noise has standard deviation
s = sigma C / sqrt(P K). The paper plots "rounds needed to eliminate the noise" (Fig. 13) without
stating the decision rule or the size of g_t; here both are explicit:

- signal: |g_t| of a member batch, in units of the clip norm C (default 1: the chosen neuron's
  coordinate at the clip norm, the client's worst case; a non-member batch has g_t = 0).
- rule 'known_signal': the server knows g_t (it can compute the target's gradient itself from t
  and the crafted model), decides "member" iff |mean| > |g_t| / 2.
  FPR = 2 Phi(-g / 2s), FNR = Phi(-g / 2s) - Phi(-3g / 2s).
- rule 'unknown_signal': the server only fixes the false-positive rate at delta: member iff
  |mean| > s z, z = Phi^-1(1 - delta / 2). FNR = Phi(z - g/s) - Phi(-z - g/s).

"Rounds needed" is the smallest P with FPR <= delta and FNR <= delta (correct with probability
>= 1 - delta on either kind of batch), in closed form and by Monte Carlo simulation of the
literal per-round, per-neuron noise.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.eval import stats
from fl_privacy.mechanisms import gaussian

RULES = ('known_signal', 'unknown_signal')
_NORMAL = statistics.NormalDist()


def noise_std(epsilon: float, delta: float, clip_norm: float = 1.0) -> float:
  """sigma C with sigma = sqrt(2 ln(1.25 / delta)) / epsilon (Appendix E, Abadi et al.)."""
  return float(gaussian.sigma_for(epsilon, delta, clip_norm))


def _phi(x: float) -> float:
  return _NORMAL.cdf(x)


def error_rates(rounds: int, *, epsilon: float, delta: float, num_neurons: int = 1,
                signal: float = 1.0, clip_norm: float = 1.0,
                rule: str = 'known_signal') -> tuple[float, float]:
  """Closed-form (FPR, FNR) after averaging `rounds` rounds of `num_neurons` noisy gradients.

  Args:
    rounds: P, rounds averaged.
    epsilon: the client's DP epsilon per round.
    delta: DP delta (sets sigma), also the FPR target of 'unknown_signal'.
    num_neurons: K chosen neurons averaged.
    signal: |g_t| / C of a member batch.
    clip_norm: C.
    rule: one of `RULES`.

  Returns:
    (FPR, FNR) as floats.
  """
  if rule not in RULES:
    raise ValueError(f'rule must be one of {RULES} (got {rule!r})')
  s = noise_std(epsilon, delta, clip_norm) / math.sqrt(rounds * num_neurons)
  g = signal * clip_norm
  if rule == 'known_signal':
    return 2.0 * _phi(-g / (2.0 * s)), _phi(-g / (2.0 * s)) - _phi(-3.0 * g / (2.0 * s))
  z = -_NORMAL.inv_cdf(delta / 2.0)
  return delta, _phi(z - g / s) - _phi(-z - g / s)


def rounds_needed(*, epsilon: float, delta: float, num_neurons: int = 1, signal: float = 1.0,
                  clip_norm: float = 1.0, rule: str = 'known_signal',
                  max_rounds: int = 10 ** 9) -> int:
  """Smallest P with FPR <= delta and FNR <= delta in closed form (Fig. 13 of the AMI paper).

  Both error rates decrease with P, so the answer is found by doubling then bisection.

  Returns:
    P, or -1 if even `max_rounds` rounds do not suffice.
  """
  def ok(p: int) -> bool:
    fpr, fnr = error_rates(p, epsilon=epsilon, delta=delta, num_neurons=num_neurons,
                           signal=signal, clip_norm=clip_norm, rule=rule)
    return fpr <= delta and fnr <= delta

  hi = 1
  while not ok(hi):
    hi *= 2
    if hi > max_rounds:
      return -1
  lo = hi // 2 + 1 if hi > 1 else 1
  while lo < hi:
    mid = (lo + hi) // 2
    if ok(mid):
      hi = mid
    else:
      lo = mid + 1
  return hi


def _threshold(s: np.ndarray, g: float, delta: float, rule: str) -> np.ndarray:
  # float32 numpy, as the simulation's arithmetic (an eager jnp op would compile per length).
  s = np.asarray(s, np.float32)
  if rule == 'known_signal':
    return np.full_like(s, 0.5 * g)
  return s * np.float32(-_NORMAL.inv_cdf(delta / 2.0))


def monte_carlo_errors(key: jax.Array, max_rounds: int, *, epsilon: float, delta: float,
                       num_neurons: int = 1, signal: float = 1.0, clip_norm: float = 1.0,
                       rule: str = 'known_signal', num_trials: int = 10_000) -> dict[str, Any]:
  """Error counts after every P = 1 .. max_rounds rounds, simulating the noise literally.

  Each trial draws, per round and per chosen neuron, g + N(0, sigma^2 C^2) (member: g = signal C;
  non-member: g = 0), averages the running sum, and applies the rule. The K draws of a round
  are drawn as their sum, K g + N(0, K sigma^2 C^2) (the same law). Trial i uses
  fold_in(key, i), so counts do not depend on how trials are batched.

  Args:
    key: PRNG key.
    max_rounds: largest P simulated.
    epsilon, delta, num_neurons, signal, clip_norm, rule: as in `error_rates`.
    num_trials: trials per kind (member and non-member each).

  Returns:
    {'fp': int [max_rounds], 'fn': int [max_rounds], 'n': num_trials}; entry P - 1 counts the
    errors after P rounds.
  """
  sigma_c = noise_std(epsilon, delta, clip_norm)
  g = signal * clip_norm
  # Simulated length rounded up to a power of two: few distinct programs across a sweep.
  length = max(64, 1 << max(0, int(max_rounds - 1).bit_length()))
  counts = np.arange(1, length + 1, dtype=np.float64)
  s = sigma_c / np.sqrt(counts * num_neurons)
  tau = _threshold(s, g, delta, rule)
  program = _errors_program(length)
  fp = np.zeros(length, np.int64)
  fn = np.zeros(length, np.int64)
  # A chunk holds chunk x length draws and running means: 2**16 of them (256 KiB each) keep
  # threefry and the cumulative sums in cache (2.3x faster than 2**22 on the 2-core machine).
  chunk = max(1, min(num_trials, (1 << 16) // length))
  for lo in range(0, num_trials, chunk):
    idx = np.arange(lo, lo + chunk, dtype=np.int32)
    a, b = program(key, jnp.asarray(idx), jnp.asarray(idx < num_trials), jnp.float32(sigma_c),
                   jnp.float32(g), jnp.asarray(tau), jnp.float32(num_neurons))
    fp += np.asarray(a, np.int64)
    fn += np.asarray(b, np.int64)
  fp, fn = fp[:max_rounds], fn[:max_rounds]
  return {'fp': fp, 'fn': fn, 'n': int(num_trials)}


@functools.lru_cache(maxsize=16)
def _errors_program(length: int):
  """Jitted (key, indices, valid, sigma C, g, tau [length], K) -> (fp, fn) counts [length].

  K (the number of chosen neurons) is an argument, not a constant: one program per length.
  """
  rounds = np.arange(1, length + 1, dtype=np.float32)

  def one_trial(k, sigma_c, g, tau, num_neurons):
    counts = rounds * num_neurons
    k_out, k_in = jax.random.split(k)
    # A round adds K independent N(0, sigma^2 C^2) draws (plus K g for a member): their sum is
    # exactly N(0, K sigma^2 C^2), so one normal per round and a cumulative sum give the same
    # law as the literal per-neuron loop, as one vector op instead of a length-step scan.
    scale = sigma_c * jnp.sqrt(num_neurons)
    sums_out = jnp.cumsum(jax.random.normal(k_out, (length,)) * scale)
    sums_in = jnp.cumsum(jax.random.normal(k_in, (length,)) * scale + g * num_neurons)
    return jnp.abs(sums_out / counts) > tau, jnp.abs(sums_in / counts) <= tau

  @jax.jit
  def run(key, indices, valid, sigma_c, g, tau, num_neurons):
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(indices)
    fp, fn = jax.vmap(one_trial, in_axes=(0, None, None, None, None))(keys, sigma_c, g, tau,
                                                                     num_neurons)
    valid = valid[:, None]
    return jnp.sum(fp & valid, axis=0), jnp.sum(fn & valid, axis=0)

  return run


def rounds_needed_monte_carlo(errors: dict[str, Any], delta: float) -> int:
  """Smallest P whose Monte Carlo FPR and FNR are both <= delta (-1 if none simulated).

  A point estimate: resolving delta needs num_trials well above 1 / delta; report the error
  rates at that P with their intervals.
  """
  n = errors['n']
  ok = (errors['fp'] <= delta * n) & (errors['fn'] <= delta * n)
  hits = np.flatnonzero(ok)
  return int(hits[0]) + 1 if len(hits) else -1


def point_metrics(key: jax.Array, *, epsilon: float, delta: float, num_neurons: int,
                  signal: float, rule: str, num_trials: int,
                  max_rounds_simulated: int = 20_000) -> tuple[dict[str, Any], int]:
  """Rounds needed to average away DP-SGD noise (Appendix E, Fig. 13); (metrics, n_trials).

  The closed form (`rounds_needed`, its FPR and FNR at that many rounds), and, when it is
  at most `max_rounds_simulated`, the Monte Carlo count (`rounds_needed_monte_carlo` over
  up to 1.5 x the closed form + 2 rounds) with the simulated error rates at the closed form's
  round count (Clopper-Pearson intervals); -1 when not simulated.
  """
  kw = dict(epsilon=epsilon, delta=delta, num_neurons=num_neurons, signal=float(signal),
            rule=rule)
  closed = rounds_needed(**kw)
  fpr, fnr = error_rates(max(closed, 1), **kw)
  m = {'rounds_closed_form': closed, 'fpr_closed_form': fpr, 'fnr_closed_form': fnr}
  cap = max_rounds_simulated
  if 0 < closed <= cap:
    max_rounds = min(cap, int(math.ceil(1.5 * closed)) + 2)
    errors = monte_carlo_errors(key, max_rounds, num_trials=int(num_trials), **kw)
    m['rounds_monte_carlo'] = rounds_needed_monte_carlo(errors, delta)
    n = errors['n']
    m.update(stats.rate('fpr_mc', int(errors['fp'][closed - 1]), n))
    m.update(stats.rate('fnr_mc', int(errors['fn'][closed - 1]), n))
  else:
    m['rounds_monte_carlo'] = -1
  return m, 2 * int(num_trials)
