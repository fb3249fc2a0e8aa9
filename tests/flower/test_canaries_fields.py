"""`flower.canaries`: every field of an audit, every threat's statistic and the one-shot fit,
by hand on synthetic runs (no deployment, except the last test's).

Written from the mutation run's survivors (docs/testing.md): the deployment tests see the
bounds move, not which inputs, deltas, confidences, keys and weights reach them.
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax
import numpy as np
import pytest

from flwr.clientapp import ClientApp

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canaries
from fl_privacy.flower.audits import canary_deploy
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import tables

KEY = jax.random.key(11)
_BOUNDS = ('epsilon_one_run', 'epsilon_one_run_fdp')
DESIGN = canary_design.Design(num_canaries=120, num_real=8, num_rounds=3, dimension=512,
                              num_null=200, confidence=0.9)


def _setting(wrapper, **kw):
  return dp_setting.Setting(wrapper, wrapper, **kw)


def _run(design, key, *, signal=1.0, clips=None, stated_flower=math.nan, local=False):
  """A run as `deploy` returns it: each round's aggregate moves `signal` along every included
  canary, plus noise; LocalDpMod's upload projections likewise, per canary and round."""
  rng = np.random.default_rng(3)
  included, dirs = canary_design.canary_draws(jax.random.fold_in(key, 0), design)
  t, d, m = int(design.num_rounds), int(design.dimension), int(design.num_canaries)
  steps = signal * (included @ dirs)[None, :] + rng.normal(size=(t, d))
  models = np.concatenate([rng.normal(size=(1, d)), steps]).cumsum(axis=0)
  return dict(included=included, directions=dirs, models=models,
              clips=np.full(t + 1, math.nan) if clips is None else np.asarray(clips, float),
              upload_projections=(signal * included[None, :] + rng.normal(size=(t, m))
                                  if local else None),
              stated_flower=stated_flower, seconds=1.25, num_nodes=design.num_nodes)


def _hand_audit(setting, design, key, run):
  """What `audit` must report, from the functions it is made of."""
  eps, delta, source = canary_stats.stated(setting, design, run)
  inc = run['included']
  canary = canary_stats.scores(setting, run, run['directions'])
  null = canary_stats.scores(setting, run,
                             canary_design.null_directions(jax.random.fold_in(key, 3), design))
  want = dict(stated_epsilon=eps, stated_delta=delta, stated_epsilon_source=source,
              num_nodes=design.num_nodes, num_rounds=design.num_rounds,
              num_canaries=design.num_canaries, num_real=design.num_real,
              dimension=design.dimension, seconds=1.25, game_relation='zero_out',
              confidence=design.confidence, real_clients='fixed')
  want.update(canary_stats.exact_epsilons(setting, design, run, delta))
  # Every node every round: no sampling, every canary in all T rounds.
  t = design.num_rounds
  want.update(fraction_train=1.0, sample_size=design.num_nodes, sampling='none',
              adversary='server_knows_the_sample', rounds_per_canary_min=t,
              rounds_per_canary_median=float(t), rounds_per_canary_mean=float(t),
              rounds_per_canary_max=t, canaries_never_sampled=0)
  mus = canary_stats.canary_mus(setting, design, run, np.ones((t, design.num_canaries), bool))
  # Bonferroni over both one-run bounds of every threat with a statistic.
  threats = [t for t in canary_design.THREATS if t in canary]
  each = 1.0 - (1.0 - design.confidence) / (2 * len(threats))
  want.update(verdict_confidence=design.confidence, bound_confidence=each,
              counted_bounds=','.join(f'{t}/{b}' for t in threats for b in _BOUNDS))
  bounds = []
  for threat in threats:
    s = canary[threat]
    a = auditing.audit_scores(s[inc], s[~inc], delta=delta, confidence=each)
    nul = null.get(threat, s[~inc])
    fit = canary_stats.gaussian_fit(s[inc], nul, delta, confidence=design.confidence,
                                    rng=np.random.default_rng(np.asarray(jax.random.key_data(
                                    jax.random.fold_in(key, 4)), np.uint32)))
    for k in ('epsilon_one_run', 'epsilon_one_run_fdp', 'n_in', 'n_out'):
      want[f'{threat}/{k}'] = a[k]
    want.update({f'{threat}/{k}': v for k, v in fit.items()})
    want[f'{threat}/n_null'] = len(nul)
    want[f'{threat}/fit_n_in'] = int(inc.sum())
    want[f'{threat}/fit_mu_expected'] = float(np.mean(mus[threat][inc]))
    bounds += [a['epsilon_one_run'], a['epsilon_one_run_fdp']]
  want['best_bound'] = max(b for b in bounds if not math.isnan(b))
  return want


