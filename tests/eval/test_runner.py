"""Tests of the game runner: per-trial keys, chunking, resume, sharding."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.eval import runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
NUM_TRIALS = 50


def _trial(key, index, weights, p):
  k1, k2 = jax.random.split(key)
  u = jax.random.uniform(k1, (4,))
  x = jax.random.normal(k2, (3, weights.shape[0]))
  return {
      'bit': jax.random.bernoulli(key, p),
      'u': u,
      'index': index,
      'score': jnp.sum(jnp.tanh(x @ weights)),
  }


def _args():
  return (jnp.linspace(-1.0, 1.0, 16).reshape(8, 2), jnp.float32(0.3))


def _run(**kw):
  kw.setdefault('chunk_size', 7)
  kw.setdefault('progress', False)
  return runner.run_trials(_trial, jax.random.key(3), NUM_TRIALS, args=_args(),
                           **kw)


def _assert_same(a, b):
  np.testing.assert_array_equal(a['bit'], b['bit'])
  np.testing.assert_array_equal(a['u'], b['u'])
  np.testing.assert_array_equal(a['index'], b['index'])
  np.testing.assert_allclose(a['score'], b['score'], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def reference():
  return _run(chunk_size=NUM_TRIALS)


def test_shapes_and_indices(reference):
  assert reference['u'].shape == (NUM_TRIALS, 4)
  assert reference['bit'].shape == (NUM_TRIALS,)
  assert reference['index'].dtype == np.int32
  np.testing.assert_array_equal(reference['index'], np.arange(NUM_TRIALS))
  assert all(isinstance(v, np.ndarray) for v in reference.values())


def test_trial_keys_are_fold_in_of_run_key(reference):
  for i in (0, 17, NUM_TRIALS - 1):
    single = jax.jit(_trial)(jax.random.fold_in(jax.random.key(3), i),
                             jnp.int32(i), *_args())
    np.testing.assert_array_equal(single['u'], reference['u'][i])


def test_trials_use_distinct_keys(reference):
  assert len(np.unique(reference['u'][:, 0])) == NUM_TRIALS


@pytest.mark.parametrize('chunk_size', [1, 7, 64])
def test_outcome_independent_of_chunk_size(reference, chunk_size):
  _assert_same(_run(chunk_size=chunk_size), reference)


@pytest.mark.parametrize('start', [1, 20, NUM_TRIALS - 1])
def test_resume_from_start_gives_the_tail(reference, start):
  out = _run(start=start, chunk_size=6)
  tail = {k: v[start:] for k, v in reference.items()}
  _assert_same(out, tail)


def test_empty_run_has_trailing_shapes():
  out = _run(start=NUM_TRIALS)
  assert out['u'].shape == (0, 4)
  assert out['bit'].dtype == np.bool_


def test_compiles_once_for_padded_chunks_and_new_arg_values():
  traces = []

  def trial(key, index, w):
    traces.append(1)
    return jnp.sum(w) + jax.random.uniform(key) + index

  key = jax.random.key(0)
  runner.run_trials(trial, key, 23, chunk_size=5, args=(jnp.ones(3),),
                    progress=False)
  # The first run traces the chunk program and the single trial whose memory
  # sizes the groups; a new value of the same shape traces nothing.
  first = len(traces)
  assert first <= 2
  out = runner.run_trials(trial, key, 23, chunk_size=5, args=(jnp.zeros(3),),
                          progress=False)
  assert len(traces) == first  # args are jit arguments, not baked-in constants
  assert out.shape == (23,)


@pytest.mark.parametrize('chunk_size,batch_bytes', [
    (None, None), (None, 1), (7, 1), (None, 10**12), (64, 300)])
def test_outcome_independent_of_group_width(reference, chunk_size, batch_bytes):
  # batch_bytes=1 runs one trial per group (a lax.map of single trials); 10**12
  # one vmapped group per chunk.
  out = _run(chunk_size=chunk_size, batch_bytes=batch_bytes)
  _assert_same(out, reference)
  np.testing.assert_array_equal(out['bit'], reference['bit'])


@pytest.mark.parametrize('count,chunk,width,devices', [
    (50, None, 4, 1), (50, None, 1000, 1), (50, 7, 3, 1), (50, 7, 100, 2),
    (10_000, None, 8, 1), (10_000, 1000, 8, 1), (5, 64, 2, 8)])
def test_layout_covers_the_chunk_with_equal_groups(count, chunk, width, devices):
  groups, w = runner._layout(count, chunk, width, devices)
  assert w % devices == 0 and groups >= 1
  assert w <= max(width * devices, _round_up_to(count, devices)) or chunk
  if chunk is not None:
    wanted = min(_round_up_to(chunk, devices), _round_up_to(count, devices))
    assert wanted <= groups * w < wanted + groups * devices
  else:
    assert groups <= runner.CHUNK_GROUPS


def _round_up_to(v, m):
  return -(-v // m) * m


def test_group_width_follows_the_byte_budget(monkeypatch):
  args = _args()
  per = runner.trial_bytes(_trial, jax.random.key(3), args)
  assert per > 0
  assert runner.group_width(_trial, jax.random.key(3), args, 10 * per) == 10
  assert runner.group_width(_trial, jax.random.key(3), args, 1) == 1
  monkeypatch.setenv(runner.BATCH_BYTES_ENV, str(3 * per))
  assert runner.default_batch_bytes() == 3 * per
  assert runner.group_width(_trial, jax.random.key(3), args) == 3


@pytest.mark.parametrize('kw', [dict(chunk_size=0), dict(batch_bytes=0),
                                dict(start=-1),
                                dict(start=NUM_TRIALS + 1)])
def test_bad_arguments_raise(kw):
  with pytest.raises(ValueError):
    _run(**kw)


@pytest.mark.parametrize('processes', [1, 3, 8])
def test_process_slices_cover_trials_once(monkeypatch, processes):
  start, num_trials = 5, 42
  monkeypatch.setattr(jax, 'process_count', lambda: processes)
  covered = []
  for p in range(processes):
    monkeypatch.setattr(jax, 'process_index', lambda p=p: p)
    first, count = runner._process_slice(start, num_trials)
    covered.extend(range(first, min(first + count, num_trials)))
  assert covered == list(range(start, num_trials))


_SHARDED_SCRIPT = textwrap.dedent('''
    import sys
    import jax
    import numpy as np
    sys.path.insert(0, {tests!r})
    from eval import test_runner as t
    from fl_privacy.eval import runner
    assert jax.device_count() == 8, jax.devices()
    _, sharding, _ = runner._compiled(t._trial, 2, tuple(jax.local_devices()))
    assert len(sharding.device_set) == 8
    out = {{}}
    for c in (7, 64):
      res = t._run(chunk_size=c)
      out.update({{f'{{k}}_{{c}}': v for k, v in res.items()}})
    res = t._run(chunk_size=16, start=13)
    out.update({{f'{{k}}_resume': v for k, v in res.items()}})
    np.savez({path!r}, **out)
''')


def test_same_outcomes_on_8_devices(reference, tmp_path):
  path = str(tmp_path / 'sharded.npz')
  # The session's compile flags (conftest.py), as the reference was compiled, and 8 devices.
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
  env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  script = _SHARDED_SCRIPT.format(tests=os.path.join(REPO, 'tests'), path=path)
  proc = subprocess.run([sys.executable, '-c', script], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  sharded = np.load(path)
  for suffix, lo in (('7', 0), ('64', 0), ('resume', 13)):
    _assert_same({k: sharded[f'{k}_{suffix}'] for k in reference},
                 {k: v[lo:] for k, v in reference.items()})


def test_group_width_without_a_memory_analysis(monkeypatch):
  # A backend without memory_analysis must not turn the whole byte budget into a width.
  monkeypatch.setattr(runner, 'trial_bytes', lambda *a, **k: 0)
  args = _args()
  assert runner.group_width(_trial, jax.random.key(3), args, 8 << 20) == (
      runner.UNKNOWN_BYTES_WIDTH)
  assert runner.group_width(_trial, jax.random.key(3), args, 3) == 3
