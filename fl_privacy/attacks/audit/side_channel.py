"""The side-channel adversary: what a canary's projection cannot see.

Canary scores read a release along the canary's own direction. A defense can leak through
what surrounds the release instead: its size, how many noisy steps made it, the example count
the client reports for FedAvg's weights. DP-SGD whose Poisson rate and steps follow a shard's
private row count leaks that count (one record more where n is a multiple of B adds a whole
noisy step), which no projection shows; so does a weighted mean of uploads whose weights are
the real row counts.

The game (`play`): `trials` independent one-round federations, each keyed by
`fold_in(key, trial)` and a fair coin. The target client holds a shard drawn from a pool; the
two worlds are neighbours under the claim's declaration (`NEIGHBOURS`): one record added
(record-level add/remove; a client-level guarantee covers any change of the client's data, so
one record more is a neighbour there too) or one record replaced (record-level replace-one).
The round is the experiments' own (`fl.rounds.run`, the defense's hooks, the client protocol,
the reported counts of `fl.client.reported_sizes`); the adversary reads what its declaration
lets it read beside the canary direction:

- the server (`dp_sgd`, `update_dp`, `ldp_sgd`): the target's upload's squared norm, its
  number of noisy steps (the local steps that drew the `grad` hook's noise: DP-SGD's
  compositions; 0 for a defense that noises the upload once), and the example count it reports;
- a reader of the aggregate (`central_dp`, `weak_dp`): the aggregate's squared norm, with
  `others` fixed clients beside the target.

Each statistic is scored in both directions (which world makes it larger is not known before
the data), and each is audited as an independent-trials audit of the claim
(`canary_statistics.audit`); the family of statistics and directions is fixed by the
adversary, so each audit runs at 1 - (1 - c) / F and a violation is a verdict at family-wise
c. Nothing about the side channel's statistic is assumed: post-processing cannot raise a
mechanism's epsilon, so any statistic above the claim refutes it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

from fl_privacy.attacks.audit import canaries as canaries_lib
from fl_privacy.attacks.audit import canary_statistics
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import losses
from fl_privacy.fl import rounds

SERVER_STATISTICS = ('upload_norm', 'noisy_steps', 'reported_examples')
AGGREGATE_STATISTICS = ('aggregate_norm',)
NEIGHBOURS = ('add', 'replace')
TRIAL_SALT = 0x7FFF3001


def neighbours(unit: str, relation: str) -> str:
  """The side channel's pair of worlds under a declaration: one record `add`ed (record-level
  add/remove, or any client-level relation: the client's whole data is the unit), or one record
  `replace`d (record-level replace-one: the count is public there)."""
  if unit == 'record' and relation == 'replace_one':
    return 'replace'
  return 'add'


def statistics(adversary: str) -> tuple[str, ...]:
  """The statistics the declaration's adversary reads beside the canary direction."""
  return SERVER_STATISTICS if adversary == 'server' else AGGREGATE_STATISTICS


def _shards(key: jax.Array, pool_x: np.ndarray, pool_y: np.ndarray, trials: int, n: int,
            others: int, mode: str):
  """Per trial: the target's n + 1 candidate rows and the fixed others' rows, drawn without
  replacement from the pool by the trial's key (numpy, so shapes are static)."""
  need = n + 2 + others * n
  if need > len(pool_y):
    raise ValueError(f'the side channel needs {need} pool rows a trial (has {len(pool_y)})')
  base = jax.random.fold_in(key, TRIAL_SALT)
  picks = np.asarray(jax.vmap(lambda t: jax.random.permutation(
      jax.random.fold_in(base, t), len(pool_y))[:need])(jnp.arange(int(trials))))
  world = np.asarray(jax.vmap(lambda t: jax.random.bernoulli(jax.random.fold_in(
      jax.random.fold_in(key, TRIAL_SALT + 1), t)))(jnp.arange(int(trials))))
  target = picks[:, :n + 1]
  if mode == 'replace':   # IN: rows 0..n-1 and row n; OUT: rows 0..n-1 and row n + 1
    target = np.where(world[:, None], picks[:, :n + 1],
                      np.concatenate([picks[:, :n], picks[:, n + 1:n + 2]], axis=1))
    mask = np.ones((int(trials), n + 1), np.float32)
  else:                   # IN: n + 1 rows; OUT: the first n (the last is padding)
    mask = np.ones((int(trials), n + 1), np.float32)
    mask[:, n] = world.astype(np.float32)
  rest = picks[:, n + 2:].reshape(int(trials), others, n)
  return world, target, mask, rest


