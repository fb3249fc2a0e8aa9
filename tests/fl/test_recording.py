"""`fl.recording.train_recorded`: segments equal one run; padded clients record as unpadded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl_privacy import models
from fl_privacy.defenses import data as data_lib
from fl_privacy.defenses import dp as dp_lib
from fl_privacy.defenses import registry
from fl_privacy.defenses import update as update_lib
from fl_privacy.fl import client
from fl_privacy.fl import losses
from fl_privacy.fl import queries
from fl_privacy.fl import recording
from fl_privacy.fl import rounds
from tests import decisions

MODEL = models.MLP(hidden=(8,), num_classes=3)
OPT = optax.sgd(0.2, momentum=0.9)


def _data(num_clients=3, per_client=8, dim=4):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(per_client, dim)).astype(np.float32) for _ in range(num_clients)]
  ys = [rng.integers(0, 3, per_client).astype(np.int32) for _ in range(num_clients)]
  qx = rng.normal(size=(10, dim)).astype(np.float32)
  qy = rng.integers(0, 3, 10).astype(np.int32)
  params = MODEL.init(jax.random.key(1), qx[:1])
  return xs, ys, qx, qy, params


def test_recorded_rounds():
  np.testing.assert_array_equal(recording.recorded_rounds(12, 4), [3, 7, 11])
  with pytest.raises(ValueError):
    recording.recorded_rounds(10, 4)


def test_segments_equal_one_run():
  xs, ys, qx, qy, params = _data()
  clients = rounds.pad_clients(xs, ys)
  key = jax.random.key(5)
  got = recording.train_recorded(MODEL.apply, params, clients, qx, qy, key=key, num_rounds=6,
                                 record_every=3, optimizer=OPT, epochs=1, batch_size=4,
                                 test_x=qx, test_y=qy, chunk_size=4)
  # Round by round (one jitted round, t traced), keeping (w_t, uploads) of every round.
  loss_fn = losses.make_loss_fn(MODEL.apply)
  zeros = jax.tree_util.tree_map(lambda a: jnp.zeros((3,) + a.shape), params)

  @jax.jit
  def one_round(p, t):
    return rounds.run(loss_fn, p, clients, key=key, num_rounds=1, first_round=t,
                      optimizer=OPT, epochs=1, batch_size=4,
                      observe=lambda k, tt, c, g, u: u, init=zeros)

  kept = {}
  p = params
  for t in range(6):
    new, log = one_round(p, t)
    kept[t] = (p, log.observed)
    p = new
  whole, _ = rounds.run(loss_fn, params, clients, key=key, num_rounds=6, optimizer=OPT,
                        epochs=1, batch_size=4)
  np.testing.assert_allclose(jax.tree_util.tree_leaves(p)[0],
                             jax.tree_util.tree_leaves(whole)[0], rtol=1e-5, atol=1e-6)
  for i, t in enumerate((2, 5)):
    want = queries.measure_numpy(MODEL.apply, *kept[t], qx, qy, chunk_size=10)
    for name in ('loss', 'cos', 'diff'):
      np.testing.assert_allclose(got[name][i], getattr(want, name), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got['grad_sq'][i], want.grad_sq, rtol=1e-4)
  decisions.assert_correct_count(got['test_correct'][-1], MODEL.apply(p, qx), qy)
  assert int(got['num_test']) == 10
  assert got['loss'].shape == (2, 3, 10) and list(got['rounds']) == [2, 5]


def test_padded_clients_record_as_unpadded():
  xs, ys, qx, qy, params = _data()
  full = rounds.ClientData(x=np.stack(xs), y=np.stack(ys), mask=np.ones((3, 8), np.float32))
  padded = rounds.pad_clients(xs, ys, capacity=13)
  kw = dict(key=jax.random.key(2), num_rounds=4, record_every=2, optimizer=OPT, epochs=2,
            batch_size=3, chunk_size=5)
  a = recording.train_recorded(MODEL.apply, params, full, qx, qy, **kw)
  b = recording.train_recorded(MODEL.apply, params, padded, qx, qy, **kw)
  for name in ('loss', 'cos', 'diff', 'grad_sq'):
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_recorded_rounds_checks():
  np.testing.assert_array_equal(recording.recorded_rounds(3, 1), [0, 1, 2])
  for n, every in ((10, 4), (4, 0), (4, -2)):
    with pytest.raises(ValueError,
                       match=rf'^record_every \({every}\) must divide num_rounds \({n}\)$'):
      recording.recorded_rounds(n, every)


def test_test_split_progress_and_a_run_without_test_split():
  xs, ys, qx, qy, params = _data(num_clients=2, per_client=4)
  clients = rounds.pad_clients(xs, ys)
  kw = dict(key=jax.random.key(3), num_rounds=2, record_every=1, optimizer=OPT, epochs=1,
            batch_size=4, chunk_size=3)
  seen = []
  # Test labels chosen so that the correct count (8, then 7) differs from the count of any one
  # class: with qy itself the model's 1 correct equalled the number of 0 labels, which hid an
  # argmax over the wrong array (a mutation survivor).
  ty = (qy + 1) % 3
  got = recording.train_recorded(MODEL.apply, params, clients, qx, qy, test_x=qx, test_y=ty,
                                 progress=lambda i, info: seen.append((i, info)), **kw)
  loss_fn = losses.make_loss_fn(MODEL.apply)
  p = params
  for t in range(2):
    p, _ = rounds.run(loss_fn, p, clients, key=kw['key'], num_rounds=1, first_round=t,
                      optimizer=OPT, epochs=1, batch_size=4)
    logits = MODEL.apply(p, qx)
    correct = int(np.sum(np.argmax(logits, -1) == ty))
    assert correct not in np.bincount(ty, minlength=3)
    decisions.assert_correct_count(got['test_correct'][t], logits, ty)
    np.testing.assert_allclose(got['test_loss'][t], float(losses.cross_entropy(logits, ty)),
                               rtol=1e-5)
    assert seen[t][0] == t and seen[t][1]['round'] == t
    assert seen[t][1]['test_accuracy'] == pytest.approx(correct / 10)
  assert got['test_correct'].dtype == np.int64 and got['test_loss'].dtype == np.float64
  assert got['rounds'].dtype == np.int32 and got['loss'].dtype == np.float32
  assert int(got['num_test']) == 10
  with pytest.raises(ValueError, match=r'^chunk_size must be >= 1 \(got 0\)$'):
    recording.train_recorded(MODEL.apply, params, clients, qx, qy, **dict(kw, chunk_size=0))
  seen.clear()
  bare = recording.train_recorded(MODEL.apply, params, clients, qx, qy,
                                  progress=lambda i, info: seen.append((i, info)), **kw)
  np.testing.assert_array_equal(bare['test_correct'], [0, 0])
  assert bare['test_loss'].shape == (2,) and np.all(np.isnan(bare['test_loss']))
  assert int(bare['num_test']) == 0 and np.isnan(seen[1][1]['test_accuracy'])
  np.testing.assert_array_equal(bare['loss'], got['loss'])


def _zero_upload(key, delta, aux):
  del key, aux
  return jax.tree_util.tree_map(jnp.zeros_like, delta)


def test_upload_hook_reaches_the_recorded_uploads_and_chunks_of_one():
  xs, ys, qx, qy, params = _data(num_clients=2, per_client=4)
  clients = rounds.pad_clients(xs, ys)
  # Every client uploads zeros: the server measures at w_0 against zero updates.
  got = recording.train_recorded(MODEL.apply, params, clients, qx[:3], qy[:3],
                                 key=jax.random.key(4), num_rounds=1, record_every=1,
                                 optimizer=OPT, epochs=1, batch_size=4, chunk_size=1,
                                 hooks=client.ClientHooks(upload=_zero_upload))
  np.testing.assert_array_equal(got['cos'], 0.0)
  np.testing.assert_allclose(got['diff'][0], -np.tile(got['grad_sq'][0], (2, 1)), rtol=1e-6)
  want = losses.per_example_cross_entropy(MODEL.apply(params, qx[:3]), qy[:3])
  np.testing.assert_allclose(got['loss'][0], np.tile(want, (2, 1)), rtol=1e-5)


def _scalar_inputs_model(params, x):
  """Logits [N, 3] of scalar inputs [N] (examples with no trailing axes)."""
  return x[:, None] * params['w'] + params['b']


def test_queries_without_trailing_axes():
  rng = np.random.default_rng(6)
  xs = [rng.normal(size=4).astype(np.float32) for _ in range(2)]
  ys = [rng.integers(0, 3, 4).astype(np.int32) for _ in range(2)]
  qx, qy = rng.normal(size=5).astype(np.float32), np.asarray([0, 1, 2, 1, 0], np.int32)
  params = {'w': jnp.asarray([1.0, -1.0, 0.5]), 'b': jnp.zeros(3)}
  got = recording.train_recorded(_scalar_inputs_model, params, rounds.pad_clients(xs, ys), qx,
                                 qy, key=jax.random.key(7), num_rounds=1, record_every=1,
                                 optimizer=OPT, epochs=1, batch_size=2, chunk_size=8)
  assert got['loss'].shape == (1, 2, 5) and got['grad_sq'].shape == (1, 5)
  assert np.all(np.isfinite(got['loss']))


def test_a_half_precision_model_records_float32():
  rng = np.random.default_rng(8)
  xs = [rng.normal(size=4).astype(np.float32) for _ in range(2)]
  ys = [rng.integers(0, 3, 4).astype(np.int32) for _ in range(2)]
  qx, qy = jnp.asarray(rng.normal(size=3), jnp.bfloat16), np.asarray([0, 1, 2], np.int32)
  params = {'w': jnp.asarray([1.0, -1.0, 0.5], jnp.bfloat16), 'b': jnp.zeros(3, jnp.bfloat16)}
  clients = rounds.pad_clients([jnp.asarray(a, jnp.bfloat16) for a in xs], ys)
  got = recording.train_recorded(_scalar_inputs_model, params, clients, qx, qy,
                                 key=jax.random.key(9), num_rounds=1, record_every=1,
                                 optimizer=optax.sgd(0.1), epochs=1, batch_size=2)
  for name in ('loss', 'cos', 'diff', 'grad_sq'):
    assert got[name].dtype == np.float32, name


def test_member_accuracy_is_the_final_global_models_on_the_given_rows():
  xs, ys, qx, qy, params = _data(num_clients=2, per_client=6)
  clients = rounds.pad_clients(xs, ys)
  kw = dict(key=jax.random.key(3), num_rounds=2, record_every=1, optimizer=OPT, epochs=1,
            batch_size=3, chunk_size=4)
  mx, my = np.concatenate(xs), np.concatenate(ys)
  my = (my + 1) % 3  # a count that no single class's count equals (an argmax on the wrong axis)
  got = recording.train_recorded(MODEL.apply, params, clients, qx, qy, member_x=mx,
                                 member_y=my, **kw)
  p, _ = rounds.run(losses.make_loss_fn(MODEL.apply), params, clients, key=kw['key'],
                    num_rounds=2, optimizer=OPT, epochs=1, batch_size=3)
  correct = int(np.sum(np.argmax(MODEL.apply(p, mx), -1) == my))
  assert correct not in np.bincount(my, minlength=3)
  decisions.assert_correct_count(int(got['member_correct']), MODEL.apply(p, mx), my)
  assert int(got['num_member']) == 12
  bare = recording.train_recorded(MODEL.apply, params, clients, qx, qy, **kw)
  assert 'member_correct' not in bare and 'num_member' not in bare


@pytest.mark.parametrize('name, field, strengths, closure', [
    ('update_noise', 'sigma', (0.1, 0.7),
     lambda v: lambda k, d, a: update_lib.noise(k, d, v)),
    ('quantize', 'bits', (2, 5), lambda v: lambda k, d, a: update_lib.quantize(k, d, v)),
    ('update_dp', 'noise_multiplier', (0.3, 1.7),
     lambda v: lambda k, d, a: dp_lib.clip_and_noise_update(k, d, 0.25, v)),
    ('sampling', 'fraction', (0.5, 0.8),
     lambda v: lambda k, x, y, m, a: (x, y, data_lib.sample_rows(k, m, v))),
])
def test_a_sweeps_strengths_share_one_compiled_segment_and_give_the_closures_numbers(
    name, field, strengths, closure):
  # The strength of these upload hooks is a traced operand (`recording._split_hooks`): one
  # compilation for the whole sweep, and the numbers of a hook with the strength baked in.
  xs, ys, qx, qy, params = _data()
  clients = rounds.pad_clients(xs, ys)
  extra = {'clip_norm': 0.25} if name == 'update_dp' else {}
  slot = 'data' if name == 'sampling' else 'upload'
  kw = dict(key=jax.random.key(9), num_rounds=4, record_every=2, optimizer=OPT, epochs=1,
            batch_size=4, test_x=qx, test_y=qy, chunk_size=5)
  runs, sizes = [], []
  for v in strengths:
    hooks = registry.make(name, **{field: v}, **extra)
    runs.append(recording.train_recorded(MODEL.apply, params, clients, qx, qy, hooks=hooks,
                                         **kw))
    sizes.append(recording._segment._cache_size())  # pylint: disable=protected-access
  assert sizes[1] == sizes[0]  # the second strength compiled nothing
  for v, got in zip(strengths, runs):
    want = recording.train_recorded(MODEL.apply, params, clients, qx, qy,
                                    hooks=client.ClientHooks(**{slot: closure(v)}), **kw)
    for k in ('loss', 'cos', 'diff', 'margin', 'test_correct'):
      np.testing.assert_array_equal(got[k], want[k], err_msg=f'{name}={v}: {k}')
  assert not np.array_equal(got['cos'], recording.train_recorded(
      MODEL.apply, params, clients, qx, qy, **kw)['cos'])  # the hook acted
