"""Coverage of membership-inference intervals on synthetic FedMIA-like scores.

A generative model of the pooled entries of replicated trainings: training r (one partition,
initialisation and set of client keys) has K target clients and Q queries; every query is
scored against every client's upload, and entry (k, q) is a member when client k owns query
q (a fraction of the queries belongs to no client). Attack X in {A, B} scores it

  s = client_sd c_{rk} + query_sd u_{rq}
      + member * (signal_X + training_sd z_r + client_signal_sd v_{rk}) + e_{rkq},

c a client's offset (shared by all its entries), u a query's difficulty (shared by its K
entries), z the training's random effect on the membership signal, v a client's, e noise; all
standard normal, A's and B's components correlated (`attack_corr`, and `training_corr` for z).
Entries that share a client, a query or a training are dependent, as in a real evaluation.

The estimand is the expected value over trainings of a statistic of one training (its AUC,
A's AUC minus B's, its TPR at a low FPR), computed by a large Monte Carlo over independent
trainings (`estimand`, with its standard error). `coverage` runs simulated experiments of R
trainings each and counts how often each interval holds the estimand, with a Clopper-Pearson
interval on every coverage (coverage checked by simulation as in Davison and Hinkley, 1997,
Ch. 5). Intervals: `conditional_one` (the query-cluster bootstrap of one training,
`eval.paired` / `eval.bootstrap` as they are), `conditional_pooled` (the same on all R
trainings' entries pooled, queries of different trainings distinct), and `eval.replicated`'s
`t`, `hierarchical_bootstrap` and `reported` intervals; for TPR also `clopper_pearson` (the
pooled counts), and for the paired TPR difference the same as for the AUC difference.

The training effect is fitted, not assumed: `variance_ratio` pools, over measured points, the
variance of the per-replicate values against the within-training variance of one training's
conditional interval (total / within, 1 = no training effect, with a chi-square interval);
`simulated_ratio` is the same quantity in this model, and `fit_training_sd` picks the
`training_sd` that matches a measured ratio (moment matching over a grid).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

from fl_privacy.eval import bootstrap
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.eval import stats

# Largest trainings x entries generated at once by `estimand`.
CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Design:
  """The generative model's sizes and effect scales (module docstring)."""
  num_clients: int = 8
  num_queries: int = 40
  member_fraction: float = 0.5
  signal_a: float = 1.0
  signal_b: float = 0.8
  training_sd: float = 0.5
  training_corr: float = 0.3
  client_sd: float = 0.5
  client_signal_sd: float = 0.2
  query_sd: float = 1.0
  attack_corr: float = 0.7

  def __post_init__(self):
    if self.num_clients < 2 or self.num_queries < 2:
      raise ValueError('a design needs at least 2 clients and 2 queries')
    members = self.num_members
    if not 1 <= members < self.num_queries:
      raise ValueError(f'member_fraction {self.member_fraction} gives {members} members of '
                       f'{self.num_queries} queries')

  @property
  def num_members(self) -> int:
    return int(round(self.member_fraction * self.num_queries))

  @property
  def num_entries(self) -> int:
    return self.num_clients * self.num_queries


def _pair(rng: np.random.Generator, shape, corr: float) -> tuple[np.ndarray, np.ndarray]:
  """Two standard normal arrays with correlation `corr`."""
  x, z = rng.standard_normal(shape), rng.standard_normal(shape)
  return x, corr * x + np.sqrt(1.0 - corr ** 2) * z


def simulate(design: Design, num_trainings: int, rng: np.random.Generator
             ) -> dict[str, np.ndarray]:
  """`num_trainings` independent trainings: `scores_a`, `scores_b`, `labels` [M, K * Q] and the
  entries' `target`, `groups` [K * Q] (entry k * Q + q is client k's score of query q)."""
  m, k, q = num_trainings, design.num_clients, design.num_queries
  # Every training redraws which client owns which query (its partition); the members are
  # spread evenly over the clients.
  owner = np.full((m, q), -1)
  perm = np.argsort(rng.random((m, q)), axis=1)[:, :design.num_members]
  np.put_along_axis(owner, perm, np.arange(design.num_members) % k, axis=1)
  labels = owner[:, None, :] == np.arange(k)[None, :, None]  # [M, K, Q]
  out = dict(labels=labels.reshape(m, k * q),
             target=np.repeat(np.arange(k), q), groups=np.tile(np.arange(q), k))
  c = _pair(rng, (m, k, 1), design.attack_corr)
  u = _pair(rng, (m, 1, q), design.attack_corr)
  z = _pair(rng, (m, 1, 1), design.training_corr)
  v = _pair(rng, (m, k, 1), design.attack_corr)
  e = _pair(rng, (m, k, q), design.attack_corr)
  for i, (name, signal) in enumerate((('scores_a', design.signal_a),
                                      ('scores_b', design.signal_b))):
    shift = signal + design.training_sd * z[i] + design.client_signal_sd * v[i]
    s = design.client_sd * c[i] + design.query_sd * u[i] + labels * shift + e[i]
    out[name] = s.reshape(m, k * q)
  return out


