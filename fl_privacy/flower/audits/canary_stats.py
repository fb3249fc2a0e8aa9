"""The canary audit's statistics: each threat model's scores, the stated and exact epsilons,
the Gaussian fit and the bounds counted (`audits.canaries` docstring).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_setting


def scores(setting: dp_setting.Setting, run: dict[str, Any], directions: np.ndarray,
           rounds: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Each threat model's statistic for the given unit directions [k, d] (the canaries', or
  never-inserted ones for the null; LocalDpMod's all-iterates statistic needs the canaries'
  own uploads, so it is defined for the canaries only: the null is their excluded half).

  `rounds` None: every direction over every round, the sums as they are (fraction_train 1).
  Else bool [T, k], the rounds each direction is scored over (canary i: the rounds the
  server sampled it in; the null: every round), and each statistic standardised to null
  std 1 (`_sampled_scores`), 0 for a direction with no round."""
  if rounds is not None:
    return _sampled_scores(setting, run, directions, np.asarray(rounds, bool))
  models = run['models']
  deltas = np.diff(models, axis=0)  # [T, d] aggregate_t - model_(t-1)
  out = {'last_iterate': directions @ (models[-1] - models[0])}
  if setting.wrapper == 'local_dp':
    if run['upload_projections'] is not None and directions is run['directions']:
      out['all_iterates'] = run['upload_projections'].sum(axis=0)
    return out
  out['all_iterates'] = (directions @ deltas.T) @ _round_weights(setting, run)
  return out


def _round_weights(setting: dp_setting.Setting, run: dict[str, Any]) -> np.ndarray:
  """The central wrappers' inverse-variance weights of the rounds: 1 for fixed clipping;
  C_(t-1) / sigma_t^2 (up to z'^2 / n^2), normalised to mean 1, for the adaptive ones."""
  weights = np.ones(len(run['models']) - 1)
  if setting.wrapper in dp_setting.ADAPTIVE:
    clips = run['clips']
    weights = clips[:-1] / clips[1:] ** 2  # C_(t-1) / sigma_t^2, up to z'^2 / n^2
    weights = weights / weights.mean()
  return weights


def _round_noise(setting: dp_setting.Setting, run: dict[str, Any]) -> np.ndarray:
  """Each round's noise std on the aggregate, up to one factor common to the rounds: the
  adaptive wrappers' z' C_t / k moves with the clip; the others' is constant."""
  if setting.wrapper in dp_setting.ADAPTIVE:
    return np.asarray(run['clips'][1:], np.float64)
  return np.ones(len(run['models']) - 1)


def _sampled_scores(setting: dp_setting.Setting, run: dict[str, Any], directions: np.ndarray,
                    rounds: np.ndarray) -> dict[str, np.ndarray]:
  """`scores` over each direction's own rounds [T, k]: all iterates, the weighted sum over
  them divided by the root of its rounds' (weight x noise std)^2 (LocalDpMod: the canary's
  uploads over sqrt(T_i)); last iterate, the projection over the root of every round's
  noise variance (the final model carries every round's noise). Standardised so that
  directions scored over different numbers of rounds share one null, mean 0 and std 1 in
  units of a factor common to all (the per-round noise std)."""
  models = run['models']
  deltas = np.diff(models, axis=0)
  noise = _round_noise(setting, run)
  taken = rounds.any(axis=0)
  last = directions @ (models[-1] - models[0]) / math.sqrt(float(np.sum(noise ** 2)))
  out = {'last_iterate': np.where(taken, last, 0.0)}
  if setting.wrapper == 'local_dp':
    if run['upload_projections'] is not None and directions is run['directions']:
      own = np.where(rounds, run['upload_projections'], 0.0).sum(axis=0)
      out['all_iterates'] = own / np.sqrt(np.maximum(rounds.sum(axis=0), 1))
    return out
  w = _round_weights(setting, run)
  total = ((directions @ deltas.T) * rounds.T) @ w
  spread = np.sqrt(rounds.T.astype(np.float64) @ (w * noise) ** 2)
  out['all_iterates'] = np.where(taken, total / np.where(taken, spread, 1.0), 0.0)
  return out


