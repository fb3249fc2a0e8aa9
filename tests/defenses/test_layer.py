"""`defenses` sits between `fl` and `eval`: it imports nothing above `fl`."""

from __future__ import annotations

import ast
import pathlib

import fl_privacy.defenses

ALLOWED = ('fl_privacy.validate', 'fl_privacy.catalog', 'fl_privacy.accounting', 'fl_privacy.mechanisms', 'fl_privacy.fl',
           'fl_privacy.defenses')


def test_defenses_import_only_lower_layers():
  folder = pathlib.Path(fl_privacy.defenses.__file__).parent
  for path in folder.glob('*.py'):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module + ('.' + node.names[0].name if node.module == 'fl_privacy'
                                else '')]
      for name in names:
        if name.startswith('fl_privacy'):
          assert name.startswith(ALLOWED), f'{path.name} imports {name}'


# ----------------------------------------------------------------------------------------------
# combine: fast, jit-free checks of the order, the keys and the arguments of every hook point.

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from fl_privacy import defenses  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.fl import client  # pylint: disable=g-import-not-at-top,wrong-import-position


def _kd(key):
  return np.asarray(jax.random.key_data(key)).tolist()


def _data_hook(i, calls):
  def fn(key, x, y, mask, aux):
    calls.append((i, _kd(key), x, y, mask, aux))
    return 10 * x + i, y + [i], mask + (i,)
  return fn


def _upload_hook(i, calls):
  def fn(key, delta, aux):
    calls.append((i, _kd(key), delta, aux))
    return 10 * delta + i
  return fn


@pytest.mark.parametrize('point', ['data', 'batch'])
def test_combine_chains_data_and_batch_hooks_in_order_with_folded_keys(point):
  calls = []
  hooks = [client.ClientHooks(**{point: _data_hook(i, calls)}) for i in range(3)]
  # IDENTITY between them is skipped: the i-th *non-identity* hook gets fold_in(key, i).
  both = defenses.combine(hooks[0], client.IDENTITY, hooks[1], defenses.make('none'), hooks[2])
  other = 'batch' if point == 'data' else 'data'
  assert getattr(both, other) is getattr(client.IDENTITY, other)
  key = jax.random.key(7)
  out = getattr(both, point)(key, 1, ['y'], (), 'aux')
  assert out == (((1 * 10 + 0) * 10 + 1) * 10 + 2, ['y', 0, 1, 2], (0, 1, 2))
  keys = [_kd(key), _kd(jax.random.fold_in(key, 1)), _kd(jax.random.fold_in(key, 2))]
  assert calls == [(0, keys[0], 1, ['y'], (), 'aux'),
                   (1, keys[1], 10, ['y', 0], (0,), 'aux'),
                   (2, keys[2], 101, ['y', 0, 1], (0, 1), 'aux')]


def test_combine_chains_upload_hooks_in_order_with_folded_keys():
  calls = []
  both = defenses.combine(*[client.ClientHooks(upload=_upload_hook(i, calls)) for i in range(3)])
  key = jax.random.key(5)
  assert both.upload(key, 1, 'aux') == 1012
  assert calls == [(0, _kd(key), 1, 'aux'), (1, _kd(jax.random.fold_in(key, 1)), 10, 'aux'),
                   (2, _kd(jax.random.fold_in(key, 2)), 101, 'aux')]
  assert both.data is client.IDENTITY.data and both.loss is client.IDENTITY.loss


def test_combine_nests_loss_hooks_the_later_wrapping_the_earlier():
  calls = []

  def base(params, x, y, mask=None):
    calls.append(('base', params, x, y, mask))
    return params * x

  def plus_one(key, loss_fn, params, x, y, mask, aux):
    calls.append((0, _kd(key), params, x, y, mask, aux))
    return loss_fn(params, 2 * x, y + '0', mask) + 1

  def times_three(key, loss_fn, params, x, y, mask, aux):  # calls its inner loss without a mask
    calls.append((1, _kd(key), params, x, y, mask, aux))
    return loss_fn(params + 1, x, y + '1') * 3

  def minus_four(key, loss_fn, params, x, y, mask, aux):
    calls.append((2, _kd(key), params, x, y, mask, aux))
    return loss_fn(params, x + 1, y + '2', mask) - 4

  hooks = [client.ClientHooks(loss=f) for f in (plus_one, times_three, minus_four)]
  key = jax.random.key(9)
  got = defenses.combine(*hooks).loss(key, base, 5, 1, 'y', ('m',), 'aux')
  # minus_four(times_three(plus_one(base))): (6 * 4 + 1) * 3 - 4.
  assert got == (6 * 4 + 1) * 3 - 4
  # A hook that calls its inner loss without a mask passes None on (the wrapper's default).
  assert calls == [(2, _kd(jax.random.fold_in(key, 2)), 5, 1, 'y', ('m',), 'aux'),
                   (1, _kd(jax.random.fold_in(key, 1)), 5, 2, 'y2', ('m',), 'aux'),
                   (0, _kd(key), 6, 2, 'y21', None, 'aux'),
                   ('base', 6, 4, 'y210', None)]


@pytest.mark.parametrize('point', ['grad', 'aggregate', 'batches', 'report'])
def test_combine_takes_at_most_one_grad_aggregate_batches_or_report_hook(point):
  f, g = (lambda *a: 'f'), (lambda *a: 'g')
  one = defenses.combine(client.IDENTITY, client.ClientHooks(**{point: f}), client.IDENTITY)
  assert getattr(one, point) is f
  assert one._replace(**{point: None}) == client.IDENTITY
  with pytest.raises(ValueError, match=rf'^at most one {point} hook can be combined \(got 3\)$'):
    defenses.combine(*[client.ClientHooks(**{point: h}) for h in (f, g, f)])
  with pytest.raises(ValueError, match=rf'\(got 2\)$'):
    defenses.combine(client.ClientHooks(**{point: f}), client.IDENTITY,
                     client.ClientHooks(**{point: g}))


def test_combine_of_one_hook_is_that_hook():
  def up(key, delta, aux):
    del key, aux
    return delta
  h = client.ClientHooks(data=lambda *a: a, batch=lambda *a: a, loss=lambda *a: a, upload=up,
                         grad=up, aggregate=up, batches=up, report=client.report_public(2.0))
  assert defenses.combine(h) == h
  assert defenses.combine(client.IDENTITY, h, client.IDENTITY) == h
  assert defenses.combine() == client.IDENTITY


def test_combine_keeps_a_defenses_report_hook_and_refuses_a_second_one():
  """update_dp reports one unit per client (equal weights); combined with a defense without a
  report hook it still does, and with another report hook `combine` refuses, whatever values
  the two would report (the server can weigh by one count only)."""
  dp_upload = defenses.make('update_dp', clip_norm=1.0, noise_multiplier=0.5)
  both = defenses.combine(defenses.make('sampling', fraction=0.5), dp_upload)
  assert both.report is dp_upload.report and both.data is not client.IDENTITY.data
  np.testing.assert_array_equal(client.reported_sizes(both, np.asarray([7.0, 0.0, 2.0])),
                                [1.0, 0.0, 1.0])
  for other in (client.ClientHooks(report=client.report_public(1.0)),
                defenses.make('ldp_sgd', epsilon=1.0, clip_norm=1.0)):
    with pytest.raises(ValueError, match=r'^at most one report hook can be combined \(got 2\)$'):
      defenses.combine(dp_upload, other)
