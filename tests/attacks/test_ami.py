"""Tests of the AMI attack's crafting, decision paths, fast LDP sampler and game trials."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy import models
from fl_privacy.attacks import ami
from fl_privacy.eval import runner
from fl_privacy.fl import losses
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point

D, R, H2, C = 12, 24, 6, 3


def _toy_data(seed=0, n=60):
  rng = np.random.default_rng(seed)
  x = rng.uniform(0, 8, size=(n, D)).astype(np.float32)
  y = rng.integers(0, C, size=n).astype(np.int32)
  return x, y


def test_craft_separates_and_reports_steps():
  x, _ = _toy_data()
  target, negatives = x[:1], x[1:]
  neuron, rep = ami.craft(jax.random.key(0), target, negatives, num_neurons=R,
                          learning_rate=1e-2, max_steps=2000)
  assert bool(rep.separated)
  assert 0 < int(rep.steps) < 2000
  v = ami.chosen_value(neuron, jnp.asarray(x))
  assert float(v[0]) > 0 and bool(jnp.all(v[1:] <= 0))
  assert float(rep.train_tpr) == 1.0 and float(rep.train_tnr) == 1.0


def test_craft_spends_budget_when_not_stopping():
  x, _ = _toy_data()
  _, rep = ami.craft(jax.random.key(0), x[:1], x[1:], num_neurons=R, learning_rate=1e-2,
                     max_steps=37, stop_when_separated=False)
  assert int(rep.steps) == 37


def test_craft_many_matches_single_targets():
  x, _ = _toy_data()
  keys = jax.random.split(jax.random.key(1), 2)
  pos = jnp.asarray(x[:2])[:, None, :]
  neg = jnp.stack([x[2:], x[2:]])
  kw = dict(num_neurons=R, learning_rate=1e-2, max_steps=500)
  many, rep = ami.craft_many(keys, pos, neg, **kw)
  for t in range(2):
    one, rep1 = ami.craft(keys[t], pos[t], neg[t], **kw)
    assert int(rep.steps[t]) == int(rep1.steps)
    np.testing.assert_allclose(many.h[t], one.h, rtol=1e-4, atol=1e-5)


def test_rescale_keeps_every_decision_and_tames_values():
  x, _ = _toy_data()
  neuron = ami.init_neuron(jax.random.key(3), D, R)
  neuron = neuron._replace(w=neuron.w * 300.0, h=neuron.h * 50.0, c=jnp.float32(-7.0))
  probe = jnp.asarray(np.random.default_rng(1).uniform(-10, 20, size=(500, D)), jnp.float32)
  scaled = ami.rescale(neuron, jnp.asarray(x))
  assert bool(jnp.all((ami.chosen_value(neuron, probe) > 0) ==
                      (ami.chosen_value(scaled, probe) > 0)))
  assert float(jnp.max(jnp.abs(ami.chosen_value(scaled, jnp.asarray(x))))) <= 1.0


def _mlp(key):
  model = models.MLP(hidden=(R, H2), num_classes=C)
  return model, model.init(key, jnp.zeros((1, D)))


def test_write_into_mlp_places_block_and_keeps_honest_rest():
  model, honest = _mlp(jax.random.key(0))
  assert models.param_count(honest) == D * R + R + R * H2 + H2 + H2 * C + C
  neuron = ami.init_neuron(jax.random.key(5), D, R)._replace(c=jnp.float32(0.25))
  params = ami.write_into_mlp(neuron, honest, 2)
  x, _ = _toy_data()
  hidden = jax.nn.relu(x @ params['params']['fc1']['kernel'] + params['params']['fc1']['bias'])
  pre = hidden @ params['params']['fc2']['kernel'] + params['params']['fc2']['bias']
  np.testing.assert_allclose(pre[:, 2], ami.chosen_value(neuron, jnp.asarray(x)), rtol=1e-5,
                             atol=1e-5)
  keep = np.array([j for j in range(H2) if j != 2])
  np.testing.assert_array_equal(params['params']['fc2']['kernel'][:, keep],
                                honest['params']['fc2']['kernel'][:, keep])
  np.testing.assert_array_equal(params['params']['fc3']['kernel'],
                                honest['params']['fc3']['kernel'])
  back = ami.neuron_from_params(params, 2)
  np.testing.assert_array_equal(back.h, neuron.h)


@pytest.mark.parametrize('honour_sign', [True, False])
def test_codes_decode_like_fixed_point(honour_sign):
  enc = ami.Encoding(honour_sign=honour_sign)
  sizes = enc.group_sizes()
  assert sum(sizes) == enc.num_bits == 10
  bits = jax.random.bernoulli(jax.random.key(0), 0.5, (50, D, 10)).astype(jnp.uint8)
  codes = ami.pack_codes(bits, sizes)
  np.testing.assert_array_equal(ami.unpack_codes(codes, sizes), bits)
  np.testing.assert_array_equal(
      ami.codes_to_values(codes, sizes, enc),
      fixed_point.decode(bits, 5, 4, True, honour_sign))


def _bit_rates(channel, sizes, in_bits, n, key):
  codes = jnp.broadcast_to(ami.pack_codes(in_bits, sizes), (n,) + in_bits.shape[:-1] +
                           (len(sizes),))
  out = ami.sample_codes(key, codes, tuple(jnp.asarray(t) for t in channel.thresholds),
                         channel.xor)
  return np.asarray(jnp.mean(ami.unpack_codes(out, sizes).astype(jnp.float32), axis=0))


@pytest.mark.parametrize('mechanism,epsilon', [('bitrand', 2.0), ('bitrand', 9.0),
                                               ('ome', 3.0)])
def test_code_sampler_bit_marginals_match_mechanism(mechanism, epsilon):
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  p_one = ami.bit_probabilities(mechanism, epsilon, 64, enc)
  channel = ami.channel_from_bit_probs(p_one, sizes)
  assert channel.tv_per_feature < 1e-7
  n = 40_000
  for bit in (0, 1):
    in_bits = jnp.full((1, 10), bit, jnp.uint8)
    rates = _bit_rates(channel, sizes, in_bits, n, jax.random.key(bit))[0]
    for k in range(10):
      lo, hi = sps.binom.interval(0.999, n, p_one[k, bit])
      assert lo / n - 1e-9 <= rates[k] <= hi / n + 1e-9, (k, bit, rates[k], p_one[k, bit])


def test_code_sampler_bits_are_independent_within_a_group():
  # P(out = 11 in bits 8, 9) is the product of the marginals (bits of one group).
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  p_one = ami.bit_probabilities('bitrand', 4.0, 64, enc)
  channel = ami.channel_from_bit_probs(p_one, sizes)
  n = 40_000
  codes = jnp.zeros((n, 1, 2), jnp.uint32)
  out = ami.sample_codes(jax.random.key(0), codes, tuple(jnp.asarray(t) for t in
                                                          channel.thresholds), channel.xor)
  bits = np.asarray(ami.unpack_codes(out, sizes))[:, 0]
  both = int(np.sum(bits[:, 8] & bits[:, 9]))
  lo, hi = sps.binom.interval(0.999, n, p_one[8, 0] * p_one[9, 0])
  assert lo <= both <= hi


def test_code_sampler_agrees_with_bitrand_on_decoded_means():
  enc = ami.Encoding()
  x = jnp.asarray(np.random.default_rng(0).uniform(-20, 20, size=(1, D)), jnp.float32)
  n = 20_000
  fast_x = ami.codes_to_values(
      ami.sample_codes(jax.random.key(1),
                       jnp.broadcast_to(ami.pack_codes(fixed_point.encode(x)[0],
                                                       enc.group_sizes()), (n, D, 2)),
                       tuple(jnp.asarray(t) for t in ami.channel_from_bit_probs(
                           ami.bit_probabilities('bitrand', 5.0, D, enc),
                           enc.group_sizes()).thresholds), (True, True)),
      enc.group_sizes(), enc)
  exact_x = bitrand.randomize(jax.random.key(2), jnp.broadcast_to(x, (n, D)), 5.0)
  diff = np.mean(np.asarray(fast_x), 0) - np.mean(np.asarray(exact_x), 0)
  se = np.sqrt((np.var(np.asarray(fast_x), 0) + np.var(np.asarray(exact_x), 0)) / n)
  assert np.all(np.abs(diff) <= 5 * se + 1e-6)


def test_calibrate_bias_separable_and_not_worse_than_zero():
  neuron = ami.init_neuron(jax.random.key(0), D, R)
  v_pos = jnp.asarray([3.0, 4.0, 5.0])
  v_neg = jnp.asarray([1.0, 2.0, 2.5, -1.0])
  new, adv = ami.calibrate_bias(neuron, v_pos, v_neg, 10)
  assert float(adv) == pytest.approx(1.0)
  assert 2.5 < float(neuron.c - new.c) < 3.0
  zero = ami.batch_advantage(jnp.mean(v_pos > 0), jnp.mean(v_neg > 0), 10)
  assert float(adv) >= float(zero)


def test_batch_advantage_matches_simulation():
  rng = np.random.default_rng(0)
  p, f, b, n = 0.7, 0.05, 8, 200_000
  member = (rng.random(n) < p) | np.any(rng.random((n, b - 1)) < f, axis=1)
  nonmember = np.any(rng.random((n, b)) < f, axis=1)
  sim = 0.5 * (member.mean() + 1 - nonmember.mean())
  assert float(ami.batch_advantage(p, f, b)) == pytest.approx(sim, abs=0.005)


# --- the game ------------------------------------------------------------------------------


def _game_setup(seed=0, num_targets=2):
  x, y = _toy_data(seed, n=200)
  targets, pool = x[:num_targets], x[num_targets:]
  keys = jax.random.split(jax.random.key(seed), num_targets)
  neurons, _ = ami.craft_many(keys, jnp.asarray(targets)[:, None, :],
                              jnp.broadcast_to(pool[:80], (num_targets, 80, D)),
                              num_neurons=R, learning_rate=1e-2, max_steps=300)
  neurons = jax.vmap(ami.rescale)(neurons, jnp.broadcast_to(x, (num_targets,) + x.shape))
  model = models.MLP(hidden=(R, H2), num_classes=C)
  per = [ami.write_into_mlp(jax.tree.map(lambda a, t=t: a[t], neurons),
                            model.init(jax.random.key(100 + t), jnp.zeros((1, D))), 0)
         for t in range(num_targets)]
  params = jax.tree.map(lambda *a: jnp.stack(a), *per)
  return x, y, neurons, model, params


def test_trial_roles_alternate_and_cycle_targets():
  b, t = ami.trial_roles(jnp.arange(12), 3)
  np.testing.assert_array_equal(b, np.arange(12) % 2)
  np.testing.assert_array_equal(t, (np.arange(12) // 2) % 3)


@pytest.mark.parametrize('mechanism', ['none', 'bitrand'])
def test_literal_gradient_agrees_with_fast_path(mechanism):
  x, y, neurons, model, params = _game_setup()
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  targets = ami.GameSide(x=jnp.asarray(x[:2]), y=jnp.asarray(y[:2]),
                         codes=ami.pack_codes(fixed_point.encode(x[:2])[0], sizes))
  pool = ami.GameSide(x=jnp.asarray(x[2:]), y=jnp.asarray(y[2:]),
                      codes=ami.pack_codes(fixed_point.encode(x[2:])[0], sizes))
  thresholds, xor = None, ()
  if mechanism == 'bitrand':
    ch = ami.channel_from_bit_probs(ami.bit_probabilities('bitrand', 6.0, D, enc), sizes)
    thresholds, xor = tuple(jnp.asarray(t) for t in ch.thresholds), ch.xor
  fn = functools.partial(ami.literal_trial, batch_size=8,
                         loss_fn=losses.make_loss_fn(model.apply), chosen_index=0, xor=xor,
                         encoding=enc)
  out = runner.run_trials(fn, jax.random.key(7), 2000, chunk_size=500,
                          args=(params, targets, pool, thresholds), progress=False)
  np.testing.assert_array_equal(out['decision'], out['decision_fast'])
  # Non-trivial: both decisions occur, in member and non-member trials alike.
  assert 0 < out['decision'].mean() < 1
  b = out['b'].astype(bool)
  assert out['decision'][b].any() and (~out['decision'][~b]).any()
  if mechanism == 'bitrand':
    wrong = out['decision'] != b
    assert wrong.any() and not wrong.all()


def test_literal_path_reads_the_gradient():
  # With the classifier's row of the chosen unit zeroed, the backprop signal into the chosen
  # neuron is exactly 0: the literal path must then say "non-member" although the neuron
  # fires, where the fast path says "member".
  x, y, neurons, model, params = _game_setup()
  params = jax.tree.map(lambda a: a, params)
  fc3 = params['params']['fc3']
  params['params']['fc3'] = dict(fc3, kernel=fc3['kernel'].at[:, 0, :].set(0.0))
  targets = ami.GameSide(x=jnp.asarray(x[:2]), y=jnp.asarray(y[:2]))
  pool = ami.GameSide(x=jnp.asarray(x[2:]), y=jnp.asarray(y[2:]))
  fn = functools.partial(ami.literal_trial, batch_size=8,
                         loss_fn=losses.make_loss_fn(model.apply), chosen_index=0)
  out = runner.run_trials(fn, jax.random.key(7), 200, chunk_size=100,
                          args=(params, targets, pool, None), progress=False)
  assert not out['decision'].any()
  assert out['decision_fast'][out['b'] == 1].all()


def test_no_ldp_fast_path_equals_literal_trial_by_trial():
  x, y, neurons, model, params = _game_setup()
  v_t, v_p = ami.precomputed_values(neurons, jnp.asarray(x[:2]), jnp.asarray(x[2:]))
  fast = runner.run_trials(functools.partial(ami.fast_trial_no_ldp, batch_size=8),
                           jax.random.key(3), 600, chunk_size=200, args=(v_t, v_p),
                           progress=False)
  fn = functools.partial(ami.literal_trial, batch_size=8,
                         loss_fn=losses.make_loss_fn(model.apply), chosen_index=0)
  lit = runner.run_trials(fn, jax.random.key(3), 600, chunk_size=200,
                          args=(params, ami.GameSide(x=jnp.asarray(x[:2]), y=jnp.asarray(y[:2])),
                                ami.GameSide(x=jnp.asarray(x[2:]), y=jnp.asarray(y[2:])), None),
                          progress=False)
  np.testing.assert_array_equal(fast['decision'], lit['decision'])
  np.testing.assert_allclose(fast['score'], lit['score'], rtol=1e-5, atol=1e-5)


def test_fast_trial_independent_of_chunk_size():
  x, _, neurons, _, _ = _game_setup()
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  ch = ami.channel_from_bit_probs(ami.bit_probabilities('bitrand', 4.0, D, enc), sizes)
  args = (neurons, ami.GameSide(codes=ami.pack_codes(fixed_point.encode(x[:2])[0], sizes)),
          ami.GameSide(codes=ami.pack_codes(fixed_point.encode(x[2:])[0], sizes)),
          tuple(jnp.asarray(t) for t in ch.thresholds))
  fn = functools.partial(ami.fast_trial, batch_size=8, xor=ch.xor, encoding=enc)
  a = runner.run_trials(fn, jax.random.key(0), 300, chunk_size=64, args=args, progress=False)
  b = runner.run_trials(fn, jax.random.key(0), 300, chunk_size=300, args=args, progress=False)
  np.testing.assert_array_equal(a['decision'], b['decision'])
  np.testing.assert_array_equal(a['score'], b['score'])


def test_pair_trial_scores_the_same_batches_as_two_runs():
  # The pipeline plays the paper's neuron and the calibrated one in one run; each must decide
  # exactly as a run of its own with the same key would (same batches, same randomization).
  x, _, neurons, _, _ = _game_setup()
  other = neurons._replace(b=neurons.b - 0.5, c=neurons.c + 0.25)
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  ch = ami.channel_from_bit_probs(ami.bit_probabilities('bitrand', 4.0, D, enc), sizes)
  sides = (ami.GameSide(codes=ami.pack_codes(fixed_point.encode(x[:2])[0], sizes)),
           ami.GameSide(codes=ami.pack_codes(fixed_point.encode(x[2:])[0], sizes)),
           tuple(jnp.asarray(t) for t in ch.thresholds))
  kw = dict(batch_size=8, xor=ch.xor, encoding=enc)
  key = jax.random.key(5)
  pair = runner.run_trials(functools.partial(ami.fast_trial_pair, **kw), key, 400,
                           args=(neurons, other) + sides, progress=False)
  alone = [runner.run_trials(functools.partial(ami.fast_trial, **kw), key, 400,
                             args=(n,) + sides, progress=False) for n in (neurons, other)]
  np.testing.assert_array_equal(pair['decision'], alone[0]['decision'])
  np.testing.assert_array_equal(pair['score'], alone[0]['score'])
  np.testing.assert_array_equal(pair['decision_variant'], alone[1]['decision'])
  np.testing.assert_array_equal(pair['score_variant'], alone[1]['score'])
  # The two neurons really differ on these trials (else the test could not fail).
  assert (alone[0]['decision'] != alone[1]['decision']).any()
