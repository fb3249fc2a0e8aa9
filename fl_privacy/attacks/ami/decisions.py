"""The crafted block inside a real classifier, and the two decision paths of the AMI paper.

`decide_from_gradient` is the literal rule (Figs. 2 and 4: the chosen neuron's gradient is
non-zero); `decide_from_activation` its exact shortcut (some row has v > 0).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fl_privacy.attacks.ami.crafting import CraftedNeuron
from fl_privacy.attacks.ami.crafting import chosen_value
from fl_privacy.models import crafting

Array = jax.Array

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


def decide_from_activation(neuron: CraftedNeuron, x: Array,
                           mask: Array | None = None) -> tuple[Array, Array]:
  """Fast decision: member iff some row of the batch has v > 0.

  Equals `decide_from_gradient` unless every active row's backprop signal into the chosen
  neuron is exactly zero (e.g. the classifier's row for the chosen unit is zero, or the softmax
  is saturated to exactly one-hot on the true label); `rescale` keeps the crafted block away
  from the latter, and the tests check agreement with the literal path trial by trial.

  Args:
    neuron: the crafted block.
    x: [B, d] the (randomized) batch.
    mask: optional [B], 1 for the rows the client trains on (a defense's data sampling);
      rows with mask 0 cannot activate anything.

  Returns:
    (decision, score) with score = max over rows of v, the soft version of the decision.
  """
  v = chosen_value(neuron, x)
  if mask is not None:
    v = jnp.where(mask > 0, v, -jnp.inf)
  score = jnp.max(v)
  return score > 0, score


