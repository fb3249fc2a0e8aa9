"""`flower.canaries` with client sampling (`fraction_train` < 1) and trained real nodes
(`real_clients` 'trained'): who Flower samples, the statistic over a canary's sampled rounds
by hand, the exact epsilon of the canary sampled most, the defaults untouched, the digits
MLP trained by the real nodes, and the new fields' validation (in-process engine, tiny
designs)."""

from __future__ import annotations

import dataclasses
import math
import pickle

import jax
import numpy as np
import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.eval import auditing
from fl_privacy.fl import losses
from fl_privacy.flower.audits import canaries
from fl_privacy.flower.audits import canary_deploy
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import config_checks as cc
from tests.experiments import cli

KEY = jax.random.key(23)
# 16 nodes, half of them a round: k = 8; each canary in 0..4 of the T = 4 rounds.
TINY = canary_design.Design(num_canaries=12, num_real=4, num_rounds=4, dimension=40, num_null=8,
                            confidence=0.9, fraction_train=0.5)


def _setting(wrapper, **kw):
  kw.setdefault('clipping_norm', 0.1 if wrapper in dp_setting.ADAPTIVE else 1.0)
  return dp_setting.Setting(wrapper, wrapper, **kw)


# ------------------------------------------------------------------------ who is sampled ---

def test_flower_samples_k_of_n_nodes_a_round_and_only_they_move_the_model():
  """FedAvg trains k = int(n q) = 8 of the 16 nodes a round, a fresh draw each round; with
  almost no noise (z = 1e-6) round t moves canary coordinate i by C / k exactly when it
  sampled canary i and its coin is in (the excluded one's 1e-6 C / k is below the tolerance),
  and not at all otherwise: the recorded sample is the one that ran."""
  run = canary_deploy.deploy(_setting('server_fixed', noise_multiplier=1e-6), TINY, KEY)
  sampled, part = run['sampled'], run['participation']
  assert sampled.shape == (4, 16) and sampled.dtype == bool
  np.testing.assert_array_equal(sampled.sum(axis=1), [8, 8, 8, 8])
  np.testing.assert_array_equal(part, sampled[:, 4:])
  assert len({row.tobytes() for row in sampled}) > 1  # not the same nodes every round
  moved = np.diff(run['models'], axis=0)[:, :12]
  want = part * run['included'][None, :] * (1.0 / 8)
  np.testing.assert_allclose(moved, want, atol=1e-6)


def test_the_wrappers_get_k_and_flower_states_no_amplification():
  """Every wrapper is told k = 8 sampled clients; FedAvg's fraction and minimum give exactly
  k; Flower's accountant (no amplification) states the same epsilon at q = 1/2 as at q = 1:
  T Gaussian releases at z over the population n."""
  nodes, dirs = list(range(4, 16)), np.eye(12, 40)
  for wrapper in dp_setting.WRAPPERS:
    # Flower's default count std k / 20 = 0.4 refuses z = 1 at k = 8.
    st = canary_deploy.build_strategy(_setting(wrapper, clipped_count_stddev=2.0), TINY, nodes,
                                      dirs)
    inner = getattr(st, 'strategy', st)
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (
        0.5, 8, 16), wrapper
    assert int(16 * inner.fraction_train) == TINY.sample_size == 8
    if wrapper != 'local_dp':
      assert st.num_sampled_clients == 8, wrapper
  half = canary_deploy.deploy(_setting('client_fixed', noise_multiplier=0.8), TINY, KEY)
  full = canary_deploy.deploy(_setting('client_fixed', noise_multiplier=0.8),
                              dataclasses.replace(TINY, fraction_train=1.0), KEY)
  want = dp_setting.flower_rdp_epsilon(0.8, 16, 1e-5, rounds=4)
  assert half['stated_flower'] == pytest.approx(want, rel=1e-9)
  assert full['stated_flower'] == pytest.approx(want, rel=1e-9)
  assert full['sampled'].all()


# ----------------------------------------------------------------- the statistic by hand ---

