"""DP bugs reproduced through fl-privacy's own DP code (`defenses.dp`, `accounting`, `fl.sampling`).

Each bug is our real mechanism function called the wrong way (a key reused, a clip moved, a
calibration given the wrong declaration, a schedule given the shard's rows), beside its twin:
the same functions called as the defense calls them. The games are white-box Dirac-canary
games after Nasr et al., "Tight Auditing of Differentially Private Machine Learning" (USENIX
Security 2023, arXiv:2302.07956): the canary is a gradient or update along coordinate 0 of
norm 2C (above the clip, so the clip must act), every other contribution is known to the
adversary (`dp_canary.known_contributions`: orthogonal to the canary), and the score is the
release's coordinate 0 (summed, or the Poisson mixture's log-likelihood ratio
`dp_canary.poisson_llr`), the optimal statistic of each game.

World functions are module-level and take the mechanism's numbers as `theta` (a float32
array), so one compilation serves both variants' strengths where the shapes agree.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import accounting
from fl_privacy.attacks.audit import bug_entries as be
from fl_privacy.attacks.audit import dp_canary
from fl_privacy.defenses import dp
from fl_privacy.fl import sampling
from fl_privacy.mechanisms import gaussian

DELTA = 1e-5
DIM = 4
C = 1.0
LIB = 'fl-privacy (this repository) '


def _canary(present, norm=2.0 * C):
  return dp_canary.canary_vector(DIM, norm) * jnp.where(present, 1.0, 0.0)


def _others(count):
  return jnp.asarray(dp_canary.known_contributions(count, DIM, C))


def _gaussian_parts(world, eps, unit, relation, adversary, stated_by, steps=lambda s: 1,
                    bug_curve='gaussian'):
  """(mu, claim, build) of an entry whose stack states `eps` for `steps(knob)` Gaussian
  releases of mu / sqrt(steps) each, and whose `world` takes theta = (z, knob, bug flag) with
  z = sqrt(steps) / mu (knob 0 where the entry has none); `bug_curve`: the buggy variant's
  trade-off curve."""
  mu = be.gaussian_mu(eps, DELTA)

  def claim(s):
    k = int(steps(s))
    return be.Claim(eps, DELTA, unit, relation, adversary, 'none', stated_by,
                    be.gaussian_event(mu / math.sqrt(k), k))

  def build(variant, s):
    bug = variant == 'bug'
    return be.jax_game(world, [math.sqrt(int(steps(s))) / mu, 0 if s is None else int(s), bug],
                       bug_curve if bug else 'gaussian')
  return mu, claim, build


# ------------------------------------------------------------- batch-mean clipping ---

# Static sizes: a knob (B, K, m) selects the first rows or steps of a static maximum, so one
# compilation serves every severity and both variants (theta carries the bug flag).
MAX_ROWS = 16


def _batch_world(key, present, theta):
  z, b, buggy = theta[0], theta[1], theta[2]
  others = _others(MAX_ROWS - 1)
  row = dp_canary.canary_vector(DIM, 100.0 * C)
  rows = jnp.concatenate([row[None], others])
  real = jnp.arange(MAX_ROWS) < b
  mask = jnp.where(jnp.arange(MAX_ROWS) == 0, jnp.where(present, 1.0, 0.0), real * 1.0)
  # The bug: the batch's mean gradient clipped instead of each example's, noise calibrated to
  # the per-example sensitivity C / B of the mean (Tramer et al. 2022, Sect. 4).
  mean = jnp.tensordot(mask, rows, axes=1) / b
  wrong = gaussian.add_noise(key, dp.clip_tree(mean, C), z * C / b)
  right = dp.private_gradient(key, rows, mask, C, z, denominator=b)
  return jnp.where(buggy > 0, wrong, right)[0] * b


def _batch_true_mu(batch: int, z: float) -> float:
  others = np.asarray(dp_canary.known_contributions(MAX_ROWS - 1, DIM, C),
                      np.float64)[:batch - 1]
  row = np.zeros(DIM)
  row[0] = 100.0 * C
  clip = lambda v: v * min(1.0, C / max(np.linalg.norm(v), 1e-300))  # noqa: E731
  diff = clip((row + others.sum(0)) / batch) - clip(others.sum(0) / batch)
  return float(np.linalg.norm(diff) / (z * C / batch))


def batch_clipping_entry() -> be.Entry:
  mu, claim, build = _gaussian_parts(_batch_world, 1.0, 'record', 'add_remove',
                                     'reads the noisy step',
                                     'Gaussian mechanism of sensitivity C / B on the mean')
  return be.Entry(
      'batch_clipping', 'the batch-mean gradient clipped (backpropagation clipping) and noised '
      'as if every example were clipped: one example moves the mean by C, not C / B',
      'F. Tramer, A. Terzis, T. Steinke, S. Song, M. Jagielski, N. Carlini, "Debugging '
      'Differential Privacy: A Case Study for Privacy Auditing", arXiv:2202.12219, 2022 '
      '(claimed 0.21, audited > 2.79)', LIB + 'defenses.dp (clip_tree, gaussian.add_noise) in '
      'place of private_gradient', 'mechanism audit', claim, build,
      lambda b: be.gaussian_epsilon(_batch_true_mu(int(b), 1.0 / mu), DELTA),
      knob='batch size B (the sensitivity ratio)', severity=16, severities=(2, 4, 16),
      milder='lower', trials=4000, verified='paper; the audited code is not public')


# ---------------------------------------------------------------- clip after noise ---


def _clip_world(key, present, theta):
  z, buggy = theta[0], theta[2]   # theta[1]: no knob
  raw = dp_canary.canary_vector(DIM, 100.0 * C) * jnp.where(present, 1.0, 0.0)
  wrong = dp.clip_tree(gaussian.add_noise(key, raw, z * C), C)
  right = dp.clip_and_noise_update(key, raw, C, z)
  return jnp.where(buggy > 0, wrong, right)[0]


def clip_after_noise_entry() -> be.Entry:
  _, claim, build = _gaussian_parts(_clip_world, 1.0, 'client', 'zero_out',
                                    'the server, the upload',
                                    'update DP: Gaussian, sensitivity C', bug_curve='other')
  return be.Entry(
      'clip_after_noise', 'noise added to the raw update, then the noisy update clipped: the '
      'clip bounds the output, not the sensitivity (unbounded)',
      'a common implementation error; Tramer et al. 2022 (arXiv:2202.12219) audit clipping '
      'bugs of this family', LIB + 'defenses.dp.clip_tree after gaussian.add_noise',
      'mechanism audit', claim, build, lambda s: None, trials=4000,
      verified='no single issue cited: a class of bug')


# -------------------------------------------------------------------- noise reuse ---


def _reuse_world(key, present, theta):
  """Two releases: the target's update (canary or nothing) and a known one, with the same
  key (theta[1] = 1) or keys folded per release (theta[1] = 0)."""
  z, reuse = theta[0], theta[1]
  known = jnp.zeros((DIM,), jnp.float32).at[1].set(0.5 * C)
  k1 = jax.random.fold_in(key, 1)
  k2 = jax.random.fold_in(key, jnp.where(reuse > 0, 1, 2))
  a = dp.clip_and_noise_update(k1, _canary(present), C, z)
  b = dp.clip_and_noise_update(k2, known, C, z)
  return (a - b)[0]


def _reuse_entry(name, title, source, what, compositions):
  mu = be.gaussian_mu(1.0, DELTA) / math.sqrt(compositions)
  claim = lambda s: be.Claim(1.0, DELTA, 'client', 'zero_out', 'the server, every upload',  # noqa: E731
                             'none', f'update DP, {compositions} release(s) composed',
                             be.gaussian_event(mu, compositions))

  def build(variant, s):
    if variant == 'bug':
      return be.jax_game(_reuse_world, [1.0 / mu, 1.0], 'other')
    return be.jax_game(_reuse_world, [1.0 / mu, 0.0])
  return be.Entry(name, title, source, LIB + what, 'mechanism audit', claim, build,
                  lambda s: math.inf, trials=2000,
                  verified='no single issue cited: a class of bug (a key not folded)')


def noise_reuse_entries() -> tuple[be.Entry, ...]:
  return (
      _reuse_entry('noise_reused_across_clients', 'two clients draw their update noise from '
                   'one key: the server subtracts the uploads and the noise cancels',
                   'the key discipline of docs/ARCHITECTURE.md ("no key serves two draws"); '
                   'a class of bug', 'defenses.dp.clip_and_noise_update, one key for two '
                   'clients', 1),
      _reuse_entry('noise_reused_across_rounds', 'a client reuses its round-1 noise in '
                   'round 2 (key not folded with the round): the difference of its uploads '
                   'is noiseless', 'a class of bug (fl.rounds.client_key folds the round in)',
                   'defenses.dp.clip_and_noise_update, one key for two rounds', 2),
  )


# ------------------------------------------------------- replace-one as add/remove ---


def _update_world(key, present, theta):
  sign = jnp.where(present, 1.0, -1.0)
  return dp.clip_and_noise_update(key, dp_canary.canary_vector(DIM, 2.0 * C) * sign, C,
                                  theta[0])[0]


@functools.lru_cache(maxsize=None)
def _replace_one_z(variant: str, eps: float) -> float:
  """The noise multiplier `accounting.noise_multiplier_for` calibrates: the bug hands it an
  add/remove declaration (sensitivity C), the twin the registry's `update_dp` (replace-one,
  2C)."""
  decl = (accounting.Declaration('update_dp', 'client', 'add_remove', 'server', 'none',
                                 sensitivity=1.0, compositions=1)
          if variant == 'bug' else accounting.update_dp(rounds=1))
  return accounting.noise_multiplier_for(decl, eps, delta=DELTA)


def replace_one_entry() -> be.Entry:
  eps = 2.0
  claim = lambda s: be.Claim(eps, DELTA, 'client', 'replace_one', 'the server, the upload',  # noqa: E731
                             'none', 'accounting.noise_multiplier_for, add/remove declaration')
  return be.Entry(
      'replace_one_as_add_remove', 'noise calibrated for add/remove neighbours (sensitivity '
      'C) while the guarantee is stated for replace-one (sensitivity 2C)',
      'a class of bug; the relations: Ponomareva et al., "How to DP-fy ML", JAIR 2023, '
      'arXiv:2303.00654, Sect. 3', LIB + 'accounting.noise_multiplier_for + '
      'defenses.dp.clip_and_noise_update', 'mechanism audit', claim,
      lambda v, s: be.jax_game(_update_world, [_replace_one_z(v, eps)]),
      lambda s: be.gaussian_epsilon(2.0 / _replace_one_z('bug', eps), DELTA), trials=8000,
      verified='no single issue cited: a class of bug')


# ------------------------------------------------ noise per round, accounted per step ---


def _steps_world(key, present, theta):
  z, k, buggy = theta[0], theta[1], theta[2]
  others = _others(3)
  rows = jnp.concatenate([dp_canary.canary_vector(DIM, 2.0 * C)[None], others])
  mask = jnp.concatenate([jnp.where(present, 1.0, 0.0)[None], jnp.ones((3,))])
  keys = jax.random.split(key, MAX_ROWS + 1)
  noise = jnp.where(buggy > 0, 0.0, z)
  grads = jax.vmap(lambda kk: dp.private_gradient(kk, rows, mask, C, noise, 1.0))(
      keys[:MAX_ROWS])
  update = jnp.sum(jnp.where((jnp.arange(MAX_ROWS) < k)[:, None], grads, 0.0), axis=0)
  # The bug: one draw for the round, at the noise the accountant composes per step.
  once = gaussian.add_noise(keys[MAX_ROWS], update, z * C)
  return jnp.where(buggy > 0, once, update)[0]


def per_step_entry() -> be.Entry:
  mu, claim, build = _gaussian_parts(_steps_world, 2.0, 'record', 'add_remove',
                                     'the server, the update', 'K noisy steps of z composed',
                                     steps=int)
  return be.Entry(
      'noise_per_round_as_per_step', 'noise added once to a round\'s update of K clipped '
      'steps, accounted as K noisy steps: sensitivity K C against noise z C',
      'a class of bug (the accountant composes releases that never happened)',
      LIB + 'defenses.dp.private_gradient without noise, summed, gaussian.add_noise once',
      'mechanism audit', claim, build,
      lambda k: be.gaussian_epsilon(math.sqrt(int(k)) * mu, DELTA),
      knob='local steps K', severity=16, severities=(2, 4, 16), milder='lower', trials=4000,
      verified='no single issue cited: a class of bug')


# ------------------------------------------------- record epsilon as the client's ---


def _client_world(key, present, theta):
  z, m, buggy = theta[0], theta[1], theta[2]
  rows = jnp.tile(dp_canary.canary_vector(DIM, 2.0 * C)[None], (MAX_ROWS, 1))
  mask = jnp.where(jnp.logical_and(present, jnp.arange(MAX_ROWS) < m), 1.0, 0.0)
  record = dp.private_gradient(key, rows, mask, C, z, 1.0)   # each row clipped, sum noised
  update = jnp.tensordot(mask, rows, axes=1)   # client level: the whole update clipped
  client = dp.clip_and_noise_update(key, update, C, z)
  return jnp.where(buggy > 0, record, client)[0]


def per_client_entry() -> be.Entry:
  mu, claim, build = _gaussian_parts(_client_world, 2.0, 'client', 'zero_out',
                                     'the server, the update',
                                     'record-level DP-SGD epsilon reported for the client')
  return be.Entry(
      'record_epsilon_as_client', 'a record-level epsilon (each client\'s DP-SGD) reported as '
      'the federation\'s client-level guarantee: a client of m records is m records',
      'a class of bug; units: McMahan et al., "Learning Differentially Private Recurrent '
      'Language Models", ICLR 2018, arXiv:1710.06963', LIB + 'defenses.dp.private_gradient '
      '(record level) vs clip_and_noise_update (client level)', 'mechanism audit', claim,
      build, lambda m: be.gaussian_epsilon(int(m) * mu, DELTA),
      knob='records per client m', severity=16, severities=(2, 4, 16), milder='lower',
      trials=4000, verified='no single issue cited: a class of bug')


# ------------------------------------------------------- Poisson DP-SGD step games ---

STEPS, BATCH = 10, 10


def _sgd_world(key, present, theta):
  """Up to `STEPS` DP-SGD steps of `BATCH` rows. theta: z, the canary's rate in each world
  (in, out), the steps released in each world (in, out), shuffle flag. Poisson: the canary
  joins each step with its world's rate; shuffle: exactly one uniformly drawn step. Score:
  the Poisson log-likelihood ratio of the released steps, + 100 x their count (the side
  channel a data-dependent schedule opens)."""
  z, shuffle = theta[0], theta[5]
  q = jnp.where(present, theta[1], theta[2])
  released = jnp.where(present, theta[3], theta[4])
  others = _others(BATCH - 1)
  k_pick, k_steps = jax.random.split(key)
  pick = jax.random.randint(k_pick, (), 0, STEPS)

  def step(t):
    k_sample, k_noise = jax.random.split(jax.random.fold_in(k_steps, t))
    used = present & jnp.where(shuffle > 0, t == pick, jax.random.bernoulli(k_sample, q))
    rows = jnp.concatenate([dp_canary.canary_vector(DIM, 2.0 * C)[None], others])
    mask = jnp.concatenate([used[None].astype(jnp.float32), jnp.ones((BATCH - 1,))])
    return dp.private_gradient(k_noise, rows, mask, C, z, float(BATCH))[0] * BATCH
  x = jax.vmap(step)(jnp.arange(STEPS))
  shown = jnp.arange(STEPS) < released
  rate = theta[2]   # the score reads every step at the public rate
  llr = jnp.logaddexp(jnp.log1p(-rate), jnp.log(rate) + (x * C - 0.5 * C**2) / (z * C)**2)
  return jnp.sum(jnp.where(shown, llr, 0.0)) + 100.0 * jnp.sum(shown)


def _poisson_event(q, z, steps):
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(float(q), dp_accounting.GaussianDpEvent(float(z))),
      int(steps))


@functools.lru_cache(maxsize=None)
def _poisson_epsilon(q: float, z: float, steps: int) -> float:
  return be.event_epsilon(_poisson_event(q, z, steps), DELTA)


def shuffle_as_poisson_entry() -> be.Entry:
  z, q = 0.8, BATCH / (STEPS * BATCH)
  claim = lambda s: be.Claim(_poisson_epsilon(q, z, STEPS), DELTA, 'record', 'add_remove',  # noqa: E731
                             'reads every noisy step', 'shuffle',
                             'Poisson-subsampled Gaussian accountant (q = B / N)',
                             _poisson_event(q, z, STEPS))

  def build(variant, s):
    return be.jax_game(_sgd_world, [z, q, q, STEPS, STEPS, variant == 'bug'], 'other')
  return be.Entry(
      'shuffle_as_poisson', 'batches drawn by shuffling (without replacement: every record '
      'in exactly one step an epoch) accounted as Poisson subsampling',
      'L. Chua, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi, A. Sinha, C. Zhang, "How '
      'Private are DP-SGD Implementations?", ICML 2024, arXiv:2403.17673',
      LIB + 'defenses.dp.private_gradient per step, shuffled; dp-accounting '
      'PoissonSampledDpEvent', 'mechanism audit', claim, build, lambda s: None,
      trials=4000, reach='true epsilon: not in dp-accounting (Chua et al. compute it '
      'numerically); the gap lives at deltas far below what a few thousand games resolve',
      verified='paper')


@functools.lru_cache(maxsize=None)
def _calibrate_poisson(q: float, steps: int, target: float) -> float:
  """The z whose `steps` Poisson steps spend at most `target` under dp-accounting's RDP
  accountant (an upper bound of the PLD epsilon, so the twin meets the claim; 40 halvings
  of the bracket in log z)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  def rdp(z):
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(_poisson_event(q, z, steps))
    return acc.get_epsilon(DELTA)
  lo, hi = 0.1, 20.0
  for _ in range(40):
    mid = math.sqrt(lo * hi)
    lo, hi = (mid, hi) if rdp(mid) > target else (lo, mid)
  return hi


