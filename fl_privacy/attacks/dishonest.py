"""Perfectly accurate membership inference by a dishonest server.

Pichler, Romanelli, Rey Vega, Piantanida, "Perfectly Accurate Membership Inference by a
Dishonest Central Server in Federated Learning" (the dishonest-server paper; SEED-NOTES
section 2). The server writes the 2M+1-ReLU structure of the paper's Fig. 1 into the fully
connected layers of a model f = head o embed so that the target label's logit is

  b = ReLU(eps - sum_m |a_m - eta_m|),

where a are M trunk features of the input and eta the target's values of them. No parameter of
the block (nor of the trunk) receives a gradient unless some training sample lands within eps of
the target (Lemma 2.1), so after one FedAvg round the detector's bias eps moved iff the target
(or a near copy) was in the client's data. The server compares that movement with one simulated
optimizer step on the target alone (Eq. (9)).

The functions here are pure; `make_trial` composes them into one run of the game for
`eval.runner.run_trials`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy import memory
from fl_privacy.fl import client, local, losses
from fl_privacy.models import crafting

# The Flower CNN's dense layers: the detector's first and second hidden layers and the output.
FC_LAYERS = ('fc1', 'fc2', 'fc3')
# Outputs of one run; the experiment reads these names.
OUTCOME_FIELDS = ('member', 'delta', 'decision', 'target', 'nearest', 'nearest_distance',
                  'num_activating')

Params = Any


def select_components(features: jax.Array, num_components: int) -> tuple[jax.Array, jax.Array]:
  """The M largest-magnitude features of the target (step 2 of Section 2.2).

  Args:
    features: [F] trunk features f_0(x_t) of the target.
    num_components: M <= F.

  Returns:
    (indices int32 [M], values [M]): the chosen positions a_1..a_M and their values
    eta_1..eta_M.
  """
  _, indices = jax.lax.top_k(jnp.abs(features), num_components)
  return indices.astype(jnp.int32), features[indices]


def detector_output(a: jax.Array, eta: jax.Array, epsilon: float) -> jax.Array:
  """b = ReLU(eps - sum_m |a_m - eta_m|): Eq. (3) of the dishonest-server paper (Lemma 2.1).

  The closed form the crafted network must reproduce; `a` may carry leading batch axes.
  """
  return jax.nn.relu(epsilon - detector_distance(a, eta))


def detector_distance(a: jax.Array, eta: jax.Array) -> jax.Array:
  """sum_m |a_m - eta_m| over the last axis: the detector fires iff this is <= eps."""
  return jnp.sum(jnp.abs(a - eta), axis=-1)


def craft(variables: Params, target_features: jax.Array, target_label: jax.Array,
          num_components: int, epsilon: float, *,
          layers: tuple[str, str, str] = FC_LAYERS,
          collection: str = 'params') -> tuple[Params, jax.Array]:
  """Writes the detector of Fig. 1 into the dense layers (Section 2.2, steps 1-3).

  Every dense weight is set to 0 and every dense bias to -1 (so all other units are dead).
  Then, for the chosen components idx_m with target values eta_m:
  unit 2m of `layers[0]` has weight +1 on idx_m and bias -eta_m, unit 2m+1 weight -1 and bias
  +eta_m (together |a_m - eta_m|); unit 0 of `layers[1]` has weight -1 on those 2M units and
  bias eps; the output logit `target_label` of `layers[2]` is that unit (weight 1, bias 0).
  The trunk (convolutions) keeps the weights it had. The other logits are the constant -1
  rather than the paper's 0, which changes Eq. (6) to -b 1{y = y_t} + log((L-1)/e + e^b) but
  not Eq. (8)'s point: the loss's derivative in eps is non-zero iff the detector fires.

  Args:
    variables: model variables holding `collection`/`layers[i]`/{kernel, bias}.
    target_features: [F] trunk features of the target under these variables.
    target_label: the target's label (may be traced).
    num_components: M; needs M <= F and 2M <= width of `layers[0]`.
    epsilon: the detector's bias eps.
    layers: names of the first hidden, second hidden and output dense layers.
    collection: the variable collection holding the parameters.

  Returns:
    (crafted variables, chosen component indices [M]).
  """
  first, second, out = ((collection, name) for name in layers)
  feature_dim = target_features.shape[-1]
  k1 = _kernel(variables, first)
  k2 = _kernel(variables, second)
  k3 = _kernel(variables, out)
  if k1.shape[0] != feature_dim:
    raise ValueError(f'{layers[0]} takes {k1.shape[0]} inputs, features have {feature_dim}')
  if num_components > feature_dim or 2 * num_components > k1.shape[1]:
    raise ValueError(f'M={num_components} needs M <= {feature_dim} features and 2M <= '
                     f'{k1.shape[1]} units of {layers[0]}')
  indices, eta = select_components(target_features, num_components)
  pairs = jnp.arange(num_components)
  kernel1 = jnp.zeros_like(k1)
  kernel1 = kernel1.at[indices, 2 * pairs].set(1).at[indices, 2 * pairs + 1].set(-1)
  bias1 = jnp.full((k1.shape[1],), -1, k1.dtype)
  bias1 = bias1.at[2 * pairs].set(-eta).at[2 * pairs + 1].set(eta)
  kernel2 = jnp.zeros_like(k2).at[:2 * num_components, 0].set(-1)
  bias2 = jnp.full((k2.shape[1],), -1, k2.dtype).at[0].set(epsilon)
  kernel3 = jnp.zeros_like(k3).at[0, target_label].set(1)
  bias3 = jnp.full((k3.shape[1],), -1, k3.dtype).at[target_label].set(0)
  variables = crafting.write_layer(variables, first, kernel=kernel1, bias=bias1)
  variables = crafting.write_layer(variables, second, kernel=kernel2, bias=bias2)
  variables = crafting.write_layer(variables, out, kernel=kernel3, bias=bias3)
  return variables, indices


def _kernel(variables: Params, path: tuple[str, str]) -> jax.Array:
  node = variables
  for part in path:
    node = node[part]
  return node['kernel']


def detector_bias(variables: Params, *, layers: tuple[str, str, str] = FC_LAYERS,
                  collection: str = 'params') -> jax.Array:
  """The eps entry of `variables`: bias of unit 0 of the second hidden layer."""
  return variables[collection][layers[1]]['bias'][0]


def delta_statistic(eps_client: jax.Array, eps_server: jax.Array, epsilon: jax.Array,
                    batch_size: int) -> jax.Array:
  """Delta = B |eps_client - eps| / |eps_server - eps|: Eq. (9) of the dishonest-server paper.

  `eps_client` is the detector bias the client returned, `eps_server` the one after the
  server's simulated step on the target alone. An unmoved bias gives Delta = 0 exactly
  (also in the degenerate case where the simulated step did not move it either).
  """
  moved = jnp.abs(eps_client - epsilon)
  scale = jnp.abs(eps_server - epsilon)
  return jnp.where(moved == 0, 0.0, batch_size * moved / scale)


def decide(delta: jax.Array, threshold: float) -> jax.Array:
  """Member iff Delta >= xi (Section 2.3)."""
  return delta >= threshold


def server_step(loss_fn: Callable, params: Params, x_target: jax.Array, y_target: jax.Array,
                optimizer: optax.GradientTransformation) -> Params:
  """One optimizer step of the client's procedure on the target alone: client(theta, {s}).

  The server's reference for Eq. (9): a fresh optimizer state (as the client's), one step on
  the single-sample batch {s}.
  """
  grads = jax.grad(loss_fn)(params, x_target[None], y_target[None])
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  return optax.apply_updates(params, updates)


@dataclasses.dataclass(frozen=True)
class Game:
  """One configuration of the dishonest-server game (static across its runs).

  Attributes:
    model: a Flax module exposing `embed(x)` and `head(h)` with dense layers `layers`.
    num_components: M.
    num_batches: J; the client holds N = J * batch_size examples.
    epochs: E.
    batch_size: B.
    optimizer: the client's optax transformation (the server knows it: Assumption 3).
    epsilon: the detector's bias.
    threshold: xi.
    layers: the three dense layers the detector occupies.
    hooks: the client's defense (`fl.client.ClientHooks`, e.g. from `fl_privacy.defenses`);
      None trains plain FedAvg. The server observes w_t - upload, so an `upload` hook changes
      what it sees; an `aggregate` hook acts after the upload and cannot.
  """
  model: Any
  num_components: int
  num_batches: int
  epochs: int
  batch_size: int
  optimizer: optax.GradientTransformation
  epsilon: float = 1e-3
  threshold: float = 0.1
  layers: tuple[str, str, str] = FC_LAYERS
  hooks: client.ClientHooks | None = None

  @property
  def num_examples(self) -> int:
    return self.num_batches * self.batch_size


def loss_fn_for(model) -> Callable:
  """Mean cross-entropy of `model` as a function of its parameter collection.

  Takes an optional row mask and soft labels (what hooks such as sampling or mixup hand it);
  without a mask it is the plain batch mean, bit for bit.
  """
  def loss_fn(params, x, y, mask=None):
    return losses.cross_entropy(model.apply({'params': params}, x), y, mask)
  return loss_fn


def draw_client(key: jax.Array, index: jax.Array, pool_size: int, num_examples: int
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Client data and target of one run (Section 3.1).

  Even run indices put the target inside (a uniformly random element of the client's data),
  odd ones outside (a uniformly random element of the rest of the pool).

  Returns:
    (client indices int32 [N] into the pool, target index int32, member bool).
  """
  order = jax.random.permutation(key, pool_size)[:num_examples + 1].astype(jnp.int32)
  member = index % 2 == 0
  return order[:num_examples], jnp.where(member, order[0], order[num_examples]), member