@pytest.mark.parametrize('wrapper, directions', [
    ('server_fixed', 'dirac'), ('server_adaptive', 'dirac'), ('local_dp', 'dirac'),
    ('client_fixed', 'random')])
def test_every_field_of_an_audit_by_hand(monkeypatch, wrapper, directions):
  design = dataclasses.replace(DESIGN, directions=directions)
  clips = [0.1, 0.08, 0.07, 0.05] if wrapper == 'server_adaptive' else None
  setting = _setting(wrapper, noise_multiplier=0.7, epsilon=1.5, delta=2e-5)
  run = _run(design, KEY, clips=clips, stated_flower=3.0, local=wrapper == 'local_dp')
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  m = canaries.audit(setting, design, KEY)
  want = _hand_audit(setting, design, KEY, run)
  for name, value in want.items():
    assert repr(m[name]) == repr(value), name
  # The fields that stand for both: the verdicts, the clip trajectory.
  assert m['privacy_violation'] == float(want['best_bound'] > want['stated_epsilon'])
  assert m['accountant_violation'] == float(max(
      want['exact_epsilon_all_iterates'], want['exact_epsilon_last_iterate'])
                                            > want['stated_epsilon'])
  if clips is None:
    assert not {'clip_first', 'clip_last', 'clips'} & set(m)
  else:
    assert (m['clip_first'], m['clip_last'], m['clips']) == (0.1, 0.05, clips)
  assert set(m) == set(want) | {'privacy_violation', 'accountant_violation'} | (
      set() if clips is None else {'clip_first', 'clip_last', 'clips'})
  # LocalDpMod's all-iterates null is its excluded canaries; the central ones' the null
  # directions (both threats).
  n_out = int((~run['included']).sum())
  if wrapper == 'local_dp':
    assert m['all_iterates/n_null'] == n_out and m['last_iterate/n_null'] == DESIGN.num_null
    assert m['stated_delta'] == pytest.approx(3 * 2e-5)
  else:
    assert m['all_iterates/n_null'] == m['last_iterate/n_null'] == DESIGN.num_null


def test_a_threat_without_a_statistic_is_left_out_not_the_ones_after_it(monkeypatch):
  """LocalDpMod without the canaries' uploads: no all-iterates statistic, the last iterate
  still audited."""
  setting = _setting('local_dp', epsilon=1.5)
  run = _run(DESIGN, KEY, local=False)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  m = canaries.audit(setting, DESIGN, KEY)
  assert not any(k.startswith('all_iterates/') for k in m)
  want = _hand_audit(setting, DESIGN, KEY, run)
  assert m['last_iterate/epsilon_one_run'] == want['last_iterate/epsilon_one_run']
  assert m['best_bound'] == want['best_bound']


def test_a_design_names_its_allowed_directions():
  with pytest.raises(ValueError, match=r"directions must be one of \('dirac', 'random'\) "
                                       r"\(got 'gauss'\)"):
    canary_design.Design(directions='gauss')
  assert canary_design.Design(directions='random', dimension=64).num_nodes == 512


def test_the_verdicts_flip_exactly_at_the_stated_epsilon(monkeypatch):
  setting = _setting('server_fixed', noise_multiplier=2.0)
  run = _run(DESIGN, KEY, signal=3.0)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  best = canaries.audit(setting, DESIGN, KEY)['best_bound']
  assert best > 0
  exact = canary_stats.exact_epsilons(setting, DESIGN, run, setting.delta)
  top = max(exact.values())
  for stated, violation, accountant in ((best, 0.0, float(top > best)),
                                        (best * (1 - 1e-6), 1.0, float(top > best * (1 - 1e-6))),
                                        (top, float(best > top), 0.0),
                                        (top * (1 - 1e-6), float(best > top * (1 - 1e-6)), 1.0)):
    run['stated_flower'] = stated
    m = canaries.audit(setting, DESIGN, KEY)
    assert (m['privacy_violation'], m['accountant_violation']) == (violation, accountant), stated


