"""Active membership inference (AMI) by a dishonest FL server, with and without LDP.

Nguyen et al., "Active Membership Inference Attack under Local Differential Privacy in
Federated Learning" (AISTATS 2023), called "the AMI paper" below.

The server crafts the first fully connected layer W (r neurons over the d-dim features) and one
neuron h of the second layer so that the chosen neuron's pre-activation
v(x) = h . ReLU(W x + b) + c is positive on the target (under LDP: on randomized copies of it)
and non-positive on everything else (Eqs. 5-7). A client's gradient of the chosen neuron is then
non-zero iff some row of its (randomized) batch activates the neuron, and the server decides
"member" iff that gradient is non-zero (Figs. 2 and 4).

This module holds
- crafting (`init_neuron`, `chosen_value`, `crafting_loss`, `craft`, `craft_many`), a sound
  replacement of the public code's sigmoid-then-cross-entropy loss by class-weighted binary
  cross-entropy on logits, full-batch Adam, stopping at 100% training separation;
- `rescale` (positive homogeneity: powers of two, decisions unchanged bit for bit) and
  `write_into_mlp`, which places the crafted block into a real Flax `models.MLP`;
- the decision, on two paths: `decide_from_gradient` (literal: `jax.grad` of the MLP's
  cross-entropy, read the chosen neuron's gradient) and `decide_from_activation` (fast: some
  row has v > 0);
- a fast LDP sampler over fixed-point codes (`CodeChannel`), which draws a whole group of up to
  5 output bits from one 32-bit word by inverse CDF instead of one Bernoulli per bit (every
  output code's probability within 2**-32 of the mechanism's; the exact total-variation
  distance is computed and reported);
- the security game's trials (Figs. 1 and 3) for `eval.runner.run_trials`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import ome
from fl_privacy.models import crafting

Array = jax.Array

# The public code's sign bit + 5 integer + 4 fractional bits; 5-bit groups keep the per-group
# inverse-CDF tables at 32 x 31 thresholds.
DEFAULT_GROUP_SIZE = 5

MECHANISMS = ('none', 'bitrand', 'ome')


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


# ----------------------------------------------------------------------------------------------
# The crafted block inside a real classifier, and the two decision paths.


FC1 = ('params', 'fc1')
FC2 = ('params', 'fc2')


def write_into_mlp(neuron: CraftedNeuron, params: Any, chosen_index: int, *,
                   fc1: tuple = FC1, fc2: tuple = FC2) -> Any:
  """Writes the crafted block into honest MLP params: all of fc1, one unit of fc2.

  Everything else (the other fc2 units, the classifier) keeps its honest initialisation, so
  only the r + 1 neurons the AMI paper says it modifies are touched (Section 3.2).

  Args:
    neuron: the crafted block (unbatched), fc1 must have exactly r units.
    params: variables of `models.MLP(hidden=(r, H2, ...), num_classes)` from `init`.
    chosen_index: which fc2 unit is the chosen neuron.
    fc1: path of the first dense layer.
    fc2: path of the second dense layer.

  Returns:
    New params (pure; the input is not modified).
  """
  params = crafting.write_layer(params, fc1, kernel=neuron.w, bias=neuron.b)
  return crafting.write_neuron(params, fc2, chosen_index, neuron.h, bias=neuron.c)


def chosen_gradient(loss_fn: Callable, params: Any, x: Array, y: Array, chosen_index: int, *,
                    fc2: tuple = FC2) -> tuple[Array, Array]:
  """The client's gradient of the chosen neuron (its fc2 column and bias) on a batch.

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar`, e.g. mean cross-entropy of the MLP.
    params: the crafted model's variables.
    x: [B, d] the client's (randomized) batch.
    y: [B] its labels.
    chosen_index: the chosen fc2 unit.
    fc2: path of the second dense layer.

  Returns:
    (kernel column [r], bias []) of the gradient, as the server receives them.
  """
  grads = jax.grad(loss_fn)(params, x, y)
  layer = grads
  for name in fc2:
    layer = layer[name]
  return layer['kernel'][:, chosen_index], layer['bias'][chosen_index]


def decide_from_gradient(loss_fn: Callable, params: Any, x: Array, y: Array,
                         chosen_index: int, *, fc2: tuple = FC2) -> Array:
  """Literal decision of Figs. 2 and 4: member iff the chosen neuron's gradient is non-zero."""
  g_w, g_b = chosen_gradient(loss_fn, params, x, y, chosen_index, fc2=fc2)
  return jnp.any(g_w != 0) | (g_b != 0)


def decide_from_activation(neuron: CraftedNeuron, x: Array) -> tuple[Array, Array]:
  """Fast decision: member iff some row of the batch has v > 0.

  Equals `decide_from_gradient` unless every active row's backprop signal into the chosen
  neuron is exactly zero (e.g. the classifier's row for the chosen unit is zero, or the softmax
  is saturated to exactly one-hot on the true label); `rescale` keeps the crafted block away
  from the latter, and the tests check agreement with the literal path trial by trial.

  Args:
    neuron: the crafted block.
    x: [B, d] the (randomized) batch.

  Returns:
    (decision, score) with score = max over rows of v, the soft version of the decision.
  """
  v = chosen_value(neuron, x)
  score = jnp.max(v)
  return score > 0, score


# ----------------------------------------------------------------------------------------------
# A fast, exact-in-distribution sampler for bitwise LDP channels over fixed-point codes.


@dataclasses.dataclass(frozen=True)
class Encoding:
  """Fixed-point encoding of a feature (the public code's 1 + 5 + 4 bits by default).

  Attributes:
    int_bits: integer bits.
    frac_bits: fractional bits (quantum 2**-frac_bits).
    sign_bit: whether bit 0 is a sign bit.
    honour_sign: decode the sign bit (False reproduces the public code, which drops it).
  """
  int_bits: int = 5
  frac_bits: int = 4
  sign_bit: bool = True
  honour_sign: bool = True

  @property
  def num_bits(self) -> int:
    return self.int_bits + self.frac_bits + int(self.sign_bit)

  @property
  def max_value(self) -> float:
    return (2 ** (self.int_bits + self.frac_bits) - 1) / 2 ** self.frac_bits

  @property
  def min_value(self) -> float:
    return -self.max_value if (self.sign_bit and self.honour_sign) else 0.0

  def group_sizes(self, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[int, ...]:
    n, sizes = self.num_bits, []
    while n > 0:
      sizes.append(min(group_size, n))
      n -= sizes[-1]
    return tuple(sizes)


def pack_codes(bits: Array, group_sizes: Sequence[int]) -> Array:
  """Packs bits [..., d, l] (bit 0 first) into per-group integers [..., d, G], MSB first."""
  bits = jnp.asarray(bits, jnp.uint32)
  out, start = [], 0
  for n in group_sizes:
    weights = jnp.asarray([1 << (n - 1 - i) for i in range(n)], jnp.uint32)
    out.append(jnp.sum(bits[..., start:start + n] * weights, axis=-1, dtype=jnp.uint32))
    start += n
  return jnp.stack(out, axis=-1)


def unpack_codes(codes: Array, group_sizes: Sequence[int]) -> Array:
  """Inverse of `pack_codes`: [..., d, G] -> bits [..., d, l] (uint8)."""
  out = []
  for g, n in enumerate(group_sizes):
    shifts = jnp.asarray([n - 1 - i for i in range(n)], jnp.uint32)
    out.append((codes[..., g, None] >> shifts) & 1)
  return jnp.concatenate(out, axis=-1).astype(jnp.uint8)


def codes_to_values(codes: Array, group_sizes: Sequence[int], encoding: Encoding) -> Array:
  """Decodes per-group codes to feature values (same rule as `mechanisms.fixed_point.decode`).

  Args:
    codes: [..., d, G] uint32 group codes.
    group_sizes: bits per group (sum = encoding.num_bits).
    encoding: the fixed-point encoding.

  Returns:
    [..., d] float32 values.
  """
  pattern = jnp.zeros(codes.shape[:-1], jnp.uint32)
  for g, n in enumerate(group_sizes):
    pattern = (pattern << n) | codes[..., g]
  quantum = 2.0 ** -encoding.frac_bits
  if not encoding.sign_bit:
    return pattern.astype(jnp.float32) * quantum
  l = encoding.num_bits
  magnitude = (pattern & ((1 << (l - 1)) - 1)).astype(jnp.float32) * quantum
  if not encoding.honour_sign:
    return magnitude
  negative = ((pattern >> (l - 1)) & 1) == 1
  return jnp.where(negative, -magnitude, magnitude)


class CodeChannel(NamedTuple):
  """Inverse-CDF tables of a bitwise LDP channel, one table per bit group.

  A table has one row per input code (or a single row of flip patterns when the channel is
  flip-symmetric, as BitRand is: P(out = u XOR f | u) independent of u); row entries are the
  cumulative probabilities of output codes 0 .. 2**n - 2 as integer multiples of 2**-32.

  Attributes:
    thresholds: per group, uint32 [rows, 2**n - 1].
    xor: per group, whether the table holds flip patterns (one row).
    tv_per_feature: upper bound on the total-variation distance between the realized and the
      exact channel of one feature (sum over groups of each group's worst-case TV).
  """
  thresholds: tuple
  xor: tuple
  tv_per_feature: float


def channel_from_bit_probs(p_one: np.ndarray, group_sizes: Sequence[int]) -> CodeChannel:
  """Builds the per-group inverse-CDF tables from per-bit output probabilities.

  Bits are randomized independently (true of BitRand, Eq. 23, and OME, Eq. 22, of the AMI
  paper), so the law of a group of n output bits given its n input bits is the product of the
  per-bit laws; drawing one 32-bit word per group by inverse CDF realizes every output code's
  probability as an integer multiple of 2**-32 within 2**-32 of the exact value. The exact
  worst-case TV of the realized channel is computed in float64 and returned.

  Args:
    p_one: [l, 2] float64, p_one[k, u] = P(output bit k = 1 | input bit k = u).
    group_sizes: bits per group, summing to l.

  Returns:
    The `CodeChannel`.
  """
  p_one = np.asarray(p_one, np.float64)
  if p_one.shape != (sum(group_sizes), 2):
    raise ValueError(f'p_one must be [{sum(group_sizes)}, 2], got {p_one.shape}')
  flip_symmetric = bool(np.allclose(p_one[:, 1], 1.0 - p_one[:, 0], rtol=0, atol=1e-15))
  tables, xors, tv, start = [], [], 0.0, 0
  scale = 2.0 ** 32
  for n in group_sizes:
    p = p_one[start:start + n]
    start += n
    size = 1 << n
    bits = (np.arange(size)[:, None] >> np.arange(n - 1, -1, -1)[None, :]) & 1  # [codes, n]
    inputs = bits[:1] if flip_symmetric else bits
    # probs[u, o] = prod_k P(out_k = o_k | in_k = u_k); in the flip form u = 0 and o = flips.
    one = p[np.arange(n)[None, :], inputs]  # [rows, n]
    probs = np.prod(np.where(bits[None, :, :] == 1, one[:, None, :], 1.0 - one[:, None, :]),
                    axis=-1)
    cdf = np.cumsum(probs, axis=-1)[:, :-1]
    thresholds = np.minimum(np.round(cdf * scale), scale - 1).astype(np.uint64)
    edges = np.concatenate([np.zeros((len(inputs), 1)), thresholds.astype(np.float64),
                            np.full((len(inputs), 1), scale)], axis=-1)
    realized = np.diff(edges, axis=-1) / scale
    tv += float(np.max(0.5 * np.sum(np.abs(realized - probs), axis=-1)))
    tables.append(thresholds.astype(np.uint32))
    xors.append(flip_symmetric)
  return CodeChannel(thresholds=tuple(tables), xor=tuple(xors), tv_per_feature=tv)


def bit_probabilities(mechanism: str, epsilon: float, num_features: int,
                      encoding: Encoding) -> np.ndarray | None:
  """p_one[k, u] = P(output bit k = 1 | input bit k = u) of an LDP mechanism, [l, 2].

  Read from the mechanisms' own probability functions (`bitrand.flip_probabilities`, Eq. 23;
  `ome.output_probabilities`, Eq. 22). Returns None when the law of a bit depends on more than
  its position within the feature (OME with an odd l, whose parity runs over the whole r*l
  vector): callers then use the mechanism itself.
  """
  l = encoding.num_bits
  if mechanism == 'bitrand':
    q = np.asarray(bitrand.flip_probabilities(epsilon, num_features, l), np.float64)
    return np.stack([q, 1.0 - q], axis=1)
  if mechanism == 'ome':
    if l % 2:
      return None
    probs = np.asarray(ome.output_probabilities(epsilon, num_features * l), np.float64)
    return probs[np.arange(l) % 2]  # [parity, input] -> [k, input]
  raise ValueError(f'no bitwise channel for mechanism {mechanism!r}')


def mechanism_fn(mechanism: str, epsilon: float | None, num_features: int,
                 encoding: Encoding) -> Callable[[Array, Array], Array]:
  """The client's randomizer `(key, x) -> x'` from `fl_privacy.mechanisms` (exact draws)."""
  kw = dict(int_bits=encoding.int_bits, frac_bits=encoding.frac_bits,
            sign_bit=encoding.sign_bit, honour_sign=encoding.honour_sign,
            num_features=num_features)
  if mechanism == 'none':
    return lambda key, x: jnp.asarray(x, jnp.float32)
  if mechanism == 'bitrand':
    return lambda key, x: bitrand.randomize(key, x, epsilon, **kw)
  if mechanism == 'ome':
    return lambda key, x: ome.randomize(key, x, epsilon, **kw)
  raise ValueError(f'mechanism must be one of {MECHANISMS} (got {mechanism!r})')


