"""A DP deployment of Flower's wrappers (`Setting`): its noise, its clipping, the epsilon
Flower states for it and the claim an audit tests (`audits.dp_games` docstring).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from flwr.supercore import differential_privacy as flwr_dp

from fl_privacy import accounting
from fl_privacy.eval import auditing
from fl_privacy.flower.engines import inprocess


WRAPPERS = ('server_fixed', 'client_fixed', 'local_dp', 'server_adaptive', 'client_adaptive')
ADAPTIVE = ('server_adaptive', 'client_adaptive')
ADVERSARY = {'server_fixed': 'aggregate', 'client_fixed': 'aggregate', 'local_dp': 'server',
             'server_adaptive': 'aggregate', 'client_adaptive': 'aggregate'}
# What the adaptive games leave out: the release of the updated clip norm (the noisy count of
# clipped updates), and every later round.
NOT_AUDITED = ('the adaptive wrappers\' clip-norm release (noisy clipped count)',
               'multi-round composition', 'client sampling')
ARRAY_NAME = 'w'
WEIGHT = 10  # every client's num-examples (FedAvg's weights, equal)
FIRST_NODE = inprocess.FIRST_NODE_ID


@dataclasses.dataclass(frozen=True)
class Setting:
  """One Flower DP deployment to audit.

  Attributes:
    label: How tables name it.
    wrapper: One of `WRAPPERS`.
    clipping_norm: C (every wrapper's `clipping_norm`).
    noise_multiplier: z of the central wrappers (ignored by `local_dp`).
    num_sampled_clients: n of the central wrappers: sampled (= all) clients per round.
    sensitivity: `LocalDpMod`'s `sensitivity` (ignored by the central wrappers).
    epsilon: `LocalDpMod`'s `epsilon` (ignored by the central wrappers).
    delta: `LocalDpMod`'s `delta`; for the central wrappers the delta their epsilon is
      stated at.
    target_clipped_quantile, clip_norm_lr, clipped_count_stddev: the adaptive wrappers'
      arguments (Flower's defaults 0.5, 0.2 and None = num_sampled_clients / 20); their
      `initial_clipping_norm` is `clipping_norm`.
  """
  label: str
  wrapper: str
  clipping_norm: float = 1.0
  noise_multiplier: float = 1.0
  num_sampled_clients: int = 10
  sensitivity: float = 1.0
  epsilon: float = 1.0
  delta: float = 1e-5
  target_clipped_quantile: float = 0.5
  clip_norm_lr: float = 0.2
  clipped_count_stddev: float | None = None

  def __post_init__(self):
    if self.wrapper not in WRAPPERS:
      raise ValueError(f'wrapper must be one of {WRAPPERS} (got {self.wrapper!r})')

  @property
  def central(self) -> bool:
    return self.wrapper != 'local_dp'

  def params(self) -> dict[str, Any]:
    """The flat params of a results point (only the fields the wrapper reads)."""
    p = {'setting': self.label, 'wrapper': self.wrapper,
         'clipping_norm': float(self.clipping_norm), 'delta': float(self.delta)}
    if self.central:
      p.update(noise_multiplier=float(self.noise_multiplier),
               num_sampled_clients=int(self.num_sampled_clients))
      if self.wrapper in ADAPTIVE:
        p.update(target_clipped_quantile=float(self.target_clipped_quantile),
                 clip_norm_lr=float(self.clip_norm_lr),
                 clipped_count_stddev=(None if self.clipped_count_stddev is None
                                       else float(self.clipped_count_stddev)))
    else:
      p.update(sensitivity=float(self.sensitivity), epsilon=float(self.epsilon))
    return p


def local_dp_std(sensitivity: float, epsilon: float, delta: float) -> float:
  """The noise std Flower 1.42's `LocalDpMod.__call__` adds to every parameter."""
  return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)


def adaptive_noise(setting: Setting) -> tuple[float, float]:
  """(clipped_count_stddev, the aggregate's noise multiplier z') of an adaptive wrapper:
  Flower's own `compute_adaptive_noise_params` (ValueError when z >= 2 clipped_count_stddev)."""
  return tuple(float(v) for v in flwr_dp.compute_adaptive_noise_params(
      setting.noise_multiplier, setting.num_sampled_clients, setting.clipped_count_stddev))


def noise_std(setting: Setting) -> float:
  """Flower's nominal noise std per coordinate: the central wrappers' `compute_stdv(z, C, n)`
  (adaptive: z' of `adaptive_noise` at the initial clip C_0), `local_dp_std` for LocalDpMod.

  The adaptive wrappers draw their noise AFTER updating the clip (flwr 1.42
  `serverapp/strategy/dp_adaptive_clipping.py` lines 213-223 server-side, 319-322
  client-side; `_add_noise_to_aggregated_arrays` line 93 reads `self.clipping_norm`), so the
  std they really add is `world_noise_stds`'s, not this one.
  """
  if setting.wrapper in ADAPTIVE:
    return float(flwr_dp.compute_stdv(adaptive_noise(setting)[1], setting.clipping_norm,
                                      setting.num_sampled_clients))
  if setting.central:
    return float(flwr_dp.compute_stdv(setting.noise_multiplier, setting.clipping_norm,
                                      setting.num_sampled_clients))
  return local_dp_std(setting.sensitivity, setting.epsilon, setting.delta)


def effective_noise_multiplier(setting: Setting) -> float:
  """Nominal noise std / the sensitivity Flower's claim assumes (C / n on the mean of n:
  a fixed denominator, i.e. zero-out; C for LocalDpMod's upload): z for the fixed central
  wrappers, z' for the adaptive ones, std / C for `LocalDpMod`."""
  if setting.central:
    return noise_std(setting) * setting.num_sampled_clients / setting.clipping_norm
  return noise_std(setting) / setting.clipping_norm


def clip(update: np.ndarray, norm: float) -> np.ndarray:
  """Flower's flat clip (`clip_inputs_inplace`, `supercore/differential_privacy.py` 50-58)."""
  return update * min(1.0, float(norm) / float(np.linalg.norm(update)))


def clip_after(setting: Setting, clipped: int, replies: int, clip_norm: float | None = None
               ) -> float:
  """The clip norm an adaptive wrapper holds after one round with `clipped` of `replies`
  updates clipped, the count's noise at its mean (its median: the update is monotone).

  Flower 1.42 `dp_adaptive_clipping.py` 105-111: fraction = (count + N(0, sigma_b)) /
  len(replies), C <- C exp(-lr (fraction - target_clipped_quantile)).
  """
  c = setting.clipping_norm if clip_norm is None else clip_norm
  return float(c * math.exp(-setting.clip_norm_lr * (clipped / replies
                                                     - setting.target_clipped_quantile)))


def gaussian_pair_epsilon(distance: float, std_p: float, std_q: float, dimension: int,
                          delta: float) -> float:
  """Exact epsilon at `delta` between N(mu_P, std_p^2 I_d) and N(mu_Q, std_q^2 I_d) with
  |mu_P - mu_Q| = distance (both orders; the hockey-stick divergence integrated exactly
  over the chi-square of the d - 1 orthogonal coordinates, numerically along the mean
  shift). Equal stds: the analytic Gaussian epsilon of mu = distance / std (Balle & Wang
  2018), `eval.auditing.gdp_epsilon`.
  """
  if math.isclose(std_p, std_q, rel_tol=1e-12):
    return auditing.gdp_epsilon(distance / std_p, delta)
  from scipy import stats as sps  # pylint: disable=g-import-not-at-top
  dof = int(dimension) - 1
  # R / s^2 ~ chi-square(d - 1): midpoint quantiles (R = 0 when d = 1).
  u = (sps.chi2.ppf((np.arange(4000) + 0.5) / 4000, dof) if dof else np.zeros(1))

  def tail(eps, s_p, s_q, under_p):
    # Pr[L > eps], L = log p / q = B x1^2 + c1 x1 + c0 + B R with x1 the coordinate along
    # the shift (mu_Q = 0, mu_P = distance) and R = |x_perp|^2: exact in x1 (the roots of
    # the quadratic, normal CDFs), averaged over the chi-square quantiles of R.
    s, mean = (s_p, distance) if under_p else (s_q, 0.0)
    b = 0.5 * (1.0 / s_q ** 2 - 1.0 / s_p ** 2)
    c1 = distance / s_p ** 2
    k = (dimension * math.log(s_q / s_p) - distance ** 2 / (2 * s_p ** 2) + b * s ** 2 * u
         - eps)
    cdf = lambda x: sps.norm.cdf((x - mean) / s)  # noqa: E731
    if abs(b) * s ** 2 < 1e-12:
      return float(np.mean(1.0 - cdf(-k / c1)))
    disc = c1 ** 2 - 4 * b * k
    root = np.sqrt(np.maximum(disc, 0.0))
    q = -0.5 * (c1 + root)
    r1, r2 = np.minimum(q / b, k / np.where(q == 0, 1e-300, q)), np.maximum(
        q / b, k / np.where(q == 0, 1e-300, q))
    if b > 0:
      p = np.where(disc < 0, 1.0, cdf(r1) + 1.0 - cdf(r2))
    else:
      p = np.where(disc < 0, 0.0, cdf(r2) - cdf(r1))
    return float(np.mean(p))

  def hockey(eps):
    d1 = tail(eps, std_p, std_q, True) - math.exp(eps) * tail(eps, std_p, std_q, False)
    d2 = tail(eps, std_q, std_p, True) - math.exp(eps) * tail(eps, std_q, std_p, False)
    return max(d1, d2)

  lo, hi = 0.0, 1.0
  while hockey(hi) > delta and hi < 1e4:
    lo, hi = hi, 2 * hi
  if hockey(lo) <= delta:
    return lo
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
  return hi


def declaration(setting: Setting) -> accounting.Declaration:
  """The `fl_privacy.accounting` declaration of the audited game (one Gaussian release)."""
  return accounting.Declaration(
      f'flower_{setting.wrapper}', 'client', 'add_remove', ADVERSARY[setting.wrapper], 'none',
      1.0, 1, note=('Flower central DP, one round, no sampling amplification' if
                    setting.central else 'Flower LocalDpMod, one upload'))


def flower_rdp_epsilon(noise_multiplier: float, num_sampled_clients: int,
                       delta: float, rounds: int = 1) -> float:
  """Epsilon of `rounds` releases of a central wrapper by Flower 1.42's own `RdpAccountant`
  (add-or-remove-one, no amplification: the configuration the wrappers accept)."""
  from flwr.serverapp import RdpAccountant  # pylint: disable=g-import-not-at-top
  from flwr.supercore.privacy_accounting import (  # pylint: disable=g-import-not-at-top
      GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod)
  n = int(num_sampled_clients)
  acc = RdpAccountant(PrivacyConfig(target_delta=float(delta), population_size=n,
                                    neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                    sampling_method=SamplingMethod.NO_AMPLIFICATION))
  for _ in range(int(rounds)):
    acc.compose(GaussianPrivacyEvent(noise_multiplier=float(noise_multiplier), sample_size=n,
                                     population_size=n))
  return float(acc.get_epsilon(float(delta)))


def stated_epsilon(setting: Setting) -> tuple[float, str]:
  """(Flower's stated epsilon, where it comes from)."""
  if setting.wrapper in ADAPTIVE:
    # Flower's accountant takes no adaptive wrapper; Andrew et al.'s claim is that the round
    # (aggregate and clip update together) is the Gaussian mechanism of noise multiplier z.
    return (flower_rdp_epsilon(setting.noise_multiplier, setting.num_sampled_clients,
                               setting.delta), 'flwr RdpAccountant at z (Andrew et al.)')
  if setting.central:
    return (flower_rdp_epsilon(setting.noise_multiplier, setting.num_sampled_clients,
                               setting.delta), 'flwr RdpAccountant')
  return float(setting.epsilon), 'LocalDpMod epsilon argument'