def replicates(sim: dict[str, np.ndarray], attack: str = 'a') -> list[dict[str, np.ndarray]]:
  """The trainings of `simulate` as `eval.replicated`'s list of per-replicate dicts."""
  return [dict(scores=sim[f'scores_{attack}'][r], labels=sim['labels'][r],
               target=sim['target'], groups=sim['groups'])
          for r in range(sim['labels'].shape[0])]


def row_auc(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """AUC of every row of [M, N] continuous scores (no ties), by ranks (Mann-Whitney)."""
  ranks = np.argsort(np.argsort(scores, axis=1), axis=1) + 1.0
  n_pos = labels.sum(axis=1)
  n_neg = labels.shape[1] - n_pos
  return ((ranks * labels).sum(axis=1) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def row_tpr_at_fpr(scores: np.ndarray, labels: np.ndarray, fpr: float) -> np.ndarray:
  """`metrics.tpr_at_fpr` of every row of [M, N] continuous scores with the same number of
  members in each row: the threshold admits at most floor(fpr * N_neg) non-members, so the
  TPR is the fraction of members above the next-highest non-member."""
  m = scores.shape[0]
  pos = scores[labels].reshape(m, -1)
  neg = scores[~labels].reshape(m, -1)
  n_neg = neg.shape[1]
  allowed = int(np.floor(fpr * n_neg * (1 + 1e-12)))
  if allowed >= n_neg:
    return np.ones(m)
  kth = n_neg - 1 - allowed
  cut = np.partition(neg, kth, axis=1)[:, kth]
  return (pos > cut[:, None]).mean(axis=1)


def estimand(design: Design, *, rng: np.random.Generator, num_trainings: int = 20000,
             fpr: float | None = None) -> dict[str, float]:
  """Monte Carlo expectation over trainings of one training's statistics.

  Returns:
    `auc_a`, `auc_b`, `auc_diff` (A - B) and, with `fpr`, `tpr_a`, `tpr_diff` (TPR at `fpr`),
    each the mean over `num_trainings` trainings with `<name>_se` (its Monte Carlo standard
    error), and `num_trainings`.
  """
  values: dict[str, list[np.ndarray]] = {}
  step = max(1, CHUNK_ELEMENTS // design.num_entries)
  for start in range(0, num_trainings, step):
    sim = simulate(design, min(step, num_trainings - start), rng)
    a = row_auc(sim['scores_a'], sim['labels'])
    b = row_auc(sim['scores_b'], sim['labels'])
    batch = dict(auc_a=a, auc_b=b, auc_diff=a - b)
    if fpr is not None:
      ta = row_tpr_at_fpr(sim['scores_a'], sim['labels'], fpr)
      tb = row_tpr_at_fpr(sim['scores_b'], sim['labels'], fpr)
      batch.update(tpr_a=ta, tpr_diff=ta - tb)
    for name, v in batch.items():
      values.setdefault(name, []).append(v)
  out: dict[str, float] = dict(num_trainings=num_trainings)
  for name, parts in values.items():
    v = np.concatenate(parts)
    out[name] = float(v.mean())
    out[f'{name}_se'] = float(v.std(ddof=1) / np.sqrt(v.size))
  return out


def _query_bootstrap_auc(scores, labels, groups, rng, num_resamples, confidence):
  """Percentile query-cluster bootstrap of one AUC (`paired.resampled_auc`'s resamples)."""
  counts = bootstrap.resample_counts(bootstrap.group_index(groups)[1], num_resamples, rng)
  aucs = paired.resampled_auc(scores, labels, groups, counts)
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(aucs[~np.isnan(aucs)], [tail, 1.0 - tail])
  return float(low), float(high)


def experiment(design: Design, num_trainings: int, *, rng: np.random.Generator,
               num_resamples: int = 200, fpr: float | None = None,
               confidence: float = 0.95, hierarchical: bool = True, auc: bool = True,
               conditional: Sequence[str] = ('conditional_one', 'conditional_pooled'),
               tpr_diff: bool = False, resample: bool = True
               ) -> dict[str, dict[str, tuple[float, float]]]:
  """One simulated experiment of `num_trainings` trainings: quantity -> method -> interval.

  Quantities `auc_a`, `auc_diff` (unless `auc=False`) and, with `fpr`, `tpr_a` and, with
  `tpr_diff`, `tpr_diff` (A's TPR at `fpr` minus B's, each threshold on its own entries: the
  paired difference every 0.1%-FPR claim reports).
  `hierarchical=False` leaves out `eval.replicated` (its t-interval, computed here, needs
  none), `resample=False` only its hierarchical bootstrap (keeping Clopper-Pearson and the
  reported union for a TPR), and `conditional` names the conditional intervals computed, for
  quick checks. The
  t-interval is left out for one training (it has none).
  """
  if not auc and fpr is None:
    raise ValueError('nothing to measure: auc=False needs an fpr')
  if tpr_diff and fpr is None:
    raise ValueError('tpr_diff needs an fpr')
  sim = simulate(design, num_trainings, rng)
  reps_a, reps_b = replicates(sim, 'a'), replicates(sim, 'b')
  n = design.num_entries
  one = dict(scores_a=sim['scores_a'][0], scores_b=sim['scores_b'][0],
             labels=sim['labels'][0], groups=sim['groups'])
  pooled = dict(scores_a=sim['scores_a'].reshape(-1), scores_b=sim['scores_b'].reshape(-1),
                labels=sim['labels'].reshape(-1),
                # Queries of different trainings are different clusters.
                groups=(np.arange(num_trainings)[:, None] * n + sim['groups'][None, :]
                        ).reshape(-1))
  out: dict[str, dict[str, tuple[float, float]]] = dict(auc_a={}, auc_diff={}) if auc else {}
  # With one training the pooled entries are that training's: one conditional interval.
  conditional_data = [(name, data) for name, data in (('conditional_one', one),
                                                      ('conditional_pooled', pooled))
                      if name in conditional]
  if num_trainings == 1:
    conditional_data = conditional_data[:1]
  for name, data in conditional_data:
    if auc:
      out['auc_a'][name] = _query_bootstrap_auc(data['scores_a'], data['labels'],
                                                data['groups'], rng, num_resamples, confidence)
      diff = paired.compare(data['scores_a'], data['scores_b'], data['labels'],
                            data['groups'], rng=rng, num_resamples=num_resamples,
                            confidence=confidence, fpr=fpr if fpr is not None else 1e-3)
      out['auc_diff'][name] = (diff['auc_diff_low'], diff['auc_diff_high'])
    if fpr is not None:
      _, low, high = bootstrap.tpr_at_fpr_interval(
          data['scores_a'], data['labels'], data['groups'], fpr, rng=rng,
          num_resamples=num_resamples, confidence=confidence)
      out.setdefault('tpr_a', {})[name] = (low, high)
      if tpr_diff:
        diff = paired.compare(data['scores_a'], data['scores_b'], data['labels'],
                              data['groups'], rng=rng, num_resamples=num_resamples,
                              confidence=confidence, fpr=fpr)
        out.setdefault('tpr_diff', {})[name] = (diff['tpr_diff_low'], diff['tpr_diff_high'])
  fprs = {'tpr': fpr} if fpr is not None else {}
  resample = resample or num_trainings == 1  # one training: the bootstrap is all it has
  methods = ((('t', '_t'),) if num_trainings > 1 else ()) + (
      (('hierarchical_bootstrap', '_boot'),) if resample else ()) + (('reported', ''),)
  if hierarchical:
    # The bootstrap is computed even where `interval_method` reports t, to be compared.
    level = replicated.metrics(reps_a, rng=rng, num_resamples=num_resamples, fprs=fprs,
                               confidence=confidence, resample=resample)
    if auc or tpr_diff:
      diff = replicated.compare(reps_a, reps_b, rng=rng, num_resamples=num_resamples,
                                confidence=confidence, fpr=fpr if fpr is not None else 1e-3,
                                resample=resample)
    if auc:
      for quantity, key, res in (('auc_a', 'auc', level), ('auc_diff', 'auc_diff', diff)):
        for method, suffix in methods:
          out[quantity][method] = (res[f'{key}{suffix}_low'], res[f'{key}{suffix}_high'])
    if fpr is not None:
      for method, suffix in methods + (('clopper_pearson', '_cp'),):
        out['tpr_a'][method] = (level[f'tpr{suffix}_low'], level[f'tpr{suffix}_high'])
      if tpr_diff:
        for method, suffix in methods:
          out['tpr_diff'][method] = (diff[f'tpr_diff{suffix}_low'],
                                     diff[f'tpr_diff{suffix}_high'])
  elif tpr_diff:
    ta = row_tpr_at_fpr(sim['scores_a'], sim['labels'], fpr)
    tb = row_tpr_at_fpr(sim['scores_b'], sim['labels'], fpr)
    out.setdefault('tpr_a', {})['t'] = tuple(replicated.t_interval(
        [float(x) for x in ta], confidence, (0.0, 1.0))[1:])
    out.setdefault('tpr_diff', {})['t'] = tuple(replicated.t_interval(
        [float(x) for x in ta - tb], confidence, (-1.0, 1.0))[1:])
  if not hierarchical and auc:
    auc_a = row_auc(sim['scores_a'], sim['labels'])
    aucs = [float(x) for x in auc_a]
    diffs = [float(x) for x in auc_a - row_auc(sim['scores_b'], sim['labels'])]
    out['auc_a']['t'] = tuple(replicated.t_interval(aucs, confidence, (0.0, 1.0))[1:])
    out['auc_diff']['t'] = tuple(replicated.t_interval(diffs, confidence, (-1.0, 1.0))[1:])
  return out


def coverage(design: Design, num_trainings: int, truth: dict[str, float], *,
             rng: np.random.Generator, num_experiments: int, num_resamples: int = 200,
             fpr: float | None = None, confidence: float = 0.95, hierarchical: bool = True,
             auc: bool = True,
             conditional: Sequence[str] = ('conditional_one', 'conditional_pooled'),
             tpr_diff: bool = False, resample: bool = True
             ) -> dict[tuple[str, str], dict[str, Any]]:
  """Empirical coverage of every interval of `experiment` over `num_experiments` experiments.

  Args:
    design: the generative model.
    num_trainings: R, trainings per experiment.
    truth: `estimand`'s dict (the value each interval should hold).
    rng: numpy Generator of the data and of every bootstrap.
    num_experiments: simulated experiments.
    num_resamples: B of every bootstrap.
    fpr: also the TPR at this FPR (the estimand must hold `tpr_a`).
    confidence: nominal two-sided level.
    hierarchical, auc, conditional, tpr_diff, resample: as in `experiment`.

  Returns:
    (quantity, method) -> `covered` (count), `num_experiments`, `coverage`, `coverage_low`
    / `coverage_high` (Clopper-Pearson at 95% on the count), `mean_width`, `missed_low` /
    `missed_high` (intervals entirely below / above the estimand), `not_estimable` (intervals
    of zero width or with a NaN limit: `paired.verdict` gives them no verdict; they count as
    not covering unless the estimand sits exactly on them).
  """
  if num_experiments < 1:
    raise ValueError(f'num_experiments must be positive (got {num_experiments})')
  tallies: dict[tuple[str, str], list[tuple[float, float]]] = {}
  for _ in range(num_experiments):
    for quantity, methods in experiment(design, num_trainings, rng=rng,
                                        num_resamples=num_resamples, fpr=fpr,
                                        confidence=confidence, hierarchical=hierarchical,
                                        auc=auc, conditional=conditional,
                                        tpr_diff=tpr_diff, resample=resample).items():
      for method, interval in methods.items():
        tallies.setdefault((quantity, method), []).append(interval)
  out = {}
  for (quantity, method), intervals in tallies.items():
    low, high = np.asarray(intervals, np.float64).T
    value = truth[quantity]
    covered = int(((low <= value) & (value <= high)).sum())
    cp = stats.clopper_pearson(covered, low.size, 0.95)
    finite = np.isfinite(high - low)
    out[(quantity, method)] = dict(
        covered=covered, num_experiments=int(low.size), coverage=covered / low.size,
        coverage_low=cp[0], coverage_high=cp[1],
        mean_width=float((high - low)[finite].mean()) if finite.any() else float('nan'),
        missed_low=int((high < value).sum()), missed_high=int((low > value).sum()),
        not_estimable=int(sum(paired.verdict(float(a), float(b)) == paired.NOT_ESTIMABLE
                              for a, b in zip(low, high))))
  return out


def variance_ratio(replicate_var, within_var, df, confidence: float = 0.95
                   ) -> dict[str, float]:
  """Total over within-training variance of a statistic, pooled over measured points.

  Point i was measured on R_i replicated trainings: s_i^2 is the sample variance of its R_i
  per-replicate values (df_i = R_i - 1 degrees of freedom) and w_i the variance of one
  training's value over its queries (from that training's conditional interval, e.g.
  ((high - low) / (2 x 1.96))^2). With a between-training variance of (ratio - 1) w_i and
  normal values, df_i s_i^2 / w_i ~ ratio x chi2(df_i), so sum_i df_i s_i^2 / w_i ~ ratio x
  chi2(sum_i df_i): the estimate is that sum over sum_i df_i, with the exact chi-square
  interval (w_i taken as known). A ratio near 1 is no training effect; the simulation's
  invented design had 3.3 (AUC) and 5.7 (A - B).

  Args:
    replicate_var: [P] s_i^2.
    within_var: [P] w_i (positive).
    df: [P] R_i - 1 (positive).
    confidence: two-sided level of the interval.

  Returns:
    `ratio`, `low`, `high`, `df` (sum of df_i), `points` (P).
  """
  s2 = np.asarray(replicate_var, np.float64).reshape(-1)
  w = np.asarray(within_var, np.float64).reshape(-1)
  d = np.asarray(df, np.float64).reshape(-1)
  if not s2.size == w.size == d.size > 0:
    raise ValueError(f'replicate_var, within_var and df need one equal, non-zero length '
                     f'(got {s2.size}, {w.size}, {d.size})')
  if (w <= 0).any() or (d <= 0).any() or (s2 < 0).any():
    raise ValueError('within_var and df must be positive, replicate_var non-negative')
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  total = float((d * s2 / w).sum())
  dof = float(d.sum())
  tail = (1.0 - confidence) / 2.0
  return dict(ratio=total / dof, low=total / float(sps.chi2.ppf(1.0 - tail, dof)),
              high=total / float(sps.chi2.ppf(tail, dof)), df=dof, points=int(s2.size))


def simulated_ratio(design: Design, *, rng: np.random.Generator, fpr: float | None = None,
                    num_trainings: int = 4000, num_within: int = 60,
                    num_resamples: int = 300) -> dict[str, float]:
  """`variance_ratio`'s quantity in the generative model: the variance over trainings of a
  training's statistic (`num_trainings` of them) over the mean variance of its query-cluster
  bootstrap (the conditional interval's, `num_within` trainings of `num_resamples` each).

  Returns:
    `auc_a`, `auc_diff` and, with `fpr`, `tpr_a`, `tpr_diff` (TPR at `fpr`).
  """
  sim = simulate(design, num_trainings, rng)
  a = row_auc(sim['scores_a'], sim['labels'])
  b = row_auc(sim['scores_b'], sim['labels'])
  total = dict(auc_a=a, auc_diff=a - b)
  if fpr is not None:
    ta = row_tpr_at_fpr(sim['scores_a'], sim['labels'], fpr)
    tb = row_tpr_at_fpr(sim['scores_b'], sim['labels'], fpr)
    total.update(tpr_a=ta, tpr_diff=ta - tb)
  within: dict[str, list[float]] = {k: [] for k in total}
  for r in range(min(num_within, num_trainings)):
    counts = bootstrap.resample_counts(design.num_queries, num_resamples, rng)
    y, g = sim['labels'][r], sim['groups']
    ra = paired.resampled_auc(sim['scores_a'][r], y, g, counts)
    rb = paired.resampled_auc(sim['scores_b'][r], y, g, counts)
    within['auc_a'].append(np.nanvar(ra, ddof=1))
    within['auc_diff'].append(np.nanvar(ra - rb, ddof=1))
    if fpr is not None:
      qa = bootstrap.resampled_tpr_at_fpr(sim['scores_a'][r], y, g, fpr, counts)
      qb = bootstrap.resampled_tpr_at_fpr(sim['scores_b'][r], y, g, fpr, counts)
      within['tpr_a'].append(np.nanvar(qa, ddof=1))
      within['tpr_diff'].append(np.nanvar(qa - qb, ddof=1))
  return {k: float(np.var(v, ddof=1) / np.mean(within[k])) for k, v in total.items()}


def fit_training_sd(design: Design, target: float, grid: Sequence[float], *,
                    rng: np.random.Generator, quantity: str = 'auc_diff',
                    fpr: float | None = None, **kwargs) -> tuple[float, dict[float, float]]:
  """The `training_sd` of `grid` whose `simulated_ratio` of `quantity` is nearest `target`
  (a measured `variance_ratio`): the training effect fitted by matching that moment.

  Returns:
    (fitted training_sd, {training_sd: simulated ratio} over the grid).
  """
  ratios = {float(sd): simulated_ratio(dataclasses.replace(design, training_sd=float(sd)),
                                       rng=rng, fpr=fpr, **kwargs)[quantity]
            for sd in grid}
  best = min(ratios, key=lambda sd: abs(ratios[sd] - target))
  return best, ratios