def _check_bonferroni_levels(monkeypatch, wrapper, uploads, k):
  """`audit_scores` (spied on) receives 1 - (1 - c) / k for each threat, k = 2 x the threats
  present, and the metrics name that family and those levels."""
  clips = [0.1, 0.08, 0.07, 0.05] if wrapper in dp_setting.ADAPTIVE else None
  run = _run(DESIGN, KEY, clips=clips, stated_flower=3.0, local=uploads)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, key, **_: run)
  seen = []
  real = auditing.audit_scores

  def spy(ins, outs, **kw):
    seen.append(kw['confidence'])
    return real(ins, outs, **kw)

  monkeypatch.setattr(auditing, 'audit_scores', spy)
  setting = _setting(wrapper, epsilon=1.5)
  m = canaries.audit(setting, DESIGN, KEY)
  level = {4: 0.975, 2: 0.95}[k]  # c = 0.9: 1 - 0.1 / 4, 1 - 0.1 / 2
  threats = canary_design.THREATS if k == 4 else ('last_iterate',)
  names = tuple(f'{t}/{b}' for t in threats for b in _BOUNDS)
  assert len(seen) == len(threats), seen  # one call per threat, both one-run bounds in it
  assert all(c == pytest.approx(level, abs=1e-12) for c in seen), seen
  assert m['bound_confidence'] == seen[0] and m['verdict_confidence'] == 0.9
  assert m['counted_bounds'] == ','.join(names)
  assert canary_stats.counted_bounds(setting, uploads) == names
  assert m['best_bound'] == max(m[n] for n in names)


@pytest.mark.parametrize('wrapper, uploads, k', [
    ('server_fixed', False, 4), ('client_fixed', False, 4), ('server_adaptive', False, 4),
    ('client_adaptive', False, 4), ('local_dp', True, 4), ('local_dp', False, 2)])
def test_the_counted_bounds_are_computed_at_the_bonferroni_level(monkeypatch, wrapper,
                                                                 uploads, k):
  """k counted bounds, two per threat model present (both count: every wrapper is Gaussian),
  each at 1 - (1 - c) / k: 97.5% at c = 0.9 with both threats, 95% for LocalDpMod without
  recorded uploads (last iterate only). The central wrappers' family does not depend on
  uploads (`uploads` False: they have none)."""
  _check_bonferroni_levels(monkeypatch, wrapper, uploads, k)


def _check_verdict_against_the_family_wise_bound(monkeypatch):
  """The verdict is the largest counted bound at 1 - (1 - c) / k against the stated epsilon,
  computed here from `audit_scores` (not read from the audit): a stated epsilon 0.1% below it
  is a violation, 0.1% above it is not (margins float rounding cannot cross), nor one between
  it and the largest of the same bounds each at c (what a per-bound verdict would read)."""
  setting = _setting('server_fixed', noise_multiplier=2.0)
  run = _run(DESIGN, KEY, signal=3.0)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  inc = run['included']
  statistic = canary_stats.scores(setting, run, run['directions'])

  def best_at(level):
    return max(auditing.audit_scores(statistic[t][inc], statistic[t][~inc],
                                     delta=setting.delta, confidence=level)[b]
               for t in canary_design.THREATS for b in _BOUNDS)

  tight = best_at(1.0 - (1.0 - DESIGN.confidence) / 4)
  loose = best_at(DESIGN.confidence)
  assert loose > 1.2 * tight > 0  # the correction matters at this size (5.49 vs 3.87)
  for label, stated, violation in (('just below', tight * 0.999, 1.0),
                                   ('just above', tight * 1.001, 0.0),
                                   ('between', 0.5 * (tight + loose), 0.0)):
    run['stated_flower'] = stated
    m = canaries.audit(setting, DESIGN, KEY)
    assert m['privacy_violation'] == violation, f'stated {label} the family-wise bound'
  assert m['best_bound'] == tight


def test_the_verdict_compares_the_family_wise_bounds_with_the_stated_epsilon(monkeypatch):
  _check_verdict_against_the_family_wise_bound(monkeypatch)


