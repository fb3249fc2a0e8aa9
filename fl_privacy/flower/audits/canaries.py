"""Flower's DP audited over every round of a real deployment, in one run (canary clients).

The `training` part of `flower_audit`. One Flower deployment per setting on the in-process
grid (`inprocess.InProcessGrid`): Flower's own `FedAvg` round loop (`Strategy.start`) over
`num_rounds` rounds, wrapped in the setting's DP wrapper, every node's `ClientApp` carrying
the setting's mod (all five of `dp_setting.WRAPPERS`:
`DifferentialPrivacyServerSideFixedClipping`, `DifferentialPrivacyClientSideFixedClipping` +
`fixedclipping_mod`, `LocalDpMod` on every node, `DifferentialPrivacyServerSideAdaptiveClipping`,
`DifferentialPrivacyClientSideAdaptiveClipping` + `adaptiveclipping_mod`). Nothing of Flower
is re-implemented: the noise, the clipping and the adaptive clip's rounds are Flower's.

Nodes. `num_real` ordinary clients, then `num_canaries` canary clients. The model is one
float32 vector of length `dimension` (4096 by default: independent random directions are
near-orthogonal, |cos| ~ 1 / sqrt(d)). The ordinary nodes (`real_clients`) are either
- 'fixed' (the default): their updates are known, fixed random vectors (fresh direction per
  node and round, norms spread `real_norm` x 0.5..2, orthogonal to the Dirac canaries; they
  stand for training clients and keep the run fast: no model, no data, about 1 ms per node
  and round), or
- 'trained': they train a real model on the offline digits (`fl_privacy.data.load`, the
  train split): a one-hidden-layer ReLU MLP 64 -> h -> 10 (`fl_privacy.models.mlp.MLP`), h
  the widest whose P = 75 h + 10 parameters fit in `dimension` (h = 54, P = 4060 of 4096 by
  default), laid on the vector's first P coordinates in `jax.flatten_util.ravel_pytree`
  order (fc1 bias, fc1 kernel, fc2 bias, fc2 kernel), the d - P coordinates after them
  padding no node trains (zero from the start). The global model starts at the MLP's
  initialisation (`fold_in(key, 6)`; 'fixed' starts at zero). Each round a sampled real node
  runs `TRAINED_EPOCHS` epoch of plain SGD (`TRAINED_LEARNING_RATE`, batches of
  `TRAINED_BATCH`) with `fl.local.client_update` from the round's global model on its
  `TRAINED_PER_CLIENT` examples, key fold_in(fold_in(fold_in(key, 5), round), partition),
  and replies the trained parameters (the padding unchanged). Node k's examples are
  positions k x 16 .. k x 16 + 15 (mod N) of a permutation of the 1,438 training digits
  (`fold_in(key, 7)`): disjoint while num_real x 16 <= 1,438, each digit on about
  num_real x 16 / 1,438 nodes beyond (5.6 at 500 nodes). The Dirac canaries (and the
  null's coordinates) are then MLP weights that the real updates move too: the projections
  carry the real updates' cross-talk, the same for both worlds of a canary
  (docs/experiments/flower_audit_sampling.md measures what it costs).

Canaries. Canary i has a fixed random unit direction v_i (from `fold_in(key, i)`) and a fair
coin b_i (also from `fold_in(key, i)`, Steinke et al.'s inclusion with probability 1/2).
Every round, an included canary replies w_t + `canary_norm` x C x v_i (above the clip: C =
the fixed clip, or the adaptive wrappers' initial clip, so Flower's clip must act); an
excluded one is the zero-out neighbour: the same node, present and replying, with an update
of norm 1e-6 C along v_i (a client that did not train: an update of exactly zero crashes
Flower 1.42's clip with a ZeroDivisionError, see `docs/experiments/flower_audit.md`). By
default (`fraction_train` 1) every node replies every round, so FedAvg's denominator
n = num_real + num_canaries is the same in both worlds and Flower's `num_sampled_clients` is
n: the relation is zero-out, the per-round sensitivity C / n of Flower's claim.

Client sampling (`fraction_train` q < 1). Flower's own FedAvg samples the nodes each round:
`FedAvg(fraction_train=q, min_train_nodes=k, min_available_nodes=n)` draws k = int(n q)
nodes without replacement with Python's `random.sample` (flwr 1.42
`serverapp/strategy/fedavg.py` line 170, `strategy_utils.sample_nodes`), seeded by
`jobs.serve` from the job's seed. Every DP wrapper gets `num_sampled_clients` = k (its noise
std z C / k on the mean of the k replies, the adaptive wrappers' default count std k / 20),
so a sampled canary's round is the same Gaussian mechanism as at q = 1 with n -> k (zero-out
among the k sampled: the denominator k does not depend on the coin). Flower's accountant
is built with `SamplingMethod.NO_AMPLIFICATION` (the only one its fixed wrappers accept), so
`privacy_spent()` states the same epsilon at q < 1 as at q = 1: T releases at z, no
amplification by sampling claimed. The adversary audited is the server, which knows whom
it sampled (`adversary` 'server_knows_the_sample'; `sampling`
'fixed_size_without_replacement'): for it there is no amplification by sampling, and its
statistic for canary i uses only the rounds S_i in which it sampled canary i (T_i = |S_i|
rounds, different per canary; `rounds_per_canary_*` records their spread). Each statistic is
then standardised by its null std (the all-iterates sum over S_i divided by the root of its
rounds' noise variances, the last iterate by the root of all T rounds'), so that canaries
sampled in different numbers of rounds share one null N(0, 1) and one threshold; a canary
never sampled scores 0 (it carries no signal; the one-run guess abstains on it) and is left
out of the Gaussian fit (whose null is the never-inserted directions scored over every
round, or, for LocalDpMod's all-iterates adversary, the excluded canaries sampled at least
once). The m canaries stay the one-run bounds' trials. What ran is mu_i-GDP for canary i
with mu_i = sqrt(T_i) / z over all iterates (T_i / (z sqrt(T)) for the last iterate), so the
exact epsilon reported (`exact_epsilon_*`) is that of the canary sampled most (max_i mu_i:
DP is a guarantee for every client, and Steinke et al.'s bound tests the epsilon that holds
for every canary); `exact_epsilon_all_iterates_median_canary` is the median canary's, and
`<threat>/fit_mu_expected` the mean mu_i over the included canaries the fit reads (what the
fit estimates). At q = 1 every T_i = T: the standardisation is one positive factor common to
every score, which changes neither the one-run bounds (ranks) nor the fit (scale-free), and
the code keeps the unstandardised sums there (the defaults' numbers are those of before).

Adversaries (`THREATS`) and scores (projections on v_i):
- `all_iterates`: central wrappers, every aggregate the server (or anyone reading the
  global model) sees, sum_t w_t <aggregate_t - model_(t-1), v_i> with inverse-variance
  weights w_t = C_(t-1) / sigma_t^2 (the round's clip over Flower's noise variance; 1 for
  fixed clipping); LocalDpMod: the server reading every upload of canary i,
  sum_t <upload_(i,t) - model_(t-1), v_i>.
- `last_iterate`: the final model only, <model_T - model_0, v_i>.
The central wrappers' all-iterates sum with equal weights telescopes to the last iterate, so
the two coincide for fixed clipping at q = 1 (with fixed or trained real nodes alike); at
q < 1 the all-iterates statistic sums only the rounds the canary was sampled in.

Statistics per threat model: Steinke, Nasr, Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846): `epsilon_one_run` and its f-DP refinement
`epsilon_one_run_fdp` from `fl_privacy.eval.auditing.audit_scores`, the m canaries as the
trials (LOWER bounds, each at `bound_confidence`, see the verdict below). Andrew, Kairouz, Oh,
Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning"
(ICLR 2024, arXiv:2302.03098): a Gaussian fitted to the included canaries' statistic against
the null of `num_null` never-inserted directions scored the same way, mu = (mean_in -
mean_null) / std_null, `epsilon_fit` = `auditing.gdp_epsilon(mu, delta)`: an ESTIMATE, not a bound
(with a bootstrap interval at `confidence`). Beside them Flower's stated epsilon over the
rounds that ran (fixed wrappers: Flower's own `RdpAccountant` passed to the wrapper,
`privacy_spent()`; adaptive: the same accountant composed at z over the rounds, Andrew et
al.'s claim, which Flower does not state itself; LocalDpMod: its `epsilon` argument composed
over the rounds, T eps at T delta) and the exact epsilon of the mechanism Flower ran
(`exact_epsilon`).

The verdict (`privacy_violation`, `best_bound`) takes the largest of the k counted bounds
(`counted_bounds`: both one-run bounds of every threat model the run has a statistic for), so
each is computed at confidence 1 - (1 - c) / k, c = `Design.confidence` (Bonferroni over the
counted bounds, fixed by the wrapper and the threats present before any score is seen): the
verdict then holds at family-wise confidence c. The maximum of k bounds each at c is
guaranteed only at 1 - k (1 - c) (0.80 for four 95% bounds). The f-DP bound tests Gaussian
trade-off curves; it counts for every wrapper here, as in `dp_games.audit`: each adds Gaussian
noise to clipped updates (the adaptive ones at a clip their noisy count moves), and the claims
it is tested against are Gaussian (Flower's RdpAccountant at z, Andrew et al.'s claim for the
adaptive ones; LocalDpMod's Gaussian calibration). k = 4 (two threats x two bounds) for
every wrapper as deployed; 2 for LocalDpMod without recorded uploads (last iterate only).

Randomness: Flower's noise comes from numpy's global generator (FedAvg samples with Python's
`random`), seeded from the run's key and restored afterwards; directions, coins, the fixed
real updates, the trained model's initialisation, the real nodes' examples and their local
SGD from `fold_in` keys. A setting's results depend only on its key.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.flatten_util  # pylint: disable=unused-import
import numpy as np

from fl_privacy.flower.audits import canary_deploy
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import dp_setting


def audit(setting: dp_setting.Setting, design: canary_design.Design, key: jax.Array, *,
          engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """One deployment and its audit against Flower's stated epsilon.

  Every counted bound (`counted_bounds`, k of them: 4, or 2 for LocalDpMod without recorded
  uploads) is computed at confidence 1 - (1 - c) / k, c = `design.confidence` (Bonferroni),
  so `privacy_violation` (the largest of them, `best_bound`, above the stated epsilon) is a
  verdict at family-wise confidence c: where the stated epsilon holds, it flags a violation
  with probability at most 1 - c. The largest of k bounds each at c would hold only at
  1 - k (1 - c). The reported one-run bounds are those counted ones (at `bound_confidence`);
  the Gaussian fit and its interval (at c) are estimates and decide nothing.

  Returns:
    Per threat model `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (lower bounds, each
    at `bound_confidence`), `/epsilon_fit`, `/fit_mu` (estimates, with their bootstrap
    interval at c), `/n_in`, `/n_out`, `/n_null`; `stated_epsilon` (+ `_delta`, `_source`),
    the exact epsilons, `best_bound`, `privacy_violation`, `verdict_confidence` (c,
    family-wise), `bound_confidence` (1 - (1 - c) / k), `counted_bounds` (the k
    '<threat>/<bound>' names, comma-separated), `confidence` (c), `accountant_violation`
    (an exact epsilon above the stated one), the clip trajectory (`clip_first`, `clip_last`,
    `clips`), `seconds`, `num_nodes`. The sampling (`sampling_metrics`: `fraction_train`,
    `sample_size`, `sampling`, `adversary`, rounds per canary), `real_clients`, per threat
    `/fit_n_in` (the included canaries the fit reads: those sampled at least once) and
    `/fit_mu_expected` (their mean mu_i, `canary_mus`: what the fit estimates without
    cross-talk); with trained real nodes `trained_metrics`.
  """
  run = canary_deploy.deploy(setting, design, key, engine=engine, workdir=workdir)
  eps, delta, source = canary_stats.stated(setting, design, run)
  included = run['included']
  if not (included.any() and (~included).any()):
    raise ValueError(f'{design.num_canaries} canaries gave no canary in one of the worlds')
  # The family is fixed by the wrapper and whether uploads were recorded, before any score.
  uploads = run['upload_projections'] is not None
  threats = canary_stats.audited_threats(setting, uploads)
  counted = canary_stats.counted_bounds(setting, uploads)
  each = 1.0 - (1.0 - float(design.confidence)) / len(counted)
  num_rounds = int(design.num_rounds)
  # The server's sample: each canary scored over its own rounds (q = 1: every round, and the
  # sums as they always were).
  participation = (run['participation'] if design.sampled else
                   np.ones((num_rounds, int(design.num_canaries)), bool))
  rounds = participation if design.sampled else None
  canary = canary_stats.scores(setting, run, run['directions'], rounds)
  if tuple(t for t in canary_design.THREATS if t in canary) != threats:
    raise RuntimeError(f'the threats scored {sorted(canary)} are not the ones counted '
                       f'{list(threats)}')
  null_dirs = canary_design.null_directions(jax.random.fold_in(key, 3), design)
  null = canary_stats.scores(
      setting, run, null_dirs,
      None if rounds is None else np.ones((num_rounds, len(null_dirs)), bool))
  m: dict[str, Any] = dict(stated_epsilon=eps, stated_delta=delta, stated_epsilon_source=source,
                           num_nodes=run['num_nodes'], num_rounds=int(design.num_rounds),
                           num_canaries=int(design.num_canaries), num_real=int(design.num_real),
                           dimension=int(design.dimension), seconds=run['seconds'],
                           game_relation='zero_out', real_clients=str(design.real_clients))
  m.update(canary_stats.exact_epsilons(setting, design, run, delta))
  m.update(canary_stats.sampling_metrics(design, participation))
  mus = canary_stats.canary_mus(setting, design, run, participation)
  # A canary never sampled carries no signal: a trial of the one-run bounds (it abstains at
  # score 0), not a sample of the fit, nor of LocalDpMod's null of excluded canaries.
  taken = participation.any(axis=0)
  for threat in threats:
    s = canary[threat]
    m.update(canary_stats.threat_metrics(
        threat, s, included, taken, null.get(threat, s[~included & taken]), delta=delta,
        each=each, confidence=float(design.confidence),
        rng=np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(key, 4)),
                                             np.uint32))))
    m[f'{threat}/fit_mu_expected'] = float(np.mean(mus[threat][included & taken]))
  if design.real_clients == 'trained':
    m.update(canary_design.trained_metrics(design, run['models']))
  best = max(b for b in (m[name] for name in counted) if not math.isnan(b))
  m.update(best_bound=best, privacy_violation=float(best > eps * (1 + 1e-9)),
           accountant_violation=float(max(
               m['exact_epsilon_all_iterates'], m['exact_epsilon_last_iterate']) > eps),
           verdict_confidence=float(design.confidence), bound_confidence=each,
           counted_bounds=','.join(counted), confidence=float(design.confidence))
  clips = run['clips']
  if not np.isnan(clips).all():
    m.update(clip_first=float(clips[0]), clip_last=float(clips[-1]),
             clips=[float(c) for c in clips])
  return m