def _hand_fixed(run, dirs, rounds):
  """Fixed clipping: the sum of <aggregate_t - model_(t-1), v> over the direction's rounds,
  over sqrt(its rounds); the last iterate over sqrt(T); 0 without a round."""
  deltas = np.diff(run['models'], axis=0)
  t = len(deltas)
  all_it, last = [], []
  for j, v in enumerate(dirs):
    own = [s for s in range(t) if rounds[s, j]]
    if not own:
      all_it.append(0.0)
      last.append(0.0)
      continue
    all_it.append(sum(float(deltas[s] @ v) for s in own) / math.sqrt(len(own)))
    last.append(float((run['models'][-1] - run['models'][0]) @ v) / math.sqrt(t))
  return np.asarray(all_it), np.asarray(last)


def test_the_audit_scores_each_canary_on_its_sampled_rounds_only():
  """A tiny deployment at q = 1/2, audited; its statistic, bounds and fit recomputed here
  from the models and the recorded sample."""
  setting = _setting('server_fixed', noise_multiplier=0.5)
  run = canary_deploy.deploy(setting, TINY, KEY)
  part, inc = run['participation'], run['included']
  counts = part.sum(axis=0)
  assert counts.min() < counts.max()  # canaries in different numbers of rounds
  assert (inc & (counts == 0)).any()  # an included canary never sampled: not in the fit
  all_it, last = _hand_fixed(run, run['directions'], part)
  got = canary_stats.scores(setting, run, run['directions'], part)
  np.testing.assert_allclose(got['all_iterates'], all_it, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(got['last_iterate'], last, rtol=1e-10, atol=1e-12)
  # Sampling matters here: every round's sum ranks the canaries otherwise.
  unsampled = run['directions'] @ np.diff(run['models'], axis=0).sum(axis=0)
  assert not np.allclose(all_it * np.sqrt(np.maximum(counts, 1)), unsampled)
  # The audit reads exactly these scores (the null: every round, standardised alike).
  m = canaries.audit(setting, TINY, KEY)
  null_dirs = canary_design.null_directions(jax.random.fold_in(KEY, 3), TINY)
  null_all, null_last = _hand_fixed(run, null_dirs, np.ones((4, 8), bool))
  taken = counts > 0
  for threat, s, nul in (('all_iterates', all_it, null_all), ('last_iterate', last, null_last)):
    a = auditing.audit_scores(s[inc], s[~inc], delta=1e-5, confidence=m['bound_confidence'])
    assert m[f'{threat}/epsilon_one_run'] == pytest.approx(a['epsilon_one_run'], abs=1e-12)
    assert (m[f'{threat}/n_in'], m[f'{threat}/n_out']) == (inc.sum(), (~inc).sum())
    fit = canary_stats.gaussian_fit(s[inc & taken], nul, 1e-5, confidence=0.9, bootstrap=0)
    assert m[f'{threat}/fit_mu'] == pytest.approx(fit['fit_mu'], rel=1e-9)
    assert m[f'{threat}/fit_n_in'] == int((inc & taken).sum())
  # What the metrics say of the sampling, and the canary sampled most's exact epsilon.
  assert (m['sampling'], m['adversary'], m['fraction_train'], m['sample_size']) == (
      'fixed_size_without_replacement', 'server_knows_the_sample', 0.5, 8)
  assert (m['rounds_per_canary_min'], m['rounds_per_canary_max'],
          m['rounds_per_canary_median'], m['canaries_never_sampled']) == (
              counts.min(), counts.max(), float(np.median(counts)), int(np.sum(counts == 0)))
  assert m['exact_epsilon_all_iterates'] == pytest.approx(
      auditing.gdp_epsilon(math.sqrt(counts.max()) / 0.5, 1e-5), rel=1e-12)
  assert m['exact_epsilon_last_iterate'] == pytest.approx(
      auditing.gdp_epsilon(counts.max() / (0.5 * 2.0), 1e-5), rel=1e-12)
  assert m['stated_epsilon'] == pytest.approx(dp_setting.flower_rdp_epsilon(0.5, 16, 1e-5, 4))


def _synthetic_run(rng, t=4, m=6, d=10, clips=None):
  return dict(models=rng.normal(size=(t + 1, d)).cumsum(axis=0),
              clips=np.full(t + 1, math.nan) if clips is None else np.asarray(clips, float),
              directions=np.eye(m, d), upload_projections=rng.normal(size=(t, m)))


def test_adaptive_and_local_dp_statistics_over_sampled_rounds_by_hand():
  """Adaptive: round t weighted w_t = C_(t-1) / C_t^2 (mean 1), its noise std C_t, the sum
  over the rounds divided by sqrt(sum w_t^2 C_t^2) over them; LocalDpMod: the canary's own
  uploads over sqrt(T_i)."""
  rng = np.random.default_rng(4)
  clips = [0.4, 0.2, 0.1, 0.3, 0.25]
  run = _synthetic_run(rng, clips=clips)
  rounds = np.array([[1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 1], [0, 1, 0, 0, 1, 1],
                     [1, 0, 0, 0, 0, 1]], bool)
  c = np.asarray(clips)
  w = c[:-1] / c[1:] ** 2
  w = w / w.mean()
  deltas = np.diff(run['models'], axis=0)
  for wrapper in dp_setting.ADAPTIVE:
    got = canary_stats.scores(_setting(wrapper), run, run['directions'], rounds)
    for i in range(6):
      own = np.flatnonzero(rounds[:, i])
      want = (sum(w[s] * deltas[s, i] for s in own) / math.sqrt(
          sum((w[s] * c[s + 1]) ** 2 for s in own))) if len(own) else 0.0
      assert got['all_iterates'][i] == pytest.approx(want, rel=1e-12, abs=1e-15), (wrapper, i)
      last = (run['models'][-1, i] - run['models'][0, i]) / math.sqrt(np.sum(c[1:] ** 2))
      assert got['last_iterate'][i] == pytest.approx(last if len(own) else 0.0, rel=1e-12)
  local = canary_stats.scores(_setting('local_dp'), run, run['directions'], rounds)
  for i in range(6):
    own = np.flatnonzero(rounds[:, i])
    want = (sum(run['upload_projections'][s, i] for s in own) / math.sqrt(len(own))
            if len(own) else 0.0)
    assert local['all_iterates'][i] == pytest.approx(want, rel=1e-12, abs=1e-15)
  # Unsampled uploads are NaN in a deployment: never read.
  run['upload_projections'] = np.where(rounds, run['upload_projections'], np.nan)
  again = canary_stats.scores(_setting('local_dp'), run, run['directions'], rounds)
  np.testing.assert_array_equal(again['all_iterates'], local['all_iterates'])


def test_each_canarys_mu_and_the_exact_epsilon_is_the_most_sampled_ones():
  """mu_i by hand for the three kinds of wrapper at k = 8, T = 4, over a given sample; the
  exact epsilons are those of the largest mu_i, the median canary's beside."""
  rounds = np.array([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 0, 1], [1, 0, 0, 0]], bool)  # T_i 4,2,1,1
  counts = np.array([4, 2, 1, 1])
  design = TINY  # k = 8 of 16, T = 4 (the mus read the sample given, not m)
  run = {'participation': rounds, 'clips': np.array([0.1, 0.2, 0.15, 0.3, 0.25])}
  fixed = canary_stats.canary_mus(_setting('server_fixed', noise_multiplier=2.0), design, run,
                                  rounds)
  np.testing.assert_allclose(fixed['all_iterates'], np.sqrt(counts) / 2.0, rtol=1e-12)
  np.testing.assert_allclose(fixed['last_iterate'], counts / (2.0 * 2.0), rtol=1e-12)
  out = canary_stats.exact_epsilons(_setting('server_fixed', noise_multiplier=2.0), design, run,
                                    1e-5)
  assert out['exact_epsilon_all_iterates'] == pytest.approx(auditing.gdp_epsilon(1.0, 1e-5))
  assert out['exact_epsilon_last_iterate'] == pytest.approx(auditing.gdp_epsilon(1.0, 1e-5))
  assert out['exact_epsilon_all_iterates_median_canary'] == pytest.approx(
      auditing.gdp_epsilon((math.sqrt(2) + 1) / 2 / 2.0, 1e-5))  # mus 1, 0.71, 0.5, 0.5
  s = _setting('server_adaptive', noise_multiplier=0.5, clipped_count_stddev=2.0)
  std_b, z = dp_setting.adaptive_noise(dataclasses.replace(s, num_sampled_clients=8))
  c = run['clips']
  per_round = c[:-1] / (z * c[1:])
  adaptive = canary_stats.canary_mus(s, design, run, rounds)
  for i in range(4):
    own = np.flatnonzero(rounds[:, i])
    mu_all = math.sqrt(sum(per_round[t] ** 2 for t in own))
    assert adaptive['all_iterates'][i] == pytest.approx(mu_all, rel=1e-12)
    assert adaptive['last_iterate'][i] == pytest.approx(
        sum(c[t] for t in own) / (z * math.sqrt(np.sum(c[1:] ** 2))), rel=1e-12)
    assert adaptive['with_counts'][i] == pytest.approx(
        math.sqrt(mu_all ** 2 + len(own) / std_b ** 2), rel=1e-12)
  out = canary_stats.exact_epsilons(s, design, run, 1e-5)
  assert out['exact_epsilon_with_counts'] == pytest.approx(
      auditing.gdp_epsilon(float(adaptive['with_counts'].max()), 1e-5), rel=1e-12)
  assert (out['noise_multiplier_aggregate'], out['clipped_count_stddev']) == (z, std_b)
  local = _setting('local_dp', clipping_norm=0.5, sensitivity=0.5, epsilon=2.0)
  sigma = dp_setting.local_dp_std(0.5, 2.0, 1e-5)
  mus = canary_stats.canary_mus(local, design, run, rounds)
  np.testing.assert_allclose(mus['all_iterates'], np.sqrt(counts) * 0.5 / sigma, rtol=1e-12)
  np.testing.assert_allclose(mus['last_iterate'], counts * 0.5 / (sigma * math.sqrt(8 * 4)),
                             rtol=1e-12)


