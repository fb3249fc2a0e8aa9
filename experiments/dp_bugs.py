"""A catalog of real, documented DP bugs of FL stacks, each beside its correct twin, audited.

Every entry (Flower's LocalDpMod, Opacus's normaliser, adaptive-clipping accounting and a
BatchNorm its validators let through, FL-bench's step count, batch-mean clipping after Tramer
et al. 2022, noise reuse, relation and unit mix-ups, our own data-dependent schedule, ...) is
reproduced through the library it lives in and played as a canary game against its claim, buggy and twin, over several seeds; entries
beyond a black- or white-box audit's reach are listed with the reason.

  python -m experiments.dp_bugs                                    # the catalog, 3 seeds
  python -m experiments.dp_bugs --config=configs/digits.py:smoke   # 1 seed, few games (CI)
  python -m experiments.dp_bugs --config.dp_bugs.bugs="('batch_clipping',)"
  python -m experiments.dp_bugs --config.dp_bugs.extra=my_module:my_entry   # your own bug

Expected: "flags N of M; false alarms on twins 0 of M" (docs/experiments/dp_bugs.md has the
measured numbers). Writes results.json, results.csv and dp_bugs_table.md to --workdir
(default ./runs/dp_bugs-<UTC timestamp>; re-using one resumes the sweep).

Like experiments/reconstruction.py this sets XLA's backend optimisation level to 0 before JAX
starts, unless the user set one: the games are small programs, compiled once each, so the run
is compile-bound (results do not depend on it).

Fields: configs/_dp_bugs.py. Results: docs/experiments/dp_bugs.md.
Code: fl_privacy/pipelines/dp_bugs.py, fl_privacy/attacks/audit/bug_*.py.
"""

from __future__ import annotations

import os

if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()

from experiments import common  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  common.run('dp_bugs')
