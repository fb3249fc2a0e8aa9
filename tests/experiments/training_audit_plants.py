"""Planted bugs between a DP claim and the training that runs, run from the command line.

Each planted run sets `training_audit.plant` (the knob the pipeline offers for this) and runs
`python -m experiments.training_audit` as a user would: the experiments' round loop with the
defense configured by the registry, canaries added, the audit's verdict stored per point. A
test fails if its planted point is not a violation, or if the same setting without the plant
is one (so a flag cannot come from the setting itself). Halved noise of Poisson DP-SGD is
flagged by the mechanism audit (tests/experiments/test_dp_audit.py): one training's
server-side view of Poisson DP-SGD sums a round's steps, which one run cannot separate from
the claim.
"""

from __future__ import annotations

import json
import os

from tests.experiments import cli

BASE = ('--config.training_audit.epsilons=(2.0,)', '--config.training_audit.num_rounds=3',
        '--config.training_audit.num_canary_clients=2400',
        '--config.training_audit.num_canary_examples=600',
        "--config.training_audit.threats=('all_iterates',)",
        "--config.training_audit.record_kinds=('gradient',)", '--quiet')


def run(tmp_path_factory, name: str, defenses: tuple, samplings: tuple, plant: str = 'none',
        *extra: str) -> dict:
  """Runs the audit; {(defense, sampling, canary): metrics} of its points."""
  workdir = tmp_path_factory.mktemp(f'training_audit_{name}') / 'run'
  proc = cli.run('training_audit', workdir, *BASE,
                 f'--config.training_audit.defenses={defenses!r}',
                 f'--config.training_audit.samplings={samplings!r}',
                 f'--config.training_audit.plant={plant}', *extra, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    points = json.load(f)['points']
  out = {(p['params']['defense'], p['params']['sampling'], p['params']['canary']): p['metrics']
         for p in points}
  assert out and all(m['plant'] == plant for m in out.values())
  return out


def flagged(planted: dict, baseline: dict, key: tuple) -> None:
  assert float(planted[key]['privacy_violation']) == 1.0, planted[key]
  assert float(baseline[key]['privacy_violation']) == 0.0, baseline[key]