# ------------------------------------------------------------------ the defaults untouched ---

def test_fraction_one_is_the_audit_of_before_and_its_standardised_twin(monkeypatch):
  """q = 1 (absent or 1.0): every node every round, the sums of before (the sampled path is
  never entered), and the same bounds and fit as the standardised statistic, which only
  rescales them by a factor common to all scores there."""
  design = dataclasses.replace(TINY, fraction_train=1.0)
  setting = _setting('server_adaptive', noise_multiplier=1.0, clipped_count_stddev=2.0)
  explicit = canaries.audit(setting, design, KEY)
  absent = canaries.audit(setting, canary_design.Design(
      num_canaries=12, num_real=4, num_rounds=4, dimension=40, num_null=8, confidence=0.9),
                          KEY)
  assert {k: v for k, v in explicit.items() if k != 'seconds'} == {
      k: v for k, v in absent.items() if k != 'seconds'}
  assert (explicit['sampling'], explicit['sample_size'], explicit['rounds_per_canary_min'],
          explicit['canaries_never_sampled']) == ('none', 16, 4, 0)
  monkeypatch.setattr(canary_stats, '_sampled_scores', None)  # would raise if called
  assert canaries.audit(setting, design, KEY)['all_iterates/fit_mu'] == explicit[
      'all_iterates/fit_mu']
  monkeypatch.undo()
  run = canary_deploy.deploy(setting, design, KEY)
  assert run['sampled'].all()
  plain = canary_stats.scores(setting, run, run['directions'])
  standard = canary_stats.scores(setting, run, run['directions'], np.ones((4, 12), bool))
  for threat in canary_design.THREATS:
    ratio = standard[threat] / plain[threat]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)
    assert ratio[0] > 0


