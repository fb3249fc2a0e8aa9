"""`pipelines.training_audit` in process: the sweep, its validation, and each point's audit.

The command-line tests (test_training_audit*.py) run the pipeline in a subprocess, where a
mutation run cannot see it; these call its functions, on three tiny real trainings (one per
branch of `point_metrics`: a reader of the aggregate under participation sampling, weak_dp's
per-round claim composed over the rounds, and ldp_sgd's declaration from the registry).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types

import chex
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from configs import digits
from fl_privacy import accounting
from fl_privacy import data
from fl_privacy import validate
from fl_privacy.attacks.audit import canaries
from fl_privacy.defenses import registry
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers
from fl_privacy.fl import rounds
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_runs as runs
from fl_privacy.report import point_key

TRAININGS = (
    dict(defense='central_dp', sampling='without_replacement', claimed_epsilon=2.0,
         canary='client'),
    dict(defense='weak_dp', sampling='none', claimed_epsilon=2.0, canary='client'),
    dict(defense='ldp_sgd', sampling='none', claimed_epsilon=8.0, canary='client'),
    dict(defense='dp_sgd', sampling='poisson', claimed_epsilon=2.0, canary='gradient'),
)
# ldp_sgd's canaries on random directions: the server reads them independently all the same.
_DIRECTION = {'ldp_sgd': 'random'}
# Trained too, for run_training's own test only: input canaries under replace-one.
INPUT = dict(defense='dp_sgd', sampling='shuffle', claimed_epsilon=2.0, canary='input')


def _name(tr) -> str:
  return 'dp_sgd_input' if tr['canary'] == 'input' else tr['defense']


def _config(direction='dirac'):
  config = digits.get_config('smoke')
  s = config.training_audit
  s.num_canary_clients, s.num_canary_examples = 40, 44
  s.clip_norm = 0.5   # not 1: C enters as a factor, never as a divisor
  s.num_rounds = 2
  s.delta, s.confidence = 2e-5, 0.9
  s.direction = direction
  return config


@pytest.fixture(scope='module')
def trained():
  config = _config()
  config.training_audit.record_kinds = ('gradient', 'input')
  state = ta.prepare(config)
  out, calls = {}, {}

  def recorded(label, real):  # records the current training's call, then makes it
    def call(*a, **kw):
      calls[name][label] = (a, kw)
      return real(*a, **kw)
    return call

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(canaries, 'train', recorded('train', canaries.train))
    mp.setattr(canaries, 'place_examples', recorded('place', canaries.place_examples))
    mp.setattr(runs, 'ran', recorded('ran', runs.ran))
    for tr in TRAININGS + (INPUT,):
      name = _name(tr)
      calls[name] = {}
      config = _config(_DIRECTION.get(tr['defense'], 'dirac'))
      out[name] = (config, ta.run_training(config, state, tr, point_key(
          jax.random.key(0), tr)))
  return state, out, calls


def _m(tr) -> int:
  return 40 if tr['canary'] == 'client' else 44   # the two counts differ on purpose


def test_run_training_builds_the_federation_and_the_canaries_it_claims(trained):
  # What `run_training` returns and hands to `canaries.train`, from its documented draws: the
  # coins, the model, the relation, the canaries, the participation and federation that ran,
  # the training's settings and test split. (One test over every training, first in the file:
  # a mutation run ties the module fixture's calls to the first test that uses it.)
  state, done, calls = trained
  test = state['test']
  test_x = np.asarray(data.to_float(test.x)).reshape(len(test), -1)
  for tr in TRAININGS + (INPUT,):
    config, d = done[_name(tr)]
    (_, params, clients), kw = calls[_name(tr)]['train']
    s = config.training_audit
    key = point_key(jax.random.key(0), tr)
    m, c = _m(tr), float(s.clip_norm)
    flat, unravel = flatten_util.ravel_pytree(params)
    np.testing.assert_array_equal(d['world'], canaries.coins(jax.random.fold_in(key, 3), m))
    chex.assert_trees_all_equal(params, state['model'].init(jax.random.fold_in(key, 2),
                                                            np.zeros((1, 64), np.float32)))
    assert d['dim'] == flat.shape[0]
    decl = d['claimed'].declaration
    if tr['canary'] == 'client':
      relation = decl.relation if decl is not None else 'replace_one'
    else:
      relation = 'add_remove' if tr['sampling'] == 'poisson' else 'replace_one'
    assert d['relation'] == relation
    # The claim is configured for the clients' record counts that run (canary rows included).
    sizes = (np.full(int(s.num_clients), int(s.per_client)) if tr['canary'] == 'client' else
             np.asarray(kw['examples'].clients.mask).sum(axis=1))
    assert d['claimed'].declaration == runs.claim(config, state, tr, sizes).declaration
    (config_, state_, tr_, claimed_, ran_sizes), _ = calls[_name(tr)]['ran']
    assert (config_, state_, tr_, claimed_) == (config, state, tr, d['claimed'])
    np.testing.assert_array_equal(ran_sizes, sizes)
    assert d['participation'] == kw['participation'] == (
        float(s.participation) if tr['sampling'] == 'without_replacement' else 1.0)
    # The training's settings, the test split, and the optimizer (one step compared).
    assert kw['kind'] == tr['canary'] and kw['clip_norm'] == c
    assert (kw['num_rounds'], kw['epochs'], kw['batch_size']) == (
        int(s.num_rounds), int(s.epochs), int(s.batch_size))
    np.testing.assert_array_equal(kw['test_x'], test_x)
    np.testing.assert_array_equal(kw['test_y'], test.y)
    g = jax.tree_util.tree_map(jnp.ones_like, params)
    want_opt = optimizers.make(s.optimizer, float(s.learning_rate))
    chex.assert_trees_all_close(kw['optimizer'].update(g, kw['optimizer'].init(params))[0],
                                want_opt.update(g, want_opt.init(params))[0])
    sc = d['scores']
    total = int(s.num_clients) + (m if tr['canary'] == 'client' else 0)
    np.testing.assert_array_equal(sc.participants,
                                  [max(1, round(d['participation'] * total))] * 2)
    assert sc.uploads.shape == (m,) and sc.aggregates.shape == sc.known.shape == (2, m)
    assert 0.0 <= sc.test_accuracy <= 1.0
    if tr['canary'] != 'gradient':
      assert kw['hooks'] is d['claimed'].hooks
    if tr['canary'] == 'client':
      dirs = canaries.directions(jax.random.fold_in(key, 4), m, flat.shape[0], s.direction)
      np.testing.assert_array_equal(kw['canary_dirs'], dirs)
      want = canaries.injected_clients(dirs, d['world'], unravel, norm=float(s.canary_norm) * c,
                                       relation=relation, size=float(s.per_client))
      chex.assert_trees_all_close(kw['injected'], want)
    else:
      (_, cx, cy, world, placed_relation), _ = calls[_name(tr)]['place']
      assert placed_relation == relation and world is d['world']
      assert kw['examples'].clients is clients
      if tr['canary'] == 'gradient':
        coords = canaries.dirac_coordinates(jax.random.fold_in(key, 4), m, flat.shape[0])
        np.testing.assert_array_equal(kw['coordinates'], coords)
        # The claim's hooks with the loss of the Dirac gradient canaries: canary i's row has
        # the gradient s_i x canary_norm x C e_{c_i}.
        assert kw['hooks']._replace(loss=None) == d['claimed'].hooks._replace(loss=None)
        sgn = canaries.signs(relation, d['world'])
        loss_fn = losses.make_loss_fn(state['model'].apply)
        for i in (0, m - 1):
          grad = jax.grad(lambda p, i=i: kw['hooks'].loss(
              jax.random.key(0), loss_fn, p, jnp.zeros((1, 64)), jnp.array([10 + i]), None,
              None))(params)
          want = np.zeros(flat.shape[0], np.float32)
          want[coords[i]] = sgn[i] * float(s.canary_norm) * c
          np.testing.assert_allclose(flatten_util.ravel_pytree(grad)[0], want, atol=1e-6)
        np.testing.assert_array_equal(cx, np.zeros((m, 64), np.float32))
        np.testing.assert_array_equal(cy, 10 + np.arange(m))
      else:
        # m distinct rows no client holds, each with a wrong label drawn uniformly among the
        # other classes; under replace-one an OUT canary keeps its true label.
        _, pool_x, pool_y = runs._shards(config, state, key)  # pylint: disable=protected-access
        rng = data.rng_from_key(jax.random.fold_in(key, 4))
        pick = rng.choice(len(pool_y), m, replace=False)
        wrong = (pool_y[pick] + rng.integers(1, 10, m)) % 10
        np.testing.assert_array_equal(cx, pool_x[pick])
        np.testing.assert_array_equal(kw['canary_x'], pool_x[pick])
        np.testing.assert_array_equal(kw['canary_y'], wrong)
        assert np.all(wrong != pool_y[pick])
        np.testing.assert_array_equal(cy, np.where(d['world'], wrong, pool_y[pick]))
    if tr['defense'] == 'central_dp':
      # The noise is added to the aggregate: the server reads each canary's own update (norm
      # canary_norm x C along its coin's sign) in each round the round loop drew it for.
      took = np.stack([np.asarray(rounds.participants(jax.random.fold_in(key, 5), t, total,
                                                      d['participation']))[-m:]
                       for t in range(2)])
      assert 0 < took.mean() < 1
      want = float(s.canary_norm) * c * canaries.signs(relation, d['world']) * took.sum(axis=0)
      np.testing.assert_allclose(sc.uploads, want, rtol=1e-4, atol=1e-5)


def test_shards_are_the_clients_disjoint_rows_and_the_pool_what_no_client_holds():
  config = _config()
  state = ta.prepare(config)
  s = config.training_audit
  key = jax.random.key(3)
  clients, pool_x, pool_y = runs._shards(config, state, key)  # pylint: disable=protected-access
  train, test = state['train'], state['test']
  k, n = int(s.num_clients), int(s.per_client)
  assert clients.x.shape == (k, n, 64) and clients.y.shape == (k, n)
  flat = np.asarray(data.to_float(train.x)).reshape(len(train), -1)
  parts = data.iid_partition(jax.random.fold_in(key, 1), len(train), k, per_client=n)
  for c, rows in enumerate(parts):
    np.testing.assert_array_equal(clients.x[c], flat[rows])
    np.testing.assert_array_equal(clients.y[c], train.y[rows])
  unused = np.setdiff1d(np.arange(len(train)), np.concatenate(parts))
  assert len(unused) == len(train) - k * n > 0
  np.testing.assert_array_equal(pool_x, np.concatenate(
      [flat[unused], np.asarray(data.to_float(test.x)).reshape(len(test), -1)]))
  np.testing.assert_array_equal(pool_y, np.concatenate([train.y[unused], test.y]))
  assert pool_y.dtype == np.int32 and pool_x.shape == (len(pool_y), 64)


@pytest.mark.parametrize('tr', TRAININGS, ids=lambda tr: tr['defense'])
@pytest.mark.parametrize('threat', ['all_iterates', 'last_iterate'])
def test_point_metrics_audit_the_training_against_its_own_claim(trained, monkeypatch, tr,
                                                                 threat):
  state, done, _ = trained
  config, d = done[tr['defense']]
  s = config.training_audit
  seen = {}
  real_scores, real_audit = canaries.threat_scores, canaries.audit

  def threat_scores(*a, **kw):
    seen['scores'] = (a, kw)
    return real_scores(*a, **kw)

  def audit(*a, **kw):
    seen['audit'] = (a, kw)
    return real_audit(*a, **kw)

  monkeypatch.setattr(canaries, 'threat_scores', threat_scores)
  monkeypatch.setattr(canaries, 'audit', audit)
  m, n = ta.point_metrics(config, state, tr, threat, d)
  adversary = 'aggregate' if tr['defense'] in ('central_dp', 'weak_dp') else 'server'
  # The statistic: the declaration's adversary reading this training under the threat.
  (sc, th, adv), kw = seen['scores']
  assert sc is d['scores'] and (th, adv) == (threat, adversary)
  want_kw = {'participation': d['participation']}
  if adversary == 'aggregate':
    z = float(d['claimed'].metrics['noise_multiplier'])
    want_kw.update(shift=0.5, sigma=z * 0.5, known=True)   # C = 0.5
  assert kw == pytest.approx(want_kw)
  # The audit: this training's coins, the mechanism that ran, the claim, the run's delta and
  # confidence, independence where each canary's score has its own noise, the claim's profile.
  (scores, world, mechanism, claimed), kw = seen['audit']
  assert world is d['world']
  assert mechanism == {'central_dp': 'central_dp_without_replacement',
                       'dp_sgd': 'dp_sgd_poisson'}.get(tr['defense'], tr['defense'])
  assert claimed == m['dp_epsilon']
  assert (kw['delta'], kw['confidence']) == (2e-5, 0.9)
  # Client canaries read every iterate: by the server, or on their own Dirac coordinate.
  assert kw['independent'] == (threat == 'all_iterates' and tr['canary'] == 'client')
  decl = d['claimed'].declaration
  if tr['defense'] == 'ldp_sgd':
    assert decl is None
    sizes = np.full(int(s.num_clients), int(s.per_client))
    decl = registry.declaration('ldp_sgd', {'epsilon': 8.0 / 2},
                                ta.setting(config, state, tr, sizes))
    assert m['dp_epsilon'] == pytest.approx(8.0, rel=1e-9)  # 4 per round, 2 rounds
    assert m['dp_epsilon'] == accounting.epsilon(decl, delta=2e-5)
    assert m['dp_delta'] == 2e-5
    for k, v in accounting.describe(decl).items():
      assert m[k] == v, k
  else:
    for k, v in d['claimed'].metrics.items():
      if k not in ('best_bound', 'privacy_violation'):
        assert m[k] == v or (isinstance(v, float) and math.isnan(v)), k
  if tr['defense'] == 'weak_dp':   # a per-round claim: the profile of the rounds that ran
    decl = dataclasses.replace(decl, compositions=2)
  grid = np.array([0.5, 1.0, 3.0])
  z = m.get('noise_multiplier')
  assert kw['claimed_delta'](grid) == accounting.delta_curve(decl, z, grid)
  if tr['defense'] == 'weak_dp':
    assert kw['claimed_delta'](grid) != accounting.delta_curve(
        d['claimed'].declaration, z, grid)
  # What the point records beside the audit.
  assert m['dp_adversary'] == adversary
  assert m['canary_relation'] == d['relation']
  assert m['participation_run'] == float(d['participation'])
  assert m['participation_run'] == (0.5 if tr['sampling'] == 'without_replacement' else 1.0)
  assert m['test_accuracy'] == float(d['scores'].test_accuracy)
  assert m['audited_pipeline'] == ta.AUDITED and m['plant'] == 'none'
  assert m['model_parameters'] == d['dim'] > 40
  assert m['dp_unit'] == ('record' if tr['defense'] == 'dp_sgd' else 'client')
  assert m['dp_compositions'] == decl.compositions   # weak_dp's: over the rounds, as audited
  if tr['defense'] == 'dp_sgd':   # steps, not rounds: the profile keeps them
    assert decl.compositions > 2
  assert n == m['num_canaries'] == _m(tr)
  assert m['n_in'] + m['n_out'] == _m(tr)


def test_the_sweep_is_defenses_by_samplings_by_claims_by_kinds():
  config = _config()
  s = config.training_audit
  s.samplings = ('shuffle', 'none', 'poisson')
  s.epsilons = (2.0, 8.0)
  s.record_kinds = ('input', 'gradient')
  state = {'defenses': ('dp_sgd', 'weak_dp', 'ldp_sgd')}
  got = [(t['defense'], t['sampling'], t['claimed_epsilon'], t['canary'])
         for t in ta.trainings(config, state)]
  want = [('dp_sgd', x, e, k) for x in ('poisson', 'shuffle') for e in (2.0, 8.0)
          for k in ('input', 'gradient')]
  want += [(d, 'none', e, 'client') for d in ('weak_dp', 'ldp_sgd') for e in (2.0, 8.0)]
  assert got == want
  # One epsilon, one kind, one sampling as plain values.
  config = types.SimpleNamespace(training_audit=types.SimpleNamespace(
      epsilons=3.0, record_kinds='gradient', samplings='poisson'))
  assert ta.trainings(config, {'defenses': ('dp_sgd', 'central_dp')}) == [
      dict(defense='dp_sgd', sampling='poisson', claimed_epsilon=3.0, canary='gradient')]
  assert isinstance(ta.trainings(config, {'defenses': ('dp_sgd',)})[0]['claimed_epsilon'],
                    float)


def test_mechanism_names_and_independence_by_hand():
  assert ta.mechanism({'defense': 'dp_sgd', 'sampling': 'poisson'}) == 'dp_sgd_poisson'
  assert ta.mechanism({'defense': 'update_dp', 'sampling': 'none'}) == 'update_dp'
  config = _config()
  client = {'canary': 'client'}
  for direction in ('dirac', 'random'):
    config.training_audit.direction = direction
    assert ta.independent(config, client, 'all_iterates', 'server')
    assert ta.independent(config, client, 'all_iterates', 'aggregate') == (direction == 'dirac')
    for adversary in ('server', 'aggregate'):
      assert not ta.independent(config, client, 'last_iterate', adversary)
      assert not ta.independent(config, {'canary': 'gradient'}, 'all_iterates', adversary)
  done = {'claimed': type('C', (), {'metrics': {'noise_multiplier': 1.5}})()}
  config.training_audit.clip_norm = 0.5
  assert ta._adversary_stats(config, done) == {'shift': 0.5, 'sigma': 0.75, 'known': True}
  done['claimed'].metrics = {}
  assert math.isnan(ta._adversary_stats(config, done)['sigma'])


# (field, value, words the message must hold); each on the valid smoke config.
_BAD = [
    ('defenses', ('dp_sgd', 'gaussian'), 'dp_sgd'),
    ('samplings', ('poisson', 'uniform'), 'without_replacement'),
    ('epsilons', (0.0,), ''),
    ('epsilons', (50.5,), '50'),
    ('epsilons', (math.inf,), ''),
    ('delta', 1.0, ''),
    ('clip_norm', 0.0, ''),
    ('participation', 1.0, 'in (0, 1) (the sampled fraction (below 1))'),
    ('participation', 0.0, 'in (0, 1)'),
    ('confidence', 0.5, ''),
    ('confidence', 1.0, ''),
    ('record_kinds', ('dirac',), 'gradient'),
    ('threats', ('every_iterate',), 'last_iterate'),
    ('num_canary_clients', 3, 'an integer in [4, 1e+06] (canaries (at least 2 per world))'),
    ('num_canary_examples', 3, 'an integer in [4, 1e+06] (canaries (at least 2 per world))'),
    ('num_canary_clients', 1_000_001, 'an integer in [4, 1e+06]'),
    ('canary_norm', 0.9, 'must be a finite number in [1, 1e+06] (in units of the clip norm) '
     '(got 0.9)'),
    ('canary_norm', 1_000_000.5, 'in [1, 1e+06]'),
    ('direction', 'gauss', 'random'),
    ('model', 'cnn', 'mlp'),
    ('hidden', (0,), 'must be a sequence of widths in [1, 4096] (got (0,))'),
    ('hidden', (2.5,), 'a sequence of widths in [1, 4096]'),
    ('hidden', (4097,), 'a sequence of widths in [1, 4096]'),
    ('num_clients', 0, '[1, 1000]'),
    ('num_clients', 1001, '[1, 1000]'),
    ('per_client', 100_001, '[1, 100000]'),
    ('epochs', 101, '[1, 100]'),
    ('num_rounds', 1001, '[1, 1000]'),
    ('batch_size', 32, 'below per_client (32): Poisson sampling needs q < 1'),
    ('optimizer', 'lbfgs', 'sgd'),
    ('learning_rate', 0.0, '(0, 100]'),
    ('learning_rate', 101.0, '(0, 100]'),
    ('plant', 'quarter_noise', 'one_composition'),
]


@pytest.mark.parametrize('field, value, words', _BAD, ids=[f'{f}={v}' for f, v, _ in _BAD])
def test_each_field_is_refused_outside_its_range_naming_it(field, value, words):
  config = _config()
  config.training_audit[field] = value
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  message = str(e.value)
  assert message.startswith(f'config.training_audit.{field}: must be '), message
  assert words in message, message


@pytest.mark.parametrize('field', ('num_clients', 'per_client', 'batch_size', 'epochs',
                                   'num_rounds', 'num_canary_clients'))
def test_a_count_that_is_not_an_integer_is_refused(field):
  # A config file may hold a float where the default is an int (the command line cannot).
  config = _config()
  with config.ignore_type():
    config.training_audit[field] = 2.5
  with pytest.raises(validate.ConfigError, match=rf'config.training_audit.{field}: must be an '
                     r'integer in \[\d, [\d+e]+\]'):
    ta.validate_config(config)


def test_the_edges_of_each_range_are_accepted():
  config = _config()
  s = config.training_audit
  s.epsilons, s.participation, s.confidence = (50.0, 1e-3), 0.999, 0.999
  s.num_canary_clients = s.num_canary_examples = 4
  s.canary_norm, s.hidden, s.num_clients, s.epochs = 1.0, (4096, 1), 1000, 100
  s.batch_size, s.learning_rate, s.num_rounds = 31, 100.0, 1000
  assert ta.validate_config(config) == {'defenses': tuple(s.defenses)}
  s.hidden, s.canary_norm = (), 1e6
  ta.validate_config(config)


def test_a_defense_without_one_of_its_samplings_and_a_defense_section_are_refused():
  config = _config()
  config.training_audit.defenses = ('dp_sgd', 'update_dp')
  config.training_audit.samplings = ('poisson',)
  with pytest.raises(validate.ConfigError, match=r"config.training_audit.samplings: must be one "
                     r"a chosen defense offers for each of them \(dp_sgd: \('poisson', "
                     r"'shuffle'\), update_dp: \('none',\)\) \(got \('poisson',\)\)$"):
    ta.validate_config(config)
  config.training_audit.samplings = ('poisson', 'none')
  ta.validate_config(config)
  config = _config()
  config.defense.name = 'update_dp'
  with pytest.raises(validate.ConfigError, match=re.escape(
      "config.defense.name: must be one of ('none',) for experiments.training_audit (it audits "
      "every DP defense itself (training_audit.defenses)) (got 'update_dp')")):
    ta.validate_config(config)


def _refused(config) -> str:
  with pytest.raises(validate.ConfigError) as e:
    ta.prepare(config)
  return str(e.value)


def test_prepare_bounds_the_canaries_by_the_model_and_the_data():
  state = ta.prepare(_config())
  dim, n_train = state['dim'], len(state['train'])
  assert dim == 64 * 32 + 32 + 32 * 10 + 10  # digits' 8x8 inputs, hidden 32, 10 classes
  assert state['trainings'] == {} and n_train >= 10 * 32
  c = _config()
  c.training_audit.per_client = 200
  assert _refused(c) == (f'config.training_audit.per_client: must be at most {n_train // 10} '
                         f'(num_clients x per_client rows of the train split, which has '
                         f'{n_train}) (got 200)')
  c = _config()   # every train row held by the clients: allowed
  c.training_audit.num_clients, c.training_audit.per_client = 2, n_train // 2
  c.training_audit.record_kinds = ('gradient',)
  assert n_train % 2 == 0
  ta.prepare(c)
  c = _config()
  c.training_audit.num_canary_examples = dim + 1
  assert _refused(c) == (f"config.training_audit.num_canary_examples: must be at most the "
                         f"model's {dim} parameters (one Dirac coordinate each) (got {dim + 1})")
  c.training_audit.num_canary_examples = dim
  c.training_audit.record_kinds = ('gradient',)
  ta.prepare(c)
  c = _config()
  c.training_audit.num_canary_clients = dim + 1
  assert _refused(c) == (f"config.training_audit.num_canary_clients: must be at most the "
                         f"model's {dim} parameters with direction 'dirac' (one coordinate "
                         f"each) (got {dim + 1})")
  c.training_audit.num_canary_clients = dim
  ta.prepare(c)
  # Gradient canaries bound by the parameters only where dp_sgd runs them; client canaries
  # only for Dirac directions of a client-level defense.
  c = _config()
  c.training_audit.defenses = ('central_dp',)
  c.training_audit.samplings = ('none',)
  c.training_audit.num_canary_examples = dim + 1
  ta.prepare(c)
  c.training_audit.num_canary_clients = dim + 1
  c.training_audit.direction = 'random'
  ta.prepare(c)
  c = _config()
  c.training_audit.defenses = ('dp_sgd',)
  c.training_audit.num_canary_clients = dim + 1
  ta.prepare(c)
  # Input canaries come from the rows no client holds.
  c = _config()
  c.training_audit.record_kinds = ('input',)
  pool = n_train - 10 * 32 + len(state['test'])
  c.training_audit.num_canary_examples = pool + 1
  assert _refused(c) == (f'config.training_audit.num_canary_examples: must be at most the '
                         f'{pool} images no client holds (the input canaries) (got {pool + 1})')
  c.training_audit.num_canary_examples = pool   # (below the 2410 of the gradient canaries)
  ta.prepare(c)


def test_plan_trains_once_per_training_and_reports_violations(monkeypatch, caplog):
  config = _config()
  s = config.training_audit
  s.defenses, s.samplings = ('central_dp', 'weak_dp'), ('none',)
  state = {'defenses': s.defenses, 'trainings': {}}
  runs, scored = [], []

  def run_training(config_, state_, tr, key):
    assert config_ is config and state_ is state
    runs.append((tr['defense'], key))
    return {'defense': tr['defense']}

  def point_metrics(config_, state_, tr, threat, done):
    assert config_ is config and state_ is state and done['defense'] == tr['defense']
    scored.append((tr['defense'], threat, dict(state_['trainings'])))
    return {'privacy_violation': float(tr['defense'] == 'weak_dp'), 'dp_epsilon': 2.0,
            'best_bound': 3.5}, 40

  monkeypatch.setattr(ta, 'run_training', run_training)
  monkeypatch.setattr(ta, 'point_metrics', point_metrics)
  key = jax.random.key(4)
  points = ta.plan(config, state, None, key)
  trs = ta.trainings(config, state)
  assert [p.params for p in points] == [{**tr, 'threat': t} for tr in trs
                                        for t in s.threats]
  assert all(p.unit == 'canaries' for p in points)
  import logging  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  with caplog.at_level(logging.ERROR):
    for p in points:
      m = p.compute()
      p.after(m[0])
  # Each training ran once, with its own key, for its first threat; one held at a time.
  assert [d for d, _ in runs] == [tr['defense'] for tr in trs] == ['central_dp', 'weak_dp']
  for (_, got), tr in zip(runs, trs):
    np.testing.assert_array_equal(jax.random.key_data(got),
                                  jax.random.key_data(point_key(key, tr)))
  assert [(d, t) for d, t, _ in scored] == [(p.params['defense'], p.params['threat'])
                                           for p in points]
  assert [len(c) for _, _, c in scored] == [1, 1, 1, 1]
  errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  assert len(errors) == len(s.threats)  # weak_dp's points only
  assert errors[0] == ('PRIVACY VIOLATION: weak_dp (none, client canaries, all_iterates) '
                       'claims epsilon 2 but the training audit certifies more: 3.500 at '
                       'family-wise 90%')
  # A point without a verdict (or with none) logs nothing.
  caplog.clear()
  with caplog.at_level(logging.ERROR):
    ta._report_violation(config, points[0].params, {})
    ta._report_violation(config, points[0].params, {'privacy_violation': 0.0})
  assert not caplog.records