def client_indices(key: jax.Array, index: int, pool_size: int, num_examples: int) -> np.ndarray:
  """The client's pool indices in run `index` of `run_trials(make_trial(game), key, ...)`.

  The draw `run` made, recomputed (fold_in(fold_in(key, index), 1)), so a decision can be
  explained after the run from its index alone.
  """
  run_key = jax.random.fold_in(key, index)
  idx, _, _ = draw_client(jax.random.fold_in(run_key, 1), jnp.int32(index), pool_size,
                          num_examples)
  return np.asarray(idx)


def run_bytes(image_shape, num_examples: int) -> int:
  """Bytes of the client data and first-convolution activations (6 channels) of one run."""
  per_example = math.prod(image_shape) + 6 * math.prod(image_shape[:2])
  return 2 * memory.FLOAT_BYTES * num_examples * per_example


def run(game: Game, key: jax.Array, index: jax.Array, x_pool: jax.Array, y_pool: jax.Array
        ) -> dict[str, jax.Array]:
  """One run of the game (Section 3.1): draw the client's data and target, then `play`.

  Args:
    game: the configuration.
    key: this run's key (`fold_in(run_key, index)`); `fold_in` 0, 1, 2 give the model
      initialisation, data draw and client-training keys.
    index: the global run index (even: target inside).
    x_pool: [P, ...] float inputs the client data and target are drawn from.
    y_pool: [P] int labels.

  Returns:
    The outcome of `play`.
  """
  k_init, k_data, k_train = (jax.random.fold_in(key, i) for i in range(3))
  client_idx, target, member = draw_client(k_data, index, x_pool.shape[0], game.num_examples)
  return play(game, k_init, k_train, x_pool, y_pool, client_idx, target, member)


