"""The points of the reconstruction pipeline (`fl_privacy.pipelines.reconstruction`).

`attack_point`: one attack point by the paper's fixed server or the adaptive one (issue 49:
tuned by `reconstruction_runs.tune` on the tuning pool, then run on the same private clients,
its paired difference with the fixed server per client, `attacks.reconstruction.paired`);
`utility_point`: the honest model's test accuracy under a defense over several trainings,
each a cluster; `report_baseline`: an input-LDP report's own PSNR, the baseline a
reconstruction must beat; `rounds_epsilon`: a defense's guarantee over the rounds an adaptive
server averaged.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy.attacks.reconstruction import metrics as rec_metrics
from fl_privacy.attacks.reconstruction import paired
from fl_privacy.attacks.reconstruction import value_grid
from fl_privacy.pipelines import base
from fl_privacy.pipelines import reconstruction_defenses
from fl_privacy.pipelines import reconstruction_figures
from fl_privacy.pipelines import reconstruction_runs as runs
from fl_privacy.report import atomic

IMAGES = reconstruction_figures.IMAGES
attack_setting = reconstruction_defenses.attack_setting
swept_defense = reconstruction_defenses.swept_defense


def attack_point(config, state, store, key, p: dict, defense: defenses.Configured,
                 extra: dict, images: dict, group: tuple | None = None,
                 branch: int = 0, server: str = 'fixed') -> base.Point:
  """Attack point `p` under `defense` (strength `branch` of the swept `group`, if any), by the
  paper's fixed server or (`server='adaptive'`, imprint only) the server that first tunes its
  restore scale, bin placement, width, structure and rounds on the tuning pool under the same
  defense (`runs.tune`) and then attacks the same private clients as the fixed one; its
  metrics then hold the paired differences adaptive - fixed (`paired`, `*_diff`)."""
  s = config.reconstruction
  params = dict(kind='attack', server=server, **p, **extra)
  # The fixed server's per-client counts of this point, for its adaptive twin (same clients).
  twin = tuple(sorted((k, v) for k, v in params.items() if k != 'server'))
  counts = state.setdefault('fixed_counts', {})
  fixed = state.setdefault('fixed_metrics', {})
  n = p['batch_size'] * p['num_batches']
  x, y = np.asarray(state['x']), np.asarray(state['y'])

  def run(**kw):
    out = runs.simulate(config, state, p, group or (defense.hooks,), branch, key, **kw)
    scores = rec_metrics.score_trials(out, x, n=n, psnr_threshold=float(s.psnr_threshold),
                                      grid=state['grid'])
    return out, scores

  def compute():
    hooks = group or (defense.hooks,)
    chosen, out, mine = {}, None, None
    if server == 'adaptive':
      chosen = runs.tune(config, state, p, hooks, branch, key)
      setting = (chosen['restore_scale'], chosen['placement'], chosen['num_bins'],
                 chosen['structure'])
      if setting == runs.fixed_setting(config) and chosen['rounds'] == 1 and twin in fixed:
        # The fixed server's own setting on the same private clients: its outcome, exactly
        # (the same program, knobs, thresholds and keys), not recomputed.
        m, mine = dict(fixed[twin]), counts[twin]
      else:
        out, scores = run(knobs=runs.knobs_of(config, state, p, chosen['restore_scale'],
                                              structure=chosen['structure'],
                                              rounds=chosen['rounds']),
                          cuts=runs.cuts_for(config, state, chosen['placement'],
                                             chosen['num_bins']),
                          num_bins=chosen['num_bins'])
        mine = _counts(scores)
      if twin not in counts:   # a resumed run: the fixed point was read back, not computed
        counts[twin] = _counts(run()[1])
    else:
      out, scores = run()
    if out is not None:
      m = rec_metrics.point_metrics(out, x, y, n=n,
                                    rng=data_lib.rng_from_key(runs.point_key(key, p)),
                                    psnr_threshold=float(s.psnr_threshold),
                                    resamples=int(s.bootstrap_resamples), scores=scores)
      m.update(defense.metrics)
    if server == 'fixed':
      counts[twin] = _counts(scores)
      m.update(report_baseline(config, state, key, p, defense))
      fixed[twin] = dict(m)
    if chosen:
      for name in ('recovered', 'exact', 'exact_grid'):
        m.update(paired.fields(name, mine[name], counts[twin][name], n))
      m.update(adaptive_restore_scale=chosen['restore_scale'],
               adaptive_placement=chosen['placement'],
               adaptive_num_bins=chosen['num_bins'],
               adaptive_structure=chosen['structure'],
               adaptive_rounds=chosen['rounds'],
               adaptive_public_recovered=chosen['recovered'] / chosen['examples'],
               adaptive_public_exact_grid=chosen['exact'] / chosen['examples'],
               adaptive_public_examples=chosen['examples'],
               adaptive_candidates=json.dumps(chosen['candidates']))
      m.update(rounds_epsilon(config, state, extra, p, chosen['rounds']))
    label = reconstruction_figures.label(params)
    if server == 'fixed' and p['learning_rate'] == float(s.learning_rate):
      # The grid shows the paper's server at the client's rate (one entry per label).
      images[label] = reconstruction_figures.example_images(out, x, int(s.grid_images), n)
      atomic.atomic_write_text(os.path.join(store.workdir, IMAGES), json.dumps(images))
    return m, int(m['n_trials'])

  return base.Point(params, compute, 'trials')


def _counts(scores: list[dict]) -> dict[str, np.ndarray]:
  """Per-client successes of a point's trials (`metrics.score_trials`)."""
  return {k: np.array([sc[k] for sc in scores]) for k in ('recovered', 'exact', 'exact_grid')}


