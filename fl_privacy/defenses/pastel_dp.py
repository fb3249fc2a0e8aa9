"""The DP baselines PASTEL is compared against (Sect. 1.4): LDP, CDP and "weak" DP, accounted.

PASTEL's Fig. 1 and Sect. 3.1 compare it with three DP mechanisms (after Naseri et al., 2020):

- `ldp`: record-level DP-SGD on each client (Abadi et al., 2016): every example's gradient is
  clipped to L2 norm C, the clipped gradients of a minibatch are summed, N(0, (sigma C)^2) is
  added per coordinate, and the sum is divided by the nominal batch size B. Accounted as E x J x
  T Poisson-subsampled Gaussian steps at rate q = B / n (n the client's members; the shuffled
  minibatches are accounted as Poisson sampling, the usual approximation).
- `cdp`: DP-FedAvg (McMahan et al., 2018): the server clips every update to C_u, averages the
  K clipped updates with equal weights and adds N(0, (z C_u / K)^2) per coordinate. Client-level
  DP, accounted as T Gaussian mechanisms of noise multiplier z (every client takes part).
- `wdp`: the same mechanism with z calibrated so that ONE round is epsilon-DP (the paper's
  "weak DP adds noise at every round ignoring the noise added in previous rounds"); the
  composition over T rounds, which the paper says makes epsilon grow, is reported beside it.

Both server-side mechanisms leave every upload as the client computed it: the noise protects
the global model, not what the server sees from each client.

Accounting uses Google's `dp-accounting` (RDP accountant; calibration by
`dp_accounting.calibrate_dp_mechanism`). This module is the experiment's own until the
`defenses.dp` layer of the client-protocol issue lands; it only builds `ClientHooks`.
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
from dp_accounting import rdp
import jax
import jax.numpy as jnp

from fl_privacy.fl import client

MECHANISMS = ('ldp', 'cdp', 'wdp')


def _global_norm(tree: Any) -> jnp.ndarray:
  return jnp.sqrt(sum(jnp.sum(jnp.square(leaf.astype(jnp.float32)))
                      for leaf in jax.tree_util.tree_leaves(tree)))


def clip(tree: Any, clip_norm: float) -> tuple[Any, jnp.ndarray]:
  """`tree * min(1, C / ||tree||)` (global L2 norm) and whether it was clipped."""
  norm = _global_norm(tree)
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-12))
  return jax.tree_util.tree_map(lambda a: a * scale.astype(a.dtype), tree), norm > clip_norm


def _gaussian_like(key, tree: Any, std) -> Any:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(key, len(leaves))
  noise = [std * jax.random.normal(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)]
  return jax.tree_util.tree_unflatten(treedef, noise)


def dp_sgd_grad(clip_norm: float, noise_multiplier: float, batch_size: int):
  """The `grad` hook of DP-SGD (Algorithm 1 of Abadi et al., 2016).

  g = (sum_i clip_C(g_i) + N(0, (sigma C)^2 I)) / B over the real rows of the minibatch.

  Args:
    clip_norm: C > 0.
    noise_multiplier: sigma >= 0.
    batch_size: B, the nominal (fixed) denominator.

  Returns:
    `grad(key, per_example_grads, mask) -> grad`.
  """
  def grad(key, per_example, mask):
    clipped, _ = jax.vmap(lambda g: clip(g, clip_norm))(per_example)
    w = mask.astype(jnp.float32)
    total = jax.tree_util.tree_map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1),
                                   clipped)
    noise = _gaussian_like(key, total, noise_multiplier * clip_norm)
    return jax.tree_util.tree_map(lambda s, n: (s + n) / batch_size, total, noise)
  return grad


def central_dp_aggregate(clip_norm: float, noise_multiplier: float):
  """The `aggregate` hook of DP-FedAvg (McMahan et al., 2018), server-side.

  mean = (sum_k clip_C(Delta_k) over participants) / K' + N(0, (z C / K')^2 I), K' the number
  of participants (equal weights, so one client moves the mean by at most C / K').

  Args:
    clip_norm: C_u > 0.
    noise_multiplier: z >= 0.

  Returns:
    `aggregate(key, uploads [K, ...], weights [K]) -> mean update`.
  """
  def aggregate(key, uploads, weights):
    clipped, _ = jax.vmap(lambda u: clip(u, clip_norm))(uploads)
    part = (weights > 0).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(part), 1.0)
    mean = jax.tree_util.tree_map(
        lambda a: jnp.tensordot(part.astype(a.dtype), a, axes=1) / count, clipped)
    noise = _gaussian_like(key, mean, noise_multiplier * clip_norm / count)
    return jax.tree_util.tree_map(jnp.add, mean, noise)
  return aggregate


def ldp_event(noise_multiplier: float, sampling_rate: float, steps: int):
  """E x J x T Poisson-subsampled Gaussian steps (DP-SGD's record-level event)."""
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(sampling_rate,
                                          dp_accounting.GaussianDpEvent(noise_multiplier)),
      steps)


def rounds_event(noise_multiplier: float, num_rounds: int):
  """T Gaussian mechanisms (DP-FedAvg with every client in every round, client level)."""
  return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier),
                                           num_rounds)