def test_a_verdict_on_bounds_each_at_the_stated_confidence_fails_both_checks(monkeypatch):
  """Mutation check: the audit as it was before issue 40 (every bound at c, the verdict on
  their largest: family-wise only at 1 - k (1 - c)), emulated by an `auditing` whose
  `audit_scores` drops the confidence `audit` passes for c, fails the level check and the
  verdict check (it flags a stated epsilon above the family-wise bound)."""
  real = auditing.audit_scores

  def per_bound(ins, outs, *, confidence, **kw):
    del confidence
    return auditing.audit_scores(ins, outs, confidence=DESIGN.confidence, **kw)

  monkeypatch.setattr(canary_stats, 'auditing', types.SimpleNamespace(
      **dict(vars(auditing), audit_scores=per_bound)))
  # It flags a stated epsilon above the family-wise bound (just above it, and between the
  # two bests): the verdict's own comparison fails, not the check's premise.
  with pytest.raises(AssertionError, match='stated just above the family-wise bound'):
    _check_verdict_against_the_family_wise_bound(monkeypatch)
  with pytest.raises(AssertionError):
    _check_bonferroni_levels(monkeypatch, 'server_fixed', False, 4)
  monkeypatch.setattr(auditing, 'audit_scores', real)
  monkeypatch.setattr(canary_stats, 'auditing', auditing)
  _check_verdict_against_the_family_wise_bound(monkeypatch)  # the audit itself passes


def test_the_training_table_states_the_levels_of_its_bounds_and_verdict(monkeypatch):
  """The table reads each point's `bound_confidence` and the family-wise
  `verdict_confidence`; a point stored before them is marked as bounds each at its
  `confidence`, a verdict that is not family-wise."""
  run = _run(DESIGN, KEY, local=True)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  m = canaries.audit(_setting('local_dp', epsilon=1.5), DESIGN, KEY)
  old = {k: v for k, v in m.items()
         if k not in ('verdict_confidence', 'bound_confidence', 'counted_bounds')}
  params = dict(setting='eps1.5', wrapper='local_dp', num_rounds=3)
  lines = tables.training_markdown([{'params': params, 'metrics': m}])
  text = '\n'.join(lines)
  assert 'at family-wise 90% (each of the k counted bounds at 1 - (1 - c) / k' in text
  assert 'per bound' not in text
  rows = [line for line in lines if line.startswith('| eps1.5 |')]
  assert len(rows) == 2 and all('| 97.5% |' in r for r in rows)
  mixed = '\n'.join(tables.training_markdown([{'params': params, 'metrics': m},
                                              {'params': params, 'metrics': old}]))
  assert '| 90% per bound |' in mixed and 'stored before the family-wise verdict' in mixed


def test_a_threat_missing_from_the_fixed_family_is_refused(monkeypatch):
  """The family (and k) is fixed before any score; statistics that do not match it stop the
  audit rather than change k after the fact."""
  run = _run(DESIGN, KEY)
  monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, **_: run)
  scores = canary_stats.scores
  monkeypatch.setattr(canary_stats, 'scores', lambda *a: {
      k: v for k, v in scores(*a).items() if k != 'all_iterates'})
  with pytest.raises(RuntimeError, match='not the ones counted'):
    canaries.audit(_setting('server_fixed'), DESIGN, KEY)


def test_an_audit_needs_canaries_in_both_worlds(monkeypatch):
  run = _run(DESIGN, KEY)
  for coins in (np.ones, np.zeros):
    run['included'] = coins(DESIGN.num_canaries, bool)
    monkeypatch.setattr(canary_deploy, 'deploy', lambda s, d, k, r=run, **_: r)
    with pytest.raises(ValueError, match='120 canaries gave no canary in one of the worlds'):
      canaries.audit(_setting('server_fixed'), DESIGN, KEY)