def fl_bench_entry() -> be.Entry:
  z, q = 1.0, BATCH / (STEPS * BATCH)

  def claim(steps):
    return be.Claim(_poisson_epsilon(q, z, 1), DELTA, 'record', 'add_remove',
                    'reads every noisy step', 'poisson',
                    'accountant told trainloader_length = 1 (one step an epoch)',
                    _poisson_event(q, z, 1))

  def build(variant, steps):
    steps = int(steps)
    if variant == 'bug':
      return be.jax_game(_sgd_world, [z, q, q, steps, steps, 0], 'other')
    zz = _calibrate_poisson(q, steps, _poisson_epsilon(q, z, 1))
    return be.jax_game(_sgd_world, [zz, q, q, steps, steps, 0], 'other',
                       event=_poisson_event(q, zz, steps))
  return be.Entry(
      'fl_bench_steps_undercount', 'the accountant counts one step per local epoch '
      '(trainloader_length hard-coded to 1) while the client runs ceil(N / B) Poisson steps',
      'FL-bench PR #200 (KarhouTam/FL-bench, "feat(dp): Implement Differential Privacy FedAvg '
      'with Enhanced Privacy Tracking"), flagged in its review thread (src/server/dpfedavg.py)',
      'FL-bench (PR #200) reproduced with ' + LIB + 'DP-SGD steps and dp-accounting',
      'mechanism audit', claim, build,
      lambda steps: _poisson_epsilon(q, z, int(steps)),
      knob='steps an epoch (ceil(N / B))', severity=10, severities=(2, 5, 10), milder='lower',
      trials=8000, verified='PR #200 review comment read through the search tool; whether '
      'the merged code kept the hard-coded 1 was not checked')


