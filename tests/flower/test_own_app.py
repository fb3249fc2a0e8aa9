"""The canary audit of a user's own Flower app, in process: the in-app pieces
(`flower.inapp`, through `audits.user_app`'s re-exports) around Flower's own FedAvg inside its
DifferentialPrivacyServerSideFixedClipping, a user-style numpy ClientApp on the real nodes,
canary nodes beside them, and the analysis (`audits.user_app`) of what the strategy recorded."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import RdpAccountant
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import user_app
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.strategies import recording as recording_lib

SEED = 11
CLIP = 1.0
NORM = 2.0
DELTA = 1e-5
EXAMPLES = 10
SHAPES = {'kernel': (64, 30), 'bias': (30,), 'head': (30, 3), 'head_bias': (3,)}
DIM = sum(int(np.prod(s)) for s in SHAPES.values())  # 2043
ALL_THREATS = ('all_iterates', 'last_iterate', 'uploads')


def _model(seed: int = 0, dtype=np.float32) -> ArrayRecord:
  rng = np.random.default_rng(seed)
  return ArrayRecord({k: Array((0.1 * rng.standard_normal(s)).astype(dtype))
                      for k, s in SHAPES.items()})


def _flat(record: ArrayRecord) -> np.ndarray:
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in record.to_numpy_ndarrays()])


def user_client_app(calls: list | None = None, mods=()) -> ClientApp:
  """A user's own ClientApp: node k moves the model halfway to its own target (norm ~2.2, above
  the clip) and reports a train loss; evaluate reports a loss; both weigh 10 examples."""
  app = ClientApp(mods=list(mods))

  def target(context):
    rng = np.random.default_rng(1000 + int(context.node_config['partition-id']))
    return rng.standard_normal(DIM) * 0.1

  @app.train()
  def train(msg, context):
    if calls is not None:
      calls.append(('train', int(context.node_config['partition-id'])))
    record = msg.content['arrays']
    w = _flat(record)
    new = w + 0.5 * (target(context) - w)
    out, offset = {}, 0
    for k, a in zip(record.keys(), record.to_numpy_ndarrays()):
      out[k] = Array(new[offset:offset + a.size].reshape(a.shape).astype(a.dtype))
      offset += a.size
    return Message(RecordDict({'arrays': ArrayRecord(out), 'metrics': MetricRecord(
        {'train_loss': float(np.sum((w - target(context)) ** 2)),
         'num-examples': EXAMPLES})}), reply_to=msg)

  @app.evaluate()
  def evaluate(msg, context):
    if calls is not None:
      calls.append(('evaluate', int(context.node_config['partition-id'])))
    w = _flat(msg.content['arrays'])
    return Message(RecordDict({'metrics': MetricRecord(
        {'eval_loss': float(np.sum((w - target(context)) ** 2)), 'num-examples': EXAMPLES})}),
                   reply_to=msg)

  @app.query()
  def query(msg, context):
    if calls is not None:
      calls.append(('query', int(context.node_config['partition-id'])))
    return Message(RecordDict({'mine': ConfigRecord({'hello': 1})}), reply_to=msg)

  del train, evaluate, query
  return app


def _canary_configs(k: int, seed: int = SEED, **extra):
  return user_app.canary_node_configs(
      k, seed=seed, canary_norm=NORM, clip_norm=CLIP, **{
          'num-examples': EXAMPLES, 'canary-metrics': 'train_loss',
          'canary-eval-metrics': 'eval_loss', **extra})


def _grid(num_real: int, num_canaries: int, **kw) -> inprocess.InProcessGrid:
  apps, configs = user_app.client_apps(user_client_app(), num_real, _canary_configs(num_canaries))
  return inprocess.InProcessGrid(apps, node_configs=configs, raise_client_errors=True, **kw)


def _dp(n: int, z: float, *, accountant: bool = True, fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0):
  k = int(n * fraction_train)
  fedavg = flwr_strategy.FedAvg(fraction_train=fraction_train,
                                fraction_evaluate=fraction_evaluate, min_train_nodes=k,
                                min_available_nodes=n, min_evaluate_nodes=1)
  acc = RdpAccountant(PrivacyConfig(
      target_delta=DELTA, population_size=n,
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION)) if accountant else None
  return flwr_strategy.DifferentialPrivacyServerSideFixedClipping(fedavg, z, CLIP, k,
                                                                   accountant=acc)


def _run(strategy, grid, rounds: int, *, seed: int = 3, observed: list | None = None):
  """Flower's round loop on the grid, numpy's and Python's generators (Flower's noise and
  sampling) seeded from `seed`."""
  def observe(server_round, arrays):
    if observed is not None:
      observed.append(_flat(arrays))
  with dp_games.quiet_flower(), jobs.seeded(seed):
    return inprocess.run(strategy, grid, _model(), num_rounds=rounds, evaluate_fn=observe)


def _audit(num_real, num_canaries, z, rounds, **kw):
  grid = _grid(num_real, num_canaries)
  n = num_real + num_canaries
  strategy = user_app.CanaryAuditStrategy(
      _dp(n, z, accountant=kw.pop('accountant', True)), seed=SEED, canary_norm=NORM,
      clip_norm=CLIP, delta=DELTA, num_null=256, **kw)
  _run(strategy, grid, rounds)
  return strategy, user_app.audit(strategy)


def _same(a, b) -> bool:
  """Equal, NaN equal to NaN."""
  nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
  return nan or a == b


def _send(grid, messages):
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    return list(grid.send_and_receive(messages))


def _train(grid, record, nodes=None, message_type='train'):
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    messages = [Message(RecordDict({'arrays': record, 'config': ConfigRecord(
        {'server-round': 1})}), dst_node_id=n, message_type=message_type)
                for n in (nodes or grid.get_node_ids())]
  return {int(r.metadata.src_node_id): r for r in _send(grid, messages)}


# --- the canary node ----------------------------------------------------------------------------


def test_a_canary_replies_the_received_model_plus_its_stated_update_along_its_direction():
  """Any model: float32 and float64 arrays of several shapes (a step counter stays out of the
  directions, unchanged). Included: + canary_norm C v_i; excluded: + 1e-6 C v_i (exact on a
  zero model); v_i and the coin are what the server redraws from (seed, i)."""
  coins = [user_app.canary_coin(SEED, i) for i in range(8)]
  assert any(coins) and not all(coins)
  k_in, k_out = coins.index(True), coins.index(False)
  record = ArrayRecord({'a': Array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)),
                        'step': Array(np.asarray([7], np.int64)),
                        'b': Array(np.zeros((2, 3, 5), np.float64))})
  zero = ArrayRecord({'a': Array(np.zeros((3, 4), np.float32)),
                      'step': Array(np.asarray([7], np.int64)),
                      'b': Array(np.zeros((2, 3, 5), np.float64))})
  grid = inprocess.InProcessGrid([user_app.canary_client_app] * 8,
                              node_configs=_canary_configs(8), raise_client_errors=True)
  ids = grid.get_node_ids()
  dim = 12 + 30
  for sent in (record, zero):
    replies = _train(grid, sent, [ids[k_in], ids[k_out]])
    for i, scale in ((k_in, NORM * CLIP), (k_out, 1e-6 * CLIP)):
      got = replies[ids[i]].content['arrays']
      assert list(got.keys()) == ['a', 'step', 'b']
      for key in got.keys():
        assert got[key].numpy().dtype == sent[key].numpy().dtype
        assert got[key].numpy().shape == sent[key].numpy().shape
      np.testing.assert_array_equal(got['step'].numpy(), [7])
      update = user_app.flat_model(got) - user_app.flat_model(sent)
      want = scale * user_app.canary_direction(SEED, i, dim)
      # float32 rounding of the model's values (|w| <= 1) bounds the error of the included
      # update; on a zero model the idle update is exact to float32's relative precision.
      if scale > 1 or sent is zero:
        np.testing.assert_allclose(update, want, rtol=1e-6, atol=scale * 1e-6 + (
            0 if sent is zero else 1e-7))
      assert abs(np.linalg.norm(update) - scale) <= (1e-6 * scale if sent is zero else 2e-6)
    metrics = replies[ids[k_in]].content['metrics']
    assert dict(metrics) == {'train_loss': 0.0, 'num-examples': EXAMPLES}
  assert np.linalg.norm(user_app.canary_direction(SEED, 3, 5)) == pytest.approx(1.0, rel=1e-12)
  assert not np.allclose(user_app.canary_direction(SEED, 0, dim),
                         user_app.canary_direction(SEED, 1, dim))


def test_an_update_that_rounding_would_erase_still_moves_the_model():
  """A float32 model of values 1e4: 1e-6 C v_i is below half an ulp everywhere, so the reply
  moves the coordinate of the largest |v_i| by one ulp (Flower's clip divides by the norm)."""
  big = ArrayRecord({'w': Array(np.full(50, 1e4, np.float32))})
  update = 1e-6 * user_app.canary_direction(SEED, 0, 50)
  got = user_app.add_to_model(big, update)['w'].numpy()
  moved = np.flatnonzero(got != np.float32(1e4))
  assert moved.tolist() == [int(np.argmax(np.abs(update)))]
  assert np.sign(got[moved[0]] - 1e4) == np.sign(update[moved[0]])


def test_evaluate_replies_weigh_zero_and_the_query_says_who_is_a_canary():
  grid = _grid(2, 4)
  ids = grid.get_node_ids()
  replies = _train(grid, _model(), message_type='evaluate')
  for node in ids[2:]:
    assert dict(replies[node].content['metrics']) == {'eval_loss': 0.0, 'num-examples': 0}
  for node in ids[:2]:
    assert replies[node].content['metrics']['num-examples'] == EXAMPLES
  found = user_app.discover_canaries(grid)
  assert {n: info[user_app.INDEX_KEY] for n, info in found.items()} == {
      ids[2 + i]: i for i in range(4)}
  assert all(info[user_app.SEED_KEY] == SEED for info in found.values())


def test_with_canaries_dispatches_canary_nodes_and_hands_the_others_to_the_users_app():
  """Real nodes: the user's app gets every message (a custom action and its own queries too)
  and replies exactly as unwrapped; the discovery query is answered before it. Canary nodes:
  the user's handlers never run; its app-level mods do (default), or not (canary_mods=[])."""
  calls, seen = [], []

  def mod(msg, context, call_next):
    seen.append(int(context.node_config['partition-id']))
    return call_next(msg, context)

  user = user_client_app(calls, mods=[mod])
  user.train('custom')(lambda msg, context: Message(
      RecordDict({'custom': ConfigRecord({'ok': 1})}), reply_to=msg))
  configs = [{}, {}] + _canary_configs(2)
  wrapped = inprocess.InProcessGrid([user_app.with_canaries(user)] * 4, node_configs=configs,
                                 raise_client_errors=True)
  plain = inprocess.InProcessGrid([user] * 4, node_configs=configs, raise_client_errors=True)
  ids = wrapped.get_node_ids()
  got, want = _train(wrapped, _model()), _train(plain, _model(), ids[:2])
  for node in ids[:2]:
    for name in ('arrays', 'metrics'):
      a, b = got[node].content[name], want[node].content[name]
      assert list(a.keys()) == list(b.keys())
      for key in a.keys():
        x = a[key].numpy() if name == 'arrays' else a[key]
        y = b[key].numpy() if name == 'arrays' else b[key]
        np.testing.assert_array_equal(x, y)
  assert sorted(calls) == [('train', 0), ('train', 0), ('train', 1), ('train', 1)]
  assert sorted(seen) == [0, 0, 1, 1, 2, 3]
  for node in ids[2:]:
    assert got[node].content['metrics']['train_loss'] == 0.0
  custom = _train(wrapped, _model(), ids[:1], message_type='train.custom')
  assert custom[ids[0]].content['custom']['ok'] == 1
  calls.clear()
  found = user_app.discover_canaries(wrapped)
  assert sorted(found) == ids[2:] and calls == []
  with inprocess.task_identity(wrapped.run.run_id, SUPERLINK_NODE_ID):
    own = [Message(RecordDict({'config': ConfigRecord({'x': 1})}), dst_node_id=ids[0],
                   message_type='query')]
  assert _send(wrapped, own)[0].content['mine']['hello'] == 1 and calls == [('query', 0)]
  seen.clear()
  bare = inprocess.InProcessGrid([user_app.with_canaries(user, canary_mods=[])] * 4,
                              node_configs=configs, raise_client_errors=True)
  _train(bare, _model())
  assert sorted(seen) == [0, 1]
  with pytest.raises(TypeError, match='ClientApp'):
    user_app.with_canaries(lambda msg, context: msg)


def test_a_misconfigured_canary_node_is_refused():
  with pytest.raises(ValueError, match='canary-norm must be >= 1'):
    user_app.CanaryConfig.from_node_config({'canary-index': 0, 'canary-seed': 1,
                                           'canary-norm': 0.5, 'clip-norm': 1.0})
  with pytest.raises(ValueError, match=r"\['canary-seed'\]"):
    user_app.CanaryConfig.from_node_config({'canary-index': 0, 'canary-norm': 2.0,
                                           'clip-norm': 1.0})
  assert user_app.CanaryConfig.from_node_config({'partition-id': 0}) is None
  # The server refuses canaries whose seed is not its own (it would redraw other coins).
  grid = _grid(2, 4)
  strategy = user_app.CanaryAuditStrategy(_dp(6, 1.0), seed=SEED + 1, canary_norm=NORM,
                                         clip_norm=CLIP, delta=DELTA)
  with pytest.raises(ValueError, match='canary-seed'):
    _run(strategy, grid, 1)


# --- the strategy ---------------------------------------------------------------------------


def test_the_strategy_changes_nothing_and_keeps_only_what_the_server_sees():
  """Same seed with and without the wrapper: the same models and metrics bit for bit. What it
  keeps is the projection of the server's own models (those `evaluate_fn` sees) and of the
  raw uploads (as `RecordingStrategy`, placed inside it, records them); the user's app never
  sees the discovery query. The server reading uploads is not protected by server-side
  clipping: that threat's bound reaches the most the canaries can certify."""
  num_real, k, z, rounds = 4, 64, 1.0, 3
  n = num_real + k
  log = recording_lib.UploadLog()
  template = {name: np.zeros(s, np.float32) for name, s in SHAPES.items()}
  recording = recording_lib.RecordingStrategy(_dp(n, z), template, observer=log)
  audit = user_app.CanaryAuditStrategy(recording, seed=SEED, canary_norm=NORM, clip_norm=CLIP,
                                      delta=DELTA, num_null=32, keep_models=True,
                                      threats=('all_iterates', 'last_iterate', 'uploads'))
  seen, bare_seen = [], []
  result = _run(audit, _grid(num_real, k), rounds, observed=seen)
  bare = _run(_dp(n, z), _grid(num_real, k), rounds, observed=bare_seen)
  np.testing.assert_array_equal(np.stack(seen), np.stack(bare_seen))
  np.testing.assert_array_equal(_flat(result.arrays), _flat(bare.arrays))
  assert result.evaluate_metrics_clientapp == bare.evaluate_metrics_clientapp
  assert len(audit.rounds) == rounds
  directions = np.stack([user_app.canary_direction(SEED, i, DIM) for i in range(k + 32)])
  nodes = {i: n for n, i in audit.canary_nodes.items()}
  for t, r in enumerate(audit.rounds):
    np.testing.assert_array_equal(r.model, seen[t])
    np.testing.assert_array_equal(r.aggregate, seen[t + 1])
    np.testing.assert_allclose(r.before, directions @ seen[t], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.after, directions @ seen[t + 1], rtol=1e-12, atol=1e-12)
    assert r.sampled.all() and r.replied.all() and r.num_messages == n
    got = log.rounds[t]
    for i in range(k):
      j = int(np.flatnonzero(got.node_ids == nodes[i])[0])
      raw = np.concatenate([np.asarray(got.uploads[j][name], np.float64).ravel()
                            for name in SHAPES])
      assert r.uploads[i] == pytest.approx(float((raw - seen[t]) @ directions[i]), abs=1e-9)
  m = user_app.audit(audit)
  assert m['counted_bounds'].count('/') == 6
  assert m['bound_confidence'] == pytest.approx(1 - 0.05 / 6)
  assert m['uploads/epsilon_one_run_fdp'] >= 0.95 * m['max_certifiable'] > 1.0


def test_discovered_and_given_canary_nodes_give_the_same_audit():
  grid = _grid(4, 32)
  nodes = grid.get_node_ids()
  given = user_app.CanaryAuditStrategy(
      _dp(36, 2.0), seed=SEED, canary_norm=NORM, clip_norm=CLIP, delta=DELTA, num_null=32,
      canary_nodes={nodes[4 + i]: i for i in range(32)})
  learnt = user_app.CanaryAuditStrategy(_dp(36, 2.0), seed=SEED, canary_norm=NORM,
                                       clip_norm=CLIP, delta=DELTA, num_null=32,
                                       num_canaries=32)
  _run(given, grid, 2)
  _run(learnt, _grid(4, 32), 2)
  assert learnt.canary_nodes == given.canary_nodes
  a, b = user_app.audit(given), user_app.audit(learnt)
  assert set(a) == set(b)
  for key, value in a.items():
    assert _same(value, b[key]), key
  with pytest.raises(ValueError, match='33 expected'):
    user_app.CanaryAuditStrategy(_dp(36, 2.0), seed=SEED, canary_norm=NORM, clip_norm=CLIP,
                                delta=DELTA, canary_nodes={n: i for i, n in enumerate(
                                    nodes[4:])}, num_canaries=33)


def test_the_bounds_stay_below_the_exact_epsilon_of_a_noisy_wrapper():
  """z = 4 over T = 3 rounds: each canary is mu = sqrt(3) / 4 GDP (zero-out: C / n against
  z C / n), exact epsilon 1.70 at 1e-5, while 128 canaries could certify up to 3.6: the
  counted bounds stay below the exact epsilon, Flower's RdpAccountant states more (no
  violation), the fit finds mu within its sampling error, the null is the noise alone."""
  z, rounds, k, n = 4.0, 3, 128, 132
  strategy, m = _audit(4, k, z, rounds)
  mu = math.sqrt(rounds) / z
  exact = auditing.gdp_epsilon(mu, DELTA)
  assert m['max_certifiable'] > 1.5 * exact  # the test could fail
  for name in m['counted_bounds'].split(','):
    assert m[name] <= exact + 0.05, (name, m[name], exact)
  assert m['stated_epsilon'] > exact and m['privacy_violation'] == 0.0
  assert m['stated_epsilon_source'].startswith('flwr privacy_spent()')
  assert m['stated_delta'] == DELTA
  assert (m['unit'], m['relation'], m['sampling']) == ('client', 'zero_out', 'none')
  assert m['adversary'] == 'server_knows_the_sample'
  assert m['n_in'] + m['n_out'] == k and m['lost_canary_replies'] == 0
  assert m['bound_confidence'] == pytest.approx(1 - 0.05 / 4)
  # The fit's mu within 3 of its sampling errors, sqrt(1 / n_in + mu^2 / (2 n_null)) (0.12).
  for threat in ('all_iterates', 'last_iterate'):
    error = math.sqrt(1 / m[f'{threat}/fit_n_in'] + mu ** 2 / (2 * m[f'{threat}/n_null']))
    assert abs(m[f'{threat}/fit_mu'] - mu) < 3 * error, (threat, m[f'{threat}/fit_mu'], error)
  # The null directions see Flower's noise alone: std sqrt(T) z C / n over the rounds.
  _, null, _ = user_app.statistics(strategy.rounds, k, ('all_iterates',))
  assert np.std(null['all_iterates']) == pytest.approx(math.sqrt(rounds) * z * CLIP / n,
                                                       rel=0.2)


def test_tiny_noise_reaches_the_most_the_canaries_can_certify():
  """z = 1e-3: every included canary stands out, the bounds reach `max_certifiable`, and a
  claim of 1 (given by the user) is refuted."""
  _, m = _audit(4, 128, 1e-3, 2, accountant=False, stated_epsilon=1.0)
  assert m['max_certifiable'] > 3.0
  assert m['best_bound'] >= 0.95 * m['max_certifiable']
  assert m['privacy_violation'] == 1.0 and m['stated_epsilon_source'] == 'given'


def test_statistics_are_the_sums_of_the_recorded_projections():
  """Against a hand computation on made-up projections: every canary every round, the raw
  sums; a canary missing a round, its own rounds over sqrt(T_i); never sampled, 0."""
  rng = np.random.default_rng(0)
  k, null, t = 3, 2, 3
  before, after = rng.normal(size=(t, k + null)), rng.normal(size=(t, k + null))
  ups = rng.normal(size=(t, k))
  part = np.ones((t, k), bool)
  rounds = [user_app.CanaryRound(r + 1, part[r], part[r], 5, before[r], after[r], ups[r])
            for r in range(t)]
  s, nul, _ = user_app.statistics(rounds, k, user_app.THREATS)
  np.testing.assert_allclose(s['all_iterates'], (after - before)[:, :k].sum(0))
  np.testing.assert_allclose(nul['all_iterates'], (after - before)[:, k:].sum(0))
  np.testing.assert_allclose(s['last_iterate'], after[-1, :k] - before[0, :k])
  np.testing.assert_allclose(s['uploads'], ups.sum(0))
  part[1, 0] = False
  part[:, 2] = False
  rounds = [user_app.CanaryRound(r + 1, part[r], part[r], 5, before[r], after[r], ups[r])
            for r in range(t)]
  s, nul, _ = user_app.statistics(rounds, k, user_app.THREATS)
  d = after - before
  np.testing.assert_allclose(s['all_iterates'], [(d[0, 0] + d[2, 0]) / math.sqrt(2),
                                                 d[:, 1].sum() / math.sqrt(3), 0.0])
  np.testing.assert_allclose(nul['all_iterates'], d[:, k:].sum(0) / math.sqrt(3))
  np.testing.assert_allclose(s['last_iterate'][:2],
                             (after[-1, :2] - before[0, :2]) / math.sqrt(3))
  np.testing.assert_allclose(s['uploads'], [(ups[0, 0] + ups[2, 0]) / math.sqrt(2),
                                            ups[:, 1].sum() / math.sqrt(3), 0.0])


def test_the_recording_is_written_each_round_and_the_command_audits_it(tmp_path, capsys):
  """The file after every round holds the rounds so far; the command's results.json is the
  in-memory audit; bad input is one line naming the field, exit 2, nothing written."""
  folder = tmp_path / 'run'
  strategy = user_app.CanaryAuditStrategy(_dp(36, 2.0), seed=SEED, canary_norm=NORM,
                                          clip_norm=CLIP, delta=DELTA, num_null=32,
                                          directory=folder, threats=ALL_THREATS)
  on_file = []

  def look(server_round, arrays):
    del arrays
    if server_round:
      on_file.append(len(user_app.load_rounds(folder / user_app.ROUNDS_FILE)[1]))

  with dp_games.quiet_flower(), jobs.seeded(3):
    inprocess.run(strategy, _grid(4, 32), _model(), num_rounds=2, evaluate_fn=look)
  assert on_file == [1, 2]
  meta, rounds = user_app.load_rounds(folder / user_app.ROUNDS_FILE)
  assert [r.server_round for r in rounds] == [1, 2] and meta['delta'] == DELTA
  assert [c['count'] for c in meta['flower']['accountant_state']['compositions']] == [1, 1]
  assert rounds[0].flower_epsilon < rounds[1].flower_epsilon == meta['flower'][
      'stated_epsilon']
  m = user_app.audit(strategy)
  _equals_reference(m, 'a')
  assert m['dp_accounting_epsilon'] == pytest.approx(m['flower_privacy_spent_epsilon'],
                                                     rel=1e-12)
  assert user_app.main([str(folder), f'--workdir={tmp_path / "out"}']) == 0
  saved = json.loads((tmp_path / 'out' / user_app.RESULTS).read_text())
  assert set(saved) == set(m)
  for key, value in m.items():
    assert _same(value, math.nan if saved[key] is None else saved[key]), key
  assert '| all_iterates |' in (tmp_path / 'out' / user_app.TABLE).read_text()
  capsys.readouterr()
  bad = [([str(tmp_path / 'nothing')], 'recording: '),
         ([str(folder), '--delta=1e-6'], 'delta: '),
         ([str(folder), '--stated_epsilon=-1'], 'stated_epsilon: '),
         ([str(folder), '--delta=x'], 'argument --delta')]
  for argv, field in bad:
    assert user_app.main(argv + [f'--workdir={tmp_path / "bad"}']) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f'user_app: {field}') and '\n' not in err, err
  meta_bad = {**meta, 'seed': -1}
  user_app.save_rounds(tmp_path / 'seed.npz', rounds, meta_bad)
  assert user_app.main([str(tmp_path / 'seed.npz'), f'--workdir={tmp_path / "bad"}']) == 2
  assert capsys.readouterr().err.startswith('user_app: seed: ')
  assert not (tmp_path / 'bad').exists()