def test_each_threats_statistic_by_hand():
  t = DESIGN.num_rounds
  run = _run(DESIGN, KEY, clips=[0.4, 0.2, 0.1, 0.3], local=True)
  dirs = run['directions'][:5] * 0.5  # not unit: the projection is linear in them
  deltas = np.diff(run['models'], axis=0)
  last = dirs @ (run['models'][-1] - run['models'][0])
  fixed = canary_stats.scores(_setting('client_fixed'), run, dirs)
  assert set(fixed) == set(canary_design.THREATS)
  np.testing.assert_allclose(fixed['last_iterate'], last, rtol=1e-12)
  np.testing.assert_allclose(fixed['all_iterates'], sum(dirs @ deltas[i] for i in range(t)),
                             rtol=1e-12)
  # Adaptive: round t weighted C_(t-1) / C_t^2, normalised to mean 1.
  w = np.array([0.4 / 0.2 ** 2, 0.2 / 0.1 ** 2, 0.1 / 0.3 ** 2])
  w = w / w.mean()
  for wrapper in dp_setting.ADAPTIVE:
    adaptive = canary_stats.scores(_setting(wrapper), run, dirs)
    np.testing.assert_allclose(adaptive['all_iterates'],
                               sum(w[i] * (dirs @ deltas[i]) for i in range(t)), rtol=1e-12)
    np.testing.assert_allclose(adaptive['last_iterate'], last, rtol=1e-12)
  # LocalDpMod: every upload of the canaries themselves; other directions have none.
  local = canary_stats.scores(_setting('local_dp'), run, run['directions'])
  np.testing.assert_allclose(local['all_iterates'], run['upload_projections'].sum(axis=0),
                             rtol=1e-12)
  other = canary_stats.scores(_setting('local_dp'), run, run['directions'].copy())
  assert set(other) == {'last_iterate'}
  no_uploads = canary_stats.scores(_setting('local_dp'), dict(run, upload_projections=None),
                                   run['directions'])
  assert set(no_uploads) == {'last_iterate'}


def test_stated_epsilon_per_wrapper_by_hand():
  run = {'stated_flower': 4.25}
  s = _setting('client_fixed', delta=3e-6)
  assert canary_stats.stated(s, DESIGN, run) == (4.25, 3e-6, 'flwr RdpAccountant (privacy_spent)')
  for wrapper in dp_setting.ADAPTIVE:
    eps, delta, source = canary_stats.stated(_setting(wrapper, noise_multiplier=0.8, delta=3e-6),
                                             DESIGN, run)
    assert eps == dp_setting.flower_rdp_epsilon(0.8, DESIGN.num_nodes, 3e-6, rounds=3)
    assert eps != dp_setting.flower_rdp_epsilon(0.8, DESIGN.num_nodes, 3e-6, rounds=1)
    assert delta == 3e-6 and source.startswith('flwr RdpAccountant at z over the rounds')
  eps, delta, source = canary_stats.stated(_setting('local_dp', epsilon=1.5, delta=3e-6), DESIGN,
                                           run)
  assert (eps, delta) == (4.5, pytest.approx(9e-6))
  assert source == 'LocalDpMod epsilon x rounds (basic composition, at rounds x delta)'


def test_null_directions_are_unit_never_inserted_and_keyed():
  dirac = canary_design.null_directions(KEY, DESIGN)
  np.testing.assert_array_equal(dirac, np.eye(512)[120:320])
  random_design = dataclasses.replace(DESIGN, directions='random')
  a = canary_design.null_directions(KEY, random_design)
  assert a.shape == (200, 512) and a.dtype == np.float64
  np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-12)
  np.testing.assert_array_equal(a, canary_design.null_directions(KEY, random_design))
  b = canary_design.null_directions(jax.random.fold_in(KEY, 1), random_design)
  assert np.abs(a @ b.T).max() < 0.3  # other directions, near-orthogonal in 512 dimensions
  # Independent Gaussian directions: each coordinate's mean square is 1 / d.
  assert np.mean(a ** 2) == pytest.approx(1 / 512, rel=1e-9)
  assert abs(np.mean(a)) < 5 / math.sqrt(a.size)


