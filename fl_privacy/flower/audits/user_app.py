"""Auditing a user's OWN Flower app with canary SuperNodes: the analysis, on a laptop.

What runs inside the user's app is `fl_privacy.flower.inapp` (numpy and flwr only, vendored
into the app: `with_canaries`, `canary_client_app`, `CanaryAuditStrategy`, which records what
the server saw each round to `canary_rounds.npz`). This module reads that recording and
computes the one-run audit (`user_rounds.audit_rounds`: jax-privacy's one-run bounds and their
f-DP refinement, Andrew et al.'s Gaussian fit, the most the canaries can certify) against the
claim: the user's `stated_epsilon`, else Flower's `privacy_spent()` recorded by the strategy,
recomputed here from its accountant's ledger with dp-accounting (`dp_accounting_epsilon`).
docs/experiments/flower_own_app.md is the recipe.

  python -m fl_privacy.flower.audits.user_app PATH [--workdir=DIR] [--delta=D]
      [--stated_epsilon=E]

PATH is the recording (or the folder holding `canary_rounds.npz`); DIR (default: the
recording's folder) gets `results.json` and `results.md`. Bad input is one line naming the
field, exit 2, nothing written. The in-app names are re-exported here for callers inside
fl-privacy (the tests' in-process rehearsals).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
from typing import Any, Mapping, Sequence

from fl_privacy.flower.audits import user_rounds
from fl_privacy.flower.inapp import fl_privacy_canaries as inapp
from fl_privacy.flower.inapp import fl_privacy_canary_strategy as recorder
from fl_privacy.report import atomic

# pylint: disable=unused-import
from fl_privacy.flower.inapp.fl_privacy_canaries import (
    CLIP_KEY, INDEX_KEY, NORM_KEY, SEED_KEY, CanaryConfig, add_to_model, app_mods,
    canary_client_app, canary_coin, canary_direction, canary_node_configs, flat_model,
    node_config_text, with_canaries)
from fl_privacy.flower.inapp.fl_privacy_canary_strategy import (
    ROUNDS_FILE, CanaryAuditStrategy, CanaryRound, discover_canaries, flower_stated,
    load_rounds, save_rounds)
from fl_privacy.flower.audits.user_rounds import (
    DEFAULT_THREATS, THREATS, audit_rounds, counted_bounds, max_certifiable, statistics)
# pylint: enable=unused-import

RESULTS = 'results.json'
TABLE = 'results.md'
# The claim's fields of today's audit (others, e.g. the accountant's ledger, stay out of it).
_STATED = ('stated_epsilon', 'stated_delta', 'stated_epsilon_source', 'stated_relation',
           'stated_sampling')


def dp_accounting_epsilon(state: Mapping[str, Any], delta: float) -> float:
  """Flower's RdpAccountant claim recomputed from its ledger (`state_dict()`) with
  dp-accounting's RDP accountant (the library Flower's own wraps): the same events, the
  same relation and sampling, at `delta`."""
  from dp_accounting import dp_event  # pylint: disable=import-outside-toplevel
  from dp_accounting import privacy_accountant  # pylint: disable=import-outside-toplevel
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=import-outside-toplevel
  config = state['config']
  relation = {'add-or-remove-one': 'ADD_OR_REMOVE_ONE', 'replace-one': 'REPLACE_ONE'}[
      config['neighboring_relation']]
  accountant = rdp_privacy_accountant.RdpAccountant(
      orders=list(state['orders']),
      neighboring_relation=getattr(privacy_accountant.NeighboringRelation, relation))
  for c in state['compositions']:
    e = c['event']
    gaussian = dp_event.GaussianDpEvent(float(e['noise_multiplier']))
    sampling = config['sampling_method']
    if sampling == 'poisson':
      event = dp_event.PoissonSampledDpEvent(e['sample_size'] / e['population_size'], gaussian)
    elif sampling == 'without-replacement':
      event = dp_event.SampledWithoutReplacementDpEvent(e['population_size'],
                                                        e['sample_size'], gaussian)
    elif sampling == 'no-amplification':
      event = gaussian
    else:
      raise ValueError(f'flower.accountant_state.config.sampling_method: {sampling!r} is '
                       "none of 'poisson', 'without-replacement', 'no-amplification'")
    accountant.compose(event, int(c['count']))
  return float(accountant.get_epsilon(float(delta)))


def stated(meta: Mapping[str, Any], delta: float, stated_epsilon: float | None = None
           ) -> dict[str, Any]:
  """The claim tested: `stated_epsilon` (or the recorded one) when given, else Flower's
  recorded `privacy_spent()` (its delta must be the audit's), else none (NaN, no verdict);
  with Flower's epsilon and its dp-accounting recomputation when recorded."""
  flower = meta.get('flower')
  given = stated_epsilon if stated_epsilon is not None else meta.get('stated_epsilon')
  if given is not None:
    out = dict(stated_epsilon=float(given), stated_delta=float(delta),
               stated_epsilon_source='given')
  elif flower is not None:
    if not math.isclose(flower['stated_delta'], delta, rel_tol=1e-9):
      raise ValueError(f'delta: Flower states its epsilon at delta {flower["stated_delta"]}, '
                       f'the audit runs at {delta}: give --delta={flower["stated_delta"]}')
    out = {k: flower[k] for k in _STATED}
  else:
    out = dict(stated_epsilon=math.nan, stated_delta=math.nan, stated_epsilon_source='none')
  if flower is not None:
    out['flower_privacy_spent_epsilon'] = flower['stated_epsilon']
    if flower.get('accountant_state'):
      out['dp_accounting_epsilon'] = dp_accounting_epsilon(flower['accountant_state'],
                                                           flower['stated_delta'])
  return out


def _delta(meta: Mapping[str, Any], delta: float | None) -> float:
  recorded = meta.get('delta')
  if delta is not None and recorded is not None and not math.isclose(delta, recorded):
    raise ValueError(f'delta: the recording fixed delta={recorded} before the run; '
                     f'--delta={delta} differs')
  flower = meta.get('flower') or {}
  value = next((d for d in (delta, recorded, flower.get('stated_delta')) if d is not None),
               None)
  if value is None:
    raise ValueError('delta: neither the recording nor Flower states one: give --delta')
  if not 0.0 < float(value) < 1.0:
    raise ValueError(f'delta: must be in (0, 1) (got {value})')
  return float(value)


def check_meta(meta: Mapping[str, Any], rounds: Sequence[CanaryRound]) -> None:
  """ValueError naming the first field of a recording's meta that the audit cannot take."""
  seed = meta.get('seed')
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f'seed: an integer >= 0 is needed (got {seed!r})')
  nodes = meta.get('canary_nodes') or {}
  recorder.check_indices({int(n): i for n, i in nodes.items()}, meta.get('num_canaries'))
  threats = meta.get('threats')
  if not threats or not set(threats) <= set(THREATS):
    raise ValueError(f'threats: distinct names of {THREATS} are needed (got {threats!r})')
  confidence = meta.get('confidence')
  if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (
      0.5 < confidence < 1.0):
    raise ValueError(f'confidence: must be in (0.5, 1) (got {confidence!r})')
  if not isinstance(meta.get('gaussian'), bool):
    raise ValueError(f'gaussian: true or false (got {meta.get("gaussian")!r})')
  if not rounds:
    raise ValueError('server_round: the recording holds no training round')


