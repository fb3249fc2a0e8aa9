"""Every DP mechanism fl-privacy ships, audited against its own claim in one run.

For `dp_sgd_poisson`, `dp_sgd_shuffle`, `update_dp`, `central_dp`, `weak_dp`, `gaussian` and
`ldp_sgd` at claimed epsilon 1, 2, 4, 8 (delta 1e-5): the mechanism is calibrated with
`fl_privacy.accounting`, then a white-box Dirac-canary game (Nasr et al., USENIX Security
2023) runs the library's real mechanism function on small vectors, in-world vs out-world as
the declaration's relation says, and `fl_privacy.eval.auditing` turns the scores into
lower bounds of epsilon. A bound above the claim is logged as an error and stored as
`privacy_violation = 1`.

  python -m experiments.dp_audit                                    # ~3 min on 2 CPU cores
  python -m experiments.dp_audit --config=configs/digits.py:smoke   # seconds (CI)
  python -m experiments.dp_audit --config.dp_audit.mechanisms="('update_dp',)"
  python -m experiments.dp_audit --config.dp_audit.noise_scale_factor=0.5   # planted bug

Expected: no violation at the honest setting; the Gaussian compositions (update_dp,
dp_sgd_shuffle, central_dp, weak_dp, gaussian) come out tight (the GDP bound close to,
never above, the claim); Poisson-subsampled DP-SGD and LDP-SGD below it. With
noise_scale_factor=0.5 every Gaussian mechanism is flagged.

Writes results.json, results.csv, fig_dp_audit_claims.png and fig_dp_audit_profile.png to
--workdir (default ./runs/dp_audit-<UTC timestamp>; re-using one resumes the sweep).

Fields: configs/_dp_audit.py. Results: docs/experiments/dp_audit.md.
Code: fl_privacy/pipelines/dp_audit.py (validation, games, metrics) and
fl_privacy/pipelines/dp_audit_figures.py (figures).
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('dp_audit')