def stated(setting: dp_setting.Setting, design: canary_design.Design, run: dict[str, Any]
           ) -> tuple[float, float, str]:
  """(Flower's stated epsilon over the T rounds, its delta, source)."""
  t = int(design.num_rounds)
  if setting.wrapper in ('server_fixed', 'client_fixed'):
    return run['stated_flower'], float(setting.delta), 'flwr RdpAccountant (privacy_spent)'
  if setting.wrapper in dp_setting.ADAPTIVE:
    return (dp_setting.flower_rdp_epsilon(setting.noise_multiplier, design.num_nodes,
                                          setting.delta, rounds=t), float(setting.delta),
            'flwr RdpAccountant at z over the rounds (Andrew et al.; Flower states none)')
  return (t * float(setting.epsilon), t * float(setting.delta),
          'LocalDpMod epsilon x rounds (basic composition, at rounds x delta)')


def exact_epsilons(setting: dp_setting.Setting, design: canary_design.Design, run: dict[str, Any],
                   delta: float) -> dict[str, float]:
  """The exact epsilon of what Flower ran, per canary (zero-out), as mu-GDP composed over
  the rounds (Dong et al. 2019): fixed central, mu = sqrt(T) / z (sensitivity C / n, noise
  z C / n, both adversaries); adaptive, per round (C_(t-1) / n) / (z' C_t / n) at the clips
  the run went through (noise drawn after the clip's update), the aggregates alone
  (`exact_epsilon`) and with the noisy counts of Flower's 0/1 bits (sensitivity 1 under
  zero-out, std sigma_b: `exact_epsilon_with_counts`); LocalDpMod, every upload
  sqrt(T) C / sigma (all iterates) and the final mean sqrt(T) C / (sigma sqrt(n)) (last).

  With client sampling (fraction_train < 1; n -> k, the sample size, in the formulas) each
  canary i is mu_i-GDP over the T_i rounds the server sampled it in (`canary_mus`): the
  exact epsilons are those of the canary sampled most (the largest mu_i), and
  `exact_epsilon_all_iterates_median_canary` that of the median one."""
  if design.sampled:
    return _sampled_exact_epsilons(setting, design, run, delta)
  t, n = int(design.num_rounds), design.num_nodes
  s = dataclasses.replace(setting, num_sampled_clients=n)
  out = {}
  if s.wrapper in ('server_fixed', 'client_fixed'):
    mu = math.sqrt(t) / s.noise_multiplier
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu, delta))
  elif s.wrapper in dp_setting.ADAPTIVE:
    std_b, z_prime = dp_setting.adaptive_noise(s)
    c = run['clips']
    per_round = c[:-1] / (z_prime * c[1:])
    mu_all = float(np.sqrt(np.sum(per_round ** 2)))
    mu_last = float(np.sum(c[:-1]) / (z_prime * np.sqrt(np.sum(c[1:] ** 2))))
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu_all, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu_last, delta),
               exact_epsilon_with_counts=auditing.gdp_epsilon(
                   math.sqrt(mu_all ** 2 + t / std_b ** 2), delta),
               exact_epsilon_as_claimed=auditing.gdp_epsilon(
                   math.sqrt(t) / s.noise_multiplier, delta),
               noise_multiplier_aggregate=float(z_prime), clipped_count_stddev=float(std_b))
  else:
    sigma = dp_setting.local_dp_std(s.sensitivity, s.epsilon, s.delta)
    mu = math.sqrt(t) * s.clipping_norm / sigma
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu / math.sqrt(n), delta))
  return out