def test_a_point_carries_the_new_fields_only_off_their_defaults():
  """A stored point of another sampling or real-client setting is not reused, and a
  default point's params (and the key drawn from them) stay those of before."""
  assert canary_design.Design().point_params() == {}
  assert canary_design.Design(fraction_train=1.0, real_clients='fixed').point_params() == {}
  assert canary_design.Design(fraction_train=0.1).point_params() == {'fraction_train': 0.1}
  assert canary_design.Design(real_clients='trained').point_params() == {'real_clients': 'trained'}


# ---------------------------------------------------------------------- trained real nodes ---

TRAINED = canary_design.Design(num_canaries=4, num_real=28, num_rounds=3, dimension=256, num_null=4,
                               real_clients='trained')


def _train_loss(design, models):
  return canary_design.digits_metrics(design, models, split='train')['loss']


def test_trained_real_nodes_descend_the_digits_loss_along_its_gradient():
  """The MLP 64 -> 3 -> 10 (235 parameters of 256) at z = 0.01: the global model's training
  loss falls every round, and round 1 moves its weights (off the canaries' and the null's
  coordinates) along minus the gradient of the real nodes' examples at the initial model."""
  assert canary_design.mlp_hidden(256) == 3
  assert canary_design.model_unravel(TRAINED.dimension)[0] == 235
  run = canary_deploy.deploy(_setting('server_fixed', noise_multiplier=0.01), TRAINED, KEY)
  models = run['models']
  assert np.any(models[0, :235]) and not np.any(models[0, 235:])  # initialised, then padding
  loss = _train_loss(TRAINED, models)
  assert all(b < a for a, b in zip(loss, loss[1:])), loss
  size, unravel = canary_design.model_unravel(TRAINED.dimension)
  trainer = canary_design.RealTrainer(KEY, TRAINED)
  x, y = trainer.x.reshape(-1, 8, 8, 1), trainer.y.reshape(-1)
  loss_fn = losses.make_loss_fn(canary_design.trained_model(TRAINED.dimension).apply)
  grad = jax.jit(lambda flat: jax.flatten_util.ravel_pytree(jax.grad(loss_fn)(
      unravel(flat), x, y))[0])(np.asarray(models[0, :size], np.float32))
  step = (models[1] - models[0])[8:size]
  cos = float(-np.asarray(grad)[8:] @ step / np.linalg.norm(grad[8:]) / np.linalg.norm(step))
  assert cos > 0.9, cos


