"""A whole default run with trainings ahead of the scoring, against one in order.

The work is `python -m experiments.<experiment>` at its defaults (digits, leaky; FedMIA: 32
trainings x 3 replicates, 287 points; PASTEL: 18 trainings x 10 replicates, 108 points), each
run in a fresh process with an empty JAX compilation cache (`FL_PRIVACY_COMPILE_CACHE=''`), so
compilation is paid as on a user's first run. The reference is the same command with
`FL_PRIVACY_AHEAD=0`: every training, then its scoring, one after the other in one thread,
which is how the pipelines ran before `pipelines.ahead`. `ratio` = reference wall time / wall
time. The first run uses the pipeline's own depth (`pipelines.ahead`: FedMIA one training
ahead, PASTEL two at once). The two runs' stored metrics must be equal (everything but the
per-point seconds and the training's own timing): the benchmark fails otherwise.

  python -m benchmarks.pipeline_ahead --experiment=fedmia    # about 15 minutes on 2 cores
  python -m benchmarks.pipeline_ahead --experiment=pastel
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import common

_EXPERIMENT = flags.DEFINE_enum('experiment', 'fedmia', ['fedmia', 'pastel'],
                                'The experiment whose default run is timed.')
# Timings the pipelines record inside a point's metrics, which differ from run to run.
_TIMINGS = ('seconds', 'train_seconds', 'elapsed_s')


def _metrics(workdir: str) -> dict:
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    points = json.load(f)['points']
  strip = lambda m: {k: v for k, v in m.items() if not any(t in k for t in _TIMINGS)}
  return {json.dumps(p['params'], sort_keys=True): strip(p['metrics']) for p in points}


def _run(experiment: str, ahead: bool, workdir: str) -> dict:
  env = dict(os.environ, FL_PRIVACY_COMPILE_CACHE='', FL_PRIVACY_AHEAD='0')
  if ahead:
    del env['FL_PRIVACY_AHEAD']  # the pipeline's own depth (FedMIA 1, PASTEL 2)
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  subprocess.run([sys.executable, '-m', f'experiments.{experiment}', f'--workdir={workdir}',
                  '--quiet'], env=env, check=True, capture_output=True)
  seconds = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {'ahead': ahead, 'seconds': seconds, 'cpu_s': (after.ru_utime - before.ru_utime)
          + (after.ru_stime - before.ru_stime), 'peak_rss_mb': after.ru_maxrss / 1024}


def main(argv):
  del argv
  experiment = _EXPERIMENT.value
  rows, metrics = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for ahead in (False, True):
      workdir = os.path.join(tmp, 'ahead' if ahead else 'in_order')
      rows.append(_run(experiment, ahead, workdir))
      metrics.append(_metrics(workdir))
  if metrics[0] != metrics[1]:
    differ = sorted(k for k in metrics[0] if metrics[0][k] != metrics[1].get(k))
    raise SystemExit(f'the two runs stored different metrics at {len(differ)} point(s), '
                     f'e.g. {differ[:1]}')
  print(f'{len(metrics[0])} points, equal metrics in both runs')
  in_order, ahead = rows
  # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: the second row's is the max.
  common.report(f'pipeline_ahead_{experiment}', rows, items_per_s=1 / ahead['seconds'],
                reference_items_per_s=1 / in_order['seconds'],
                peak_rss_mb=max(r['peak_rss_mb'] for r in rows))


if __name__ == '__main__':
  app.run(main)