def play(game: Game, init_key: jax.Array, train_key: jax.Array, x_pool: jax.Array,
         y_pool: jax.Array, client_idx: jax.Array, target: jax.Array, member: jax.Array
         ) -> dict[str, jax.Array]:
  """Craft, the client's FedAvg round, and the server's decision statistic for given data.

  Matmuls and convolutions run at full precision: with eps = 1e-3 a TF32 matmul (JAX's GPU
  default) could shift features by more than eps, or leak rounding into the detector's bias.

  Args:
    game: the configuration.
    init_key: key of the random trunk the server sends (Section 2.2, step 1).
    train_key: the client's key (minibatch shuffling and the defense's hooks).
    x_pool: [P, ...] float inputs.
    y_pool: [P] int labels.
    client_idx: [N] pool indices of the client's data, N = `game.num_examples`.
    target: pool index of the target.
    member: whether `target` is in `client_idx` (reported, not used by the server).

  Returns:
    dict with `member`, `delta` (Eq. (9)), `decision` (Delta >= xi), `target`, and the
    diagnostics the duplicate attribution needs, computed under the crafted parameters the
    client received: `nearest`
    (pool index of the client example closest to the target in detector distance, the target's
    own pool index excluded), `nearest_distance`, and `num_activating` (other client examples
    within eps of the target: in an outside run they alone can move the detector).
  """
  with jax.default_matmul_precision('highest'):
    x_t, y_t = x_pool[target], y_pool[target]
    variables = game.model.init(init_key, x_t[None])
    h_t = game.model.apply(variables, x_t[None], method='embed')[0]
    variables, chosen = craft(variables, h_t, y_t, game.num_components, game.epsilon,
                              layers=game.layers)
    params = variables['params']
    epsilon = detector_bias(variables, layers=game.layers)

    x, y = x_pool[client_idx], y_pool[client_idx]
    loss_fn = loss_fn_for(game.model)
    hooks = client.IDENTITY if game.hooks is None else game.hooks
    upload, trained = local.client_update(loss_fn, params, x, y, key=train_key, hooks=hooks,
                                          optimizer=game.optimizer, epochs=game.epochs,
                                          batch_size=game.batch_size)
    if hooks.upload is not client.IDENTITY.upload:
      # What the server receives: w_t - upload (without an upload hook it reads w_local
      # itself, which w_t - (w_t - w_local) need not equal to the last bit).
      trained = client.apply_update(params, upload)
    simulated = server_step(loss_fn, params, x_t, y_t, game.optimizer)
    delta = delta_statistic(detector_bias({'params': trained}, layers=game.layers),
                            detector_bias({'params': simulated}, layers=game.layers),
                            epsilon, game.batch_size)

    h = game.model.apply(variables, x, method='embed')
    distance = detector_distance(h[:, chosen], h_t[chosen])
    others = jnp.where(client_idx == target, jnp.inf, distance)
    nearest = jnp.argmin(others)
    return dict(member=member, delta=delta, decision=decide(delta, game.threshold),
                target=target, nearest=client_idx[nearest],
                nearest_distance=others[nearest],
                num_activating=jnp.sum(others <= game.epsilon).astype(jnp.int32))


def make_trial(game: Game) -> Callable:
  """`trial_fn(key, index, x_pool, y_pool)` for `eval.runner.run_trials`: one run each."""
  def trial_fn(key, index, x_pool, y_pool):
    return run(game, key, index, x_pool, y_pool)
  return trial_fn
