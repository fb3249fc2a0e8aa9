"""The runner's edges: config options, the byte budget, plan(), chunk listeners, progress lines.

Deterministic: a fake clock stands in for `time.perf_counter`, so the throughput the progress
line reports and the elapsed time a listener receives are exact.
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fl_privacy import validate
from fl_privacy.eval import runner


def _trial(key, index, weights, p):
  x = jax.random.normal(key, (3, weights.shape[0]))
  return {'bit': jax.random.bernoulli(key, p), 'score': jnp.sum(jnp.tanh(x @ weights)),
          'index': index}


def _args(d=8):
  return (jnp.linspace(-1.0, 1.0, 2 * d).reshape(d, 2), jnp.float32(0.3))


def _config(**game):
  return ml_collections.ConfigDict({'game': game})


# --- options / validate_options ---------------------------------------------------------

def test_options_reads_both_fields_as_ints_or_none():
  assert runner.options(_config(chunk_size=None, batch_bytes=None)) == {
      'chunk_size': None, 'batch_bytes': None}
  assert runner.options(_config()) == {'chunk_size': None, 'batch_bytes': None}
  got = runner.options(_config(chunk_size=np.int64(7), batch_bytes=4096))
  assert got == {'chunk_size': 7, 'batch_bytes': 4096}
  assert type(got['chunk_size']) is int and type(got['batch_bytes']) is int
  assert runner.options(_config(chunk_size=3)) == {'chunk_size': 3, 'batch_bytes': None}
  assert runner.options(_config(batch_bytes=5)) == {'chunk_size': None, 'batch_bytes': 5}


@pytest.mark.parametrize('field', ['chunk_size', 'batch_bytes'])
def test_validate_options_accepts_none_and_positive_ints(field):
  runner.validate_options(_config())
  runner.validate_options(_config(**{field: None}))
  runner.validate_options(_config(**{field: 1}))
  runner.validate_options(_config(**{field: 10**9}))


@pytest.mark.parametrize('field', ['chunk_size', 'batch_bytes'])
@pytest.mark.parametrize('bad', [0, -3, True, 2.0, '4'])
def test_validate_options_names_the_bad_field(field, bad):
  other = 'batch_bytes' if field == 'chunk_size' else 'chunk_size'
  with pytest.raises(validate.ConfigError) as e:
    runner.validate_options(_config(**{field: bad, other: 5}))
  assert e.value.field == f'game.{field}'
  assert e.value.allowed == 'None (automatic) or an integer >= 1'
  assert e.value.got is bad or e.value.got == bad


# --- default_batch_bytes ----------------------------------------------------------------

def test_default_batch_bytes_per_backend(monkeypatch):
  monkeypatch.delenv(runner.BATCH_BYTES_ENV, raising=False)
  assert runner.default_batch_bytes('cpu') == 8 << 20
  assert runner.default_batch_bytes('tpu') == 1 << 30
  assert runner.default_batch_bytes('some_new_backend') == 1 << 30
  assert runner.default_batch_bytes() == runner.DEFAULT_BATCH_BYTES[jax.default_backend()]
  monkeypatch.setenv(runner.BATCH_BYTES_ENV, '')  # empty: unset
  assert runner.default_batch_bytes('tpu') == 1 << 30


@pytest.mark.parametrize('text,want', [('1', 1), ('2', 2), ('1e3', 1000), ('4096.7', 4096)])
def test_default_batch_bytes_from_the_environment(monkeypatch, text, want):
  monkeypatch.setenv(runner.BATCH_BYTES_ENV, text)
  assert runner.default_batch_bytes('cpu') == want
  assert runner.default_batch_bytes('tpu') == want


@pytest.mark.parametrize('text', ['0', '-5', '0.5'])
def test_default_batch_bytes_refuses_less_than_one(monkeypatch, text):
  monkeypatch.setenv(runner.BATCH_BYTES_ENV, text)
  with pytest.raises(ValueError, match=f'{runner.BATCH_BYTES_ENV} must be >= 1'):
    runner.default_batch_bytes('cpu')


# --- trial_bytes ------------------------------------------------------------------------

def _analysis(fn, key, args):
  one = lambda k, i, *a: fn(jax.random.fold_in(k, i), i, *a)
  m = jax.jit(one).lower(key, jnp.int32(0), *args).compile().memory_analysis()
  return int(m.temp_size_in_bytes) + int(m.output_size_in_bytes)


def _tile(key, index, w):
  del key, index
  return jnp.tile(w, 50)


def test_trial_bytes_is_temporaries_plus_outcomes_per_shape_and_dtype():
  key = jax.random.key(0)
  small, big = _args(8), _args(512)
  assert runner.trial_bytes(_trial, key, small) == _analysis(_trial, key, small)
  assert runner.trial_bytes(_trial, key, big) == _analysis(_trial, key, big)
  assert runner.trial_bytes(_trial, key, big) > runner.trial_bytes(_trial, key, small)
  # Same shape, another dtype: its own entry (outcomes of 50 x 64 int8 vs float32).
  i8, f32 = (jnp.zeros(64, jnp.int8),), (jnp.zeros(64, jnp.float32),)
  b8, b32 = runner.trial_bytes(_tile, key, i8), runner.trial_bytes(_tile, key, f32)
  assert (b8, b32) == (_analysis(_tile, key, i8), _analysis(_tile, key, f32))
  assert b32 >= 50 * 64 * 4 > b8


def test_trial_bytes_compiles_once_per_shape():
  traces = []

  def trial(key, index, w):
    traces.append(1)
    return jnp.sum(w) + jax.random.uniform(key)

  key = jax.random.key(0)
  first = runner.trial_bytes(trial, key, (jnp.ones(5),))
  n = len(traces)
  assert runner.trial_bytes(trial, key, (jnp.zeros(5),)) == first
  assert len(traces) == n
  runner.trial_bytes(trial, key, (jnp.zeros(6),))
  assert len(traces) == n + 1


def test_trial_bytes_without_a_memory_analysis_is_zero(monkeypatch):
  def missing(self):
    raise NotImplementedError

  monkeypatch.setattr(jax.stages.Compiled, 'memory_analysis', missing)
  trial = lambda key, index, w: w * jax.random.uniform(key)
  assert runner.trial_bytes(trial, jax.random.key(0), (jnp.ones(3),)) == 0
  assert runner.group_width(trial, jax.random.key(0), (jnp.ones(3),), 1 << 20) == (
      runner.UNKNOWN_BYTES_WIDTH)


class _Unhashable:
  __hash__ = None

  def __init__(self, size):
    self.size = size

  def __call__(self, key, index):
    return jax.random.uniform(key, (self.size,))


def test_trial_bytes_of_unhashable_trials_are_not_shared():
  key = jax.random.key(0)
  small = runner.trial_bytes(_Unhashable(4), key, ())
  large = runner.trial_bytes(_Unhashable(4096), key, ())
  assert large >= 4096 * 4 > small


# --- plan ---------------------------------------------------------------------------------

@pytest.mark.parametrize('kw,want', [
    # width 7 from the budget; 50 trials in ceil(50 / 7) = 8 groups (49 would be 7)
    (dict(), (56, 8, 7)),
    (dict(start=1), (49, 7, 7)),
    (dict(chunk_size=10), (10, 2, 5)),  # 2 groups of 7 would cover 10: 2 equal groups of 5
    (dict(chunk_size=10, start=45), (5, 1, 5)),  # only 5 trials left
    (dict(start=49), (1, 1, 1)),
    (dict(start=50), (1, 1, 1)),  # nothing left: the plan of one trial
])
def test_plan_from_the_byte_budget(kw, want):
  key = jax.random.key(3)
  per = runner.trial_bytes(_trial, key, _args())
  got = runner.plan(_trial, key, 50, args=_args(), batch_bytes=7 * per, **kw)
  assert got == {'chunk': want[0], 'groups': want[1], 'width': want[2]}


# --- chunk listeners and progress lines ---------------------------------------------------

class _Clock:
  """perf_counter stand-in: returns the given times in turn."""

  def __init__(self, times):
    self.times = list(times)
    self.given = []

  def perf_counter(self):
    value = self.times[len(self.given)]
    self.given.append(value)
    return value


def _key_trial(key, index):
  return jax.random.bits(key, (), jnp.uint32) + index


def test_listener_sees_done_total_and_elapsed_after_every_chunk(monkeypatch):
  clock = _Clock([100.0, 100.5, 102.0, 104.0, 107.5, 111.0])
  monkeypatch.setattr(runner, 'time', types.SimpleNamespace(perf_counter=clock.perf_counter))
  calls = []
  remove = runner.add_chunk_listener(lambda *a: calls.append(a))
  try:
    # 23 trials in chunks of 5 (one group of 5): 5 chunks, the last padded: 25 trials run,
    # but the listener counts the 23 the results hold.
    out = runner.run_trials(_key_trial, jax.random.key(1), 23, chunk_size=5, progress=False)
  finally:
    remove()
  assert out.shape == (23,)
  assert [c[:2] for c in calls] == [(5, 23), (10, 23), (15, 23), (20, 23), (23, 23)]
  assert [c[2] for c in calls] == [0.5, 2.0, 4.0, 7.5, 11.0]
  assert {c[3] for c in calls} == {'trials'}
  remove()  # removing twice is harmless
  clock.times.extend([200.0 + t for t in range(6)])
  runner.run_trials(_key_trial, jax.random.key(1), 23, chunk_size=5, progress=False)
  assert len(calls) == 5  # removed: not called again


def test_progress_line_per_chunk(monkeypatch):
  # 10, 10: a chunk that took no time at all must not divide by zero.
  clock = _Clock([10.0, 10.0, 10.25, 11.0, 13.0])
  monkeypatch.setattr(runner, 'time', types.SimpleNamespace(perf_counter=clock.perf_counter))
  lines = []
  monkeypatch.setattr(runner, 'logging',
                      types.SimpleNamespace(info=lambda fmt, *a: lines.append(fmt % a)))
  runner.run_trials(_key_trial, jax.random.key(1), 16, chunk_size=4)  # progress is the default
  assert lines == [
      '_key_trial: 4/16 trials, 4000000000.0 trials/s (chunk), 4000000000.0 trials/s (run)',
      '_key_trial: 8/16 trials, 16.0 trials/s (chunk), 32.0 trials/s (run)',
      '_key_trial: 12/16 trials, 5.3 trials/s (chunk), 12.0 trials/s (run)',
      '_key_trial: 16/16 trials, 2.0 trials/s (chunk), 5.3 trials/s (run)',
  ]


def test_progress_line_counts_real_trials_in_their_unit(monkeypatch):
  # 6 runs in chunks of 4: the padded last chunk shows 6/6 runs, as many as are saved.
  clock = _Clock([0.0, 1.0, 2.0, 3.0, 4.0])
  monkeypatch.setattr(runner, 'time', types.SimpleNamespace(perf_counter=clock.perf_counter))
  lines = []
  monkeypatch.setattr(runner, 'logging',
                      types.SimpleNamespace(info=lambda fmt, *a: lines.append(fmt % a)))
  out = runner.run_trials(_key_trial, jax.random.key(1), 6, chunk_size=4, unit='runs')
  assert out.shape == (6,)
  assert lines == ['_key_trial: 4/6 runs, 4.0 runs/s (chunk), 4.0 runs/s (run)',
                   '_key_trial: 6/6 runs, 2.0 runs/s (chunk), 3.0 runs/s (run)']


def test_progress_line_names_a_trial_without_a_name(monkeypatch):
  clock = _Clock([0.0, 1.0, 2.0, 3.0])
  monkeypatch.setattr(runner, 'time', types.SimpleNamespace(perf_counter=clock.perf_counter))
  lines = []
  monkeypatch.setattr(runner, 'logging',
                      types.SimpleNamespace(info=lambda fmt, *a: lines.append(fmt % a)))
  runner.run_trials(functools.partial(_key_trial), jax.random.key(1), 3, progress=True)
  assert lines == ['trial_fn: 3/3 trials, 3.0 trials/s (chunk), 3.0 trials/s (run)']
  runner.run_trials(_key_trial, jax.random.key(1), 3, progress=False)
  assert len(lines) == 1


# --- argument checks ----------------------------------------------------------------------

@pytest.mark.parametrize('kw,message', [
    (dict(num_trials=10, chunk_size=0), r'chunk_size must be >= 1 \(got 0\)'),
    (dict(num_trials=10, batch_bytes=0), r'batch_bytes must be >= 1 \(got 0\)'),
    (dict(num_trials=10, start=-1), r'need 0 <= start <= num_trials \(got start=-1, '
     r'num_trials=10\)'),
    (dict(num_trials=10, start=11), 'got start=11, num_trials=10'),
    # 2**31 trials do not fit the int32 trial index, even when only 2 are left to run.
    (dict(num_trials=2**31, start=2**31 - 2), r'num_trials must fit int32 \(got 2147483648\)'),
])
def test_bad_arguments_say_what_is_allowed(kw, message):
  with pytest.raises(ValueError, match=message):
    runner.run_trials(_key_trial, jax.random.key(0), progress=False, **kw)


def test_largest_int32_run_is_accepted():
  # The last two trials of a run of 2**31 - 1: the indices just fit.
  n = 2**31 - 1
  trial = lambda key, index: (jax.random.bits(key, (), jnp.uint32), index)
  bits, index = runner.run_trials(trial, jax.random.key(0), n, start=n - 2, progress=False)
  np.testing.assert_array_equal(index, [n - 2, n - 1])
  for row, i in enumerate((n - 2, n - 1)):
    assert bits[row] == jax.random.bits(jax.random.fold_in(jax.random.key(0), i), (), jnp.uint32)


# --- several hosts, simulated --------------------------------------------------------------

def test_hosts_run_their_slices_and_the_gather_is_trimmed(monkeypatch):
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  key, n, start = jax.random.key(5), 23, 4
  reference = runner.run_trials(_key_trial, key, n, start=start, chunk_size=4,
                                progress=False)
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  locals_ = {}

  def run_as(p, gather):
    monkeypatch.setattr(jax, 'process_index', lambda: p)
    monkeypatch.setattr(multihost_utils, 'process_allgather', gather)
    return runner.run_trials(_key_trial, key, n, start=start, chunk_size=4, progress=False)

  def record(p):
    def gather(local, tiled):
      assert tiled is True
      locals_[p] = np.asarray(local)
      return np.concatenate([local, local])
    return gather

  for p in (0, 1):
    run_as(p, record(p))
  # 19 trials over 2 hosts: 10 each, host 1's last one a repeat of trial 22.
  np.testing.assert_array_equal(locals_[0], reference[:10])
  np.testing.assert_array_equal(locals_[1], np.append(reference[10:], reference[-1]))

  def gather(local, tiled):
    assert tiled is True
    return np.concatenate([locals_[0], locals_[1]])

  for p in (0, 1):
    out = run_as(p, gather)
    assert out.shape == (n - start,)
    np.testing.assert_array_equal(out, reference)


# --- what run_trials does matches plan(), and padding stays in range ----------------------

@pytest.mark.parametrize('kw', [dict(), dict(chunk_size=10), dict(start=7), dict(chunk_size=4)])
def test_run_trials_splits_as_plan_says(kw):
  key, n = jax.random.key(3), 50
  per = runner.trial_bytes(_trial, key, _args())
  budget = dict(batch_bytes=3 * per)
  want = runner.plan(_trial, key, n, args=_args(), **budget, **kw)
  calls = []
  remove = runner.add_chunk_listener(lambda *a: calls.append(a))
  try:
    out = runner.run_trials(_trial, key, n, args=_args(), progress=False, **budget, **kw)
  finally:
    remove()
  count = n - kw.get('start', 0)
  chunks = -(-count // want['chunk'])
  assert [c[:2] for c in calls] == [(min((i + 1) * want['chunk'], count), count)
                                    for i in range(chunks)]
  np.testing.assert_array_equal(out['index'], np.arange(n - count, n))


def test_padding_repeats_the_last_trial_and_never_passes_the_end():
  seen = []

  def trial(key, index):
    jax.debug.callback(lambda i: seen.append(np.asarray(i).copy()), index)
    return jax.random.bits(key, (), jnp.uint32)

  out = runner.run_trials(trial, jax.random.key(4), 23, chunk_size=5, progress=False)
  indices = np.concatenate([np.ravel(s) for s in seen])
  assert indices.max() == 22 and indices.min() == 0
  assert set(indices.tolist()) == set(range(23))  # 25 slots: 22 repeated in the padding
  assert out.shape == (23,)


def test_unhashable_trials_run_uncached():
  key = jax.random.key(6)
  out = runner.run_trials(_Unhashable(3), key, 5, chunk_size=2, progress=False)
  for i in range(5):
    np.testing.assert_array_equal(out[i], jax.random.uniform(jax.random.fold_in(key, i), (3,)))


def test_group_width_is_an_integer_count():
  key, args = jax.random.key(3), _args()
  per = runner.trial_bytes(_trial, key, args)
  width = runner.group_width(_trial, key, args, 10 * per + per // 2)
  assert width == 10 and type(width) is int
  # A one-byte trial (a bool outcome, no temporaries) is a known size, not an unknown one.
  tiny = lambda key, index: index > 0
  assert runner.trial_bytes(tiny, key, ()) == 1
  assert runner.group_width(tiny, key, (), 100) == 100


def test_group_width_without_analysis_and_a_tiny_budget(monkeypatch):
  monkeypatch.setattr(runner, 'trial_bytes', lambda *a, **k: 0)
  assert runner.group_width(_trial, jax.random.key(3), _args(), 1) == 1


def test_empty_run_keeps_every_outcome_dtype():
  out = runner.run_trials(_trial, jax.random.key(3), 10, start=10, args=_args(), progress=False)
  assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
      'bit': ((0,), np.bool_), 'score': ((0,), np.float32), 'index': ((0,), np.int32)}