def _equals_reference(m, name):
  """Every field `flower.own_app`'s in-process audit gave before the in-app split, on the
  same run (own_app_reference.json, computed then at commit f583b65): 'a' every node every
  round with the uploads threat and Flower's accountant, 'b' half the nodes sampled a round
  with a stated claim."""
  ref = json.loads(pathlib.Path(__file__).with_name('own_app_reference.json').read_text())
  assert set(ref[name]) <= set(m), set(ref[name]) - set(m)
  for key, want in ref[name].items():
    got = m[key]
    if want is None:
      assert isinstance(got, float) and math.isnan(got), (name, key, got)
    elif isinstance(want, float):
      assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (name, key, got, want)
    else:
      assert got == want, (name, key, got, want)


def test_client_sampling_audited_from_the_file_equals_the_audit_of_before(tmp_path):
  """FedAvg trains 18 of 36 nodes a round (Python's random.sample): the server knows whom it
  sampled, so each canary counts its own rounds. With a stated claim, audited from the file:
  every field as before the in-app split (run 'a' is the test above)."""
  strategy = user_app.CanaryAuditStrategy(
      _dp(36, 2.0, accountant=False, fraction_train=0.5), seed=SEED, canary_norm=NORM,
      clip_norm=CLIP, delta=DELTA, num_null=32, directory=tmp_path, stated_epsilon=3.0)
  _run(strategy, _grid(4, 32), 3)
  m = user_app.audit_recording(*user_app.load_rounds(tmp_path / user_app.ROUNDS_FILE))
  _equals_reference(m, 'b')
  assert m['sampling'] == 'fixed_size_without_replacement'
  assert all(r.num_messages == 18 and r.sampled.sum() <= 18 for r in strategy.rounds)
  assert m['rounds_per_canary_min'] < m['rounds_per_canary_max'] <= 3


def test_the_most_k_canaries_can_certify():
  """The one-run bounds' ceiling (every guess right), at c = 0.95 over 4 counted bounds:
  16 canaries certify nothing, more canaries more (the doc's table)."""
  reach = {k: user_app.max_certifiable(k // 2, k - k // 2, delta=DELTA, confidence=0.95,
                                      num_counted=4) for k in (16, 64, 256)}
  assert reach[16] == 0.0 and 0 < reach[64] < reach[256]
  direct = auditing.audit_scores(np.ones(32), np.zeros(32), delta=DELTA,
                                 confidence=1 - 0.05 / 4)
  assert reach[64] == max(direct['epsilon_one_run'], direct['epsilon_one_run_fdp'])