def audit_recording(meta: Mapping[str, Any], rounds: Sequence[CanaryRound], *,
                    delta: float | None = None, stated_epsilon: float | None = None
                    ) -> dict[str, Any]:
  """The audit (`user_rounds.audit_rounds`) of a recording (`load_rounds`, or a strategy's
  `meta()` and `rounds`) at its recorded threats, confidence and mechanism shape, with the
  canaries' norm, clip and the model's dimension."""
  check_meta(meta, rounds)
  if stated_epsilon is not None and not float(stated_epsilon) >= 0:
    raise ValueError(f'stated_epsilon: must be >= 0 (got {stated_epsilon})')
  d = _delta(meta, delta)
  out = audit_rounds(rounds, seed=int(meta['seed']), num_canaries=int(meta['num_canaries']),
                     delta=d, confidence=float(meta['confidence']),
                     threats=tuple(meta['threats']), gaussian=bool(meta['gaussian']),
                     stated=stated(meta, d, stated_epsilon))
  out.update(canary_norm=float(meta['canary_norm']), clip_norm=float(meta['clip_norm']),
             dimension=meta['dimension'])
  return out


def audit(strategy: CanaryAuditStrategy, **kw: Any) -> dict[str, Any]:
  """`audit_recording` of a strategy's rounds so far (in process, no file)."""
  if not strategy.rounds:
    raise RuntimeError('no training round ran: nothing to audit')
  return audit_recording(strategy.meta(), strategy.rounds, **kw)


