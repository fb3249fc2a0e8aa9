"""Differential privacy in federated learning: four placements of the Gaussian mechanism.

- `dp_sgd` (record-level, on the client): every local step clips each example's gradient to
  L2 norm C, sums, adds N(0, (sigma C)^2 I) and divides by the batch's number of real rows
  (Abadi et al. 2016, Algorithm 1), through the client protocol's `grad` hook.
- `update_dp` (client-level, on the client): clip the update Delta to L2 norm C and add
  N(0, (z C)^2 I) before upload (the FedMIA paper's Appendix A.2.1; Geyer et al. 2017's
  client-side variant), an `upload` hook.
- `central_dp` (client-level, on the server): DP-FedAvg (McMahan et al. 2018, "Learning
  Differentially Private Recurrent Language Models", Algorithm 1 with the fixed denominator):
  the server clips each participant's update to C, averages them with equal weights over the
  K participants and adds N(0, (z C / K)^2 I), an `aggregate` hook. The uploads themselves are
  not protected from the server.
- `weak_dp`: the same server-side mechanism, calibrated so that one round spends the target
  epsilon (PASTEL's "WDP", Sect. 1.4 of the PASTEL paper: noise calibrated per round, without
  composing over rounds). `weak_dp_epsilons` reports the per-round and the composed epsilon.

Accounting uses Google's `dp-accounting` package (RDP by default, PLD on request), never a
hand-written accountant:

- record level (`dp_sgd`): T E J steps of the Poisson-subsampled Gaussian mechanism at
  sampling rate q = B / n (the standard DP-SGD accounting of Abadi et al. and of Opacus / TF
  Privacy). The client here walks shuffled fixed-size batches rather than Poisson samples, as
  nearly every DP-SGD implementation does; the reported epsilon is the conventional one under
  that approximation.
- client level (`update_dp`, `central_dp`): T rounds of the Gaussian mechanism, Poisson
  subsampled at the participation fraction when it is below 1 (the round loop draws a fixed
  number of participants: the same approximation).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

from absl import logging
import dp_accounting
import jax
import jax.numpy as jnp

from fl_privacy.mechanisms import gaussian

ACCOUNTANTS = ('rdp', 'pld')


# ----------------------------------------------------------------------------------------------
# Mechanisms.


def global_norm(tree: Any) -> jax.Array:
  """L2 norm of a pytree over all its entries."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree)))


def clip_tree(tree: Any, clip_norm: float) -> Any:
  """`tree` scaled to L2 norm at most `clip_norm` (a zero tree stays zero)."""
  norm = global_norm(tree)
  scale = clip_norm / jnp.maximum(norm, clip_norm)
  return jax.tree_util.tree_map(lambda x: x * scale.astype(x.dtype), tree)


def private_gradient(key: jax.Array, per_example: Any, mask: jax.Array, clip_norm: float,
                     noise_multiplier: float) -> Any:
  """DP-SGD's step gradient: (sum_i clip_C(g_i) + N(0, (sigma C)^2 I)) / n_real.

  Abadi et al. (2016), Algorithm 1. Padding rows (mask 0) contribute nothing; the divisor is
  the batch's number of real rows (B for a full batch, fewer for an epoch's partial last batch).

  Args:
    key: the step's `grad` key.
    per_example: pytree of per-example gradients, leaves [B, ...].
    mask: [B] 1 for real rows.
    clip_norm: C > 0.
    noise_multiplier: sigma >= 0.

  Returns:
    pytree like one example's gradient.
  """
  clipped, _ = gaussian.clip_per_example(per_example, clip_norm)
  m = mask.astype(jnp.float32)
  summed = jax.tree_util.tree_map(
      lambda g: jnp.tensordot(m.astype(g.dtype), g, axes=1), clipped)
  noisy = gaussian.add_noise(key, summed, noise_multiplier * clip_norm)
  count = jnp.maximum(jnp.sum(m), 1.0)
  return jax.tree_util.tree_map(lambda g: g / count.astype(g.dtype), noisy)


def clip_and_noise_update(key: jax.Array, delta: Any, clip_norm: float,
                          noise_multiplier: float) -> Any:
  """`update_dp`: clip_C(Delta) + N(0, (z C)^2 I) (FedMIA paper, Appendix A.2.1)."""
  return gaussian.add_noise(key, clip_tree(delta, clip_norm), noise_multiplier * clip_norm)


def dp_fedavg(key: jax.Array, uploads: Any, weights: jax.Array, clip_norm: float,
              noise_multiplier: float) -> Any:
  """DP-FedAvg's server step (McMahan et al. 2018): mean of clipped uploads + N(0, (zC/K)^2).

  Participants are the clients with weight > 0; each gets weight 1/K (size weighting would
  let one client's update move the mean by more than C / K). K = 0 gives a zero update.

  Args:
    key: the round's server key.
    uploads: pytree with leading axis [num_clients].
    weights: [num_clients] (> 0 marks a participant).
    clip_norm: C > 0.
    noise_multiplier: z >= 0.

  Returns:
    The noisy mean update.
  """
  part = (weights > 0).astype(jnp.float32)
  k = jnp.maximum(jnp.sum(part), 1.0)
  clipped = jax.vmap(lambda u: clip_tree(u, clip_norm))(uploads)
  mean = jax.tree_util.tree_map(
      lambda u: jnp.tensordot(part.astype(u.dtype), u, axes=1) / k.astype(u.dtype), clipped)
  noisy = gaussian.add_noise(key, mean, noise_multiplier * clip_norm / k)
  return jax.tree_util.tree_map(lambda u: jnp.where(jnp.sum(part) > 0, u, 0.0), noisy)


