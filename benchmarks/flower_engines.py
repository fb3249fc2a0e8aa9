"""Flower at scale on the Simulation Engine (Ray) beside the in-process grid: 100 and 1,000
nodes, 10% of them sampled each round.

Two workloads, each a `jobs.Job` run by `engines.run_job` exactly as `flower_audit` runs its
parts:
- `canary`: the `training` part's canary audit (`canaries.deploy`), half canaries and half
  fixed-update real nodes, Flower's `DifferentialPrivacyServerSideFixedClipping` (z = 1)
  around FedAvg with `fraction_train` = 0.1, d = 4,096, 3 rounds;
- `recording`: `RecordingStrategy` around FedAvg(fraction_train = 0.1) over N nodes training
  Flower's tutorial CNN on one digit each (`benchmarks.flower_scale_part`), 3 rounds.

Each (workload, engine, N) runs in a fresh process. Per round: the wall time of the rounds
(after the engine has started and every node has said its partition), and the peak resident
memory of the process and all its descendants (Ray's raylet, GCS and actors included), sampled
every 0.2 s. The reference is the in-process grid at the same N: `ratio` = in-process seconds
per round / simulation seconds per round (below 1: the Simulation Engine is slower).

  python -m benchmarks.flower_engines                       # N = 100 and 1,000, both workloads
  python -m benchmarks.flower_engines --nodes=100 --workloads=canary
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

_NODES = flags.DEFINE_list('nodes', ['100', '1000'], 'Node counts.')
_WORKLOADS = flags.DEFINE_list('workloads', ['canary', 'recording'], 'Workloads.')
_ENGINES = flags.DEFINE_list('engines', ['inprocess', 'simulation'], 'Engines.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'FedAvg rounds.')
_FRACTION = flags.DEFINE_float('fraction', 0.1, "FedAvg's fraction_train.")
_CHILD = flags.DEFINE_string('child', '', 'Internal: workload:engine:nodes, one run.')


def _tree_rss_mb(root: int) -> float:
  """Resident memory of `root` and its descendants (Linux /proc)."""
  children: dict[int, list[int]] = {}
  rss: dict[int, int] = {}
  for entry in pathlib.Path('/proc').iterdir():
    if not entry.name.isdigit():
      continue
    try:
      stat = (entry / 'stat').read_text().rsplit(')', 1)[1].split()
      pid, ppid = int(entry.name), int(stat[1])
      rss[pid] = int(stat[21]) * os.sysconf('SC_PAGE_SIZE')
      children.setdefault(ppid, []).append(pid)
    except (OSError, ValueError, IndexError):
      continue
  total, todo = 0, [root]
  while todo:
    pid = todo.pop()
    total += rss.get(pid, 0)
    todo.extend(children.get(pid, []))
  return total / 2**20


def _job(workload: str, nodes: int, rounds: int, fraction: float):
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from configs import digits
  from fl_privacy.flower.audits import canary_deploy
  from fl_privacy.flower.audits import canary_design
  from fl_privacy.flower.audits import dp_setting
  from fl_privacy.flower.engines import jobs
  if workload == 'canary':
    design = canary_design.Design(num_canaries=nodes // 2, num_real=nodes - nodes // 2,
                                  num_rounds=rounds, dimension=4096, num_null=1000,
                                  fraction_train=fraction)
    setting = dp_setting.Setting('server_fixed_z1', 'server_fixed', clipping_norm=1.0,
                                 delta=1e-5, noise_multiplier=1.0,
                                 num_sampled_clients=design.sample_size)
    key = jax.random.key(0)
    seed = canary_deploy._server_seed(key)  # pylint: disable=protected-access
    return jobs.Job('training', nodes, dict(setting=setting, design=design, seed=seed,
                                            key=np.asarray(jax.random.key_data(key))),
                    seed=seed)
  return jobs.Job('benchmarks.flower_scale_part', nodes,
                  dict(data=digits.get_config().data, num_nodes=nodes, rounds=rounds,
                       fraction=fraction), seed=0)


def _child(spec: str) -> dict:
  # pylint: disable=import-outside-toplevel
  from fl_privacy.flower.engines import dispatch
  workload, engine, nodes = spec.split(':')
  nodes = int(nodes)
  job = _job(workload, nodes, _ROUNDS.value, _FRACTION.value)
  peak, done = [0.0], threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], _tree_rss_mb(os.getpid()))
      time.sleep(0.2)
  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  start = time.perf_counter()
  out = dispatch.run_job(engine, job)
  total = time.perf_counter() - start
  done.set()
  thread.join()
  rounds_s = (out['result']['seconds'] if workload == 'canary' else
              float(sum(out['result']['round_seconds'])))
  return dict(workload=workload, engine=engine, nodes=nodes, rounds=_ROUNDS.value,
              fraction=_FRACTION.value, total_s=total,
              seconds_per_round=rounds_s / _ROUNDS.value, peak_tree_rss_mb=peak[0],
              losses=len(out['losses']))


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(_child(_CHILD.value)))
    return
  rows = []
  for workload in _WORKLOADS.value:
    for nodes in map(int, _NODES.value):
      for engine in _ENGINES.value:
        spec = f'{workload}:{engine}:{nodes}'
        proc = subprocess.run(
            [sys.executable, '-m', 'benchmarks.flower_engines', f'--child={spec}',
             f'--rounds={_ROUNDS.value}', f'--fraction={_FRACTION.value}'],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
          raise RuntimeError(f'{spec} failed: {proc.stderr[-2000:]}')
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{workload:9s} {engine:10s} N={nodes:5d}  {r['seconds_per_round']:8.2f} s/round"
              f"  total {r['total_s']:7.1f} s  peak {r['peak_tree_rss_mb']:8.0f} MB", flush=True)
  ref = {(r['workload'], r['nodes']): r for r in rows if r['engine'] == 'inprocess'}
  sim = [r for r in rows if r['engine'] == 'simulation']
  ratios = [ref[(r['workload'], r['nodes'])]['seconds_per_round'] / r['seconds_per_round']
            for r in sim if (r['workload'], r['nodes']) in ref]
  node_rounds = sum(r['nodes'] * r['fraction'] * r['rounds'] for r in sim)
  print(json.dumps({
      'name': 'flower_engines', 'rows': rows,
      'items_per_s': node_rounds / max(sum(r['seconds_per_round'] * r['rounds'] for r in sim),
                                       1e-9),
      'reference_items_per_s': node_rounds / max(sum(
          ref[(r['workload'], r['nodes'])]['seconds_per_round'] * r['rounds'] for r in sim
          if (r['workload'], r['nodes']) in ref), 1e-9),
      'ratio': min(ratios) if ratios else float('nan'),
      'peak_rss_mb': max(r['peak_tree_rss_mb'] for r in rows)}))


if __name__ == '__main__':
  app.run(main)
