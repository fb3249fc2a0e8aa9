"""Every DP defense audited inside the FL training that runs, with canaries, in one run each.

For every DP defense of the `defense` section (dp_sgd with Poisson and shuffled batches,
update_dp, central_dp and weak_dp with and without participation sampling, ldp_sgd) at
claimed epsilon 2 and 8: the defense is configured by the calls the experiments use
(`defenses.configured.configure`), one real training runs (`fl.rounds.run`: client protocol,
participation, upload and aggregate hooks) with canary clients (client-level defenses) or
canary examples (dp_sgd: white-box Dirac gradients and black-box mislabelled inputs), and the
canaries' scores under the adversary's threat (all iterates, last iterate) give Steinke et
al.'s one-run lower bounds and Andrew et al.'s Gaussian-fit estimate. A bound above the claim
is logged as an error and stored as `privacy_violation = 1`.

  python -m experiments.training_audit                                    # ~2 min cold (2 cores)
  python -m experiments.training_audit --config=configs/digits.py:smoke   # ~1-2 min (CI)
  python -m experiments.training_audit --config.training_audit.plant=half_noise  # planted bug

Writes results.json, results.csv, training_audit.md and fig_training_audit.png to --workdir.
Fields: configs/_training_audit.py. Results: docs/experiments/training_audit.md.
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('training_audit')
