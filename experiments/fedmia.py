"""FedMIA: passive server-side membership inference under defenses and non-IID data.

Zhu et al., "FedMIA: An Effective Membership Inference Attack Exploiting 'All for One'
Principle in Federated Learning" (CVPR 2025, arXiv:2402.06289). FedAvg clients train on their
shards; a passive server records every client's update at every `record_every`-th round and
scores each query (train + test split) against each client as target: the Table 1 baselines
(Blackbox-Loss, Grad-Cosine, Grad-Diff, Grad-Norm at one round, and their optimistic best-round
choice; Loss-Series, Avg-Cosine over rounds) and FedMIA-I/II (Eqs. 8-12: a Gaussian test of the
target's measurement against the other clients' measurements of the same query, averaged over
rounds), with the paper's 3-sigma filter (default, `fedmia_ii`), our leave-one-out filter
(`fedmia_ii@leave_one_out`, beside it in every table) or none. Non-members
are scored aligned (default) or the public code's way (redrawn per client and round), which
measures how much that inflates the paper's numbers.

  python -m experiments.fedmia                                   # digits: 5.1-5.4 min cold, 2 cores
  python -m experiments.fedmia --config=configs/digits.py:smoke  # seconds (CI)
  python -m experiments.fedmia --config=configs/cifar100.py      # the paper's setting: GPU
  python -m experiments.fedmia --config.fedmia.outlier_filter=leave_one_out

Writes, beside results.json: `recorded/*.npz` (each training's [R, K, Q] measurements, so
re-scoring and resuming never retrain), `table1.md` (attacks, aligned vs public-code scoring),
`table2.md` (hypervolume of each defense's privacy-utility front), `rounds.json`, and
`fedmia_roc.png`, `fedmia_noniid.png`, `fedmia_rounds.png`, `fedmia_clients_epochs.png`,
`fedmia_defenses.png`. Code: fl_privacy/pipelines/fedmia.py (`prepare`, `plan`, `figures`), fedmia_tables.py,
fedmia_figures.py; defenses from fl_privacy/defenses/registry.py. Fields: configs/_fedmia.py. Expected results:
docs/experiments/fedmia.md.
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('fedmia')
