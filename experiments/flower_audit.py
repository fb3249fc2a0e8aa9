"""A real Flower deployment audited: FedMIA, the dishonest server and Flower's own DP.

Needs the optional extra: `pip install -e '.[flower]'` (without it: exit status 2 and one line
saying so). Three parts on digits (configs/_flower_audit.py):

1. FedAvg with 10 Flower ClientApps on the in-process grid, recorded by `RecordingStrategy`:
   FedMIA's table from the recorded uploads beside the same training in fl_privacy's own
   simulation (they agree within their intervals).
2. `DishonestStrategy` (M = 4) against that deployment: TPR and FPR with intervals.
3. Flower's DP (server-side and client-side fixed clipping, LocalDpMod) audited with canary
   games against its stated epsilon, including the issue's misconfigured
   `LocalDpMod(clipping_norm=1, sensitivity=1e-4, epsilon=10, delta=1e-5)` (flagged).

  python -m experiments.flower_audit                                    # a few min, 2 cores
  python -m experiments.flower_audit --config=configs/digits.py:smoke   # seconds (CI)
  python -m experiments.flower_audit --config.flower_audit.parts="('reconstruction',)"
      # opt-in: the imprint server (ReconstructionStrategy) recovering the nodes' inputs

Writes results.json, results.csv, flower_audit.md and flower_dp_audit.png to --workdir.
Results: docs/experiments/flower_audit.md. Code: fl_privacy/flower/parts/pipeline.py,
fl_privacy/flower/audits/dp_games.py.
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('flower_audit')