def test_gaussian_fit_by_hand_and_its_interval_covers_mu():
  rng = np.random.default_rng(5)
  mu, n = 1.5, 4000
  inside, null = rng.normal(mu, 1.0, n) * 2 + 7, rng.normal(0, 1.0, n) * 2 + 7
  fit = canary_stats.gaussian_fit(inside, null, 1e-5, rng=np.random.default_rng(1), bootstrap=300,
                                  confidence=0.9)
  want_mu = (inside.mean() - null.mean()) / null.std()
  assert fit['fit_mu'] == pytest.approx(want_mu, rel=1e-12)
  assert fit['epsilon_fit'] == auditing.gdp_epsilon(want_mu, 1e-5)
  assert fit['fit_in_std_over_null_std'] == pytest.approx(inside.std() / null.std(), rel=1e-12)
  # The percentile interval of mu: about mu +- 1.645 se, se^2 ~ (1 + 1 + mu^2 / 2) / n
  # (the delta method: the two means and the null's sd).
  se = math.sqrt((2 + mu ** 2 / 2) / n)
  assert fit['fit_mu_ci_low'] < want_mu < fit['fit_mu_ci_high']
  assert fit['fit_mu_ci_high'] - fit['fit_mu_ci_low'] == pytest.approx(2 * 1.645 * se, rel=0.2)
  # Each end at its own quantile: at 50% confidence, mu -+ 0.674 se (2000 resamples: the
  # 25% quantile's error is about 5% of that distance).
  half = canary_stats.gaussian_fit(inside, null, 1e-5, rng=np.random.default_rng(2), bootstrap=2000,
                                   confidence=0.5)
  assert want_mu - half['fit_mu_ci_low'] == pytest.approx(0.674 * se, rel=0.15)
  assert half['fit_mu_ci_high'] - want_mu == pytest.approx(0.674 * se, rel=0.15)
  # The Generator given is the one drawn from; 1000 resamples by default.
  assert canary_stats.gaussian_fit(inside, null, 1e-5, rng=np.random.default_rng(1),
                                   bootstrap=20) != canary_stats.gaussian_fit(inside, null, 1e-5,
                                                                          bootstrap=20)
  assert canary_stats.gaussian_fit(inside[:300], null[:300], 1e-5) == canary_stats.gaussian_fit(
      inside[:300], null[:300], 1e-5, bootstrap=1000)
  assert fit['epsilon_fit_ci_low'] == auditing.gdp_epsilon(fit['fit_mu_ci_low'], 1e-5)
  assert fit['epsilon_fit_ci_high'] == auditing.gdp_epsilon(fit['fit_mu_ci_high'], 1e-5)
  wider = canary_stats.gaussian_fit(inside, null, 1e-5, rng=np.random.default_rng(1), bootstrap=300,
                                    confidence=0.99)
  assert wider['fit_mu_ci_high'] - wider['fit_mu_ci_low'] > 1.3 * (
      fit['fit_mu_ci_high'] - fit['fit_mu_ci_low'])
  # Both samples are resampled: fewer of either widens the interval.
  def width(a, b):
    f = canary_stats.gaussian_fit(a, b, 1e-5, bootstrap=200)
    return f['fit_mu_ci_high'] - f['fit_mu_ci_low']
  assert width(inside[:40], null[:400]) > 1.5 * width(inside[:400], null[:400])
  assert width(inside[:400], null[:40]) > 1.5 * width(inside[:400], null[:400])
  # Seeded by default; no interval without resamples; a negative mu is epsilon 0.
  assert canary_stats.gaussian_fit(inside, null, 1e-5, bootstrap=20) == canary_stats.gaussian_fit(
      inside, null, 1e-5, rng=np.random.default_rng(0), bootstrap=20)
  bare = canary_stats.gaussian_fit(null, inside, 1e-5, bootstrap=0)
  assert set(bare) == {'fit_mu', 'epsilon_fit', 'fit_in_std_over_null_std'}
  assert bare['fit_mu'] < 0 and bare['epsilon_fit'] == auditing.gdp_epsilon(0.0, 1e-5)
  low = canary_stats.gaussian_fit(null, inside, 1e-5, bootstrap=50)
  assert low['epsilon_fit_ci_low'] == low['epsilon_fit_ci_high'] == auditing.gdp_epsilon(0.0,
                                                                                         1e-5)