_PROGRAMS: dict = {}


def _program(apply_fn, static_hooks, *, n: int, others: int, optimizer, epochs: int,
             batch_size: int, noisy: bool):
  """The jitted, trial-vmapped round of the game, one per static configuration (the hooks'
  `Partial` fields are traced operands: a sweep's claims and planted noises share it)."""
  key = (apply_fn, static_hooks, n, others, optimizer, epochs, batch_size, noisy)
  if key in _PROGRAMS:
    return _PROGRAMS[key]
  loss_fn = losses.make_loss_fn(apply_fn)
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]

  def one(params, pool_x, pool_y, traced, tkey, rows, tmask, other_rows):
    hooks = static_hooks._replace(**traced)
    x = jnp.concatenate([pool_x[rows][None], jnp.concatenate(
        [pool_x[other_rows], jnp.zeros((others, 1) + pool_x.shape[1:], pool_x.dtype)],
        axis=1)])
    y = jnp.concatenate([pool_y[rows][None], jnp.concatenate(
        [pool_y[other_rows], jnp.zeros((others, 1), pool_y.dtype)], axis=1)])
    m = jnp.concatenate([tmask[None], jnp.broadcast_to(
        jnp.concatenate([jnp.ones(n), jnp.zeros(1)]), (others, n + 1))])
    data = rounds.ClientData(x=x, y=y, mask=m)

    def observe(k, t, i, gp, upload, traces):
      del k, t, gp, i
      return jnp.sum(ravel(upload) ** 2), jnp.sum(traces) * float(noisy)

    final, log = rounds.run(loss_fn, params, data, key=tkey, num_rounds=1, optimizer=optimizer,
                            epochs=epochs, batch_size=batch_size, hooks=hooks,
                            observe=observe, init=(jnp.zeros(others + 1),
                                                   jnp.zeros(others + 1)),
                            trace=lambda step: step.live)
    norm, steps = log.observed
    reported = client_lib.reported_sizes(hooks, data.sizes())
    moved = jnp.sum((ravel(params) - ravel(final)) ** 2)
    return norm[0], steps[0], reported[0], moved

  _PROGRAMS[key] = jax.jit(jax.vmap(one, in_axes=(None, None, None, None, 0, 0, 0, 0)))
  return _PROGRAMS[key]


def play(apply_fn, params, pool_x: np.ndarray, pool_y: np.ndarray, *, key: jax.Array, hooks,
         adversary: str, mode: str, trials: int, num_examples: int, others: int, optimizer,
         epochs: int, batch_size: int, chunk: int = 256) -> tuple[np.ndarray, dict[str, Any]]:
  """The side-channel game (module docstring): (world [trials], {statistic: scores}).

  Args:
    apply_fn, params: the model and w_t of the round.
    pool_x, pool_y: rows to draw shards from ([P, ...], [P]).
    key: the game's key (trial t: `fold_in`).
    hooks: the defense's `ClientHooks`.
    adversary: 'server' or 'aggregate'.
    mode: 'add' or 'replace' (`neighbours`).
    trials: independent trials.
    num_examples: n, the target's rows in the OUT world.
    others: fixed clients beside the target (the aggregate's reader; 0 for the server).
    optimizer, epochs, batch_size: the clients' local training.
    chunk: trials per compiled call.
  """
  if mode not in NEIGHBOURS:
    raise ValueError(f'mode must be one of {NEIGHBOURS} (got {mode!r})')
  n = int(num_examples)
  hooks = client_lib.IDENTITY if hooks is None else hooks
  world, target, mask, rest = _shards(key, pool_x, pool_y, trials, n, others, mode)
  static, traced = canaries_lib.split_hooks(hooks)
  compiled = _program(apply_fn, static, n=n, others=int(others), optimizer=optimizer,
                      epochs=int(epochs), batch_size=int(batch_size),
                      noisy=hooks.grad is not None)
  keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(jnp.arange(int(trials)))
  px, py = jnp.asarray(pool_x), jnp.asarray(pool_y)
  out = []
  size = min(int(chunk), int(trials))
  for lo in range(0, int(trials), size):
    # The last chunk is padded (then dropped), so every call has the program's shape.
    idx = np.minimum(np.arange(lo, lo + size), int(trials) - 1)
    got = jax.device_get(compiled(params, px, py, traced, keys[idx], jnp.asarray(target[idx]),
                                  jnp.asarray(mask[idx]), jnp.asarray(rest[idx])))
    out.append(tuple(np.asarray(a)[:min(size, int(trials) - lo)] for a in got))
  norm, steps, reported, moved = (np.concatenate(a).astype(np.float64) for a in zip(*out))
  scores = ({'upload_norm': norm, 'noisy_steps': steps, 'reported_examples': reported}
            if adversary == 'server' else {'aggregate_norm': moved})
  return world, scores


