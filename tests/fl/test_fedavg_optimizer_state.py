"""FedAvg carries the optimizer's state from step to step within a call (and starts it fresh).

Plain SGD has no state, so an implementation that re-initialised the state every step would
pass every SGD test; momentum and Adam expose it.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import optimizers


@pytest.mark.parametrize('name,kw', [('momentum', {'momentum': 0.9}), ('adam', {})])
def test_fedavg_advances_optimizer_state_like_a_hand_loop(name, kw):
  model = models.MLP(hidden=(6,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (12, 5))
  y = jax.random.randint(jax.random.key(2), (12,), 0, 3)
  params = model.init(jax.random.key(0), x)
  loss_fn = fl.make_loss_fn(model.apply)
  opt = optimizers.make(name, 0.05, **kw)
  got = fl.fedavg(loss_fn, params, x, y, key=jax.random.key(3), optimizer=opt, epochs=2,
                  batch_size=4, shuffle=False)
  want, state = params, opt.init(params)
  for _ in range(2):
    for j in range(3):
      g = jax.grad(loss_fn)(want, x[4 * j:4 * j + 4], y[4 * j:4 * j + 4])
      updates, state = opt.update(g, state, want)
      want = optax.apply_updates(want, updates)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
  # The same steps with the state reset every step land elsewhere: the check has teeth.
  reset = params
  for _ in range(2):
    for j in range(3):
      g = jax.grad(loss_fn)(reset, x[4 * j:4 * j + 4], y[4 * j:4 * j + 4])
      updates, _ = opt.update(g, opt.init(reset), reset)
      reset = optax.apply_updates(reset, updates)
  diff = jax.tree_util.tree_reduce(
      max, jax.tree_util.tree_map(lambda a, b: float(abs(a - b).max()), got, reset))
  assert diff > 1e-3


@pytest.mark.parametrize('mask', [None, (1.0,) * 11 + (0.0,)])
def test_fedavg_hands_the_params_to_the_optimizer(mask):
  """Coupled weight decay reads the parameters: both the plain and the masked path pass them."""
  model = models.MLP(hidden=(6,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (12, 5))
  y = jax.random.randint(jax.random.key(2), (12,), 0, 3)
  params = model.init(jax.random.key(0), x)
  loss_fn = fl.make_loss_fn(model.apply)
  opt = optimizers.make('sgd', 0.1, weight_decay=0.5)
  got = fl.fedavg(loss_fn, params, x, y, key=jax.random.key(3), optimizer=opt, epochs=1,
                  batch_size=4, shuffle=False, mask=None if mask is None else jnp.asarray(mask))
  want = params
  for rows in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11] if mask is None else [8, 9, 10]):
    g = jax.grad(loss_fn)(want, x[jnp.asarray(rows)], y[jnp.asarray(rows)])
    want = jax.tree_util.tree_map(lambda p, g: p - 0.1 * (g + 0.5 * p), want, g)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
