"""The record-level audit of the PyTorch + Opacus Flower App, from what its run recorded.

The app (`flower_torch_app/`, package `torch_audit_app`) trains every node with Opacus's
DP-SGD; one node holds record-level canaries, each IN its data by a fair coin, and the
server's `RecordingFedAvg` writes `record.npz` (the node's uploads, its noisy steps projected
on the canaries' directions, the input-space canaries' losses, its Opacus epsilons). This module
runs afterwards, outside the app (JAX allowed here): it scores every canary per threat and
audits the scores against the epsilon Opacus's accountant reported for that node's whole
training.

Claims (`claims`): Opacus's RDP and PRV epsilons at `target-delta` after the last round,
each for unit = one example (record), add/remove-one neighbours, Poisson sampling at the
node's sample rate, over every noisy step of the node (so also for any function of them).

Threats and scores (one per canary; larger = more likely IN):
- `every_step` (gradient canaries; the adversary reads every noisy summed gradient, as the
  app's Opacus step hook does): the log-likelihood ratio of a Poisson-subsampled Gaussian at
  the node's sample rate q, sum_t log(1 - q + q exp((y_t - 1/2) / s_t^2)), where x_t is the
  step projected on the canary's direction in units of C (a drawn canary adds exactly C
  there), y_t = x_t minus its median over the steps (the real examples' drift along it; a
  canary is drawn in few steps, q T of T), and s_t the standard deviation of y_t over the
  never-inserted null directions at step t: the noise as the adversary sees it
  (Opacus's z C plus the real examples' share), measured, not claimed. A statistic fixed
  before the coins are read, so every bound stays valid; it does not assume the noise the
  accountant claims (a node adding less noise than it accounts shows as a smaller s_t).
- `uploads` (gradient canaries; the server reading the node's uploads): minus the sum over
  rounds of (upload - sent model) projected on the canary's direction (plain SGD moves the
  model by -lr x the noisy step / B: the sum of the steps).
- `uploads_input` (input-space canaries; the server): the sum over rounds of the canary's
  loss under the model sent minus under the model uploaded.

Statistics: `fl_privacy.attacks.audit.canary_statistics.audit` on each threat's scores with
mechanism 'dp_sgd_poisson' (a subsampled Gaussian: the f-DP bound, which tests Gaussian
trade-off curves, is reported but not counted) and `independent=False` (one training: the
canaries are not independent trials), i.e. the one-run bound of Steinke, Nasr, Jagielski
("Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846) on
jax-privacy's auditor (`eval.auditing.audit_scores`), a LOWER bound on epsilon at confidence
1 - (1 - c) / k each (k = the threats recorded, Bonferroni: the verdict's family-wise
confidence is c), with `max_certifiable` (what a perfect attack on the same canaries
certifies) and the verdict: 'violation' (a bound above the claim), 'no violation' (none, and
the canaries could have refuted it) or 'cannot refute' (no attack on these canaries could).
A run whose audited node sent no reply (Opacus refused the model: BatchNorm) gets the verdict
'refused' with the node's error line.

CLI: `python -m fl_privacy.flower.audits.opacus_record <record.npz>` prints the rows (JSON).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np

from fl_privacy.attacks.audit import canary_statistics

MECHANISM = 'dp_sgd_poisson'
CLAIMS = ('rdp', 'prv')
THREATS = ('every_step', 'uploads', 'uploads_input')
ADVERSARY = {'every_step': 'every noisy step (white box)',
             'uploads': "the server reading the node's uploads",
             'uploads_input': "the server reading the node's uploads"}
CANARIES = {'every_step': 'gradient', 'uploads': 'gradient', 'uploads_input': 'input'}


def load(path) -> dict[str, Any]:
  """record.npz as a dict (the JSON fields decoded)."""
  with np.load(path, allow_pickle=False) as f:
    rec = {k: f[k] for k in f.files}
  rec['run_config'] = json.loads(str(rec['run_config']))
  rec['errors'] = json.loads(str(rec['errors']))
  return rec


def refused(rec: dict[str, Any]) -> str | None:
  """The audited node's error line when it never replied (None when it did)."""
  if 'upload' in rec and len(rec['upload']):
    return None
  lines = [ln for e in rec['errors'] for ln in str(e).splitlines() if 'Error' in ln]
  return lines[-1].strip() if lines else 'the audited node sent no reply'


def claims(rec: dict[str, Any]) -> dict[str, float]:
  """Opacus's epsilons after the last round (`rdp`, `prv`) and `delta`."""
  return {'rdp': float(rec['epsilon_rdp'][-1]), 'prv': float(rec['epsilon_prv'][-1]),
          'delta': float(rec['run_config']['target-delta'])}


def poisson_llr(x: np.ndarray, q: np.ndarray, s: np.ndarray) -> np.ndarray:
  """Per canary, the summed log-likelihood ratio over steps [T, m] of N(1, s^2) w.p. q vs
  N(0, s^2) (x in units of C; q, s per step)."""
  q = np.asarray(q, np.float64)[:, None]
  s = np.asarray(s, np.float64)[:, None]
  a = (np.asarray(x, np.float64) - 0.5) / s ** 2
  return np.logaddexp(np.log1p(-q), np.log(q) + a).sum(axis=0)


