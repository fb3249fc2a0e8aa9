"""The DP-bug catalog audited in one run: `python -m experiments.dp_bugs`.

Every entry of `attacks.audit.bug_catalog` (real, documented DP bugs of FL stacks: Flower,
Opacus, FL-bench, the literature and our own history), and every entry a user adds
(`dp_bugs.extra=module:attr`), is played as a canary game against its claim twice: the BUGGY
mechanism (`variant='bug'`) and its CORRECT TWIN (`'twin'`), each over `seeds` independent
seeds, by `attacks.audit.bug_audit` (lower bounds of epsilon on jax-privacy's auditor, a
verdict at family-wise confidence). Where an entry has a knob (a sensitivity ratio, rounds,
a batch size), its buggy variant is also audited at each of its `severities` (seed 0): the
mildest severity flagged is the audit's resolution for that bug.

Points (params): `part` ('catalog' or 'severity'), `bug`, `variant`, `seed` (0..seeds-1),
`severity` (the documented value on catalog rows; None where the bug has no knob). Metrics:
the claim (`claimed_epsilon`, `dp_*`), `true_epsilon` (dp-accounting, where computable),
the bounds (`epsilon_cp`, `epsilon_gdp`, `epsilon_one_run`; `certified_cp` and `best_bound`
at the verdict's level), `privacy_violation`, `verdict` ('violation', 'no violation', 'out of
reach', 'not run: needs the torch extra'). Entries that cannot run here are rows too, never
dropped. `figures` writes `dp_bugs_table.md` (one line per bug: its twin's verdict, the
seeds' spread, the mildest severity detected) and logs the headline "flags N of M; false
alarms on twins F of M".

Fields: configs/_dp_bugs.py. Results: docs/experiments/dp_bugs.md.
"""

from __future__ import annotations

from typing import Any

from absl import logging
import jax

from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks.audit import bug_audit
from fl_privacy.attacks.audit import bug_catalog
from fl_privacy.attacks.audit import bug_entries
from fl_privacy.pipelines import base
from fl_privacy.pipelines import dp_bugs_tables
from fl_privacy.report import summary

NAME = 'dp_bugs'

SUMMARY = (
    summary.Table(
        'DP bugs: each documented bug and its correct twin against the claim',
        (summary.param('bug'), summary.param('variant'), summary.param('seed'),
         summary.metric('claimed_epsilon', 'eps claimed', digits=2),
         summary.metric('true_epsilon', 'eps true', digits=2),
         summary.metric('certified_cp', 'certified (CP)', digits=2),
         summary.metric('best_bound', 'best bound', digits=2),
         summary.metric('verdict', 'verdict')),
        where={'part': 'catalog'}),
    summary.Table(
        'DP bugs: the buggy variant at each severity (seed 0)',
        (summary.param('bug'), summary.param('severity'),
         summary.metric('claimed_epsilon', 'eps claimed', digits=2),
         summary.metric('true_epsilon', 'eps true', digits=2),
         summary.metric('best_bound', 'best bound', digits=2),
         summary.metric('verdict', 'verdict')),
        where={'part': 'severity'}),
)


def _extras(config) -> tuple[str, ...]:
  raw = config.dp_bugs.extra
  if raw is None or raw == '':
    return ()
  if not isinstance(raw, str):
    raise validate.ConfigError('dp_bugs.extra', 'comma-separated module:attr specs', raw)
  return tuple(s.strip() for s in raw.split(',') if s.strip())


