"""LDP-SGD: the client randomizer and the server's debiased update.

The client clips its gradient to L2 norm L, projects it to one of the two poles
+-L * g / ||g|| (the true one with probability 1/2 + ||g|| / (2L)), and reports a
uniformly random unit vector from the hemisphere around that pole, or from the
opposite hemisphere with probability 1 / (1 + e^eps). This is Algorithm 1 of the
LDP-audit paper (Matsumoto et al., "Measuring Lower Bounds of Local Differential
Privacy via Adversary Instantiations in Federated Learning"), after Erlingsson et
al. (2020) and Duchi et al. (2018). The report is eps-LDP whatever the gradient.

The server averages the reports and multiplies by the constant that makes the
estimate unbiased (E[estimate] = clipped gradient), then takes an SGD step and
projects onto the L2 ball of the parameter set (Algorithm 2 of the same paper).
Two deliberate differences from the printed paper (SEED-NOTES.md, section 4):
the constant is L * sqrt(pi) * Gamma((d+1)/2) / Gamma(d/2) * (e^eps+1)/(e^eps-1)
(the printed one drops a factor d), and the projection rescales only when the
norm exceeds the radius.

Gradients here are flat vectors `[..., d]`; a params pytree is flattened with
`jax.flatten_util.ravel_pytree` by the caller (or by `server_update`).
"""

from __future__ import annotations

import math

import jax
from jax import flatten_util
import jax.numpy as jnp


def keep_probability(epsilon) -> jax.Array:
  """Probability e^eps / (1 + e^eps) that the report stays on the pole's side."""
  return jax.nn.sigmoid(jnp.asarray(epsilon, jnp.float32))


def clip(g: jax.Array, clip_norm) -> jax.Array:
  """Scales `g` [..., d] to L2 norm at most `clip_norm` (line 1 of Algorithm 1)."""
  norm = jnp.linalg.norm(g, axis=-1, keepdims=True)
  return g * jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30))


def _direction_and_pole(key: jax.Array, g: jax.Array, clip_norm):
  """The clipped gradient's direction and its random pole z (Algorithm 1, step 2).

  Returns `(unit, pole)`: `unit` = clip(g)/||clip(g)|| and `pole` = +1 with
  probability 1/2 + ||clip(g)||/(2L), else -1.
  """
  x = clip(g, clip_norm)
  norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
  # Any fixed direction serves for a zero gradient: its pole is then a fair coin.
  e1 = jnp.zeros((g.shape[-1],), jnp.float32).at[0].set(1.0)
  unit = jnp.where(norm > 0, x / jnp.maximum(norm, 1e-30), e1)
  p_true_pole = 0.5 + norm[..., 0] / (2.0 * clip_norm)
  pole = jnp.where(jax.random.bernoulli(key, p_true_pole, g.shape[:-1]), 1.0, -1.0)
  return unit, pole


def randomize(key: jax.Array, g: jax.Array, epsilon, clip_norm) -> jax.Array:
  """Randomizes gradients into eps-LDP unit vectors (Algorithm 1, LDP-audit paper).

  Lines 1-3 of Algorithm 1: clip to `clip_norm`; pick the pole z = +-L g/||g||
  with P(+) = 1/2 + ||g|| / (2L); draw v uniformly on the unit sphere and report
  sgn(<z, v>) v with probability e^eps / (1 + e^eps), else -sgn(<z, v>) v.
  A zero gradient gives a uniformly random report (both poles equally likely).

  Formal guarantee: for any two gradients the density ratio of reports is at most
  e^eps, because the report's density is e^eps/(1+e^eps) or 1/(1+e^eps) times the
  uniform density on a hemisphere, whatever the input.

  Args:
    key: a typed PRNG key; one key serves the whole batch.
    g: gradients `[..., d]` (leading axes are independent clients/trials).
    epsilon: the LDP budget (> 0).
    clip_norm: the L2 clipping norm L (> 0).

  Returns:
    Unit vectors `[..., d]`, float32.
  """
  g = jnp.asarray(g, jnp.float32)
  batch = g.shape[:-1]
  k_pole, k_dir, k_keep = jax.random.split(key, 3)
  unit, pole = _direction_and_pole(k_pole, g, clip_norm)
  v = jax.random.normal(k_dir, g.shape, jnp.float32)
  v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
  side = jnp.where(jnp.sum(unit * v, axis=-1) >= 0, 1.0, -1.0) * pole
  keep = jax.random.bernoulli(k_keep, keep_probability(epsilon), batch)
  sign = jnp.where(keep, side, -side)
  return sign[..., None] * v


