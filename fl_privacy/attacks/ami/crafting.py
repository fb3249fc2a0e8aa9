"""Crafting the AMI block: the chosen neuron that fires on the target only (Eqs. 5-7).

Nguyen et al., "Active Membership Inference Attack under Local Differential Privacy in
Federated Learning" (AISTATS 2023), "the AMI paper". See `fl_privacy.attacks.ami`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array

# ----------------------------------------------------------------------------------------------
# The crafted block and its value.


class CraftedNeuron(NamedTuple):
  """First FC layer plus the chosen second-layer neuron (the AMI paper's (W, h)).

  Attributes:
    w: [d, r] first-layer kernel in Flax's [in, out] layout (the paper's W transposed).
    b: [r] first-layer bias (the paper suppresses it "for simplicity"; we train it).
    h: [r] incoming weights of the chosen second-layer neuron.
    c: [] bias of the chosen neuron.
  """
  w: Array
  b: Array
  h: Array
  c: Array


class CraftReport(NamedTuple):
  """What crafting did: steps used and how well it separates its own training data."""
  steps: Array  # int32, Adam updates applied
  separated: Array  # bool, every positive v > 0 and every negative v <= 0
  train_tpr: Array  # fraction of positives with v > 0
  train_tnr: Array  # fraction of negatives with v <= 0
  loss: Array  # final weighted BCE


def init_neuron(key: Array, num_features: int, num_neurons: int) -> CraftedNeuron:
  """Honest-looking initial weights, as `flax.linen.Dense` initialises them.

  Args:
    key: PRNG key.
    num_features: d, the input dimension.
    num_neurons: r, the number of first-layer neurons.

  Returns:
    A `CraftedNeuron` with LeCun-normal kernels and zero biases.
  """
  k_w, k_h = jax.random.split(key)
  init = jax.nn.initializers.lecun_normal()
  w = init(k_w, (num_features, num_neurons), jnp.float32)
  h = init(k_h, (num_neurons, 1), jnp.float32)[:, 0]
  return CraftedNeuron(w=w, b=jnp.zeros((num_neurons,), jnp.float32), h=h,
                       c=jnp.zeros((), jnp.float32))


def chosen_value(neuron: CraftedNeuron, x: Array) -> Array:
  """The chosen neuron's pre-activation v(x) = h . ReLU(W x + b) + c (Eqs. 5-6, AMI paper).

  Args:
    neuron: the crafted block.
    x: [..., d] features.

  Returns:
    [...] values; the neuron fires (and its gradient can be non-zero) iff v > 0.
  """
  hidden = jax.nn.relu(x @ neuron.w + neuron.b)
  return hidden @ neuron.h + neuron.c


def crafting_loss(neuron: CraftedNeuron, x: Array, labels: Array,
                  class_weights: Array) -> tuple[Array, Array]:
  """Class-weighted binary cross-entropy on the chosen neuron's logit (Eq. 6, AMI paper).

  The paper puts a sigmoid on v and trains with cross-entropy; the public code feeds
  sigmoid(v) into a softmax cross-entropy, which saturates. Here v itself is the logit.

  Args:
    neuron: the crafted block.
    x: [n, d] crafting data (positives and negatives).
    labels: [n] 1 for (randomized copies of) the target, 0 for the adversary's samples.
    class_weights: [2] weights of label 0 and label 1.

  Returns:
    (loss, v) with v the [n] values, so the caller can check separation for free.
  """
  v = chosen_value(neuron, x)
  per_example = optax.sigmoid_binary_cross_entropy(v, labels.astype(v.dtype))
  weights = class_weights[labels]
  return jnp.sum(weights * per_example) / jnp.sum(weights), v


def balanced_class_weights(num_negatives: int, num_positives: int) -> tuple[float, float]:
  """Weights (negative, positive) that make both classes count half of the loss."""
  n = num_negatives + num_positives
  return n / (2.0 * num_negatives), n / (2.0 * num_positives)


def _separation(v: Array, labels: Array) -> tuple[Array, Array, Array]:
  pos = labels == 1
  hit = jnp.where(pos, v > 0, v <= 0)
  tpr = jnp.sum(hit & pos) / jnp.maximum(jnp.sum(pos), 1)
  tnr = jnp.sum(hit & ~pos) / jnp.maximum(jnp.sum(~pos), 1)
  return jnp.all(hit), tpr, tnr


def craft(key: Array, positives: Array, negatives: Array, *, num_neurons: int,
          learning_rate: float, max_steps: int,
          class_weights: Sequence[float] | None = None,
          stop_when_separated: bool = True) -> tuple[CraftedNeuron, CraftReport]:
  """Trains (W, b, h, c) so that v > 0 on the positives and v <= 0 on the negatives.

  Full-batch Adam on `crafting_loss` in a `lax.while_loop` that stops as soon as the training
  data is 100% separated (checked on the parameters before each update) or after `max_steps`
  updates. This is the adversary's A_INIT of Figs. 2 and 4 of the AMI paper.

  Args:
    key: PRNG key for the honest-looking initialisation.
    positives: [l, d] the target (l = 1) or l LDP-randomized copies of it (Fig. 4).
    negatives: [m, d] the adversary's own samples (under LDP: randomized once each).
    num_neurons: r.
    learning_rate: Adam's step size.
    max_steps: step budget.
    class_weights: (negative, positive) loss weights; None = balanced.
    stop_when_separated: stop at 100% separation (else always spend the budget, as the
      public code does under LDP).

  Returns:
    (neuron, report).
  """
  x = jnp.concatenate([positives, negatives], axis=0).astype(jnp.float32)
  labels = jnp.concatenate([jnp.ones(positives.shape[0], jnp.int32),
                            jnp.zeros(negatives.shape[0], jnp.int32)])
  if class_weights is None:
    class_weights = balanced_class_weights(negatives.shape[0], positives.shape[0])
  cw = jnp.asarray(class_weights, jnp.float32)
  params = init_neuron(key, x.shape[-1], num_neurons)
  optimizer = optax.adam(learning_rate)
  grad_fn = jax.value_and_grad(crafting_loss, has_aux=True)

  def cond(carry):
    _, _, step, done = carry
    return (step < max_steps) & ~done

  def body(carry):
    p, opt_state, step, _ = carry
    (_, v), g = grad_fn(p, x, labels, cw)
    done, _, _ = _separation(v, labels)
    done = done & stop_when_separated
    updates, new_state = optimizer.update(g, opt_state, p)
    new_p = optax.apply_updates(p, updates)
    keep = lambda old, new: jnp.where(done, old, new)
    p = jax.tree.map(keep, p, new_p)
    opt_state = jax.tree.map(keep, opt_state, new_state)
    return p, opt_state, step + (~done).astype(jnp.int32), done

  carry = (params, optimizer.init(params), jnp.zeros((), jnp.int32), jnp.zeros((), bool))
  params, _, steps, _ = jax.lax.while_loop(cond, body, carry)
  loss, v = crafting_loss(params, x, labels, cw)
  separated, tpr, tnr = _separation(v, labels)
  return params, CraftReport(steps=steps, separated=separated, train_tpr=tpr, train_tnr=tnr,
                             loss=loss)


def craft_many(keys: Array, positives: Array, negatives: Array, **kw
               ) -> tuple[CraftedNeuron, CraftReport]:
  """`craft` vmapped over targets: keys [T], positives [T, l, d], negatives [T, m, d].

  The while loop runs until every target is separated or out of budget; finished targets are
  frozen, so each report's `steps` is that target's own count.
  """
  return _craft_many_jit(**kw)(keys, positives, negatives)


@functools.lru_cache(maxsize=16)
def _craft_many_jit(**kw):
  # One compiled program per static setting, reused across sweep points.
  return jax.jit(jax.vmap(functools.partial(craft, **kw)))


def _pow2_floor(x: Array) -> Array:
  return jnp.exp2(jnp.floor(jnp.log2(x)))


def rescale(neuron: CraftedNeuron, x_ref: Array) -> CraftedNeuron:
  """Rescales the block so hidden activations and |v| on `x_ref` are at most about 1.

  ReLU is positively homogeneous, so (W, b) -> s1 (W, b), h -> s2 h, c -> s1 s2 c multiplies
  every v by s1 s2 > 0. With s1, s2 powers of two the scaling is exact in floating point, so
  every decision v > 0 is unchanged bit for bit. Why: a crafted v in the thousands would
  saturate the honest classifier's softmax downstream, and an exactly saturated softmax has an
  exactly zero backprop signal, which would hide an active neuron from the literal gradient.

  Args:
    neuron: the crafted block (one target, unbatched).
    x_ref: [n, d] features the block should be tame on (e.g. the crafting data).

  Returns:
    The rescaled block.
  """
  pre = x_ref @ neuron.w + neuron.b
  s1 = _pow2_floor(1.0 / jnp.maximum(jnp.max(jax.nn.relu(pre)), 1e-30))
  s1 = jnp.minimum(s1, 1.0)
  v = jax.nn.relu(s1 * pre) @ neuron.h + s1 * neuron.c
  s2 = jnp.minimum(_pow2_floor(1.0 / jnp.maximum(jnp.max(jnp.abs(v)), 1e-30)), 1.0)
  return CraftedNeuron(w=s1 * neuron.w, b=s1 * neuron.b, h=s2 * neuron.h,
                       c=s1 * s2 * neuron.c)


def batch_advantage(tpr_row: Array, fpr_row: Array, batch_size: int) -> Array:
  """Game Adv of a per-row decision rule applied to a whole batch (max over rows).

  A member batch holds the target and |D| - 1 pool rows, a non-member batch |D| pool rows, and
  the server says "member" iff some row fires. With a row firing w.p. `tpr_row` for the
  (randomized) target and `fpr_row` for a pool row, independently:
  TPR = 1 - (1 - tpr_row) (1 - fpr_row)^(|D| - 1), TNR = (1 - fpr_row)^|D| (Eq. 3).
  """
  keep = 1.0 - fpr_row
  tpr = 1.0 - (1.0 - tpr_row) * keep ** (batch_size - 1)
  return 0.5 * (tpr + keep ** batch_size)


def calibrate_bias(neuron: CraftedNeuron, v_positive: Array, v_negative: Array,
                   batch_size: int) -> tuple[CraftedNeuron, Array]:
  """Shifts the chosen neuron's bias to maximise the predicted game Adv on held-out data.

  The firing rule is fixed (gradient != 0 iff v > 0), but c is the server's to choose: a
  threshold tau on v is the bias c - tau. tau is picked among midpoints of the sorted held-out
  values (the adversary's own data: fresh randomized copies of the target and negatives not
  used for training; never the game pool) to maximise `batch_advantage`.

  Args:
    neuron: the crafted block (one target).
    v_positive: [p] values of held-out (randomized) copies of the target.
    v_negative: [q] values of held-out (randomized) adversary samples.
    batch_size: |D| of the game.

  Returns:
    (neuron with c - tau, the predicted Adv at tau).
  """
  values = jnp.sort(jnp.concatenate([v_positive, v_negative]))
  mids = 0.5 * (values[1:] + values[:-1])
  candidates = jnp.concatenate([values[:1] - 1.0, mids, values[-1:] + 1.0, jnp.zeros((1,))])
  tpr = jnp.mean(v_positive[None, :] > candidates[:, None], axis=1)
  fpr = jnp.mean(v_negative[None, :] > candidates[:, None], axis=1)
  adv = batch_advantage(tpr, fpr, batch_size)
  best = jnp.argmax(adv)  # ties -> the first (lowest) threshold; 0 is last, so kept only if best
  return neuron._replace(c=neuron.c - candidates[best]), adv[best]




def craft_targets(key: Array, target_x: Array, negatives: Array, heldout: Array,
                  randomize, *, ldp: bool, copies: int, randomize_negatives: bool,
                  num_neurons: int, learning_rate: float, max_steps: int,
                  class_weights: tuple[float, float] | None, stop_when_separated: bool,
                  calibrated_variant: bool, batch_size: int):
  """Crafts one neuron per target with the paper's rule, and its calibrated variant.

  Under LDP the positives are `copies` randomized copies of each target (Sect. 4 of the AMI
  paper), the negatives the adversary's crafting rows (randomized once per target when
  `randomize_negatives`); without LDP the target itself. Keys: fold_in(key, 0..4) for the
  positives, negatives, initialisations and the calibration's positives and negatives.

  Args:
    key: PRNG key of the point's crafting.
    target_x: [T, d] targets; `negatives`: [m, d] crafting rows; `heldout`: [h, d] the
      adversary's held-out rows (calibration only).
    randomize: `(key, x) -> x'`, the clients' LDP mechanism (read only when `ldp`).
    ldp: whether clients randomize.
    copies, randomize_negatives: as above.
    num_neurons, learning_rate, max_steps, class_weights, stop_when_separated: `craft`'s.
    calibrated_variant: also return the neurons with the bias shifted by `calibrate_bias` on
      the held-out rows (our extension).
    batch_size: |D|, the batch the calibration predicts the game's Adv for.

  Returns:
    (neurons, report, calibrated, predicted): `neurons` decide with the paper's rule
    (member iff v > 0 with the crafted bias); `calibrated` are the same neurons with the
    bias shifted by `calibrate_bias` on held-out adversary data (None unless
    `calibrated_variant`); `predicted` the calibration's predicted Adv per target
    (NaN without the variant). Both are rescaled by `rescale` (decisions unchanged).
  """
  t_x = jnp.asarray(target_x)
  num_targets, d = t_x.shape
  neg = jnp.asarray(negatives)
  held = jnp.asarray(heldout)
  k_pos, k_neg, k_init, k_vpos, k_vneg = (jax.random.fold_in(key, i) for i in range(5))

  def randomized_copies(k, n):
    return jnp.stack([randomize(jax.random.fold_in(k, t), jnp.broadcast_to(t_x[t], (n, d)))
                      for t in range(num_targets)])

  def once(k, x):
    if not (ldp and randomize_negatives):
      return jnp.broadcast_to(x, (num_targets,) + x.shape)
    return jnp.stack([randomize(jax.random.fold_in(k, t), x) for t in range(num_targets)])

  pos = randomized_copies(k_pos, copies) if ldp else t_x[:, None, :]
  negs = once(k_neg, neg)
  neurons, report = craft_many(
      jax.random.split(k_init, num_targets), pos, negs, num_neurons=int(num_neurons),
      learning_rate=float(learning_rate), max_steps=int(max_steps), class_weights=class_weights,
      stop_when_separated=bool(stop_when_separated))
  predicted = jnp.full((num_targets,), jnp.nan)
  calibrated = None
  if calibrated_variant:
    v_pos = jax.vmap(chosen_value)(neurons, randomized_copies(k_vpos, copies) if ldp
                                   else t_x[:, None, :])
    held_r = (jnp.stack([randomize(jax.random.fold_in(k_vneg, t), held)
                         for t in range(num_targets)]) if ldp
              else jnp.broadcast_to(held, (num_targets,) + held.shape))
    v_neg = jax.vmap(chosen_value)(neurons, held_r)
    calibrated, predicted = jax.vmap(calibrate_bias, in_axes=(0, 0, 0, None))(
        neurons, v_pos, v_neg, int(batch_size))
  rows = jnp.concatenate([pos, negs], axis=1)
  neurons = jax.vmap(rescale)(neurons, rows)
  if calibrated is not None:
    calibrated = jax.vmap(rescale)(calibrated, rows)
  return neurons, report, calibrated, predicted


def report_metrics(report: CraftReport) -> dict[str, float]:
  """Crafting diagnostics over the targets: `craft_steps_mean/max`, the fraction of targets
  separated on the crafting data, and the crafting-set TPR and TNR (means)."""
  steps = np.asarray(report.steps)
  return {'craft_steps_mean': float(np.mean(steps)), 'craft_steps_max': int(np.max(steps)),
          'craft_separated_fraction': float(np.mean(np.asarray(report.separated))),
          'craft_train_tpr': float(np.mean(np.asarray(report.train_tpr))),
          'craft_train_tnr': float(np.mean(np.asarray(report.train_tnr)))}