def sample_codes(key: Array, codes: Array, thresholds: Sequence[Array],
                 xor: Sequence[bool]) -> Array:
  """Randomizes group codes [..., d, G] through the channel: one uint32 draw per group.

  Args:
    key: PRNG key (used once).
    codes: [..., d, G] uint32 input codes.
    thresholds: `CodeChannel.thresholds` (as arrays; may be traced).
    xor: `CodeChannel.xor` (static).

  Returns:
    [..., d, G] uint32 output codes.
  """
  u = jax.random.bits(key, codes.shape, jnp.uint32)
  out = []
  for g, (table, is_xor) in enumerate(zip(thresholds, xor)):
    code = codes[..., g]
    rows = table[0] if is_xor else table[code]
    drawn = jnp.sum(u[..., g, None] >= rows, axis=-1, dtype=jnp.uint32)
    out.append(code ^ drawn if is_xor else drawn)
  return jnp.stack(out, axis=-1)


# ----------------------------------------------------------------------------------------------
# The security game (Figs. 1 and 3 of the AMI paper), one trial at a time for the runner.


class GameSide(NamedTuple):
  """Rows a trial draws from: the targets (one per crafted neuron) or the pool.

  Fields a path does not need may be None (the fast path carries only `codes`).

  Attributes:
    x: [N, d] float32 features as the client holds them (inside the encoding's range).
    y: [N] int32 labels of the legitimate task.
    codes: [N, d, G] uint32 fixed-point group codes of `x` (LDP paths only).
  """
  x: Any = None
  y: Any = None
  codes: Any = None