def epsilon(event, delta: float) -> float:
  """epsilon of `event` at `delta` by the RDP accountant."""
  accountant = rdp.RdpAccountant()
  accountant.compose(event)
  return float(accountant.get_epsilon(delta))


def calibrate(make_event, target_epsilon: float, delta: float) -> float:
  """The smallest noise multiplier whose event is (target_epsilon, delta)-DP."""
  return float(dp_accounting.calibrate_dp_mechanism(rdp.RdpAccountant, make_event,
                                                    target_epsilon, delta))


def make(mechanism: str, *, target_epsilon: float, delta: float, num_rounds: int,
         clip_norm: float = 1.0, update_clip_norm: float = 1.0, epochs: int = 1,
         batch_size: int = 32, num_examples: int = 1) -> tuple[client.ClientHooks, dict]:
  """Hooks and accounting of one DP baseline calibrated to `target_epsilon`.

  Args:
    mechanism: 'ldp', 'cdp' or 'wdp'.
    target_epsilon: epsilon > 0 (per round for 'wdp', over the run otherwise).
    delta: delta in (0, 1).
    num_rounds: T.
    clip_norm: per-example clip C of 'ldp'.
    update_clip_norm: update clip C_u of 'cdp' and 'wdp'.
    epochs: E (ldp accounting).
    batch_size: B (ldp).
    num_examples: n, the smallest client's member count (ldp: q = B / n, J = ceil(n / B)).

  Returns:
    (hooks, info) with info `noise_multiplier`, `dp_epsilon` (over T rounds),
    `dp_epsilon_per_round` (wdp; nan otherwise), `dp_delta`, and `dp_steps`.
  """
  if mechanism not in MECHANISMS:
    raise ValueError(f'mechanism must be one of {MECHANISMS} (got {mechanism!r})')
  if mechanism == 'ldp':
    q = min(1.0, batch_size / num_examples)
    steps = epochs * math.ceil(num_examples / batch_size) * num_rounds
    sigma = calibrate(lambda s: ldp_event(s, q, steps), target_epsilon, delta)
    hooks = client.ClientHooks(grad=dp_sgd_grad(clip_norm, sigma, batch_size))
    info = dict(noise_multiplier=sigma, dp_epsilon=epsilon(ldp_event(sigma, q, steps), delta),
                dp_epsilon_per_round=math.nan, dp_steps=steps, dp_sampling_rate=q)
  elif mechanism == 'cdp':
    z = calibrate(lambda s: rounds_event(s, num_rounds), target_epsilon, delta)
    hooks = client.ClientHooks(aggregate=central_dp_aggregate(update_clip_norm, z))
    info = dict(noise_multiplier=z, dp_epsilon=epsilon(rounds_event(z, num_rounds), delta),
                dp_epsilon_per_round=epsilon(rounds_event(z, 1), delta), dp_steps=num_rounds,
                dp_sampling_rate=1.0)
  else:
    z = calibrate(lambda s: rounds_event(s, 1), target_epsilon, delta)
    hooks = client.ClientHooks(aggregate=central_dp_aggregate(update_clip_norm, z))
    info = dict(noise_multiplier=z, dp_epsilon=epsilon(rounds_event(z, num_rounds), delta),
                dp_epsilon_per_round=epsilon(rounds_event(z, 1), delta), dp_steps=num_rounds,
                dp_sampling_rate=1.0)
  info['dp_delta'] = delta
  return hooks, info
