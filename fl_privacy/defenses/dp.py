"""Differential privacy in federated learning: four placements of the Gaussian mechanism.

- `dp_sgd` (record-level, on the client): every local step clips each example's gradient to
  L2 norm C, sums, adds N(0, (sigma C)^2 I) and divides by the lot size B (Abadi et al. 2016,
  Algorithm 1's L: the expected batch of Poisson lots, the batch size of shuffled ones, whose
  partial last batch is then down-weighted rather than its noise amplified), through the
  client protocol's `grad` hook.
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
  composing over rounds); its metrics carry the per-round and the composed epsilon.

Accounting lives in `fl_privacy.accounting`: each mechanism's declaration (unit, neighbouring
relation, adversary, sampling) is in `defenses.registry`, and dp-accounting turns it into
epsilon. `dp_sgd` samples its batches by Poisson (`fl.sampling`) by default, so its accounting
is exact; shuffled batches are accounted without amplification. `update_dp` is replace-one
against the server (sensitivity 2C, no amplification); `central_dp`/`weak_dp` protect only
readers of the aggregate.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fl_privacy.mechanisms import gaussian



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
                     noise_multiplier: float, denominator: float | None = None) -> Any:
  """DP-SGD's step gradient: (sum_i clip_C(g_i) + N(0, (sigma C)^2 I)) / n.

  Abadi et al. (2016), Algorithm 1. Padding rows (mask 0) contribute nothing. The divisor n is
  `denominator` when given, the lot size L of Algorithm 1: Poisson-sampled batches divide by
  the expected batch size B, since the realised batch size depends on which records were drawn
  and is not public, and shuffled batches by their batch size B, so an epoch's partial last
  batch is down-weighted instead of its noise amplified (the `dp_sgd` defense passes B for
  both). Without it, n is the batch's number of real rows.

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
  if denominator is None:
    count = jnp.maximum(jnp.sum(m), 1.0)
  else:
    count = jnp.asarray(denominator, jnp.float32)
  return jax.tree_util.tree_map(lambda g: g / count.astype(g.dtype), noisy)


def _update_dp_upload(clip_norm, std, key, delta, aux):
  """clip_C(Delta) + N(0, std^2 I): `clip_and_noise_update` with std = z C given (the upload
  hook's form, whose C and std may be traced)."""
  del aux
  return gaussian.add_noise(key, clip_tree(delta, clip_norm), std)


def clip_and_noise_update(key: jax.Array, delta: Any, clip_norm: float,
                          noise_multiplier: float) -> Any:
  """`update_dp`: clip_C(Delta) + N(0, (z C)^2 I) (FedMIA paper, Appendix A.2.1)."""
  return _update_dp_upload(clip_norm, noise_multiplier * clip_norm, key, delta, None)


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


def _operand(value):
  """A hook's parameter as a weakly typed array: a Python number through float (so 2 and 2.0
  give the same program), a traced value (a strength a jitted training sweeps) as it is."""
  if isinstance(value, (int, float)):
    return jnp.asarray(float(value))
  return jnp.asarray(value)


def _dp_sgd_grad(clip_norm, noise_multiplier, denominator, key, per_example, mask):
  return private_gradient(key, per_example, mask, clip_norm, noise_multiplier, denominator)


def dp_sgd_hook(clip_norm: float, noise_multiplier: float, denominator: float | None = None):
  """`grad` hook of DP-SGD (`private_gradient`): a `jax.tree_util.Partial` over C, z and the
  denominator as weakly typed arrays (as `update_dp_hook`), so a jitted training that takes
  the hook as an operand compiles once for every noise of a sweep."""
  return jax.tree_util.Partial(
      _dp_sgd_grad, _operand(clip_norm), _operand(noise_multiplier),
      None if denominator is None else _operand(denominator))


def update_dp_hook(clip_norm: float, noise_multiplier: float):
  """`upload` hook of `update_dp` (`clip_and_noise_update`): a `jax.tree_util.Partial` over C
  and the noise's std z C (the product taken in float64, as the floats were) as weakly typed
  arrays, so a jitted training that takes the hook as an operand (`fl.recording`) compiles
  once for every z of a sweep."""
  return jax.tree_util.Partial(_update_dp_upload, jnp.asarray(float(clip_norm)),
                               jnp.asarray(float(noise_multiplier) * float(clip_norm)))


def _central_dp_aggregate(clip_norm, noise_multiplier, key, uploads, weights):
  return dp_fedavg(key, uploads, weights, clip_norm, noise_multiplier)


def central_dp_hook(clip_norm: float, noise_multiplier: float):
  """`aggregate` hook of DP-FedAvg (`central_dp` and `weak_dp`): a `jax.tree_util.Partial`
  over C and z as weakly typed arrays (as `update_dp_hook`)."""
  return jax.tree_util.Partial(_central_dp_aggregate, _operand(clip_norm),
                               _operand(noise_multiplier))
