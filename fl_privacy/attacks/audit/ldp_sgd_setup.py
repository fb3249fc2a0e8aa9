"""The LDP-SGD audit's setup: the model theta_t, every crafter's pair, the server's step.

Section 3.4 and Table 1 of the LDP-audit paper (Matsumoto et al.): `build` trains the
audit model theta_t (and, for 'collusion', the colluding server's model), picks the
target examples and crafts each requested pair once per run (the pairs do not depend on
the trial); `trial_fn` caches the trial functions of `game` per (distinguisher, rule);
`server_learning_rate` is the server's eta_t; `antipodal_accuracy` the exact white-box
accuracy when g2 = -g1.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from absl import logging
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import models
from fl_privacy import report
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import distinguishers
from fl_privacy.attacks.audit import game
from fl_privacy.fl import losses
from fl_privacy.mechanisms import ldp_sgd

SERVER_LR_RULES = ('relative', 'paper')


def stream(key: jax.Array, name: str) -> jax.Array:
  """An independent key for a named purpose (`report.point_key` of {'stream': name})."""
  return report.point_key(key, {'stream': name})


def build(dataset, key, wanted: Sequence[str], *, pretrain_steps: int, pretrain_lr: float,
          batch_size: int, candidates: int, target_selection: str, fgsm_alpha: float,
          retrogression_alpha: float, clip_norm: float, collusion_label: int,
          collusion_steps: int, collusion_lr: float) -> dict[str, Any]:
  """Trains theta_t (and the colluding model) and crafts every crafter in `wanted`.

  Args:
    dataset: the `data.Dataset` the model trains on and the targets come from.
    key: the setup's key; named streams of it init, pretrain, pick and collude.
    wanted: the crafters to build.
    pretrain_steps, pretrain_lr, batch_size: SGD that trains theta_t.
    candidates: examples drawn, among which x1 and x2 are selected by `target_selection`.
    fgsm_alpha, retrogression_alpha, clip_norm: the crafters' parameters.
    collusion_label, collusion_steps, collusion_lr: the colluding server's model.

  Returns:
    {'crafted': {crafter: `crafters.Crafted`}, 'unravel', 'per_example_loss',
    'trial_fns': {} (the cache `trial_fn` fills)}.
  """
  x = data_lib.to_float(dataset.x)
  y = dataset.y.astype(np.int32)
  model = models.make('audit_cnn', dataset.num_classes, padding='SAME')
  variables = jax.jit(model.init)(stream(key, 'init'), jnp.asarray(x[:1]))
  loss_fn = losses.make_loss_fn(model.apply)
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  theta = crafters.sgd_train(loss_fn, variables, xj, yj,
                             key=stream(key, 'pretrain'),
                             steps=pretrain_steps,
                             learning_rate=pretrain_lr,
                             batch_size=batch_size)
  rng = data_lib.rng_from_key(stream(key, 'candidates'))
  cand = rng.choice(len(y), size=min(candidates, len(y)), replace=False)
  cx, cy = jnp.asarray(x[cand]), y[cand]
  norms = crafters.grad_norms(loss_fn, theta, cx, jnp.asarray(cy))
  i1, i2 = crafters.select_examples(norms, cy, target_selection)
  x1, y1, x2, y2 = cx[i1], int(cy[i1]), cx[i2], int(cy[i2])
  logging.info('audit model: %d parameters; x1 = example %d (label %d, '
               '||g|| %.3f), x2 = example %d (label %d, ||g|| %.3f)',
               models.param_count(theta), cand[i1], y1, norms[i1], cand[i2],
               y2, norms[i2])
  crafted = {}
  wanted = set(wanted)
  if 'benign' in wanted:
    crafted['benign'] = crafters.benign(loss_fn, theta, x1, y1, x2, y2)
  if 'input_perturbation' in wanted:
    crafted['input_perturbation'] = crafters.input_perturbation(
        loss_fn, theta, x1, y1, alpha=fgsm_alpha)
  if 'parameter_retrogression' in wanted:
    crafted['parameter_retrogression'] = crafters.parameter_retrogression(
        loss_fn, theta, x1, y1, alpha=retrogression_alpha)
  if 'gradient_flip' in wanted:
    crafted['gradient_flip'] = crafters.gradient_flip(loss_fn, theta, x1, y1)
  if 'dummy_gradient' in wanted:
    crafted['dummy_gradient'] = crafters.dummy_gradient(
        theta, x1, y1, clip_norm=clip_norm)
  if 'collusion' in wanted:
    bad = crafters.malicious_model(
        loss_fn, theta, x, y, label=collusion_label,
        key=stream(key, 'collusion'), steps=collusion_steps,
        learning_rate=collusion_lr, batch_size=batch_size)
    bad_norms = crafters.grad_norms(loss_fn, bad, cx, jnp.asarray(cy))
    j1, _ = crafters.select_examples(bad_norms, cy, target_selection,
                                     exclude_label=collusion_label)
    crafted['collusion'] = crafters.collusion(loss_fn, bad, cx[j1],
                                              int(cy[j1]))
  _, unravel = flatten_util.ravel_pytree(theta)

  def per_example_loss(params, xs, ys):
    return losses.per_example_cross_entropy(model.apply(params, xs), ys)

  return {'crafted': crafted, 'unravel': unravel,
          'per_example_loss': per_example_loss, 'trial_fns': {}}


def trial_fn(setup: dict, distinguisher: str, crafter: str):
  """`game.ldp_sgd_trial_fn` for the point, built once per (distinguisher, rule)."""
  rule = (distinguishers.BLACK_BOX_RULE[crafter] if distinguisher == 'black_box'
          else None)
  cache = setup['trial_fns']
  if (distinguisher, rule) not in cache:
    cache[(distinguisher, rule)] = game.ldp_sgd_trial_fn(
        distinguisher, rule, setup['per_example_loss'], setup['unravel'])
  return cache[(distinguisher, rule)]


def antipodal_accuracy(g_norm: float, epsilon: float, clip_norm: float) -> float:
  """The exact white-box accuracy when g2 = -g1 (the cosine's sign decides)."""
  # Exact white-box accuracy for g2 = -g1: keep x pole agreement.
  pk = 1.0 / (1.0 + math.exp(-epsilon))
  pz = 0.5 + min(g_norm, clip_norm) / (2.0 * clip_norm)
  return pk * pz + (1.0 - pk) * (1.0 - pz)


def server_learning_rate(server_lr: float | None, rule: str, radius: float, dim: int,
                         eps: float, clip_norm: float, step_fraction: float) -> float:
  """The server's eta_t: `server_lr` if set, else by `rule` (one of `SERVER_LR_RULES`).

  'relative' (default): the step is `step_fraction` of ||C||
  (`ldp_sgd.relative_learning_rate`, whose docstring derives it); 'paper': the
  eta_t of Algorithm 2 (`ldp_sgd.paper_learning_rate`, n = 1 client), whose step
  with the unbiased constant is about 1.25 ||C||.
  """
  if server_lr is not None:
    return float(server_lr)
  if rule == 'paper':
    return float(ldp_sgd.paper_learning_rate(radius, 1, dim, eps, clip_norm))
  return float(ldp_sgd.relative_learning_rate(radius, dim, eps, clip_norm,
                                              float(step_fraction)))