def step_scores(steps: np.ndarray, m: int, q: np.ndarray) -> np.ndarray:
  """`every_step`'s scores from the recorded steps [T, m + n_null] (module docstring)."""
  y = np.asarray(steps, np.float64)
  y = y - np.median(y, axis=0, keepdims=True)
  s = np.std(y[:, m:], axis=1)
  if y.shape[1] - m < 2 or not np.all(s > 0):
    raise ValueError('the every-step score needs at least two null directions with spread')
  return poisson_llr(y[:, :m], q, s)


def scores(rec: dict[str, Any]) -> dict[str, np.ndarray]:
  """Each recorded threat's canary scores (module docstring)."""
  out: dict[str, np.ndarray] = {}
  m = len(rec.get('grad_coins', ()))
  if m:
    out['uploads'] = -np.asarray(rec['upload_projection'])[:, :m].sum(axis=0)
    steps = np.asarray(rec['steps'])
    if steps.size:
      rounds = np.asarray(rec['step_round'])
      idx = np.searchsorted(np.asarray(rec['round']), rounds)
      out['every_step'] = step_scores(steps, m, rec['sample_rate'][idx])
  if 'input_loss_sent' in rec and rec['input_loss_sent'].size:
    out['uploads_input'] = (rec['input_loss_sent'] - rec['input_loss_upload']).sum(axis=0)
  return out


def coins(rec: dict[str, Any], threat: str) -> np.ndarray:
  return np.asarray(rec['grad_coins'] if CANARIES[threat] == 'gradient'
                    else rec['input_coins'], bool)


def audit(rec: dict[str, Any], confidence: float = 0.95) -> list[dict[str, Any]]:
  """One row per claim (RDP, PRV) and threat, plus the verdict per claim in every row
  (`verdict`, `privacy_violation`: over the claim's threats, family-wise at `confidence`).
  A refused run gives one row per claim with verdict 'refused'; a run without canaries none."""
  cfg = rec['run_config']
  if int(cfg['grad-canaries']) + int(cfg['input-canaries']) == 0:
    return []
  why = refused(rec)
  base = dict(unit='record', relation='add_remove', sampling=_sampling(rec),
              mechanism=MECHANISM, plant=str(rec['run_config'].get('plant', 'none')),
              verdict_confidence=float(confidence))
  if why is not None:
    return [dict(base, claim=c, verdict='refused', privacy_violation=math.nan, reason=why)
            for c in CLAIMS]
  s = scores(rec)
  threats = [t for t in THREATS if t in s]
  each = 1.0 - (1.0 - float(confidence)) / len(threats)
  claim = claims(rec)
  rows = []
  for c in CLAIMS:
    eps = claim[c]
    group = []
    for t in threats:
      r = canary_statistics.audit(s[t], coins(rec, t), MECHANISM, eps, delta=claim['delta'],
                                  confidence=each, independent=False, reach=True,
                                  report_all=False)
      group.append(dict(base, claim=c, claimed_epsilon=eps, delta=claim['delta'], threat=t,
                        adversary=ADVERSARY[t], canaries=CANARIES[t],
                        **{k: r[k] for k in ('epsilon_one_run', 'best_bound',
                                             'max_certifiable', 'n_in', 'n_out',
                                             'bounding_canaries', 'epsilon_estimate',
                                             'score_in_mean', 'score_out_mean',
                                             'canaries_needed')},
                        threat_verdict=r['verdict'], bound_confidence=r['bound_confidence']))
    violated = any(g['best_bound'] > eps for g in group)
    verdict = ('violation' if violated else
               'no violation' if any(g['threat_verdict'] != 'cannot refute' for g in group)
               else 'cannot refute')
    best = max(g['best_bound'] for g in group)
    for g in group:
      g.update(verdict=verdict, privacy_violation=float(violated), claim_best_bound=best)
    rows += group
  return rows


def _sampling(rec: dict[str, Any]) -> str:
  return ('shuffled (accounted as Poisson)' if rec['run_config'].get('plant') == 'no_poisson'
          else 'poisson')


def utility(rec: dict[str, Any]) -> dict[str, float]:
  """The global model's test accuracy and loss after the last round, the seconds per round
  (mean), the audited node's noise multiplier, sample rate and steps."""
  out = {'test_accuracy': float(rec['test_accuracy'][-1]),
         'test_loss': float(rec['test_loss'][-1]),
         'seconds_per_round': float(np.mean(rec['round_seconds']))
         if len(rec['round_seconds']) else math.nan}
  if 'noise_multiplier' in rec and len(rec['noise_multiplier']):
    out.update(noise_multiplier=float(rec['noise_multiplier'][-1]),
               sample_rate=float(rec['sample_rate'][-1]), steps=int(rec['steps_total'][-1]))
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print('usage: python -m fl_privacy.flower.audits.opacus_record RECORD.npz', file=sys.stderr)
    return 2
  rec = load(argv[1])
  print(json.dumps({'utility': utility(rec), 'rows': audit(rec)}, indent=1, default=float))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