def canary_mus(setting: dp_setting.Setting, design: canary_design.Design, run: dict[str, Any],
               participation: np.ndarray) -> dict[str, np.ndarray]:
  """mu_i [m] of every canary i, per threat (zero-out; the adversary knows the sample), for
  its rounds S_i (`participation` [T, m]; T_i = |S_i|), k = `sample_size`: fixed central,
  sqrt(T_i) / z (all iterates) and T_i / (z sqrt(T)) (last: the final model carries all T
  rounds' noise); adaptive, sqrt(sum_(S_i) (C_(t-1) / (z' C_t))^2) and
  sum_(S_i) C_(t-1) / (z' sqrt(sum_t C_t^2)), with the counts
  sqrt(mu_all^2 + T_i / sigma_b^2) (`with_counts`); LocalDpMod, sqrt(T_i) C / sigma and
  T_i C / (sigma sqrt(k T)). At T_i = T these are `exact_epsilons`' mus of fraction 1."""
  t = int(design.num_rounds)
  part = np.asarray(participation, bool)
  counts = part.sum(axis=0).astype(np.float64)
  s = dataclasses.replace(setting, num_sampled_clients=design.sample_size)
  if s.wrapper in ('server_fixed', 'client_fixed'):
    return {'all_iterates': np.sqrt(counts) / s.noise_multiplier,
            'last_iterate': counts / (s.noise_multiplier * math.sqrt(t))}
  if s.wrapper in dp_setting.ADAPTIVE:
    std_b, z_prime = dp_setting.adaptive_noise(s)
    c = np.asarray(run['clips'], np.float64)
    mu_all = np.sqrt(part.T.astype(np.float64) @ (c[:-1] / (z_prime * c[1:])) ** 2)
    return {'all_iterates': mu_all,
            'last_iterate': (part.T.astype(np.float64) @ c[:-1])
                            / (z_prime * np.sqrt(np.sum(c[1:] ** 2))),
            'with_counts': np.sqrt(mu_all ** 2 + counts / std_b ** 2)}
  sigma = dp_setting.local_dp_std(s.sensitivity, s.epsilon, s.delta)
  return {'all_iterates': np.sqrt(counts) * s.clipping_norm / sigma,
          'last_iterate': counts * s.clipping_norm / (sigma * math.sqrt(
              design.sample_size * t))}


def _sampled_exact_epsilons(setting: dp_setting.Setting, design: canary_design.Design,
                            run: dict[str, Any], delta: float) -> dict[str, float]:
  mus = canary_mus(setting, design, run, run['participation'])
  out = {f'exact_epsilon_{threat}': auditing.gdp_epsilon(float(np.max(mus[threat])), delta)
         for threat in canary_design.THREATS}
  out['exact_epsilon_all_iterates_median_canary'] = auditing.gdp_epsilon(
      float(np.median(mus['all_iterates'])), delta)
  if setting.wrapper in dp_setting.ADAPTIVE:
    s = dataclasses.replace(setting, num_sampled_clients=design.sample_size)
    std_b, z_prime = dp_setting.adaptive_noise(s)
    out.update(exact_epsilon_with_counts=auditing.gdp_epsilon(
        float(np.max(mus['with_counts'])), delta),
               exact_epsilon_as_claimed=auditing.gdp_epsilon(
                   math.sqrt(int(design.num_rounds)) / s.noise_multiplier, delta),
               noise_multiplier_aggregate=float(z_prime), clipped_count_stddev=float(std_b))
  return out


def sampling_metrics(design: canary_design.Design, participation: np.ndarray) -> dict[str, Any]:
  """What the sampling was and how many rounds each canary took part in (`participation`
  [T, m]): `fraction_train`, `sample_size` k, `sampling`, `adversary`,
  `rounds_per_canary_min` / `_median` / `_mean` / `_max`, `canaries_never_sampled`."""
  counts = np.asarray(participation, bool).sum(axis=0)
  return dict(fraction_train=float(design.fraction_train), sample_size=design.sample_size,
              sampling=(canary_design.SAMPLING_FIXED_SIZE if design.sampled
                        else canary_design.SAMPLING_NONE),
              adversary=canary_design.ADVERSARY, rounds_per_canary_min=int(counts.min()),
              rounds_per_canary_median=float(np.median(counts)),
              rounds_per_canary_mean=float(counts.mean()),
              rounds_per_canary_max=int(counts.max()),
              canaries_never_sampled=int(np.sum(counts == 0)))