# Examples whose input-LDP report `report_baseline` scores (from the clients' pool).
REPORT_EXAMPLES = 1000


def report_baseline(config, state, key, p: dict, defense: defenses.Configured) -> dict:
  """For an input mechanism (a `batch` hook that randomises the inputs: BitRand, OME, the
  Gaussian one), what its report alone gives away: the PSNR of the randomised input against
  the true one, clipped to [0, 1] as the server clips a recovery (`report_psnr_mean`, over up
  to 1,000 of the clients' examples), and the share of reports exact after rounding to the
  value grid (`report_exact_grid`). A reconstruction must beat this to have learnt anything
  beyond the report the mechanism releases. {} for other defenses."""
  name = defense.params.get('defense')
  if name not in ('bitrand', 'ome', 'gaussian'):
    return {}
  k = min(REPORT_EXAMPLES, int(state['pool_size']))
  x = state['x'][:k]
  flat = np.asarray(x, np.float64).reshape(k, -1)
  fn = jax.jit(lambda kk, xx: defense.hooks.batch(kk, xx, state['y'][:k], jnp.ones(k), None)[0])
  rep = np.clip(np.asarray(fn(jax.random.fold_in(runs.point_key(key, p), REPORT_STREAM), x),
                           np.float64).reshape(k, -1), 0.0, 1.0)
  mse = np.mean((rep - flat) ** 2, axis=1)
  psnr = np.minimum(10 * np.log10(1.0 / np.maximum(mse, 1e-300)), rec_metrics.PSNR_CAP)
  grid = value_grid.round_to(rep, state['grid'])
  exact = np.max(np.abs(grid - flat), axis=1) < rec_metrics.EXACT
  return {'report_psnr_mean': float(np.mean(psnr)),
          'report_recovered': float(np.mean(psnr > float(config.reconstruction.psnr_threshold))),
          'report_exact_grid': float(np.mean(exact)), 'report_examples': k}


# The stream of a point's key that randomises `report_baseline`'s inputs.
REPORT_STREAM = 0x72657074


def rounds_epsilon(config, state, extra: dict, p: dict, rounds: int) -> dict:
  """The swept defense's guarantee over the `rounds` rounds an adaptive server averaged (its
  epsilon labels are for one round): a DP defense accounted anew for that many rounds, an LDP
  one's releases counted (basic composition). {} for one round or no swept defense."""
  if rounds <= 1 or 'defense' not in extra or extra.get('strength') is None:
    return {}
  d = {k: extra[k] for k in ('defense', 'strength', 'dp_sgd_sampling') if k in extra}
  setting = attack_setting(config, state, p['attack'], p)._replace(rounds=int(rounds))
  m = swept_defense(config, state, d, setting).metrics
  out = {}
  if 'dp_epsilon' in m:
    out['rounds_dp_epsilon'] = m['dp_epsilon']
  if 'ldp_epsilon' in m:
    out['rounds_ldp_releases'] = m.get('ldp_releases', rounds)
  return out


def utility_point(config, state, key, d: dict, defense: defenses.Configured,
                  group: tuple | None = None, branch: int = 0) -> base.Point:
  """Test accuracy of the honest model one client trains under `defense`."""
  u = config.reconstruction.utility
  params = dict(kind='utility', **d)

  def compute():
    correct = runs.utility(config, state, key, group or (defense.hooks,), branch)
    # The trainings are the independent units (they share the test set): the interval takes
    # each training's accuracy as one cluster (`metrics.clustered_rate`), not the
    # predictions of all trainings as independent.
    m = rec_metrics.rate_fields('test_accuracy', np.sum(correct, axis=1), correct.shape[1])
    m.update({f'utility_{k}': v for k, v in defense.metrics.items()})
    return m, int(u.trials)

  return base.Point(params, compute, 'trainings')