def audit(world: np.ndarray, scores: dict[str, np.ndarray], mechanism: str,
          claimed_epsilon: float, *, delta: float, confidence: float,
          claimed_delta: Callable | None) -> dict[str, Any]:
  """Each statistic in both directions audited as independent trials against the claim, at
  family-wise `confidence` over the statistics and directions (module docstring).

  Returns the `canary_statistics.audit` fields of the strongest (statistic, direction) (its
  `best_bound`, `verdict`, ...), `side_channel_statistic` naming it, per statistic
  `side_<statistic>_best` and `side_<statistic>_in_mean` / `_out_mean`, and
  `side_channel_family` (F); `privacy_violation` if any of the F audits finds one, `can_refute`
  if any could, and the verdict's labels (`canary_statistics.verdict_labels`) over the tests
  that refute, or could, in any of them.
  """
  family = 2 * len(scores)
  level = 1.0 - (1.0 - float(confidence)) / family
  best, best_name, out = None, '', {}
  violation = refutable = False
  refutes, reach = set(), set()   # the tests that refute in any audit, or could
  for name, s in scores.items():
    s = np.asarray(s, np.float64)
    stat_best = 0.0
    for sign in (1.0, -1.0):
      a = canary_statistics.audit(sign * s, world, mechanism, claimed_epsilon, delta=delta,
                                  confidence=level, independent=True,
                                  claimed_delta=claimed_delta, reach=True, report_all=False)
      violation |= a['privacy_violation'] > 0
      refutable |= a['can_refute'] > 0
      refutes.update(t for t in a['refuting_tests'].split(',') if t != 'none')
      reach.update(t for t in a['reach_tests'].split(',') if t != 'none')
      stat_best = max(stat_best, a['best_bound'])
      if best is None or (a['privacy_violation'], a['best_bound']) > (
          best['privacy_violation'], best['best_bound']):
        best, best_name = a, f"{name}{'' if sign > 0 else ' (lower)'}"
    out[f'side_{name}_best'] = stat_best
    out[f'side_{name}_in_mean'] = float(np.mean(s[world]))
    out[f'side_{name}_out_mean'] = float(np.mean(s[~world]))
  result = dict(best)
  result.update(out)
  result.update(side_channel_statistic=best_name, side_channel_family=family,
                privacy_violation=float(violation), can_refute=float(refutable),
                verdict_confidence=float(confidence),
                verdict=('violation' if violation else
                         'no violation' if refutable else 'cannot refute'))
  order = lambda tests: tuple(sorted(tests, key=tuple(canary_statistics.ASSUMES).index))
  result.update(canary_statistics.verdict_labels(order(refutes), order(reach)))
  result['refuting_tests'] = ','.join(order(refutes)) or 'none'
  if refutable:
    result['canaries_needed'] = 0
  return result


__all__ = ['SERVER_STATISTICS', 'AGGREGATE_STATISTICS', 'NEIGHBOURS', 'neighbours',
           'statistics', 'play', 'audit']