@functools.lru_cache(maxsize=None)
def _schedule_setup(declared: int, batch: int, eps: float):
  decl = accounting.dp_sgd(batch_size=batch, num_examples=declared,
                           steps=sampling.public_schedule(declared, batch).steps_per_epoch,
                           epochs=1)
  z = accounting.noise_multiplier_for(decl, eps, delta=DELTA)
  return decl, z


def schedule_entry() -> be.Entry:
  declared, eps = 80, 2.0

  def claim(s):
    decl, z = _schedule_setup(declared, BATCH, eps)
    return be.Claim(eps, DELTA, 'record', 'add_remove', 'reads every noisy step and counts '
                    'them', 'poisson', 'accounting.dp_sgd at the declared N',
                    accounting.event(decl, z, accountant='pld'))

  def build(variant, s):
    # The bug: the schedule of the shard's rows (N + 1 with the canary); the twin: of the
    # declared N, whatever the rows.
    _, z = _schedule_setup(declared, BATCH, eps)
    s_in = sampling.public_schedule(declared + 1 if variant == 'bug' else declared, BATCH)
    s_out = sampling.public_schedule(declared, BATCH)
    return be.jax_game(_sgd_world, [z, s_in.rate, s_out.rate, s_in.steps_per_epoch,
                                    s_out.steps_per_epoch, 0], 'other')
  return be.Entry(
      'data_dependent_schedule', 'Poisson DP-SGD took its rate and steps from the shard\'s '
      'rows: one record more adds a noisy step (80 rows: 8 steps, 81: 9)',
      'this repository, fixed in commit 88d3805 ("DP-SGD\'s Poisson schedule is public: rate '
      'B / N and S steps an epoch from the declared record count"); '
      'docs/experiments/training_audit.md',
      LIB + 'fl.sampling.public_schedule given the rows + defenses.dp.private_gradient',
      'side channel', claim, build, lambda s: math.inf, trials=2000,
      verified='our own history (docs/experiments/training_audit.md)')


def entries() -> tuple[be.Entry, ...]:
  """The entries reproduced through our own code."""
  return (batch_clipping_entry(), clip_after_noise_entry(), *noise_reuse_entries(),
          replace_one_entry(), per_step_entry(), per_client_entry(),
          shuffle_as_poisson_entry(), fl_bench_entry(), schedule_entry())