def trial_roles(index: Array, num_targets: int) -> tuple[Array, Array]:
  """(b, target) of a global trial index: b = index % 2, target = (index // 2) % T.

  Members and non-members alternate, so any prefix of trials is balanced and every target
  gets as many member as non-member trials when the count is a multiple of 2 T.
  """
  b = (index % 2).astype(jnp.int32)
  return b, ((index // 2) % num_targets).astype(jnp.int32)


def _take(tree, t, num_targets: int):
  # A single target is a static slice; several are a per-trial gather.
  if num_targets == 1:
    return jax.tree.map(lambda a: a[0], tree)
  return jax.tree.map(lambda a: a[t], tree)


def trial_batch(key: Array, index: Array, targets: GameSide, pool: GameSide, *,
                batch_size: int) -> tuple[Array, Array, GameSide]:
  """The client's batch D of one trial, before any randomization.

  Member trial (b = 1): the target plus |D| - 1 pool rows drawn uniformly with replacement;
  non-member trial (b = 0): |D| pool rows (as in the public code's game).

  Args:
    key: the trial's key (the runner's fold_in(run_key, index)); the draw uses fold_in(key, 0).
    index: global trial index.
    targets: target rows, leading axis T.
    pool: pool rows, leading axis N.
    batch_size: |D|.

  Returns:
    (b, target index, rows) with rows a `GameSide` of leading axis |D|.
  """
  num_targets = jax.tree.leaves(targets)[0].shape[0]
  num_pool = jax.tree.leaves(pool)[0].shape[0]
  b, t = trial_roles(index, num_targets)
  idx = jax.random.randint(jax.random.fold_in(key, 0), (batch_size,), 0, num_pool)
  target = _take(targets, t, num_targets)

  def pick(target_rows, pool_rows):
    rows = pool_rows[idx]
    return rows.at[0].set(jnp.where(b == 1, target_rows, rows[0]))

  return b, t, jax.tree.map(pick, target, pool)


def randomize_key(key: Array) -> Array:
  """The key of a trial's LDP randomization (fold_in(key, 1); the batch draw uses 0)."""
  return jax.random.fold_in(key, 1)


def fast_trial(key: Array, index: Array, neurons: CraftedNeuron, targets: GameSide,
               pool: GameSide, thresholds: tuple, *, batch_size: int, xor: tuple = (),
               encoding: Encoding | None = None,
               mechanism: Callable | None = None) -> dict:
  """One LDP game trial on the fast path: randomize codes, decode, member iff max v > 0.

  The client's whole batch is randomized afresh in every trial (Fig. 3).

  Args:
    key: the trial's key.
    index: global trial index.
    neurons: crafted blocks stacked over targets [T, ...].
    targets: `GameSide(codes=[T, d, G])`.
    pool: `GameSide(codes=[N, d, G])`.
    thresholds: `CodeChannel.thresholds` as arrays.
    batch_size: |D|.
    xor: `CodeChannel.xor`.
    encoding: the fixed-point encoding (with the sign switch).
    mechanism: if given, `(key, x) -> x'` on `GameSide.x` replaces the code sampler (for
      channels `bit_probabilities` cannot tabulate); `thresholds` is then ignored.

  Returns:
    {'b', 'target', 'decision', 'score'}.
  """
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  if mechanism is not None:
    x = mechanism(randomize_key(key), rows.x)
  else:
    codes = sample_codes(randomize_key(key), rows.codes, thresholds, xor)
    sizes = tuple(int(np.log2(tab.shape[-1] + 1)) for tab in thresholds)
    x = codes_to_values(codes, sizes, encoding)
  neuron = _take(neurons, t, jax.tree.leaves(targets)[0].shape[0])
  decision, score = decide_from_activation(neuron, x)
  return {'b': b, 'target': t, 'decision': decision, 'score': score}


def precomputed_values(neurons: CraftedNeuron, target_x: Array, pool_x: Array
                       ) -> tuple[Array, Array]:
  """v of every target under its own neuron [T] and of every pool row under each [T, N].

  Without LDP nothing in a trial but the index draw depends on the trial, so v is computed
  once per target and pool row, and a trial only gathers.
  """
  v_target = jax.vmap(chosen_value)(neurons, target_x)
  v_pool = jax.vmap(chosen_value, in_axes=(0, None))(neurons, pool_x)
  return v_target, v_pool


def fast_trial_no_ldp(key: Array, index: Array, v_target: Array, v_pool: Array, *,
                      batch_size: int) -> dict:
  """One game trial without LDP from precomputed values (same batch draws as the others)."""
  targets = GameSide(x=v_target)
  pool = GameSide(x=v_pool.T)  # [N, T]: a pool row carries its value under every neuron
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  v = rows.x[:, t]  # row 0 already holds v_target[t] in member trials
  score = jnp.max(v)
  return {'b': b, 'target': t, 'decision': score > 0, 'score': score}


def neuron_from_params(params: Any, chosen_index: int, *, fc1: tuple = FC1,
                       fc2: tuple = FC2) -> CraftedNeuron:
  """Reads the crafted block back out of MLP params (what the client actually runs)."""
  def at(path):
    node = params
    for name in path:
      node = node[name]
    return node
  l1, l2 = at(fc1), at(fc2)
  return CraftedNeuron(w=l1['kernel'], b=l1['bias'], h=l2['kernel'][:, chosen_index],
                       c=l2['bias'][chosen_index])


def literal_trial(key: Array, index: Array, params: Any, targets: GameSide, pool: GameSide,
                  thresholds: tuple | None, *, batch_size: int, loss_fn: Callable,
                  chosen_index: int, xor: tuple = (), encoding: Encoding | None = None,
                  mechanism: Callable | None = None) -> dict:
  """One game trial exactly as Figs. 3-4 describe it: the client computes the gradient.

  The client randomizes its batch (by the code sampler when `thresholds` is given, by the
  `mechanism(key, x)` when given, else not at all), computes jax.grad of the crafted MLP's
  loss, and the server decides from the chosen neuron's gradient. The fast decision on the
  same randomized batch is returned beside it, for the agreement test.

  Args:
    key: the trial's key.
    index: global trial index.
    params: crafted MLP variables stacked over targets [T, ...].
    targets: `GameSide(x, y, codes)` of the targets.
    pool: `GameSide(x, y, codes)` of the pool.
    thresholds: `CodeChannel.thresholds` or None.
    batch_size: |D|.
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    chosen_index: the chosen fc2 unit.
    xor: `CodeChannel.xor`.
    encoding: fixed-point encoding (code sampler only).
    mechanism: `(key, x) -> x'` applied to the float batch (exact upstream mechanism).

  Returns:
    {'b', 'target', 'decision', 'decision_fast', 'score'}.
  """
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  if thresholds is not None:
    sizes = tuple(int(np.log2(tab.shape[-1] + 1)) for tab in thresholds)
    codes = sample_codes(randomize_key(key), rows.codes, thresholds, xor)
    x = codes_to_values(codes, sizes, encoding)
  elif mechanism is not None:
    x = mechanism(randomize_key(key), rows.x)
  else:
    x = rows.x
  p = _take(params, t, jax.tree.leaves(targets)[0].shape[0])
  decision = decide_from_gradient(loss_fn, p, x, rows.y, chosen_index)
  fast, score = decide_from_activation(neuron_from_params(p, chosen_index), x)
  return {'b': b, 'target': t, 'decision': decision, 'decision_fast': fast, 'score': score}


def game_rates(outcomes: dict) -> dict[str, float | int]:
  """TPR, TNR and Adv = (TPR + TNR) / 2 (Eq. 3 of the AMI paper) as plain counts and rates.

  Intervals are added by the caller with `eval.stats` / `eval.metrics`.
  """
  b = np.asarray(outcomes['b']).astype(bool)
  d = np.asarray(outcomes['decision']).astype(bool)
  tp, n_pos = int(np.sum(d & b)), int(np.sum(b))
  tn, n_neg = int(np.sum(~d & ~b)), int(np.sum(~b))
  tpr, tnr = tp / max(n_pos, 1), tn / max(n_neg, 1)
  return {'tp': tp, 'n_pos': n_pos, 'tn': tn, 'n_neg': n_neg, 'tpr': tpr, 'tnr': tnr,
          'adv': 0.5 * (tpr + tnr)}
