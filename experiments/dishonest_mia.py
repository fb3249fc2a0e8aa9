"""Perfectly accurate membership inference by a dishonest server (Pichler et al.).

The server writes the 2M+1-ReLU detector of the paper's Fig. 1 into the Flower CNN's dense
layers for one target; the client trains one FedAvg round (N = J * B examples, E epochs, SGD
with momentum or Adam, cross-entropy); the server decides "member" iff
Delta = B |eps_client - eps| / |eps_server - eps| >= xi (Eq. (9)). Each run has its own client
data, target and random trunk; even runs hold the target, odd runs do not. Runs are paired across
M and optimizers (same data, targets and trunks), so a larger M can only remove false positives.

  python -m experiments.dishonest_mia                                  # digits, see docs
  python -m experiments.dishonest_mia --config=configs/digits.py:smoke # seconds (CI)
  python -m experiments.dishonest_mia --config=configs/mnist.py:data_dir=DIR
  python -m experiments.dishonest_mia --config.dishonest.grid=product
  python -m experiments.dishonest_mia --config.defense.name=dp_sgd --config.defense.target_epsilon=4

The client trains under `config.defense` (configs/_defense.py; default none): the server observes
w_t - upload, so upload defenses change what it sees; the DP defenses report their epsilon.

Runs go through `eval.runner.run_trials` at the `game` defaults (on CPU one run at a time
inside each jitted chunk, with im2col convolutions; side by side on accelerators); results do
not depend on the chunking.

Writes, beside results.json: `table2.md` (the paper's Table 2 layout and the J / E sweeps),
`false_decisions.json` (every false decision, each false positive attributed to the duplicate of
the target in the client's data that caused it, or to none), `deltas.json` and `delta.png`.
Code: fl_privacy/pipelines/dishonest_mia.py (`prepare`, `plan`, `figures`) and
fl_privacy/pipelines/dishonest_mia_figures.py. Fields: configs/_dishonest.py.
Expected results: docs/experiments/dishonest_mia.md.
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('dishonest_mia')
