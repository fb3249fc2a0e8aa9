"""The LDP audit's default server step: a fixed fraction of the model's radius."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.mechanisms import ldp_sgd


@pytest.mark.parametrize('dim,eps,clip', [(10_650, 4.0, 1.0), (40, 0.5, 2.0)])
def test_relative_step_is_the_fraction_of_the_radius_for_any_report(dim, eps, clip):
  radius, fraction = 9.7, 1e-3
  lr = ldp_sgd.relative_learning_rate(radius, dim, eps, clip, fraction)
  theta = jnp.zeros((dim,)).at[0].set(radius * 0.5)  # inside C: no projection
  for seed in range(3):
    report = ldp_sgd.randomize(jax.random.key(seed), jnp.ones((dim,)), eps, clip)
    step = theta - ldp_sgd.server_update(theta, report[None], lr, radius, epsilon=eps,
                                         clip_norm=clip)
    np.testing.assert_allclose(float(jnp.linalg.norm(step)), fraction * radius, rtol=1e-4)
  # The default fraction is 1e-3, and the paper's eta_t is ~1250x larger (~1.25 ||C|| steps).
  assert ldp_sgd.relative_learning_rate(radius, dim, eps, clip) == pytest.approx(lr)
  paper = ldp_sgd.paper_learning_rate(radius, 1, dim, eps, clip)
  gamma_ratio = math.exp(math.lgamma((dim + 1) / 2) - math.lgamma(dim / 2))
  want = math.sqrt(math.pi) * gamma_ratio / (math.sqrt(dim) * fraction)  # -> 1e3 sqrt(pi / 2)
  assert float(paper / lr) == pytest.approx(want, rel=1e-4)


def test_paper_learning_rate_grows_with_sqrt_clients_and_radius():
  base = float(ldp_sgd.paper_learning_rate(2.0, 1, 100, 1.0, 1.0))
  assert float(ldp_sgd.paper_learning_rate(2.0, 4, 100, 1.0, 1.0)) == pytest.approx(2 * base)
  assert float(ldp_sgd.paper_learning_rate(6.0, 1, 100, 1.0, 1.0)) == pytest.approx(3 * base)
  assert float(ldp_sgd.paper_learning_rate(2.0, 1, 400, 1.0, 2.0)) == pytest.approx(base / 4)
  assert base == pytest.approx(2.0 / 10.0 * math.tanh(0.5), rel=1e-6)
