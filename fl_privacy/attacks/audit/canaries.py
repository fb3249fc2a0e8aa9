"""Canaries inside the training that runs: the one-run audit of a whole FL training.

A training audit adds canaries to a real federated training (the experiments' own client
protocol, round loop, participation sampling, upload hook and defense hooks: `fl.rounds.run`)
and reads what the adversary of the defense's declaration may read:

- **Canary clients** (client-level mechanisms: `update_dp`, `central_dp`, `weak_dp`,
  `ldp_sgd`): J extra clients (`fl.rounds.Injected`) whose update every round is a fixed unit
  direction v_j scaled to `norm` (above the clip, so the defense's clip must act), Andrew,
  Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for
  Federated Learning" (ICLR 2024, arXiv:2302.03098), Sect. 3. Each canary's world is a fair
  coin (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
  arXiv:2305.08846, Algorithm 1): under a replace-one declaration the client is present in
  both worlds and uploads +v_j (IN) or -v_j (OUT); under add/remove it uploads v_j (IN) or
  reports no examples (OUT: weight 0, out of every mean).
- **Canary examples** (record-level `dp_sgd`, Poisson or shuffled): m extra rows spread over
  the real clients' shards, going through the real sampler, masks, per-example gradients and
  clip. Two kinds: `gradient` (white-box: the row's loss is s v . w for a Dirac v on its own
  coordinate, so its per-example gradient is the Dirac vector of norm `norm` whatever the
  model, the canary Nasr et al., "Tight Auditing of Differentially Private Machine Learning",
  USENIX Security 2023, arXiv:2302.07956, let the adversary insert) and `input` (black-box: a
  test image with a wrong label). Add/remove (Poisson): the row is real (IN) or padding (OUT);
  replace-one (shuffle): the row is real in both worlds, +Dirac / -Dirac, or the wrong / the
  true label.

Threats (what the adversary reads): `all_iterates`, every release its declaration lets it see
(each upload of the canary's client when the adversary is the server; each round's aggregate
when it reads the aggregate), and `last_iterate`, only the final model w_T against w_0.
Scores (higher = IN): the projection of each release on the canary's direction summed over
rounds (the server knows who took part and sums the rounds its canary did; an aggregate reader
does not, and under participation sampling uses the likelihood ratio of the subsampled
mixture, `mixture_llr`), for input canaries the loss decrease on the wrong label.

Statistics (`audit`): the canaries of one training share it, so their scores are dependent:
only the one-run bounds apply (`eval.auditing.audit_scores`' `epsilon_one_run` and its f-DP
refinement `epsilon_one_run_fdp`, the latter counted only for Gaussian-shaped mechanisms),
at a family-wise confidence (Bonferroni over the counted bounds), and Andrew et al.'s
Gaussian-fit `epsilon_estimate` (an estimate, not a bound). Their strength depends on the
number of canaries m and on delta: the one-run p-value carries a term in m delta.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

from fl_privacy.defenses import dp
from fl_privacy.eval import auditing
from fl_privacy.fl import losses
from fl_privacy.fl import rounds

CANARY_KINDS = ('client', 'gradient', 'input')
THREATS = ('all_iterates', 'last_iterate')
DIRECTIONS = ('random', 'dirac')
# Mechanisms whose trade-off curve is not Gaussian: the f-DP one-run bound (which tests
# Gaussian curves) is reported there but not counted.
NON_GAUSSIAN = ('ldp_sgd', 'dp_sgd_poisson', 'central_dp_without_replacement',
                'weak_dp_without_replacement')
# Pure-DP randomizers: their trade-off curve is randomized response's over any number of
# reports, so Andrew et al.'s Gaussian fit says nothing about them (it reads 15 at a claimed
# 8 for LDP-SGD over 5 reports); `audit` leaves the estimate out (NaN).
NO_ESTIMATE = ('ldp_sgd',)

COIN_SALT = 0x7FFF2001
DIRECTION_SALT = 0x7FFF2002


# ------------------------------------------------------------------------------ canaries ---


def coins(key: jax.Array, num: int) -> np.ndarray:
  """Canary i's world: an independent fair coin from `fold_in(fold_in(key, COIN_SALT), i)`
  (True = IN), as the one-run theorem assumes."""
  k = jax.random.fold_in(key, COIN_SALT)
  return np.asarray(jax.vmap(lambda i: jax.random.bernoulli(jax.random.fold_in(k, i)))(
      jnp.arange(num)))


def directions(key: jax.Array, num: int, dim: int, kind: str = 'random') -> np.ndarray:
  """[num, dim] unit directions: independent uniform ones (`random`, row i from
  `fold_in(key, i)`) or Dirac vectors on distinct random coordinates (`dirac`, num <= dim)."""
  k = jax.random.fold_in(key, DIRECTION_SALT)
  if kind == 'dirac':
    if num > dim:
      raise ValueError(f'{num} Dirac canaries need as many coordinates (the model has {dim})')
    coords = np.asarray(jax.random.permutation(k, dim)[:num])
    out = np.zeros((num, dim), np.float32)
    out[np.arange(num), coords] = 1.0
    return out
  if kind != 'random':
    raise ValueError(f'direction must be one of {DIRECTIONS} (got {kind!r})')
  g = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(k, i), (dim,)))(jnp.arange(num))
  return np.asarray(g / jnp.linalg.norm(g, axis=1, keepdims=True), np.float32)


def dirac_coordinates(key: jax.Array, num: int, dim: int) -> np.ndarray:
  """`num` distinct coordinates of a `dim`-vector (the gradient canaries' Diracs)."""
  if num > dim:
    raise ValueError(f'{num} gradient canaries need as many coordinates (the model has {dim})')
  return np.asarray(jax.random.permutation(jax.random.fold_in(key, DIRECTION_SALT), dim)[:num])


def signs(relation: str, world: np.ndarray) -> np.ndarray:
  """+1 / -1 per canary under replace-one (the two worlds' values), +1 under add/remove."""
  if relation == 'replace_one':
    return np.where(world, 1.0, -1.0).astype(np.float32)
  if relation == 'add_remove':
    return np.ones(world.shape, np.float32)
  raise ValueError(f"relation must be 'add_remove' or 'replace_one' (got {relation!r})")


def injected_clients(dirs: np.ndarray, world: np.ndarray, unravel: Callable, *, norm: float,
                     relation: str, size: float) -> rounds.Injected:
  """The canary clients as `rounds.Injected`: update sign x norm x v_j every round; under
  add/remove an OUT canary reports 0 examples (out of every mean and of the participants)."""
  flat = dirs * (float(norm) * signs(relation, world))[:, None]
  present = np.ones(len(world), np.float32) if relation == 'replace_one' else world
  deltas = jax.vmap(unravel)(jnp.asarray(flat))
  return rounds.Injected(deltas=deltas, sizes=jnp.asarray(present * float(size), jnp.float32))


class Examples(NamedTuple):
  """Canary rows placed in the clients' shards: canary i sits in client `owner[i]`, row
  `row[i]` (after its real rows)."""
  owner: np.ndarray
  row: np.ndarray
  clients: rounds.ClientData


def place_examples(clients: rounds.ClientData, x: np.ndarray, y: np.ndarray,
                   world: np.ndarray, relation: str) -> Examples:
  """Appends m canary rows (x [m, ...], y [m]) to the K shards, canary i to client i mod K.

  Add/remove: an OUT canary's row is padding (mask 0). Replace-one: every canary row is real;
  the caller gives the world-dependent value in `y` (a label or the gradient canary's code).
  """
  k = clients.num_clients
  m = len(y)
  per = -(-m // k)
  owner = np.arange(m) % k
  slot = np.arange(m) // k
  cx = np.zeros((k, per) + x.shape[1:], np.asarray(clients.x).dtype)
  cy = np.zeros((k, per), np.asarray(clients.y).dtype)
  cm = np.zeros((k, per), np.float32)
  cx[owner, slot] = x
  cy[owner, slot] = y
  live = np.ones(m, bool) if relation == 'replace_one' else np.asarray(world, bool)
  cm[owner, slot] = live.astype(np.float32)
  base_mask = (np.ones(np.shape(clients.y), np.float32) if clients.mask is None
               else np.asarray(clients.mask, np.float32))
  n = base_mask.shape[1]
  data = rounds.ClientData(x=np.concatenate([np.asarray(clients.x), cx], axis=1),
                           y=np.concatenate([np.asarray(clients.y), cy], axis=1),
                           mask=np.concatenate([base_mask, cm], axis=1), aux=clients.aux)
  return Examples(owner=owner, row=n + slot, clients=data)


def gradient_canary_loss(loss_hook: Callable, num_classes: int, coordinates: np.ndarray,
                         code_sign: np.ndarray, scale: float, ravel: Callable) -> Callable:
  """A `loss` hook: rows whose label is `num_classes + i` are gradient canary i.

  Canary i's loss is s_i x scale x w[c_i] (w the flattened parameters), so its per-example
  gradient is s_i x scale x e_{c_i} whatever the model: the Dirac gradient canary of Nasr et
  al. 2023, which DP-SGD's per-example clip then bounds. The other rows keep `loss_hook`.
  """
  coords = jnp.asarray(coordinates, jnp.int32)
  sgn = jnp.asarray(code_sign, jnp.float32)
  num = int(len(coordinates))

  def loss(key, loss_fn, params, x, y, mask, aux):
    canary = y >= num_classes
    idx = jnp.clip(y - num_classes, 0, num - 1)
    rows = jnp.ones(y.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
    real = rows * (1.0 - canary.astype(jnp.float32))
    base = loss_hook(key, loss_fn, params, x, jnp.where(canary, 0, y), real, aux)
    flat = ravel(params)
    term = jnp.sum(rows * canary * sgn[idx] * float(scale) * flat[coords[idx]])
    return base * jnp.sum(real) / jnp.maximum(jnp.sum(rows), 1.0) + term / jnp.maximum(
        jnp.sum(rows), 1.0)
  return loss


# -------------------------------------------------------------------------------- scores ---


def mixture_llr(x: jax.Array, q: float, shift: jax.Array, sigma: jax.Array) -> jax.Array:
  """Per-round log-likelihood ratio of +shift vs -shift, each present with probability q in
  Gaussian noise sigma: log(1 - q + q e^{(x D - D^2/2)/s^2}) - log(1 - q + q e^{(-x D -
  D^2/2)/s^2}); the optimal statistic of a replace-one canary under Poisson-like
  participation (for q = 1 it is 2 x D / s^2, proportional to x). Summed over the last axis."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  b = (-x * shift - 0.5 * shift**2) / sigma**2
  lq, l1q = jnp.log(q), jnp.log1p(-q) if q < 1 else -jnp.inf
  return jnp.sum(jnp.logaddexp(l1q, lq + a) - jnp.logaddexp(l1q, lq + b), axis=-1)


class Scores(NamedTuple):
  """What one training gave the adversaries, per canary: the sum over the rounds it took part
  in of the server-read projections of its own uploads (`uploads` [m]), the per-round
  aggregate projections w_t - w_{t+1} (`aggregates` [T, m]), the real clients' clipped
  uploads projected and summed per round (`known` [T, m], what a white-box reader of the
  aggregate subtracts), the participants per round (`participants` [T]), the last iterate's
  projection w_0 - w_T (`last` [m]; the loss decrease for input canaries) and w_T's test
  accuracy (NaN without a test split)."""
  uploads: np.ndarray
  aggregates: np.ndarray
  known: np.ndarray
  participants: np.ndarray
  last: np.ndarray
  test_accuracy: float


def _client_observers(dirs: jax.Array, num_real: int, num_rounds: int, clip_norm: float,
                      ravel: Callable):
  """observe / reduce of canary clients: each canary's own upload projected (server), and
  the real participants' uploads clipped to C, summed and projected once (the known
  contributions: one J x P product per round, not one per client)."""
  def observe(k, t, i, global_params, upload):
    del k, t, global_params
    own = ravel(upload) @ dirs[jnp.clip(i - num_real, 0, dirs.shape[0] - 1)]
    clipped = jnp.where(i < num_real, ravel(dp.clip_tree(upload, clip_norm)), 0.0)
    return own, clipped

  def reduce(state, t, seen, part):
    own_sum, known = state
    own, clipped = seen
    p = part.astype(jnp.float32)
    return (own_sum + own[num_real:] * p[num_real:],
            known.at[t].set(dirs @ jnp.sum(clipped * p[:, None], axis=0)))

  init = (jnp.zeros(dirs.shape[0]), jnp.zeros((num_rounds, dirs.shape[0])))
  return observe, reduce, init


def train(apply_fn, params, clients: rounds.ClientData, *, key, hooks, num_rounds: int,
          optimizer, epochs: int, batch_size: int, participation: float, kind: str,
          clip_norm: float, canary_dirs: np.ndarray | None = None,
          injected: rounds.Injected | None = None, examples: Examples | None = None,
          coordinates: np.ndarray | None = None, canary_x: np.ndarray | None = None,
          canary_y: np.ndarray | None = None, test_x=None, test_y=None) -> Scores:
  """One real training (`rounds.run` with the defense's hooks) with canaries; the scores.

  Args:
    apply_fn: the model's `apply`.
    params: w_0.
    clients: the real clients' `ClientData` (with the canary rows for record canaries).
    key, hooks, num_rounds, optimizer, epochs, batch_size, participation: as `rounds.run`
      takes them (the defense's hooks, the participation that runs).
    kind: 'client', 'gradient' or 'input'.
    clip_norm: C of the known contributions (canary clients; the record kinds do not read it).
    canary_dirs: [J, P] the canary clients' unit directions ('client').
    injected: the canary clients ('client').
    examples: the canary rows' placement ('gradient', 'input').
    coordinates: the gradient canaries' Dirac coordinates [m].
    canary_x, canary_y: the input canaries and the label their score reads (the wrong one).
    test_x, test_y: for the final model's accuracy.
  """
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  loss_fn = losses.make_loss_fn(apply_fn)
  num_real = clients.num_clients
  per_example_ce = lambda p, x, y: losses.per_example_cross_entropy(apply_fn(p, x), y)

  if kind == 'client':
    dirs = jnp.asarray(canary_dirs)
    observe, reduce, init = _client_observers(dirs, num_real, num_rounds, clip_norm, ravel)
    project = lambda p: dirs @ ravel(p)
  else:
    owner = examples.owner
    per = int(np.max(np.bincount(owner)))
    slot_of = np.zeros((num_real, per), np.int64)
    slot_of[owner, _slot_positions(owner)] = np.arange(len(owner))
    slot_idx = jnp.asarray(slot_of)
    if kind == 'gradient':
      coords = jnp.asarray(coordinates, jnp.int32)

      def observe(k, t, i, global_params, upload):
        del k, t, global_params
        return ravel(upload)[coords[slot_idx[i]]]

      project = lambda p: ravel(p)[coords]
    else:
      cx, cy = jnp.asarray(canary_x), jnp.asarray(canary_y)

      def observe(k, t, i, global_params, upload):
        del k, t
        xs, ys = cx[slot_idx[i]], cy[slot_idx[i]]
        local = jax.tree_util.tree_map(lambda w, d: w - d, global_params, upload)
        return per_example_ce(global_params, xs, ys) - per_example_ce(local, xs, ys)

      project = lambda p: -per_example_ce(p, cx, cy)

    def reduce(state, t, seen, part):
      del t
      return state + seen * part[:, None]

    init = jnp.zeros((num_real, per))

  def run(params, clients):
    final, log = rounds.run(loss_fn, params, clients, key=key, num_rounds=num_rounds,
                            optimizer=optimizer, epochs=epochs, batch_size=batch_size,
                            hooks=hooks, participation=participation, observe=observe,
                            reduce=reduce, init=init, evaluate=project, injected=injected)
    correct = (jnp.sum(jnp.argmax(apply_fn(final, test_x), -1) == test_y)
               if test_x is not None else jnp.asarray(0))
    return (log.observed, log.evaluations, jnp.sum(log.participants, axis=1),
            project(params), project(final), correct)

  observed, per_round, count, first, last, correct = jax.jit(run)(params, clients)
  per_round, first, last = np.asarray(per_round), np.asarray(first), np.asarray(last)
  if kind == 'client':
    own, known = (np.asarray(a) for a in observed)
  else:
    own = np.asarray(observed)[examples.owner, _slot_positions(examples.owner)]
    known = np.zeros_like(per_round)
  before = np.concatenate([first[None], per_round[:-1]])
  acc = math.nan if test_y is None else float(correct) / len(test_y)
  # Projections are read as w_t - w_{t+1} (what moved towards the canary); the input
  # canaries' projection is minus their loss, so there the same reading is a loss decrease
  # with the other sign.
  sign = -1.0 if kind == 'input' else 1.0
  return Scores(uploads=own, aggregates=sign * (before - per_round), known=known,
                participants=np.asarray(count), last=sign * (first - last),
                test_accuracy=acc)


def _slot_positions(owner: np.ndarray) -> np.ndarray:
  """Canary i's position among its client's canaries (the order `place_examples` used)."""
  pos = np.zeros(len(owner), np.int64)
  seen: dict[int, int] = {}
  for i, o in enumerate(owner):
    pos[i] = seen.get(int(o), 0)
    seen[int(o)] = pos[i] + 1
  return pos


def threat_scores(scores: Scores, threat: str, adversary: str, *, participation: float,
                  shift: float | None = None, sigma: float | None = None,
                  known: bool = False) -> np.ndarray:
  """The scores [m] of the adversary `adversary` ('server' or 'aggregate') under `threat`.

  all_iterates: the server reads its canaries' uploads (summed over the rounds each took
  part in); a reader of the aggregate reads every round's aggregate: with `known`, the
  white-box reader of DP's definition, who knows every other client's contribution, takes
  k_t x aggregate minus the real participants' clipped uploads (what is left on a Dirac
  canary's coordinate is its own clipped update and the noise); it sums them over rounds, or
  under participation sampling (participation < 1, `shift` and `sigma` of that difference
  given) scores them by `mixture_llr`.
  last_iterate: w_0 - w_T projected (the loss decrease for input canaries).
  """
  if threat == 'last_iterate':
    return np.asarray(scores.last, np.float64)
  if threat != 'all_iterates':
    raise ValueError(f'threat must be one of {THREATS} (got {threat!r})')
  if adversary == 'server':
    return np.asarray(scores.uploads, np.float64)
  agg = np.asarray(scores.aggregates, np.float64)
  if known:
    agg = agg * np.asarray(scores.participants, np.float64)[:, None] - scores.known
  if participation < 1 and shift is not None and sigma is not None and sigma > 0:
    return np.asarray(mixture_llr(jnp.asarray(agg.T), float(participation), float(shift),
                                  float(sigma)), np.float64)
  return agg.sum(axis=0)


# ---------------------------------------------------------------------------- statistics ---


def counted_bounds(mechanism: str, independent: bool) -> tuple[str, ...]:
  """The bounds that bound `mechanism`'s epsilon from these canaries.

  The one-run bounds hold for any canaries of one training (Steinke et al. 2023, Theorem
  3.1); the f-DP one (Mahloujifar et al. 2024) tests Gaussian trade-off curves, so it counts
  only for Gaussian-shaped mechanisms. Where the canaries' scores are independent given their
  coins by construction (`independent`: each canary's score is a function of its own coin and
  of noise drawn for it alone), the canaries are independent trials of the mechanism and the
  many-trial bounds of Nasr et al. 2023 apply as well: Clopper-Pearson `epsilon_cp` and, for
  Gaussian-shaped mechanisms, `epsilon_gdp`.
  """
  gaussian = mechanism not in NON_GAUSSIAN
  out = ('epsilon_one_run',) + (('epsilon_one_run_fdp',) if gaussian else ())
  if independent:
    out += ('epsilon_cp',) + (('epsilon_gdp',) if gaussian else ())
  return out


def gaussian_fit_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, delta: float) -> tuple[
    float, float]:
  """Andrew et al. 2024's one-shot estimate (ICLR 2024, arXiv:2302.03098, Sect. 3): a
  Gaussian fitted to each world's scores, mu = |mean_in - mean_out| / pooled std, and the
  epsilon of mu-GDP at `delta`. An ESTIMATE (no confidence), not a bound. (mu, epsilon)."""
  sd = math.sqrt(0.5 * (np.var(in_scores, ddof=1) + np.var(out_scores, ddof=1)))
  if not sd > 0:
    return math.inf, math.inf
  mu = abs(float(np.mean(in_scores) - np.mean(out_scores))) / sd
  return mu, auditing.gdp_epsilon(mu, delta)


def audit(scores: np.ndarray, world: np.ndarray, mechanism: str, claimed_epsilon: float, *,
          delta: float, confidence: float, independent: bool = False,
          claimed_delta: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, Any]:
  """The audit of one training's canaries against a claim.

  Every counted bound (`counted_bounds`) is computed at confidence 1 - (1 - confidence) / k
  for k counted tests (Bonferroni), so `privacy_violation` (a counted bound above the claim,
  or, with independent canaries and the claim's privacy profile `claimed_delta`, the profile
  test `auditing.profile_violation`, which counts as one more test) is a verdict at family-wise
  `confidence`. The bounds not counted are still reported (at the same per-bound confidence)
  but decide nothing.

  Returns:
    `epsilon_one_run`, `epsilon_one_run_fdp`, `epsilon_cp`, `epsilon_gdp`,
    `epsilon_estimate` and `gdp_mu_estimate` (Andrew et al.'s estimate), `num_canaries`,
    `n_in`, `n_out`, `best_bound`, `tightness` (best / claim), `privacy_violation`,
    `counted_bounds`, `canaries_independent`, `verdict_confidence`, `bound_confidence`,
    `score_in_mean`, `score_out_mean`.
  """
  scores = np.asarray(scores, np.float64)
  world = np.asarray(world, bool)
  ins, outs = scores[world], scores[~world]
  if len(ins) < 2 or len(outs) < 2:
    raise ValueError('the audit needs at least two canaries in each world')
  counted = counted_bounds(mechanism, independent)
  profile = independent and claimed_delta is not None
  each = 1.0 - (1.0 - float(confidence)) / (len(counted) + int(profile))
  found = auditing.audit_scores(ins, outs, delta=delta, confidence=each)
  mu, est = gaussian_fit_epsilon(ins, outs, delta)
  if mechanism in NO_ESTIMATE:
    mu, est = math.nan, math.nan
  best = max([float(found[k]) for k in counted if math.isfinite(found[k])] + [0.0])
  tests = {'profile_violation': math.nan, 'profile_excess': math.nan,
           'profile_epsilon': math.nan}
  if profile:
    grid = np.linspace(0.0, 2.0 * float(claimed_epsilon), 41)
    tests = auditing.profile_violation(ins, outs, claimed_delta, grid, confidence=each)
  out = {k: float(found[k]) for k in ('epsilon_one_run', 'epsilon_one_run_fdp',
                                      'epsilon_cp', 'epsilon_gdp')}
  out.update({
      'epsilon_estimate': float(est), 'gdp_mu_estimate': float(mu),
      'num_canaries': int(len(scores)), 'n_in': int(len(ins)), 'n_out': int(len(outs)),
      'best_bound': best, 'tightness': best / float(claimed_epsilon),
      'privacy_violation': float(best > float(claimed_epsilon) or
                                 tests['profile_violation'] == 1.0),
      'counted_bounds': ','.join(counted + (('profile',) if profile else ())),
      **tests, 'canaries_independent': float(independent),
      'verdict_confidence': float(confidence), 'bound_confidence': each,
      'score_in_mean': float(np.mean(ins)), 'score_out_mean': float(np.mean(outs)),
  })
  return out


__all__ = ['CANARY_KINDS', 'THREATS', 'coins', 'directions', 'dirac_coordinates', 'signs',
           'injected_clients', 'place_examples', 'gradient_canary_loss', 'mixture_llr',
           'Scores', 'train', 'threat_scores', 'counted_bounds', 'gaussian_fit_epsilon',
           'audit']