def table(m: Mapping[str, Any]) -> str:
  """results.md: one row per threat, then the verdict's lines."""
  def f(x):
    return 'nan' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:.3g}'
  threats = [t for t in THREATS if f'{t}/epsilon_one_run' in m]
  lines = ['| threat | reader | eps one-run | eps one-run f-DP | fit mu [CI] | eps fit |',
           '|---|---|---|---|---|---|']
  for t in threats:
    lines.append(f'| {t} | {m[t + "/adversary"]} | {f(m[t + "/epsilon_one_run"])} | '
                 f'{f(m[t + "/epsilon_one_run_fdp"])} | {f(m[t + "/fit_mu"])} '
                 f'[{f(m.get(t + "/fit_mu_ci_low"))}, {f(m.get(t + "/fit_mu_ci_high"))}] | '
                 f'{f(m[t + "/epsilon_fit"])} |')
  lines += ['', f'- best counted bound (LOWER bound, family-wise confidence '
            f'{m["verdict_confidence"]}): {f(m["best_bound"])}; the most these '
            f'{m["num_canaries"]} canaries ({m["n_in"]} in, {m["n_out"]} out) can certify: '
            f'{f(m["max_certifiable"])}',
            f'- stated epsilon {f(m["stated_epsilon"])} at delta {m["delta"]} '
            f'({m["stated_epsilon_source"]}); privacy_violation {f(m["privacy_violation"])}',
            f'- per {m["unit"]}, {m["relation"]} neighbours, adversary {m["adversary"]}, '
            f'sampling {m["sampling"]}, {m["num_rounds"]} rounds, '
            f'{m["lost_canary_replies"]} lost canary replies']
  if 'dp_accounting_epsilon' in m:
    lines.append(f'- Flower privacy_spent() {f(m["flower_privacy_spent_epsilon"])}, '
                 f'dp-accounting from its ledger {f(m["dp_accounting_epsilon"])}')
  return '\n'.join(lines) + '\n'


def _recording_path(path: str) -> pathlib.Path:
  p = pathlib.Path(path)
  if p.is_dir():
    p = p / ROUNDS_FILE
  if not p.is_file():
    raise ValueError(f'recording: {path} is neither a {ROUNDS_FILE} file nor a folder holding '
                     'one')
  return p


def client_apps(app: Any, num_real: int, canary_configs: Sequence[Mapping[str, Any]]
                ) -> tuple[list[Any], list[dict[str, Any]]]:
  """(apps, node_configs) for an `InProcessGrid` rehearsal of the recipe: `num_real` nodes
  running the user's `app` wrapped by `with_canaries`, then one node per canary config (the
  same wrapped app: their node config makes them canaries)."""
  wrapped = with_canaries(app)
  configs = [{} for _ in range(int(num_real))] + [dict(c) for c in canary_configs]
  return [wrapped] * len(configs), configs


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise ValueError(message)


def main(argv: Sequence[str] | None = None) -> int:
  """The command (module docstring): 0, or 2 with one line on bad input."""
  parser = _Parser(prog='python -m fl_privacy.flower.audits.user_app', add_help=True)
  parser.add_argument('recording')
  parser.add_argument('--workdir', default=None)
  parser.add_argument('--delta', type=float, default=None)
  parser.add_argument('--stated_epsilon', type=float, default=None)
  try:
    args = parser.parse_args(argv)
    path = _recording_path(args.recording)
    meta, rounds = load_rounds(path)
    m = audit_recording(meta, rounds, delta=args.delta, stated_epsilon=args.stated_epsilon)
    workdir = pathlib.Path(args.workdir) if args.workdir else path.parent
    if workdir.exists() and not workdir.is_dir():
      raise ValueError(f'workdir: {workdir} is a file')
  except (ValueError, KeyError, TypeError) as e:
    print(f'user_app: {e}', file=sys.stderr)
    return 2
  workdir.mkdir(parents=True, exist_ok=True)
  clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}
  atomic.atomic_write_text(workdir / RESULTS, json.dumps(clean, indent=1, sort_keys=True))
  atomic.atomic_write_text(workdir / TABLE, table(m))
  print(table(m), end='')
  print(os.fspath(workdir / RESULTS))
  return 0


if __name__ == '__main__':
  sys.exit(main())