def randomize_in_subspace(key: jax.Array, coef: jax.Array, epsilon, clip_norm,
                          dim) -> jax.Array:
  """The report's coordinates in a k-dim subspace that holds the gradient.

  Exact shortcut for tests that look at the report only through inner products
  with vectors of a small subspace (the white-box test of the LDP-audit paper,
  Eq. 5, looks at <report, g1> and <report, g2>). With an orthonormal basis
  e_1..e_k of a subspace containing g and coef = (<g, e_j>)_j, the result has
  exactly the distribution of `(<randomize(key', g), e_j>)_j`: Algorithm 1 only
  uses v through <v, z>, z in the subspace, and for v = n / ||n|| with n
  standard normal in d dims, (n_1..n_k) are the in-subspace coordinates and
  ||n||^2 = sum_j n_j^2 + chi^2_{d-k}. Cost O(k) per report instead of O(d).

  Args:
    key: a typed PRNG key.
    coef: the gradient's coordinates `[..., k]` in the basis.
    epsilon: the LDP budget (> 0).
    clip_norm: the clipping norm L (> 0).
    dim: the full dimension d (>= k); may be a traced scalar.

  Returns:
    float32 `[..., k]`: <report, e_j> for each j.
  """
  coef = jnp.asarray(coef, jnp.float32)
  batch, k = coef.shape[:-1], coef.shape[-1]
  k_pole, k_dir, k_rest, k_keep = jax.random.split(key, 4)
  unit, pole = _direction_and_pole(k_pole, coef, clip_norm)
  n = jax.random.normal(k_dir, coef.shape, jnp.float32)
  rest_dof = jnp.maximum(jnp.asarray(dim, jnp.float32) - k, 0.0)
  # chi^2_m = 2 Gamma(m / 2); a zero-dimensional rest contributes nothing.
  rest = jnp.where(rest_dof > 0, 2.0 * jax.random.gamma(
      k_rest, jnp.maximum(rest_dof, 1.0) / 2.0, batch), 0.0)
  length = jnp.sqrt(jnp.sum(n * n, axis=-1) + rest)
  side = jnp.where(jnp.sum(unit * n, axis=-1) >= 0, 1.0, -1.0) * pole
  keep = jax.random.bernoulli(k_keep, keep_probability(epsilon), batch)
  sign = jnp.where(keep, side, -side)
  return (sign / length)[..., None] * n


def debias_scale(dim: int, epsilon, clip_norm) -> jax.Array:
  """The factor that makes the mean report an unbiased gradient estimate.

  L * sqrt(pi) * Gamma((d+1)/2) / Gamma(d/2) * (e^eps + 1) / (e^eps - 1): the
  inverse of E|<u, v>| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) for a uniform unit
  v times the kept-minus-flipped margin (e^eps - 1)/(e^eps + 1), times L. This is
  line 4 of Algorithm 2 of the LDP-audit paper with the factor d that the printed
  constant drops restored (SEED-NOTES.md, section 4). The Gamma ratio is computed
  in float64 log space on the host (d is static), so d in the millions is
  exact to float32 precision (it grows like sqrt(d / 2)).

  Args:
    dim: the gradient dimension d.
    epsilon: the LDP budget used by the clients.
    clip_norm: the clients' clipping norm L.

  Returns:
    A float32 scalar.
  """
  eps = jnp.asarray(epsilon, jnp.float32)
  # float32 lgamma of d/2 ~ 1e7 is off by units; the ratio needs float64.
  ratio = math.exp(math.lgamma((dim + 1) / 2.0) - math.lgamma(dim / 2.0))
  return clip_norm * math.sqrt(math.pi) * ratio / jnp.tanh(eps / 2.0)


def server_estimate(reports: jax.Array, epsilon, clip_norm) -> jax.Array:
  """Unbiased estimate of the mean clipped gradient from reports `[n, d]`."""
  reports = jnp.asarray(reports, jnp.float32)
  return debias_scale(reports.shape[-1], epsilon, clip_norm) * jnp.mean(
      reports, axis=0)


