"""The AMI client's defense: data/batch hooks on the batch it trains on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import defenses
from fl_privacy.attacks import ami


def _neuron(d=4):
  # v(x) = x_0 - 0.5: fires iff feature 0 exceeds 0.5.
  w = jnp.zeros((d, 1)).at[0, 0].set(1.0)
  return ami.CraftedNeuron(w=w, b=jnp.zeros(1), h=jnp.ones(1), c=jnp.asarray(-0.5))


def test_no_defense_is_the_identity():
  x = jnp.ones((3, 4))
  out, y, mask = ami.apply_defense(jax.random.key(0), None, x, None)
  assert out is x and y is None and mask is None


def test_masked_rows_cannot_fire():
  x = jnp.zeros((4, 4)).at[2, 0].set(1.0)  # only row 2 fires
  neuron = _neuron()
  assert bool(ami.decide_from_activation(neuron, x)[0])
  assert not bool(ami.decide_from_activation(neuron, x, jnp.asarray([1.0, 1.0, 0.0, 1.0]))[0])


def test_sampling_defense_hides_the_target_in_some_trials():
  x = jnp.zeros((10, 4)).at[0, 0].set(1.0)  # the target is row 0
  hooks = defenses.make('sampling', fraction=0.3)
  fired = []
  defend = jax.jit(lambda k: ami.apply_defense(k, hooks, x, None))  # one compilation
  for i in range(400):
    xs, _, mask = defend(jax.random.key(i))
    assert int(np.sum(mask)) == 3
    fired.append(bool(ami.decide_from_activation(_neuron(), xs, mask)[0]))
  # The target is kept with probability 3/10: within 5 standard deviations over 400 trials.
  assert abs(np.mean(fired) - 0.3) < 5 * np.sqrt(0.3 * 0.7 / 400)
