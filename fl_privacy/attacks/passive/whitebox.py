"""The white-box membership attack of Nasr, Shokri and Houmansadr (IEEE S&P 2019), passive.

(Section and figure numbers below as we read the paper; unverified against its text.)

Per example (x, y) and observed model w (a client's uploaded model, or the global model) the
attacker reads (Sect. III-B and Fig. 4 of Nasr et al.): the softmax output f(x; w), the one-hot
label, the loss L(f(x; w), y), and the gradient of that loss w.r.t. the parameters. As in their
federated setting it reads several recorded rounds (snapshots) of the same model. The gradient
enters as the L2 norm of every parameter tensor's gradient, plus (optionally) the full gradient
of the last layer, which Nasr et al. find the most informative (Sect. V-B). Each feature group
(stacked over snapshots) goes through its own small MLP; their outputs are concatenated and an
encoder MLP gives the membership logit. The attack model is trained with Adam (optax) on a
balanced half of the labelled examples and scores the other half (the supervised "known
members" setting of Nasr et al.; `balanced_halves` draws the halves).

PASTEL (Sect. 1.4) names this attack; its Sect. 3.1 cites Shokri et al. instead. The black-box
baseline of the experiment is the loss threshold (`loss_scores`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.fl import losses

GROUPS = ('output', 'label', 'loss', 'grad_norms', 'last_layer_grad')


def last_layer_name(variables: Any) -> str:
  """The last top-level layer with a 2-D kernel (the classifier of the fl-privacy models)."""
  names = [n for n, sub in variables['params'].items()
           if hasattr(sub, 'keys') and 'kernel' in sub and len(sub['kernel'].shape) == 2]
  if not names:
    raise ValueError('the model has no Dense layer')
  return names[-1]


def make_feature_fn(apply_fn: Callable, *, last_layer: str | None = None
                    ) -> Callable[[Any, jnp.ndarray, jnp.ndarray], dict[str, jnp.ndarray]]:
  """A jitted `features(variables, x, y) -> {group: [N, d_g]}` (Fig. 4 of Nasr et al.).

  Groups: 'output' softmax probabilities [C]; 'label' one-hot [C]; 'loss' [1]; 'grad_norms'
  the L2 norm of the per-example loss gradient of every parameter tensor [#tensors]; and, when
  `last_layer` is given, 'last_layer_grad' that layer's full kernel and bias gradient.

  Args:
    apply_fn: The model's `apply`.
    last_layer: Name of the layer whose full gradient is a feature, or None.

  Returns:
    The jitted feature function (per-example gradients by `vmap`).
  """
  def one(variables, xi, yi):
    def loss(v):
      logits = apply_fn(v, xi[None])
      return losses.per_example_cross_entropy(logits, yi[None])[0], logits[0]
    (value, logits), g = jax.value_and_grad(loss, has_aux=True)(variables)
    num_classes = logits.shape[-1]
    out = {'output': jax.nn.softmax(logits), 'label': jax.nn.one_hot(yi, num_classes),
           'loss': value[None],
           'grad_norms': jnp.stack([jnp.sqrt(jnp.sum(leaf.astype(jnp.float32) ** 2))
                                    for leaf in jax.tree_util.tree_leaves(g)])}
    if last_layer is not None:
      layer = g['params'][last_layer]
      out['last_layer_grad'] = jnp.concatenate([layer[k].reshape(-1) for k in sorted(layer)])
    return out

  return jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))


def features(feature_fn: Callable, variables: Any, x: np.ndarray, y: np.ndarray, *,
             chunk_size: int = 256) -> dict[str, np.ndarray]:
  """`feature_fn` over `x` in chunks of exactly `chunk_size` rows (the last one wraps around to
  real rows), so one compiled program serves every call whatever its number of rows.

  Returns:
    {group: float32 [N, d_g]}.
  """
  n = len(y)
  if n == 0:
    raise ValueError('no examples')
  chunk = int(chunk_size)
  parts: dict[str, list[np.ndarray]] = {}
  for start in range(0, n, chunk):
    stop = min(start + chunk, n)
    idx = np.arange(start, start + chunk) % n  # wraps: pads the last chunk with real rows
    out = feature_fn(variables, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
    for name, value in out.items():
      parts.setdefault(name, []).append(np.asarray(value)[:stop - start])
  return {name: np.concatenate(v).astype(np.float32) for name, v in parts.items()}


def balanced_halves(rng: np.random.Generator, num_pos: int, num_neg: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Balanced attack-training and evaluation halves.

  n = min(num_pos, num_neg) positives and n negatives are drawn without replacement; the first
  floor(n / 2) of each train the attack, the other ceil(n / 2) of each are scored.

  Args:
    rng: numpy Generator.
    num_pos: Candidate positives (indices 0..num_pos-1).
    num_neg: Candidate negatives.

  Returns:
    (train_pos, train_neg, eval_pos, eval_neg) index arrays.
  """
  n = min(num_pos, num_neg)
  if n < 2:
    raise ValueError(f'need at least 2 positives and 2 negatives (got {num_pos}, {num_neg})')
  pos = rng.permutation(num_pos)[:n]
  neg = rng.permutation(num_neg)[:n]
  h = n // 2
  return pos[:h], neg[:h], pos[h:], neg[h:]


class AttackNet(nn.Module):
  """One MLP per feature group, concatenated, then the encoder MLP (Fig. 4 of Nasr et al.).

  Attributes:
    groups: Feature group names (keys of the input dict), in order.
    hidden: Width of the group MLPs' first layer and of the encoder.
    embed: Width of each group's output.
  """
  groups: Sequence[str]
  hidden: int = 64
  embed: int = 16

  @nn.compact
  def __call__(self, inputs: dict[str, jnp.ndarray]) -> jnp.ndarray:
    parts = []
    for name in self.groups:
      h = inputs[name].reshape((inputs[name].shape[0], -1))
      h = nn.relu(nn.Dense(self.hidden, name=f'{name}_1')(h))
      parts.append(nn.relu(nn.Dense(self.embed, name=f'{name}_2')(h)))
    h = nn.relu(nn.Dense(self.hidden, name='encoder_1')(jnp.concatenate(parts, axis=-1)))
    return nn.Dense(1, name='encoder_2')(h)[:, 0]


def _standardise(train: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Scales each feature by the training rows' mean and std (no evaluation data leaks in)."""
  mean = train.mean(axis=0, keepdims=True)
  std = train.std(axis=0, keepdims=True)
  # Near-constant features (a saturated softmax column: std ~1e-40 in float32) would blow up
  # to inf after division; they carry no information, so they are only centred.
  std = np.where(std > 1e-6, std, 1.0)
  return (train - mean) / std, (other - mean) / std


def train_and_score(key, train: dict[str, np.ndarray], train_labels: np.ndarray,
                    evaluate: dict[str, np.ndarray], *, steps: int = 300,
                    learning_rate: float = 1e-3, hidden: int = 64,
                    embed: int = 16, weight_decay: float = 0.0) -> np.ndarray:
  """Trains `AttackNet` (full-batch Adam, logistic loss) and returns logits of `evaluate`.

  Args:
    key: Initialises the attack model.
    train: {group: [n, ...]} of the training half.
    train_labels: [n] 1 = member.
    evaluate: {group: [m, ...]} of the evaluation half.
    steps: Adam steps.
    learning_rate: Adam's step size.
    hidden: Group MLP and encoder width.
    embed: Output width of each group MLP.
    weight_decay: Decoupled weight decay (`optax.adamw`); 0 is plain Adam.

  Returns:
    float64 [m] membership scores (logits; higher = member).
  """
  groups = tuple(g for g in GROUPS if g in train)
  tr, ev = {}, {}
  for g in groups:
    a, b = _standardise(np.asarray(train[g], np.float64), np.asarray(evaluate[g], np.float64))
    tr[g], ev[g] = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  fit = _fitter(groups, hidden, embed, int(steps), float(learning_rate), float(weight_decay))
  scores = np.asarray(fit(key, tr, jnp.asarray(train_labels, jnp.float32), ev), np.float64)
  if not np.all(np.isfinite(scores)):
    raise FloatingPointError('the attack model diverged (non-finite scores)')
  return scores


@functools.lru_cache(maxsize=None)
def _fitter(groups: tuple[str, ...], hidden: int, embed: int, steps: int, learning_rate: float,
            weight_decay: float):
  """A jitted `fit(key, train, labels, evaluate) -> logits`, one per attack configuration."""
  net = AttackNet(groups=groups, hidden=hidden, embed=embed)
  opt = (optax.adamw(learning_rate, weight_decay=weight_decay) if weight_decay > 0
         else optax.adam(learning_rate))

  @jax.jit
  def fit(key, tr, labels, ev):
    params = net.init(key, {g: v[:1] for g, v in tr.items()})

    def loss(p):
      return jnp.mean(optax.sigmoid_binary_cross_entropy(net.apply(p, tr), labels))

    def step(carry, _):
      p, s = carry
      u, s = opt.update(jax.grad(loss)(p), s, p)
      return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return net.apply(params, ev)

  return fit


def loss_scores(feats: dict[str, np.ndarray]) -> np.ndarray:
  """The loss-threshold attack (Yeom et al., 2018): score = -loss of the last snapshot.

  Args:
    feats: {group: [n, S, d]} with group 'loss'.

  Returns:
    [n] scores, higher = member.
  """
  return -np.asarray(feats['loss'], np.float64)[:, -1, 0]