def test_the_server_reads_each_canary_upload_on_its_direction():
  """LocalDpMod at a huge epsilon (noise ~1e-7): round t's projection of canary i's upload is
  C when included (its canary_norm C update clipped by the mod), 1e-6 C otherwise; every
  round and canary, nothing else."""
  design = dataclasses.replace(DESIGN, num_canaries=24, num_null=8, num_real=4, dimension=64)
  setting = _setting('local_dp', clipping_norm=0.5, sensitivity=0.5, epsilon=1e7)
  run = canary_deploy.deploy(setting, design, KEY)
  proj = run['upload_projections']
  assert proj.shape == (3, 24) and not np.isnan(proj).any()
  want = np.where(run['included'], 0.5, canary_design.IDLE * 0.5)
  np.testing.assert_allclose(proj, np.broadcast_to(want, proj.shape), atol=1e-5)


def test_exact_epsilons_by_hand_for_every_kind_of_wrapper():
  """`exact_epsilons` against mu-GDP computed here, at settings where z != 1 and the clips
  move, so each formula's factors are seen (T = 3 rounds, n = 64 nodes, delta 1e-5)."""
  delta, t, n = 1e-5, DESIGN.num_rounds, DESIGN.num_nodes
  for wrapper in ('server_fixed', 'client_fixed'):
    out = canary_stats.exact_epsilons(_setting(wrapper, noise_multiplier=2.0), DESIGN, {}, delta)
    want = auditing.gdp_epsilon(math.sqrt(t) / 2.0, delta)
    assert out == {'exact_epsilon_all_iterates': pytest.approx(want, rel=1e-12),
                   'exact_epsilon_last_iterate': pytest.approx(want, rel=1e-12)}
  s = _setting('server_adaptive', noise_multiplier=0.5, clipped_count_stddev=8.0)
  clips = np.array([0.1, 0.2, 0.15, 0.3])  # C_0 .. C_T
  out = canary_stats.exact_epsilons(s, DESIGN, {'clips': clips}, delta)
  std_b, z = dp_setting.adaptive_noise(dataclasses.replace(s, num_sampled_clients=n))
  per_round = [0.1 / (z * 0.2), 0.2 / (z * 0.15), 0.15 / (z * 0.3)]
  mu_all = math.sqrt(sum(m * m for m in per_round))
  mu_last = (0.1 + 0.2 + 0.15) / (z * math.sqrt(0.2 ** 2 + 0.15 ** 2 + 0.3 ** 2))
  assert out['exact_epsilon_all_iterates'] == pytest.approx(
      auditing.gdp_epsilon(mu_all, delta), rel=1e-12)
  assert out['exact_epsilon_last_iterate'] == pytest.approx(
      auditing.gdp_epsilon(mu_last, delta), rel=1e-12)
  assert out['exact_epsilon_with_counts'] == pytest.approx(
      auditing.gdp_epsilon(math.sqrt(mu_all ** 2 + t / std_b ** 2), delta), rel=1e-12)
  assert out['exact_epsilon_as_claimed'] == pytest.approx(
      auditing.gdp_epsilon(math.sqrt(t) / 0.5, delta), rel=1e-12)
  assert (out['noise_multiplier_aggregate'], out['clipped_count_stddev']) == (z, std_b)
  local = _setting('local_dp', clipping_norm=0.5, sensitivity=0.5, epsilon=2.0, delta=1e-5)
  out = canary_stats.exact_epsilons(local, DESIGN, {}, delta)
  sigma = dp_setting.local_dp_std(0.5, 2.0, 1e-5)
  mu = math.sqrt(t) * 0.5 / sigma
  assert out['exact_epsilon_all_iterates'] == pytest.approx(auditing.gdp_epsilon(mu, delta),
                                                             rel=1e-12)
  assert out['exact_epsilon_last_iterate'] == pytest.approx(
      auditing.gdp_epsilon(mu / math.sqrt(n), delta), rel=1e-12)