def project_l2(params, radius):
  """Euclidean projection of a params pytree onto the L2 ball of `radius`.

  A real projection: points inside the ball are returned unchanged, points
  outside are rescaled onto its surface. (The public copy of the paper's code
  rescales always, which moves interior points; SEED-NOTES.md, section 4.)
  """
  leaves = jax.tree_util.tree_leaves(params)
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in leaves))
  scale = jnp.minimum(1.0, radius / jnp.maximum(norm, 1e-30))
  return jax.tree_util.tree_map(lambda leaf: leaf * scale, params)


def paper_learning_rate(radius, num_clients: int, dim: int, epsilon, clip_norm):
  """eta_t = ||C|| sqrt(n) / (L sqrt(d)) * (e^eps - 1)/(e^eps + 1) (Algorithm 2).

  The paper pairs this with its printed debiasing constant, which lacks a factor d;
  with the unbiased constant (`debias_scale`) one client's step has norm
  ||C|| sqrt(pi) Gamma((d+1)/2) / (sqrt(d) Gamma(d/2)) ~ sqrt(pi/2) ||C|| ~ 1.25 ||C||:
  larger than the model. `relative_learning_rate` is the default of the audit.
  """
  eps = jnp.asarray(epsilon, jnp.float32)
  return (radius * jnp.sqrt(num_clients) / (clip_norm * jnp.sqrt(dim))
          * jnp.tanh(eps / 2.0))


def relative_learning_rate(radius, dim: int, epsilon, clip_norm,
                           step_fraction: float = 1e-3):
  """A server step size whose step is `step_fraction` of the model's radius.

  With one client the server's estimate is `debias_scale(d, eps, L)` times a unit
  vector, so its norm is known before any report arrives: ||g_t|| = debias_scale.
  eta_t = step_fraction * ||C|| / debias_scale makes every step
  ||eta_t g_t|| = step_fraction * ||C|| exactly, for every epsilon and d, and
  independently of the report (so the step size itself leaks nothing).

  Why a small fraction: a black-box distinguisher reads the change of a loss,
  f(theta - eta g_t) - f(theta) = -eta <grad f, g_t> + O(eta^2 ||g_t||^2): the
  first term carries the report's sign, the second (curvature, and the projection
  onto C, which only acts at second order) does not. A step that is a small
  fraction of the model keeps the first-order term dominant; a step that is the
  size of the model (the paper's eta_t with the unbiased constant:
  ~ sqrt(pi/2) ||C||, see `paper_learning_rate`) does not. 1e-3 is the
  update-to-weight ratio of ordinary training (LARS' trust coefficient, You et al.,
  "Large Batch Training of Convolutional Networks", arXiv:1708.03888), and keeps
  the loss change far above float32 resolution for d up to millions.

  Args:
    radius: ||C||, the radius of the parameter set.
    dim: the gradient dimension d.
    epsilon: the clients' LDP budget.
    clip_norm: the clients' clipping norm L.
    step_fraction: the step's norm as a fraction of `radius`.

  Returns:
    A float32 scalar.
  """
  return step_fraction * radius / debias_scale(dim, epsilon, clip_norm)


def server_update(params, reports: jax.Array, lr, radius, *, epsilon,
                  clip_norm):
  """One server step of LDP-SGD (Algorithm 2, line 4-5, LDP-audit paper).

  theta_{t+1} = Proj_C(theta_t - lr * g_t), g_t = `server_estimate(reports)`,
  C the L2 ball of `radius`.

  Args:
    params: the current model, a flat `[d]` array or a pytree with d leaves'
      entries in total (flattened in `ravel_pytree` order, as the reports are).
    reports: the clients' reports `[n, d]`.
    lr: the step size (see `paper_learning_rate` for the paper's choice).
    radius: the radius of the parameter set C.
    epsilon: the clients' LDP budget.
    clip_norm: the clients' clipping norm L.

  Returns:
    The new params, with the structure of `params`.
  """
  flat, unravel = flatten_util.ravel_pytree(params)
  estimate = server_estimate(reports, epsilon, clip_norm)
  return unravel(project_l2(flat - lr * estimate, radius))
