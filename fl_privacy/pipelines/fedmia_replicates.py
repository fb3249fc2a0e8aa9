"""FedMIA's replicated trainings: keys, one point's metrics over the replicates, and claims.

`fedmia.replicates` = R independent trainings of every setting. Replicate r trains with key
fold_in(run key, r) (partition, w_0 and the clients' keys all derive from it), so a defense and
the undefended run of one replicate share data, shuffles and initialisation (common random
numbers) while the replicates are independent. A point's attack statistics (AUC, TPR at 1% and
0.1% FPR) and every paired claim are reported over the replicates by `eval.replicated`, whose
intervals include the training-to-training variation and the dependence of entries that share
a training, a target client or a query; the single-training intervals (DeLong, Clopper-Pearson
on entries taken as independent, the query-cluster bootstrap) are kept per replicate under
`conditional`; they cover the queries of one training only, and under-cover when trainings
differ (`eval.coverage`; benchmarks/README.md, "Coverage of the intervals", where the fit to
the measured runs found no such difference on digits).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.report import point_key

# Attack statistics reported over the replicates by `eval.replicated.metrics`.
ATTACK = ('auc', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3')
# Counts that add up over replicates (different trainings: their entries are distinct).
SUMMED = ('n_pos', 'n_neg', 'n_neg_distinct', 'n_test', 'top_tied', 'top_tied_negatives',
          'tpr_at_fpr_1e-2_distinct_negatives', 'tpr_at_fpr_1e-3_distinct_negatives')
# Utility rates: the mean over replicates with the t-interval over them (R >= 2).
UTILITY = ('test_accuracy', 'train_accuracy')
# Single-training intervals of the attack statistics, kept per replicate under `conditional`.
CONDITIONAL = tuple(f'{name}_{suffix}' for name in ATTACK
                    for suffix in ('ci_low', 'ci_high', 'boot_low', 'boot_high'))


# How `eval.replicated` names the interval it reports, in words for the tables.
METHODS = {'t': "Student's t over the per-replicate values, R - 1 degrees of freedom",
           'hierarchical_bootstrap': 'hierarchical bootstrap: replicates, then target clients '
                                     'and queries (two-way)',
           'two_way_bootstrap_conditional': 'one training: two-way bootstrap of its target '
                                            'clients and queries, conditional on it'}


def key(run_key, replicate: int):
  """Replicate `replicate`'s key: fold_in(run key, replicate)."""
  return jax.random.fold_in(run_key, int(replicate))


def _mean(values: list) -> Any:
  if all(isinstance(v, bool) for v in values):
    return values[0] if len(set(values)) == 1 else float(np.mean(values))
  if all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
    return float(np.mean(np.asarray(values, np.float64)))
  return values[0] if all(v == values[0] for v in values) else values


def combine(per: list[tuple[dict, dict]], *, rng: np.random.Generator,
            num_resamples: int) -> dict[str, Any]:
  """One point's metrics over R replicates.

  Args:
    per: each replicate's (metrics, entries) (`evaluate.recording_metrics(..., entries=True)`).
    rng: Generator of the hierarchical bootstrap.
    num_resamples: its resamples.

  Returns:
    The attack statistics of `eval.replicated.metrics` under their usual names (`auc`,
    `auc_ci_low/high`, `tpr_at_fpr_1e-3`, `_ci_low/_ci_high` = the reported interval, with
    `interval_method` and the per-replicate values `<name>_replicates`); counts summed
    (`SUMMED`); utility rates as the mean with the t-interval over replicates; every other
    number the mean over replicates; `replicates` = R; `conditional`: each replicate's
    single-training intervals (`CONDITIONAL`).
  """
  ms = [m for m, _ in per]
  out: dict[str, Any] = {}
  for name in ms[0]:
    if name in CONDITIONAL or any(name not in m for m in ms):
      continue
    values = [m[name] for m in ms]
    out[name] = (int(sum(int(v) for v in values)) if name in SUMMED else _mean(values))
  for name in UTILITY:
    if name in ms[0] and not any(math.isnan(float(m[name])) for m in ms):
      values = [float(m[name]) for m in ms]
      if len(values) > 1:
        _, out[f'{name}_ci_low'], out[f'{name}_ci_high'] = replicated.t_interval(
            values, bounds=(0.0, 1.0))
      out[f'{name}_replicates'] = values
  out.update(replicated.metrics([e for _, e in per], rng=rng, num_resamples=num_resamples))
  for name in ATTACK:
    out[f'{name}_ci_low'], out[f'{name}_ci_high'] = out[f'{name}_low'], out[f'{name}_high']
  out['replicates'] = len(per)
  out['conditional'] = [{k: m[k] for k in CONDITIONAL + ATTACK if k in m} for m in ms]
  return out