def test_a_real_node_trains_from_keys_of_round_and_partition_rebuilt_from_small_args():
  """The job's args hold no array of the training (a few hundred bytes pickled); the
  ClientApp built from their pickle replies what `RealTrainer` trains; node k in round r
  trains with its own key (another round or partition: another reply)."""
  setting = _setting('server_fixed')
  args = dict(setting=setting, design=TRAINED, key=np.asarray(jax.random.key_data(KEY)),
              seed=3)
  blob = pickle.dumps(jobs.Job('training', TRAINED.num_nodes, args, seed=3))
  assert len(blob) < 2000
  trainer = canary_design.RealTrainer(KEY, TRAINED)
  w = canary_design.initial_model(jax.random.fold_in(KEY, 6), TRAINED).astype(np.float64)
  a = trainer(w, 1, 0)
  assert a.dtype == np.float32 and a.shape == (256,)
  np.testing.assert_array_equal(a, trainer(w, 1, 0))
  np.testing.assert_array_equal(a[235:], w[235:].astype(np.float32))
  assert not np.array_equal(a, trainer(w, 2, 0)) and not np.array_equal(a, trainer(w, 1, 1))
  rebuilt = pickle.loads(blob).args
  again = canary_deploy._real(rebuilt)  # pylint: disable=protected-access
  np.testing.assert_array_equal(again(w, 1, 0), a)
  # Disjoint digits per node (28 x 16 <= 1,438).
  idx = canary_design.real_shards(jax.random.fold_in(KEY, 7), TRAINED, 1438)
  assert idx.shape == (28, 16) and len(np.unique(idx)) == 28 * 16


def test_a_trained_audit_reports_its_model_and_loss_by_round():
  # Enough canaries for the one-run bound's split, null directions for the fit's bootstrap.
  design = dataclasses.replace(TRAINED, num_canaries=24, num_null=16)
  m = canaries.audit(_setting('server_fixed', noise_multiplier=0.01), design, KEY)
  assert (m['real_clients'], m['model'], m['model_parameters']) == ('trained', 'mlp 64-3-10',
                                                                    235)
  assert len(m['digits_test_loss']) == len(m['digits_test_accuracy']) == 4
  assert m['digits_test_loss'][-1] < m['digits_test_loss'][0]