def validate_config(config) -> dict[str, bug_entries.Entry]:
  """Checks every field; returns the entries to audit (catalog choice, then extras)."""
  catalog = {e.name: e for e in bug_catalog.catalog()}
  chosen = validate.subset_of(config, 'dp_bugs.bugs', tuple(catalog))
  validate.checked(config, 'dp_bugs.seeds', validate.number(1, 20, integer=True))
  validate.checked(config, 'dp_bugs.trial_scale', validate.number(
      0.0, 100.0, low_open=True, words='a number in (0, 100]'))
  validate.in_range(config, 'dp_bugs.confidence', 0.5, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.checked(config, 'dp_bugs.severity_sweep', validate.Rule(
      'True or False', lambda v: isinstance(v, bool)))
  entries = {n: catalog[n] for n in chosen}
  for spec in _extras(config):
    try:
      entry = bug_catalog.load_extra(spec)
    except bug_catalog.ExtraError as e:
      raise validate.ConfigError('dp_bugs.extra', 'comma-separated module:attr, each naming '
                                 f'a bug_entries.Entry with a builder ({e})', spec) from None
    validate.require(entry.name not in entries, 'dp_bugs.extra',
                     'entries whose names are not already audited', entry.name)
    entries[entry.name] = entry
  return entries


def prepare(config) -> dict:
  """Validates the config (nothing to load: the games' releases are small vectors)."""
  return {'entries': validate_config(config)}


def trials(config, entry: bug_entries.Entry) -> int:
  """The games a point of `entry` plays: its default x `trial_scale`, at least 8."""
  return max(8, int(round(entry.trials * float(config.dp_bugs.trial_scale))))


def points(config, entries: dict[str, bug_entries.Entry]) -> list[dict]:
  """The sweep's params, in run order: the catalog rows, then the severity rows."""
  s = config.dp_bugs
  out = []
  for e in entries.values():
    variants = ('bug',) if e.build is None else bug_entries.VARIANTS
    seeds = 1 if e.build is None else int(s.seeds)
    out += [dict(part='catalog', bug=e.name, variant=v, seed=k, severity=e.severity)
            for v in variants for k in range(seeds)]
  if s.severity_sweep:
    for e in entries.values():
      if e.build is None:
        continue
      out += [dict(part='severity', bug=e.name, variant='bug', seed=0, severity=sev)
              for sev in e.severities if sev != e.severity]
  return out


def _seed(key: jax.Array, params: dict) -> int:
  return int(jax.random.randint(report.point_key(key, params), (), 0, 2**31 - 1))


def _describe(entry: bug_entries.Entry) -> dict[str, Any]:
  return {'source': entry.source, 'library': entry.library, 'threat': entry.threat,
          'title': entry.title, 'knob': entry.knob or '', 'verified': entry.verified,
          'reach': entry.reach}


def audit_point(config, entry: bug_entries.Entry, params: dict, key: jax.Array
                ) -> tuple[dict[str, Any], int]:
  """One row: the entry's variant at a severity, played and audited (or why it was not)."""
  sev = params['severity']
  metrics: dict[str, Any] = _describe(entry)
  nan = float('nan')
  missing = bug_catalog.missing_extras(entry)
  if missing:   # its claim and true epsilon may need the extra too (Opacus's accountant)
    metrics.update(verdict=f'not run: needs the {"/".join(missing)} extra',
                   privacy_violation=nan)
    return metrics, 0
  claim = entry.claim(sev)
  metrics.update(bug_audit.claim_metrics(claim))
  true = entry.true_epsilon(sev) if params['variant'] == 'bug' else None
  metrics['true_epsilon'] = nan if true is None else float(true)
  if entry.build is None:
    metrics.update(verdict='out of reach', privacy_violation=nan)
    return metrics, 0
  n = trials(config, entry)
  seed = _seed(key, params)
  game = entry.build(params['variant'], sev)
  present, scores = game.play(seed, n)
  metrics.update(bug_audit.verdict(present, scores, claim, game.curve,
                                   confidence=float(config.dp_bugs.confidence),
                                   event=game.event))
  metrics.update(curve=game.curve, game_seed=seed)
  if game.checks is not None:
    metrics.update(game.checks(seed))
  return metrics, n


def _after(params: dict, metrics) -> None:
  if params['variant'] == 'twin' and float(metrics.get('privacy_violation', 0) or 0) > 0:
    logging.error('FALSE ALARM: the correct twin of %s is flagged (best bound %.3f > claim '
                  '%.3f)', params['bug'], float(metrics['best_bound']),
                  float(metrics['claimed_epsilon']))


def plan(config, state, store, key) -> list[base.Point]:
  """One point per `points` row, each drawing from its own seed (`report.point_key`)."""
  del store
  entries = state['entries']
  return [base.Point(p, lambda p=p: audit_point(config, entries[p['bug']], p, key),
                     after=lambda m, p=p: _after(p, m))
          for p in points(config, entries)]


def figures(config, state, store, key) -> None:
  """`dp_bugs_table.md` and the headline (logged and printed)."""
  del key
  _, line = dp_bugs_tables.write(store.points, state['entries'], store.workdir,
                                 int(config.dp_bugs.seeds))
  logging.info('DP bugs: %s', line)
  print(f'DP bugs: {line}', flush=True)

