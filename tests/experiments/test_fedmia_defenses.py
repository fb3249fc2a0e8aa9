"""The FedMIA pipeline's defense wiring (through the defense registry): each config strength
reaches the right hook with the code's parameterisation, update_dp's epsilon is the one every
experiment reports, and upload defenses reach the loss scores."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import digits
from fl_privacy import data as data_lib
from fl_privacy import models
from fl_privacy.fl import client
from fl_privacy.fl import recording
from fl_privacy.fl import rounds
import dp_accounting

from fl_privacy import defenses
from fl_privacy.pipelines import fedmia

CONFIG = digits.get_config()
TRAIN = data_lib.load(CONFIG.data)['train']


def _built(config, name, value):
  tr = dict(defense=name, defense_param=value, local_epochs=int(config.fedmia.local_epochs),
            num_clients=int(config.fedmia.num_clients))
  return fedmia.defense_for(config, {'train': TRAIN}, tr)


class wiring:  # pylint: disable=invalid-name
  """The registry-built hooks and epsilon, under the names these tests used before."""

  @staticmethod
  def hooks(config, name, value, train):
    del train
    return None if name == 'none' else _built(config, name, value).hooks

  @staticmethod
  def epsilon(config, name, value):
    return _built(config, name, value).metrics.get('dp_epsilon', math.inf)


def _changed(hooks) -> set[str]:
  return {name for name in client.ClientHooks._fields
          if getattr(hooks, name) is not getattr(client.IDENTITY, name)}


@pytest.mark.parametrize('name,value,points', [
    # update_dp also reports one unit for FedAvg's weights (a client-level guarantee against
    # the server hides the client's size).
    ('update_noise', 0.1, {'upload'}), ('update_dp', 1.0, {'upload', 'report'}),
    ('sparsify', 0.9, {'upload'}), ('quantize', 4, {'upload'}), ('mixup', 0.5, {'batch'}),
    ('augment', 2, {'batch'}), ('sampling', 0.5, {'data'}),
    ('augment_sampling', 0.5, {'batch', 'data'}),
])
def test_each_defense_uses_its_hook_point(name, value, points):
  assert _changed(wiring.hooks(CONFIG, name, value, TRAIN)) == points
  assert wiring.hooks(CONFIG, 'none', None, TRAIN) is None


def _delta():
  key = jax.random.key(0)
  return {'big': jax.random.normal(key, (40, 50)),  # 2,000 entries: sparsified
          'small': jax.random.normal(jax.random.fold_in(key, 1), (30,))}  # <= 1,000: kept


def test_upload_defense_properties():
  delta = _delta()
  key = jax.random.key(1)
  sparse = wiring.hooks(CONFIG, 'sparsify', 0.9, TRAIN).upload(key, delta, None)
  assert int(jnp.sum(sparse['big'] != 0)) == int((1 - 0.9) * 2000)  # int((1 - p) n) kept
  np.testing.assert_array_equal(sparse['small'], delta['small'])
  quant = wiring.hooks(CONFIG, 'quantize', 2, TRAIN).upload(key, delta, None)
  assert len(np.unique(np.asarray(quant['big']))) <= 4  # 2^bits levels per tensor
  noisy = wiring.hooks(CONFIG, 'update_noise', 0.5, TRAIN).upload(key, delta, None)
  residual = np.asarray(noisy['big'] - delta['big'])
  assert residual.std() == pytest.approx(0.5, rel=0.06)  # 2,000 draws: sd of sd ~ 1.6%
  dp = wiring.hooks(CONFIG, 'update_dp', 0.0, TRAIN).upload(key, delta, None)
  norm = math.sqrt(sum(float(jnp.sum(v ** 2)) for v in dp.values()))
  assert norm == pytest.approx(CONFIG.fedmia.dp_clip, rel=1e-5)  # z = 0: clipping only


def test_data_defense_properties():
  x = jnp.asarray(data_lib.to_float(TRAIN.x[:64]))
  y = jnp.asarray(TRAIN.y[:64])
  mask = jnp.ones(64)
  key = jax.random.key(2)
  hooks = wiring.hooks(CONFIG, 'sampling', 0.25, TRAIN)
  _, _, m = hooks.data(key, x, y, mask, None)
  assert int(m.sum()) == 16
  xm, ym, _ = wiring.hooks(CONFIG, 'mixup', 1.0, TRAIN).batch(key, x, y, mask, None)
  assert ym.shape == (64, 10) and not np.allclose(xm, x)
  config = digits.get_config()
  config.fedmia.mixup_public_code = True
  xp, yp, _ = wiring.hooks(config, 'mixup', 1.0, TRAIN).batch(key, x, y, mask, None)
  np.testing.assert_array_equal(xp, x)  # the public code trains on unmixed inputs
  assert yp.shape == (64, 10)
  xa, _, _ = wiring.hooks(CONFIG, 'augment', 1, TRAIN).batch(key, x, y, mask, None)
  assert xa.shape == x.shape and not np.allclose(xa, x)


def test_dp_epsilon_decreases_with_noise_and_is_inf_otherwise():
  eps = [wiring.epsilon(CONFIG, 'update_dp', z) for z in (0.5, 1.0, 2.0, 8.0)]
  assert all(a > b for a, b in zip(eps, eps[1:]))
  assert math.isinf(wiring.epsilon(CONFIG, 'update_dp', 0.0))
  assert math.isinf(wiring.epsilon(CONFIG, 'sparsify', 0.9))


@pytest.mark.parametrize('z', [0.5, 1.16, 3.0])
def test_update_dp_epsilon_is_replace_one_against_the_server_and_the_same_everywhere(z):
  """One example moves a clipped update by up to 2C and the server reads every upload, so
  T rounds compose the Gaussian mechanism at noise multiplier z / 2, with no amplification."""
  t = int(CONFIG.fedmia.num_rounds)
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(z / 2), t)
  want = acc.get_epsilon(CONFIG.fedmia.dp_delta)
  got = _built(CONFIG, 'update_dp', z).metrics
  assert got['dp_epsilon'] == pytest.approx(want, rel=1e-9)
  assert (got['dp_unit'], got['dp_relation'], got['dp_adversary']) == (
      'client', 'replace_one', 'server')
  section = digits.get_config().defense
  section.name, section.noise_multiplier, section.delta = 'update_dp', z, CONFIG.fedmia.dp_delta
  other = defenses.configure(section, defenses.Setting(rounds=t), experiment='dishonest_mia')
  assert other.metrics['dp_epsilon'] == pytest.approx(want, rel=1e-9)


def test_upload_defense_reaches_the_loss_scores():
  """Round 0: same w_0 and local training, so grad_sq is unchanged, but the loss is measured
  under w_0 - upload (the defended model), not under the local model."""
  model = models.MLP(hidden=(8,), num_classes=10)
  rng = np.random.default_rng(0)
  xs = [rng.random((16, 64), dtype=np.float32) for _ in range(3)]
  ys = [rng.integers(0, 10, 16).astype(np.int32) for _ in range(3)]
  params = model.init(jax.random.key(0), xs[0][:1])
  kw = dict(key=jax.random.key(1), num_rounds=1, record_every=1, optimizer=optax.sgd(0.1),
            epochs=1, batch_size=8, chunk_size=16)
  clients = rounds.pad_clients(xs, ys)
  plain = recording.train_recorded(model.apply, params, clients, xs[0], ys[0], **kw)
  noisy = recording.train_recorded(model.apply, params, clients, xs[0], ys[0],
                                   hooks=wiring.hooks(CONFIG, 'update_noise', 1.0, TRAIN), **kw)
  np.testing.assert_allclose(plain['grad_sq'], noisy['grad_sq'], rtol=1e-6)
  assert np.abs(plain['loss'] - noisy['loss']).mean() > 0.5