def test_build_strategy_hands_flower_every_setting_field():
  design = dataclasses.replace(DESIGN, num_canaries=8, num_real=4, dimension=64, num_null=8)
  nodes, dirs = list(range(4, 12)), np.eye(8, 64)
  kw = dict(clipping_norm=0.3, noise_multiplier=0.7, target_clipped_quantile=0.3,
            clip_norm_lr=0.1, clipped_count_stddev=2.5)
  for wrapper in dp_setting.WRAPPERS:
    st = canary_deploy.build_strategy(_setting(wrapper, **kw), design, nodes, dirs)
    inner = getattr(st, 'strategy', st)
    assert (inner.fraction_train, inner.fraction_evaluate, inner.min_train_nodes,
            inner.min_available_nodes) == (1.0, 0.0, 12, 12), wrapper
    if wrapper == 'local_dp':
      assert isinstance(st, canary_deploy._Uploads) and st.canary_nodes == {n: i for i, n in
                                                                            enumerate(nodes)}
      continue
    assert (st.clipping_norm, st.num_sampled_clients) == (0.3, 12), wrapper
    if wrapper in dp_setting.ADAPTIVE:
      assert (st.target_clipped_quantile, st.clip_norm_lr, st.clipped_count_stddev) == (
          0.3, 0.1, 2.5), wrapper
    else:
      assert st.noise_multiplier == 0.7 and st.accountant is not None


def test_random_canaries_are_float64_unit_rows_and_real_updates_fit_every_node_count():
  design = dataclasses.replace(DESIGN, directions='random', num_canaries=30)
  included, dirs = canary_design.canary_draws(KEY, design)
  assert included.dtype == bool and dirs.dtype == np.float64 and dirs.shape == (30, 512)
  np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0, rtol=1e-6)
  for k in (0, 1, 3):
    real = canary_design.real_updates(KEY, dataclasses.replace(DESIGN, num_real=k))
    assert real.shape == (3, k, 512)
    np.testing.assert_allclose(np.linalg.norm(real, axis=-1),
                               np.broadcast_to(np.linspace(0.5, 2.0, k), (3, k)), rtol=1e-9)


_TINY = dataclasses.replace(DESIGN, num_canaries=6, num_null=4, num_real=2, dimension=32)


def test_a_deployment_reports_its_models_in_float64_its_nodes_and_its_time():
  run = canary_deploy.deploy(_setting('server_fixed'), _TINY, KEY)
  assert run['models'].dtype == np.float64 and run['models'].shape == (4, 32)
  assert not run['models'][0].any()
  assert run['num_nodes'] == 8 and 0 < run['seconds'] < 300


def test_a_client_error_stops_the_audit_naming_what_the_deployment_lost(monkeypatch):
  """Not a run that lost rounds scored as if complete: every lost reply is named."""
  def broken_app(*args, **kwargs):
    del args, kwargs
    app = ClientApp()

    @app.train()
    def train(msg, context):
      del msg, context
      raise KeyError('canary node failed')
    return app

  monkeypatch.setattr(canary_deploy, 'client_app', broken_app)
  with pytest.raises(jobs.EngineError, match=r'lost \d+ replies \(round, partition\): '
                     r'\[\(1, 0\), \(1, 1\)'):
    canary_deploy.deploy(_setting('server_fixed'), _TINY, KEY)


def test_a_deployment_that_released_too_few_models_is_refused(monkeypatch):
  real_build = canary_deploy.build_strategy

  def two_rounds_released(*args):
    strategy = real_build(*args)
    real_start = strategy.start

    def start(grid, initial, *, num_rounds, evaluate_fn):
      calls = []   # the initial model and round 1's reach the observer, not rounds 2 and 3
      return real_start(grid, initial, num_rounds=num_rounds,
                        evaluate_fn=lambda r, a: calls.append(r) or (
                            evaluate_fn(r, a) if len(calls) <= 2 else None))
    strategy.start = start
    return strategy

  monkeypatch.setattr(canary_deploy, 'build_strategy', two_rounds_released)
  with pytest.raises(RuntimeError, match='^1 of 3 rounds released a model$'):
    canary_deploy.deploy(_setting('server_fixed'), _TINY, KEY)



def test_a_small_null_whose_resample_repeats_one_value_still_gets_an_interval():
  """With 3 null scores, 1 in 9 resamples repeats one value (no spread): left out, not a
  ZeroDivisionError (the engine tests' 4-node deployments have so few)."""
  fit = canary_stats.gaussian_fit(np.asarray([2.0, 2.5]), np.asarray([0.0, 0.5, 1.0]), 1e-5,
                                  rng=np.random.default_rng(0), bootstrap=200)
  assert np.isfinite(fit['fit_mu']) and fit['fit_mu'] > 0
  assert np.isfinite(fit['fit_mu_ci_low']) and fit['fit_mu_ci_low'] <= fit['fit_mu_ci_high']