# The paper's ordering claims at low FPR: (winner, losers), FedMIA with the paper's filter
# (no suffix) and with ours (leave-one-out) beside it.
_LOO = '@leave_one_out'
ORDERING = tuple((w + f, losers) for w, losers in (
    ('fedmia_ii', ('grad_cosine', 'avg_cosine')), ('fedmia_i', ('blackbox_loss', 'loss_series')))
                 for f in ('', _LOO))
# Beside the paper's claims, FedMIA-II (both filters) against the state of the art.
STATE_OF_THE_ART = tuple((w, ('lira_offline', 'lira_offline_fixed', 'lira_online',
                              'lira_online_fixed', 'rmia'))
                         for w in ('fedmia_ii', 'fedmia_ii' + _LOO))


# The scored entries `eval.replicated` pools (`evaluate.final_scores`' names).
_ENTRIES = ('scores', 'labels', 'target', 'groups')


class Scored:
  """The main trainings' aligned scored entries, kept from point scoring for the figure phase.

  Point scoring (`fedmia.plan`) ranks every main-setting attack's aligned entries on every
  replicate; the claims (`claims`), the rounds curves and the ROC then score the same
  recordings the same way (aligned scoring draws nothing), so they read them here instead of
  scoring again (the default run's figure phase: 21.6 s before, 10-12 s with it, 2 cores). A
  resumed run, whose points came from results.json, finds nothing here and scores again: the
  same numbers (`tests/experiments/test_fedmia_replicates.py`).
  """

  def __init__(self):
    self._kept: dict[tuple[str, str, int], dict] = {}

  def put(self, model: str, attack: str, replicate: int, entries: dict) -> None:
    """Keeps `evaluate`'s `entries_out` of an aligned main-setting point; the per-round scores
    [R, N] only for replicate 0, the one the figures draw."""
    kept = {k: entries[k] for k in _ENTRIES}
    if int(replicate) == 0:
      kept['round_scores'] = entries['round_scores']
    self._kept[(model, attack, int(replicate))] = kept

  def keep(self, tr: dict, attack: str, scoring: str, per: list[tuple[dict, dict]]) -> None:
    """Keeps a point's replicates (`fedmia.point_metrics`' (metrics, entries)) when the
    figure phase reads them: an aligned point of a main training."""
    if tr['sweep'] == 'main' and scoring == 'aligned':
      for r, (_, entries) in enumerate(per):
        self.put(tr['model'], attack, r, entries)

  def get(self, model: str, attack: str, replicate: int) -> dict | None:
    return self._kept.get((model, attack, int(replicate)))

  def aligned(self, model: str, attack: str, scoring: str) -> dict | None:
    """Replicate 0's kept scores, for the figures; None for another scoring."""
    return self.get(model, attack, 0) if scoring == 'aligned' else None

  def entries(self, model: str, attack: str, replicate: int) -> dict | None:
    """The kept entries as `eval.replicated` takes them, or None."""
    kept = self.get(model, attack, replicate)
    return None if kept is None else {k: kept[k] for k in _ENTRIES}


def _entries(config, rec: dict, attack: str) -> dict:
  s = config.fedmia
  single = list(np.asarray(rec['rounds']) + 1).index(int(s.single_round))
  f = evaluate_lib.final_scores(
      rec, rec['owner'], attack, scoring='aligned', single_index=single,
      default_filter=s.outlier_filter, rmia_gamma=float(s.rmia_gamma), rmia_a=float(s.rmia_a))
  return {k: f[k] for k in _ENTRIES}


