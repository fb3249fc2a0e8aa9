"""The `dp_bugs` config section: a catalog of documented DP bugs of FL stacks, each beside its
correct twin, audited in one run.

Used by `python -m experiments.dp_bugs` (fl_privacy/pipelines/dp_bugs.py; the catalog is
fl_privacy/attacks/audit/bug_catalog.py). The dataset configs call `section(dataset, smoke)`;
every field is documented in `section`'s docstring. The games need no data. Expected
results: docs/experiments/dp_bugs.md.
"""

from __future__ import annotations

import ml_collections

# The catalog's entries in table order. The catalog (`bug_catalog.names()`) holds the same
# names; a test checks they agree (the config layer does not import the audit's builders).
BUGS = ('flower_localdp_sensitivity', 'flower_localdp_classic_formula',
        'flower_localdp_no_composition', 'opacus_571', 'opacus_819',
        'opacus_adaclip_accounting', 'opacus_batchnorm', 'batch_clipping', 'clip_after_noise',
        'noise_reused_across_clients', 'noise_reused_across_rounds',
        'replace_one_as_add_remove', 'noise_per_round_as_per_step',
        'record_epsilon_as_client', 'shuffle_as_poisson', 'fl_bench_steps_undercount',
        'data_dependent_schedule', 'floating_point_sampler', 'non_cryptographic_generator')


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `dp_bugs` section (the same for every dataset: the games read no data).

  Fields:
    bugs: the catalog entries to audit, a non-empty subset of `BUGS` (default all). Entries
      out of the audit's reach get a row saying so; entries whose extra is missing (Opacus:
      `pip install -e '.[torch]'`) a row saying "not run: needs the torch extra".
    extra: '' or comma-separated `module:attr` specs, each naming a
      `fl_privacy.attacks.audit.bug_entries.Entry` (or a function returning one) with a
      builder: a bug of your own, audited like the catalog's (docs/experiments/dp_bugs.md,
      "Adding a bug").
    seeds: independent seeds per (bug, variant), an integer in [1, 20] (3): the headline
      gives the seeds' spread of "flags N of M" and of the twins' false alarms.
    trial_scale: multiplies every entry's default number of games (each entry's `trials`),
      a number in (0, 100] (1.0).
    confidence: family-wise confidence of every verdict, in (0.5, 1) (0.95).
    severity_sweep: also audit each bug with a knob at its `severities` (seed 0), for the
      mildest severity flagged (True).
  """
  del dataset
  s = ml_collections.ConfigDict()
  s.bugs = BUGS
  s.extra = ''
  s.seeds = 3
  s.trial_scale = 1.0
  s.confidence = 0.95
  s.severity_sweep = True
  if smoke:
    s.seeds = 1
    s.trial_scale = 0.25
    s.severity_sweep = False
  return s