def dp_sgd_hook(clip_norm: float, noise_multiplier: float):
  """`grad` hook of DP-SGD (`private_gradient`)."""
  def grad(key, per_example, mask):
    return private_gradient(key, per_example, mask, clip_norm, noise_multiplier)
  return grad


def update_dp_hook(clip_norm: float, noise_multiplier: float):
  """`upload` hook of `update_dp`."""
  def upload(key, delta, aux):
    del aux
    return clip_and_noise_update(key, delta, clip_norm, noise_multiplier)
  return upload


def central_dp_hook(clip_norm: float, noise_multiplier: float):
  """`aggregate` hook of DP-FedAvg (`central_dp` and `weak_dp`)."""
  def aggregate(key, uploads, weights):
    return dp_fedavg(key, uploads, weights, clip_norm, noise_multiplier)
  return aggregate


# ----------------------------------------------------------------------------------------------
# Accounting (dp-accounting).


@contextlib.contextmanager
def _quiet_accountant():
  # The RDP accountant logs one warning per fractional order whose series does not converge
  # and drops that order; epsilon is then the minimum over the remaining orders, still a valid
  # bound. Hundreds of such lines per calibration drown a run's log, so they are muted here.
  old = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(old)


def _accountant(accountant: str) -> dp_accounting.PrivacyAccountant:
  if accountant == 'rdp':
    return dp_accounting.rdp.RdpAccountant()
  if accountant == 'pld':
    return dp_accounting.pld.PLDAccountant()
  raise ValueError(f'accountant must be one of {ACCOUNTANTS} (got {accountant!r})')


def gaussian_event(noise_multiplier: float, *, sampling_rate: float = 1.0,
                   steps: int = 1) -> dp_accounting.DpEvent:
  """`steps` compositions of the (Poisson-subsampled when q < 1) Gaussian mechanism."""
  event = dp_accounting.GaussianDpEvent(noise_multiplier)
  if sampling_rate < 1.0:
    event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
  return dp_accounting.SelfComposedDpEvent(event, int(steps))


def epsilon(noise_multiplier: float, *, delta: float, sampling_rate: float = 1.0,
            steps: int = 1, accountant: str = 'rdp') -> float:
  """epsilon at `delta` of `steps` (subsampled) Gaussian mechanisms with this noise multiplier.

  The noise standard deviation is `noise_multiplier` times the sensitivity (the clip norm).
  A zero noise multiplier spends infinite epsilon.

  Args:
    noise_multiplier: sigma (DP-SGD) or z (DP-FedAvg), >= 0.
    delta: target delta in (0, 1).
    sampling_rate: q in (0, 1] (B / n per step, or the participation fraction per round).
    steps: number of compositions (E J T steps, or T rounds).
    accountant: 'rdp' (Mironov 2017; Mironov et al. 2019) or 'pld' (Koskela et al.; Doroshenko
      et al. 2022), both from dp-accounting.
  """
  if noise_multiplier <= 0:
    return math.inf
  acc = _accountant(accountant)
  acc.compose(gaussian_event(noise_multiplier, sampling_rate=sampling_rate, steps=steps))
  with _quiet_accountant():
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_multiplier_for(target_epsilon: float, *, delta: float, sampling_rate: float = 1.0,
                         steps: int = 1, accountant: str = 'rdp') -> float:
  """The smallest noise multiplier whose `epsilon(...)` is at most `target_epsilon`.

  Found by dp-accounting's `calibrate_dp_mechanism` (bisection on the accountant); cached,
  since a sweep asks for the same calibration at every point.
  """
  if not target_epsilon > 0:
    raise ValueError(f'target_epsilon must be > 0 (got {target_epsilon})')
  with _quiet_accountant():
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda z: gaussian_event(z, sampling_rate=sampling_rate, steps=steps),
        target_epsilon, delta,
        dp_accounting.mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0)))


def dp_sgd_epsilon(noise_multiplier: float, *, batch_size: int, num_examples: int,
                   steps: int, delta: float, accountant: str = 'rdp') -> float:
  """Record-level epsilon of DP-SGD: `steps` steps at sampling rate B / n."""
  return epsilon(noise_multiplier, delta=delta, sampling_rate=min(1.0, batch_size / num_examples),
                 steps=steps, accountant=accountant)


def weak_dp_epsilons(noise_multiplier: float, *, delta: float, rounds: int,
                     participation: float = 1.0, accountant: str = 'rdp') -> dict[str, float]:
  """`weak_dp`'s per-round epsilon (what it is calibrated to) and the composed one over T."""
  return {'dp_epsilon_per_round': epsilon(noise_multiplier, delta=delta, accountant=accountant),
          'dp_epsilon': epsilon(noise_multiplier, delta=delta, sampling_rate=participation,
                                steps=rounds, accountant=accountant)}