def threat_metrics(threat: str, s: np.ndarray, included: np.ndarray, taken: np.ndarray,
                   null_scores: np.ndarray, *, delta: float, each: float, confidence: float,
                   rng: np.random.Generator, **audit_kw) -> dict[str, Any]:
  """One threat model's fields `<threat>/...`: the one-run bounds of the canaries' scores `s`
  (included vs excluded; each bound at confidence `each`; `audit_kw` to
  `auditing.audit_scores`) and the Gaussian fit of the included canaries that took part
  (`taken`) against `null_scores`, with `n_null` and `fit_n_in`."""
  a = auditing.audit_scores(s[included], s[~included], delta=delta, confidence=each,
                            **audit_kw)
  fit = gaussian_fit(s[included & taken], null_scores, delta, confidence=confidence, rng=rng)
  m = {f'{threat}/{k}': a[k] for k in ('epsilon_one_run', 'epsilon_one_run_fdp', 'n_in',
                                       'n_out')}
  m.update({f'{threat}/{k}': v for k, v in fit.items()})
  m[f'{threat}/n_null'] = int(len(null_scores))
  m[f'{threat}/fit_n_in'] = int(np.sum(included & taken))
  return m


def gaussian_fit(in_scores: np.ndarray, null_scores: np.ndarray, delta: float, *,
                 rng: np.random.Generator | None = None, bootstrap: int = 1000,
                 confidence: float = 0.95) -> dict[str, float]:
  """Andrew et al.'s one-shot estimate: mu = (mean_in - mean_null) / std_null, epsilon of
  mu-GDP at delta (an ESTIMATE, not a bound), with a percentile bootstrap interval of mu
  (both samples resampled; `bootstrap` resamples) mapped through the epsilon of mu-GDP."""
  def mu_of(a, b):
    return (float(np.mean(a)) - float(np.mean(b))) / float(np.std(b))
  mu = mu_of(in_scores, null_scores)
  out = {'fit_mu': mu, 'epsilon_fit': auditing.gdp_epsilon(max(mu, 0.0), delta),
         'fit_in_std_over_null_std': float(np.std(in_scores) / np.std(null_scores))}
  if bootstrap:
    rng = np.random.default_rng(0) if rng is None else rng
    def resampled_mu():
      a = rng.choice(in_scores, len(in_scores))  # in this order: the draws of every run so far
      b = rng.choice(null_scores, len(null_scores))
      # A resample of a small null can repeat one value: no spread, no mu (left out).
      return mu_of(a, b) if np.std(b) > 0 else np.nan
    mus = np.asarray([resampled_mu() for _ in range(int(bootstrap))])
    low, high = np.nanquantile(mus, [(1 - confidence) / 2, (1 + confidence) / 2])
    out.update(fit_mu_ci_low=float(low), fit_mu_ci_high=float(high),
               epsilon_fit_ci_low=auditing.gdp_epsilon(max(float(low), 0.0), delta),
               epsilon_fit_ci_high=auditing.gdp_epsilon(max(float(high), 0.0), delta))
  return out


def audited_threats(setting: dp_setting.Setting, uploads_recorded: bool = True
                    ) -> tuple[str, ...]:
  """The threat models of `THREATS` that `scores` gives a statistic for, from the design
  alone (no score read): both for the central wrappers; LocalDpMod's all-iterates adversary
  reads the canaries' uploads, so it is there only when they were recorded."""
  if setting.wrapper == 'local_dp' and not uploads_recorded:
    return ('last_iterate',)
  return canary_design.THREATS


def counted_bounds(setting: dp_setting.Setting, uploads_recorded: bool = True
                   ) -> tuple[str, ...]:
  """The bounds the verdict takes the largest of, as '<threat>/<bound>': both one-run bounds
  (`BOUNDS`, the f-DP one counted because every wrapper here is Gaussian) of every threat
  model `audited_threats` gives. Fixed before the data: their number k sets the per-bound
  confidence 1 - (1 - c) / k (4 for every wrapper as deployed, 2 for LocalDpMod without
  recorded uploads)."""
  return tuple(f'{threat}/{bound}' for threat in audited_threats(setting, uploads_recorded)
               for bound in canary_design.BOUNDS)
