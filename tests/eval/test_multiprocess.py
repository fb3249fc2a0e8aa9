"""A real 2-process run on localhost: `jax.distributed.initialize` with CPU (gloo) collectives.

Two processes each run their slice of a game's chunks and gather the outcomes; the test checks
that both return exactly what one process returns, and that a sweep (`experiments.toy_game`)
run across the two writes its results from process 0 only, identical to a one-process run.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]

_GAME = textwrap.dedent('''
    import os, sys
    import jax
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=os.environ['COORD'], num_processes=2,
                               process_id=int(os.environ['PID']))
    import numpy as np
    sys.path.insert(0, os.path.join({repo!r}, 'tests'))
    from eval import test_runner as t
    assert jax.process_count() == 2
    out = {{}}
    for name, kw in (('auto', {{}}), ('chunk7', dict(chunk_size=7)),
                     ('resume', dict(start=13, chunk_size=4))):
      res = t._run(**kw)
      out.update({{f'{{k}}_{{name}}': v for k, v in res.items()}})
    np.savez(os.environ['OUT'], **out)
''')


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _two_processes(cmds_env, timeout=240):
  procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for cmd, env in cmds_env]
  results = [p.communicate(timeout=timeout) for p in procs]
  for p, (_, err) in zip(procs, results):
    assert p.returncode == 0, err[-3000:]


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(REPO), FL_PRIVACY_COMPILE_CACHE='')
  # The session's compile flags (conftest.py) as in this process, but one device each.
  env['XLA_FLAGS'] = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                              if 'xla_force_host_platform_device_count' not in f)
  env.update({k: str(v) for k, v in extra.items()})
  return env


def test_game_across_two_processes_equals_one_process(tmp_path):
  sys.path.insert(0, str(REPO / 'tests'))
  from eval import test_runner as t  # pylint: disable=g-import-not-at-top
  reference = t._run(chunk_size=t.NUM_TRIALS)
  coord = f'localhost:{_free_port()}'
  script = _GAME.format(repo=str(REPO))
  outs = [tmp_path / f'p{i}.npz' for i in range(2)]
  _two_processes([([sys.executable, '-c', script],
                   _env(COORD=coord, PID=i, OUT=outs[i])) for i in range(2)])
  for path in outs:  # every process returns the full, identical result
    got = np.load(path)
    for suffix, lo in (('auto', 0), ('chunk7', 0), ('resume', 13)):
      part = {k: got[f'{k}_{suffix}'] for k in reference}
      for k in ('bit', 'u', 'index'):
        np.testing.assert_array_equal(part[k], reference[k][lo:], err_msg=(suffix, k))
      np.testing.assert_allclose(part['score'], reference['score'][lo:], rtol=1e-5, atol=1e-6)


def test_sweep_across_two_processes_writes_once_and_matches(tmp_path):
  args = ['-m', 'experiments.toy_game', '--config=configs/toy.py:smoke', '--seed=3']
  one = tmp_path / 'one'
  proc = subprocess.run([sys.executable, *args, f'--workdir={one}'], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  coord = f'localhost:{_free_port()}'
  dirs = [tmp_path / f'proc{i}' for i in range(2)]
  _two_processes([([sys.executable, *args, f'--workdir={dirs[i]}'],
                   _env(FL_PRIVACY_COORDINATOR=coord, FL_PRIVACY_NUM_PROCESSES=2,
                        FL_PRIVACY_PROCESS_ID=i)) for i in range(2)])
  assert not (dirs[1] / 'results.json').exists()  # only process 0 writes
  assert not (dirs[1] / 'results.csv').exists()
  with open(one / 'results.json', encoding='utf-8') as f:
    single = json.load(f)
  with open(dirs[0] / 'results.json', encoding='utf-8') as f:
    multi = json.load(f)
  assert multi['manifest']['devices']['process_count'] == 2
  strip = lambda r: [(p['params'], p['metrics'], p['n_trials']) for p in r['points']]
  assert strip(multi) == strip(single)
  assert len(single['points']) >= 1