# ---------------------------------------------------------------------------- validation ---

def _config(**training):
  config = digits.get_config('smoke')  # dimension 512
  with config.ignore_type():
    # 64 canaries + 64 real nodes (the smoke config's 22 fit a local deployment; these rules
    # are stated on 128).
    config.flower_audit.training.num_canaries = 64
    config.flower_audit.training.num_real = 64
    for k, v in training.items():
      config.flower_audit.training[k] = v
  return config


def _refused(fn, field, allowed, got):
  with pytest.raises(validate.ConfigError) as e:
    fn()
  assert (e.value.field, e.value.allowed, e.value.got) == (f'flower_audit.training.{field}',
                                                           allowed, got)


@pytest.mark.parametrize('bad', [0.0, -0.1, 1.5, float('inf'), 'half'])
def test_a_fraction_outside_zero_one_is_refused(bad):
  _refused(lambda: cc.check_training(_config(fraction_train=bad)), 'fraction_train',
           'a finite number in (0, 1]', bad)


def test_a_fraction_sampling_no_node_is_refused_and_the_wrappers_get_k():
  _refused(lambda: cc.check_training(_config(fraction_train=0.0078)), 'fraction_train',
           'at least one node a round: int(128 nodes x fraction_train) >= 1', 0.0078)
  one = _config(fraction_train=1 / 128)
  for name in ('server_adaptive_z1', 'client_adaptive_z1'):  # z = 1 needs k > 10
    del one.flower_audit.training.settings[name]
  assert cc.check_training(one)[0].sample_size == 1
  design, settings = cc.check_training(_config(fraction_train=0.25))
  assert (design.fraction_train, design.sample_size) == (0.25, 32)
  assert {s.num_sampled_clients for s in settings} == {32}


def test_the_adaptive_wrappers_count_noise_is_checked_at_the_sample_size():
  """Flower's default count std is k / 20: z = 1 needs k > 10, so q = 0.05 (k = 6 of 128)
  is refused on the setting's noise multiplier, q = 0.1 (k = 12) accepted."""
  cc.check_training(_config(fraction_train=0.1))
  with pytest.raises(validate.ConfigError, match=r'training\.settings\.client_adaptive_z1\.'
                     r'noise_multiplier|training\.settings\.server_adaptive_z1\.'
                     r'noise_multiplier'):
    cc.check_training(_config(fraction_train=0.05))


def test_real_clients_is_one_of_two_and_trained_needs_room_for_the_mlp():
  _refused(lambda: cc.check_training(_config(real_clients='learned')), 'real_clients',
           "one of ('fixed', 'trained')", 'learned')
  assert cc.check_training(_config(real_clients='trained'))[0].real_clients == 'trained'
  small = dict(directions='random', num_canaries=4, num_null=4, real_clients='trained')
  assert cc.check_training(_config(dimension=85, **small))[0].dimension == 85
  _refused(lambda: cc.check_training(_config(dimension=84, **small)), 'dimension',
           'at least 85 with trained real clients (the digits MLP 64 -> h -> 10 with h >= 1)',
           84)
  with pytest.raises(ValueError, match='trained real clients need dimension >= 85'):
    canary_design.Design(directions='random', dimension=84, real_clients='trained')
  with pytest.raises(ValueError, match=r'fraction_train must be in \(0, 1\]'):
    canary_design.Design(fraction_train=0.0)


@pytest.mark.parametrize('override, field', [
    ('--config.flower_audit.training.fraction_train=0', 'flower_audit.training.fraction_train'),
    ('--config.flower_audit.training.real_clients=learned',
     'flower_audit.training.real_clients'),
])
def test_a_bad_new_field_exits_2_naming_it_before_any_work(tmp_path, override, field):
  workdir = tmp_path / 'run'
  proc = cli.run_forked('flower_audit', workdir, override,
                        '--config.flower_audit.parts=("training",)', FLWR_TELEMETRY_ENABLED='0')
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and field in lines[0], proc.stderr
  assert not workdir.exists()