def claims(config, key, records: dict, scored: Scored | None = None) -> dict[str, list[dict]]:
  """Paired comparisons over the replicated main trainings: {model: [{winner, loser, ...}]}.

  Each claim of ORDERING and STATE_OF_THE_ART whose two attacks are in `fedmia.attacks`,
  scored aligned on the same entries of every replicate (`records`: {model: [recording of
  replicate r]}), as `eval.replicated.compare` (A - B in AUC and TPR@0.1% FPR: per-replicate
  differences, their t-interval and the hierarchical bootstrap with the same resamples for
  both, `bootstrap_resamples` of them, from a Generator keyed by the pair and model). The
  entries come from `scored` where point scoring kept them, else are scored here. A model's
  claims, AUC and TPR, are one family: each row also carries `family_size` and the
  Holm-adjusted `auc_p_holm` / `auc_verdict_holm`, `tpr_p_holm` / `tpr_verdict_holm`
  (`eval.replicated.holm_family`, p-values from the per-replicate t statistics).
  """
  s = config.fedmia
  out = {}
  for model, recs in records.items():
    rows, cache = [], {}

    def entries(attack, recs=recs, cache=cache, model=model):
      if attack not in cache:
        cache[attack] = [(scored and scored.entries(model, attack, r))
                         or _entries(config, rec, attack) for r, rec in enumerate(recs)]
      return cache[attack]

    for winner, losers in ORDERING + STATE_OF_THE_ART:
      for loser in (l for l in losers if winner in s.attacks and l in s.attacks):
        rng = data_lib.rng_from_key(point_key(key, {'claim': winner, 'versus': loser,
                                                   'model': model}))
        result = replicated.compare(entries(winner), entries(loser), rng=rng,
                                    num_resamples=int(s.bootstrap_resamples))
        rows.append(dict(winner=winner, loser=loser, **result))
    # One model's claims are one family (its table): Holm over all of them, AUC and TPR.
    out[model] = replicated.holm_family(rows)
  return out


def _holm(r: dict, q: str) -> str:
  """A row's Holm-adjusted verdict; rows written before it was computed have none."""
  return r.get(f'{q}_verdict_holm', 'not computed (run before Holm)')


def claim_lines(config, rows: list[dict]) -> list[str]:
  """Markdown of `claims`' rows: unadjusted verdicts from each claim's interval and, beside
  them, Holm-adjusted verdicts over the family of all the rows' AUC and TPR claims."""
  if not rows:
    return []
  s = config.fedmia
  r0 = rows[0]
  m = 2 * len(rows)
  lines = ['### Claims as paired differences (aligned)', '',
           f'A minus B on the same members and non-members of {r0["num_trainings"]} replicated '
           'trainings: the mean of the per-replicate differences with a 95% interval '
           f'({METHODS.get(r0["interval_method"], r0["interval_method"])}; '
           "each training's threshold chosen on its own entries): the paper's claims "
           '(FedMIA-II over Grad-Cosine and Avg-Cosine, FedMIA-I over Blackbox-Loss and '
           'Loss-Series) and '
           "FedMIA-II against LiRA and RMIA, each for FedMIA with the paper's filter and with "
           f'ours (leave-one-out). The {m} verdicts form one family. The "verdict" columns '
           'are each at 95% alone, not adjusted for it: they are exploratory; with no '
           f'difference anywhere about {0.05 * m:.1f} of them would read "better" or "worse" '
           'by chance. The "Holm" columns adjust the whole family (Holm 1979, two-sided '
           "p-values of the same per-replicate t statistics, family-wise 95%). An interval of "
           'zero width (replicates that agree) supports no verdict: "not estimable".', '',
           '| A | B | AUC A | AUC B | A - B, AUC [95%] | verdict (AUC) | Holm (AUC) | '
           'TPR@0.1% A | TPR@0.1% B | A - B, TPR@0.1% (points) [95%] | verdict (TPR@0.1%) | '
           'Holm (TPR@0.1%) |',
           '|' + '---|' * 12]
  for r in rows:
    f = lambda name, r=r: float(r[name])  # pylint: disable=unnecessary-lambda-assignment
    lines.append(
        f'| {scores_lib.label(r["winner"], s.outlier_filter)} | '
        f'{scores_lib.label(r["loser"], s.outlier_filter)} | {f("auc_a"):.3f} | '
        f'{f("auc_b"):.3f} | {f("auc_diff"):+.3f} [{f("auc_diff_low"):+.3f}, '
        f'{f("auc_diff_high"):+.3f}] | {paired.verdict(f("auc_diff_low"), f("auc_diff_high"))} | '
        f'{_holm(r, "auc")} | '
        f'{100 * f("tpr_a"):.2f} | {100 * f("tpr_b"):.2f} | '
        f'{100 * f("tpr_diff"):+.2f} [{100 * f("tpr_diff_low"):+.2f}, '
        f'{100 * f("tpr_diff_high"):+.2f}] | '
        f'{paired.verdict(f("tpr_diff_low"), f("tpr_diff_high"))} | {_holm(r, "tpr")} |')
  return lines + ['']
