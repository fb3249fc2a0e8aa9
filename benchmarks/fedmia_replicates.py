"""What R replicated FedMIA trainings cost against one: `fedmia.replicates` = 3 vs 1.

The work is the default config's main setting (digits, leaky: K = 20 clients of 16, T = 60
rounds recorded every 5, online LiRA's IN models) trained and scored by the pipeline's own
code (`pipelines.fedmia.plan`: `recorded` per replicate, every (attack, scoring) point through
`fedmia_replicates.combine`). Each R runs in a fresh process with an empty JAX compilation
cache (the library alone enables none), so compilation is paid as on a user's first run. The
reference is the same pipeline with R = 1; `ratio` = 3 x (the time of R = 1) / (the time of
R = 3), the speed-up over running three single-replicate jobs (1.0 = no saving), taken on the
trainings (set-up, compilation, training); the scoring's and the whole run's times are
printed beside it. The scoring is not the same work at R = 1: one training's intervals come
from the query-cluster bootstrap, R >= 2 replicates' from a t-interval over the replicates.

Replicates run one after the other: vmapping three trainings measured 2.75x one on this 2-core
CPU (the per-query gradients are compute-bound), so what is shared is the compilation, the
data and the model set-up, and the scoring's fixed costs.

  python -m benchmarks.fedmia_replicates
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import common

_CHILD = flags.DEFINE_integer('child', 0, 'Internal: run R replicates and print the seconds.')


def _run(replicates: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.report import ArtifactStore  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.report import ResultsStore  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config()
  config.fedmia.replicates = replicates
  t0 = time.perf_counter()
  state = fedmia.prepare(config)
  state['trainings'] = [tr for tr in state['trainings'] if tr['sweep'] == 'main']
  key = jax.random.key(0)
  with tempfile.TemporaryDirectory() as workdir:
    store = ResultsStore(workdir, 'fedmia', config.to_dict())
    # The trainings first (each replicate recorded as the pipeline records it), then every
    # point scored from the stored recordings: training and scoring timed apart.
    artifacts = ArtifactStore(store.workdir, fedmia.RECORDED)
    for tr in state['trainings']:
      for r in range(replicates):
        fedmia.recorded(config, state, key, artifacts, tr, r)
    t1 = time.perf_counter()
    points = fedmia.plan(config, state, store, key)
    for p in points:
      p.compute()
      if p.after is not None:
        p.after(None)
    t2 = time.perf_counter()
  return {'replicates': replicates, 'points': len(points), 'train_s': t1 - t0,
          'score_s': t2 - t1, 'seconds': t2 - t0, 'peak_rss_mb': common.peak_rss_mb()}


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(_run(_CHILD.value)))
    return
  rows = []
  for r in (1, 3):
    out = subprocess.run(
        [sys.executable, '-m', 'benchmarks.fedmia_replicates', f'--child={r}'],
        capture_output=True, text=True, check=True)
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
  one, three = rows
  for name in ('train_s', 'score_s', 'seconds'):
    print(f'{name}: 3 replicates cost {three[name] / one[name]:.2f}x one')
  # The ratio is of the trainings (data, model set-up, compilation and training): the scoring
  # differs in kind, R = 1 adds the query-cluster bootstrap that R = 3 replaces by a t-interval.
  common.report('fedmia_replicates', rows, items_per_s=3 / three['train_s'],
                reference_items_per_s=1 / one['train_s'],
                peak_rss_mb=max(r['peak_rss_mb'] for r in rows))


if __name__ == '__main__':
  app.run(main)
