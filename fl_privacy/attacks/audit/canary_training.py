"""The trainings of a training audit: real federated trainings with canaries, and their scores.

`train` runs R replicates of the experiments' own federated training (`fl.rounds.run`: the
client protocol, round loop, participation sampling, upload hook and defense hooks) with the
canaries `attacks.audit.canaries` placed (`Planted`), `chunk` replicates at a time under
`vmap` in one compiled program, and returns per canary what every adversary could read
(`canary_scores.Scores`): the server's reading of each upload and, for gradient canaries of
DP-SGD, of every local step (`StepReading`), each round's aggregate and the last iterate.
`accuracy` runs the canary-free twins of those trainings. Gradient canaries train through
`gradient_canary_loss`, the Dirac gradient canary of Nasr, Hayes, Steinke, Balle, Tramer,
Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private Machine Learning"
(USENIX Security 2023, arXiv:2302.07956).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.attacks.audit import canary_scores
from fl_privacy.defenses import dp
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.mechanisms import gaussian


@dataclasses.dataclass(frozen=True)
class StepReading:
  """How the `all_steps` adversary reads a DP-SGD client's steps (public facts of the claim):
  the lot size `batch_size` the noisy sum is divided by, `poisson` (else shuffled: the
  adversary knows which step holds its canary), the clip C, the claimed rate q
  and noise std z C of the likelihood ratio, and `base_rows`: the shard rows before the canary
  rows (`canaries.place_examples` appends them). The noise std travels as a traced operand of
  the compiled training (`static` drops it), so the claims of a sweep share one program."""
  poisson: bool
  clip_norm: float
  batch_size: int
  rate: float
  noise_std: float
  base_rows: int

  def static(self) -> 'StepReading':
    return dataclasses.replace(self, noise_std=math.nan)


class Planted(NamedTuple):
  """One training's canaries (each field stacked on a leading replicate axis for
  `train`): their coins, and per kind the canary clients (`directions` [J, P], `injected`:
  the `rounds.Injected` deltas and sizes as a pair; whether they take part every round is
  `train`'s `always`), the gradient canaries' `coordinates` [m] and signs, or the input
  canaries' images and the wrong labels their scores read."""
  world: Any
  directions: Any = None
  injected: Any = None
  coordinates: Any = None
  code_sign: Any = None
  x: Any = None
  y: Any = None


def gradient_canary_loss(loss_hook: Callable, num_classes: int, coordinates: np.ndarray,
                         code_sign: np.ndarray, scale: float, ravel: Callable) -> Callable:
  """A `loss` hook: rows whose label is `num_classes + i` are gradient canary i.

  Canary i's loss is s_i x scale x w[c_i] (w the flattened parameters), so its per-example
  gradient is s_i x scale x e_{c_i} whatever the model: the Dirac gradient canary of Nasr et
  al. 2023, which DP-SGD's per-example clip then bounds. The other rows keep `loss_hook`.
  `coordinates` and `code_sign` may be traced (one training per replicate under `vmap`).
  """
  coords = jnp.asarray(coordinates, jnp.int32)
  sgn = jnp.asarray(code_sign, jnp.float32)
  num = int(np.shape(coordinates)[0])

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


def _client_observers(num_real: int, num_rounds: int, clip_norm: float, ravel: Callable):
  """observe / reduce of canary clients (directions given at each call): each canary's own
  upload projected (server), and the real participants' uploads clipped to C, summed and
  projected once (the known contributions: one J x P product per round, not one per
  client)."""
  def make(dirs):
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
  return make


def _step_trace(reading: StepReading, coords: jax.Array, per: int, ravel: Callable):
  """The `all_steps` instrument of one step (`fl.local.Step`): per canary coordinate, the
  step's noisy sum minus the other rows' clipped gradients (L), and which of the client's
  canary slots the batch holds."""
  c = float(reading.clip_norm)

  def trace(step: local.Step):
    clipped, _ = gaussian.clip_per_example(step.per_example, c)
    cols = jax.vmap(lambda g: ravel(g)[coords])(clipped)          # [W, m]
    others = step.row_mask * (step.indices < reading.base_rows)   # real, non-canary rows
    known = others @ cols
    leftover = float(reading.batch_size) * ravel(step.grad)[coords] - known
    slots = reading.base_rows + jnp.arange(per)
    held = (step.row_mask[:, None] * (step.indices[:, None] == slots[None, :])).sum(0)
    return leftover, held, step.live
  return trace


def _steps_per_round(loss_fn, params, clients: rounds.ClientData, hooks, trace: Callable, *,
                     optimizer, epochs: int, batch_size: int) -> int:
  """The local steps a client's round traces (E x S, padding steps included): the length
  of its stacked traces, read off one client's round without running it (`jax.eval_shape`)."""
  first = lambda tree: jax.tree_util.tree_map(lambda a: a[0], tree)
  opt = optimizer if isinstance(optimizer, optax.GradientTransformation) else optimizer(0)

  def one(p, x, y, mask, aux):
    # eval_shape traces shapes only: no number is drawn, so any key serves.
    return local.client_update(loss_fn, p, x, y, key=jax.random.key(0), hooks=hooks,
                               mask=mask, aux=aux, optimizer=opt, epochs=epochs,
                               batch_size=batch_size, trace=trace)[2]
  got = jax.eval_shape(one, params, first(clients.x), first(clients.y),
                       None if clients.mask is None else first(clients.mask),
                       None if clients.aux is None else first(clients.aux))
  return int(jax.tree_util.tree_leaves(got)[0].shape[0])


def _example_observers(kind: str, reading: StepReading | None, slot_of: jax.Array,
                       coords: jax.Array | None, cx, cy, per_example_ce, ravel: Callable,
                       noise_std=None, *, num_rounds: int = 0, steps: int = 0):
  """observe / reduce / init / trace of canary examples: the server's per-round reading of the
  owner's upload (`all_iterates`), and with `reading` the per-step one (`all_steps`); for
  Poisson batches also the readings themselves ([clients, slots, num_rounds, steps], NaN
  where the client took no step; `steps` per round, `_steps_per_round`)."""
  num_real, per = slot_of.shape
  ids = jnp.clip(slot_of, 0, None)
  live_slot = (slot_of >= 0).astype(jnp.float32)

  def server_view(i, global_params, upload):
    if kind == 'gradient':
      return ravel(upload)[coords[ids[i]]]
    xs, ys = cx[ids[i]], cy[ids[i]]
    local_params = jax.tree_util.tree_map(lambda w, d: w - d, global_params, upload)
    return per_example_ce(global_params, xs, ys) - per_example_ce(local_params, xs, ys)

  if reading is None:
    def observe(k, t, i, global_params, upload):
      del k, t
      return server_view(i, global_params, upload)

    def reduce(state, t, seen, part):
      del t
      return state + seen * part[:, None] * live_slot
    return observe, reduce, jnp.zeros((num_real, per)), None

  def observe(k, t, i, global_params, upload, traces):
    del k, t
    leftover, held, live = traces                     # [S, m], [S, per], [S]
    own = leftover[:, ids[i]] * live[:, None]          # [S, per]
    if reading.poisson:
      score = jnp.sum(canary_scores.step_llr(own, reading.rate, reading.clip_norm, noise_std)
                      * live[:, None], axis=0)
    else:
      score = jnp.sum(own * held, axis=0)
    moments = jnp.stack([own.sum(0), (own ** 2).sum(0),
                         jnp.broadcast_to(live.sum(), (per,))], axis=-1)
    seen = (server_view(i, global_params, upload), score, moments)
    if reading.poisson:
      # The readings themselves [per, S] for the MLE / PLD test (`poisson_mle`); NaN on the
      # steps the client did not take.
      seen += (jnp.where(live[:, None] > 0, own, jnp.nan).T,)
    return seen

  def reduce(state, t, seen, part):
    w = part[:, None] * live_slot
    sums = tuple(s + v * (w if v.ndim == 2 else w[..., None])
                 for s, v in zip(state[:3], seen[:3]))
    if not reading.poisson:
      return sums
    # Round t's readings of the clients that took part (and of real canary slots); NaN
    # elsewhere, so a canary's row holds exactly the steps its client ran.
    reads = jnp.where(w[..., None] > 0, seen[3], jnp.nan)
    return sums + (state[3].at[:, :, t, :].set(reads),)

  init = (jnp.zeros((num_real, per)), jnp.zeros((num_real, per)),
          jnp.zeros((num_real, per, 3)))
  if reading.poisson:
    init += (jnp.full((num_real, per, num_rounds, steps), jnp.nan),)
  return observe, reduce, init, _step_trace(reading, coords, per, ravel)


def _slot_positions(owner: np.ndarray) -> np.ndarray:
  """Canary i's position among its client's canaries (the order `canaries.place_examples`
  used)."""
  pos = np.zeros(len(owner), np.int64)
  seen: dict[int, int] = {}
  for i, o in enumerate(owner):
    pos[i] = seen.get(int(o), 0)
    seen[int(o)] = pos[i] + 1
  return pos


def slot_table(owner: np.ndarray, num_clients: int) -> np.ndarray:
  """[K, per] the canary id in each client's canary slot (-1 where none)."""
  per = max(1, int(np.max(np.bincount(owner, minlength=num_clients))))
  out = np.full((num_clients, per), -1, np.int64)
  out[owner, _slot_positions(owner)] = np.arange(len(owner))
  return out


def split_hooks(hooks) -> tuple[Any, dict[str, Any]]:
  """(static, traced) parts of the hooks: the fields that are `jax.tree_util.Partial`s (the DP
  defenses' clip and noise as arrays) travel as traced operands, so every claim and every
  planted noise of a defense runs the same compiled training; the rest stay static."""
  traced = {f: h for f, h in hooks._asdict().items() if isinstance(h, jax.tree_util.Partial)}
  return hooks._replace(**{f: None for f in traced}), traced


# The compiled trainings, keyed by their static arguments (`_compiled`).
_PROGRAMS: dict = {}


def _compiled(apply_fn, *, kind: str, hooks, num_rounds: int, optimizer, epochs: int,
              batch_size: int, participation: float, clip_norm: float, num_real: int,
              owner: np.ndarray | None, reading: StepReading | None, num_classes: int,
              canary_norm: float, always: bool):
  """The jitted, replicate-vmapped training: (params, clients, key, planted, traced hooks,
  test_x, test_y) -> raw outputs, one program per static configuration."""
  key = (apply_fn, kind, hooks, num_rounds, optimizer, epochs, batch_size, participation,
         clip_norm, num_real, None if owner is None else np.asarray(owner).tobytes(),
         None if reading is None else reading.static(), num_classes, canary_norm, always)
  if key in _PROGRAMS:
    return _PROGRAMS[key]
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  loss_fn = losses.make_loss_fn(apply_fn)
  per_example_ce = lambda p, x, y: losses.per_example_cross_entropy(apply_fn(p, x), y)
  slot_of = None if owner is None else jnp.asarray(slot_table(owner, num_real))

  def run(params, clients, rkey, planted: Planted, traced, test_x, test_y):
    traced = dict(traced)
    noise_std = traced.pop('step_noise_std', None)
    trace, h = None, hooks._replace(**traced)
    if kind == 'client':
      dirs = jnp.asarray(planted.directions)
      observe, reduce, init = _client_observers(num_real, num_rounds, clip_norm, ravel)(dirs)
      project = lambda p: dirs @ ravel(p)
      injected = rounds.Injected(deltas=planted.injected[0], sizes=planted.injected[1],
                                 always=always)
    else:
      injected = None
      coords = None if kind == 'input' else planted.coordinates
      if kind == 'gradient':
        h = h._replace(loss=gradient_canary_loss(h.loss, num_classes, coords,
                                                 planted.code_sign, canary_norm, ravel))
        project = lambda p: ravel(p)[coords]
      else:
        project = lambda p: -per_example_ce(p, planted.x, planted.y)
      trace = None if reading is None else _step_trace(reading, coords, slot_of.shape[1],
                                                       ravel)
      steps = 0 if reading is None or not reading.poisson else _steps_per_round(
          loss_fn, params, clients, h, trace, optimizer=optimizer, epochs=epochs,
          batch_size=batch_size)
      observe, reduce, init, trace = _example_observers(
          kind, reading, slot_of, coords, planted.x, planted.y, per_example_ce, ravel,
          noise_std, num_rounds=num_rounds, steps=steps)
    final, log = rounds.run(loss_fn, params, clients, key=rkey, num_rounds=num_rounds,
                            optimizer=optimizer, epochs=epochs, batch_size=batch_size,
                            hooks=h, participation=participation, observe=observe,
                            reduce=reduce, init=init, evaluate=project, injected=injected,
                            trace=trace)
    correct = (jnp.sum(jnp.argmax(apply_fn(final, test_x), -1) == test_y)
               if test_y is not None else jnp.asarray(0))
    return (log.observed, log.evaluations, jnp.sum(log.participants, axis=1),
            project(params), project(final), correct)

  _PROGRAMS[key] = jax.jit(jax.vmap(run, in_axes=(0, 0, 0, 0, None, None, None)))
  return _PROGRAMS[key]


def train(apply_fn, params, clients: rounds.ClientData, *, keys, hooks, num_rounds: int,
          optimizer, epochs: int, batch_size: int, participation: float, kind: str,
          clip_norm: float, planted: Planted, owner: np.ndarray | None = None,
          reading: StepReading | None = None, test_x=None, test_y=None,
          num_classes: int = 0, canary_norm: float = 0.0, always: bool = False,
          chunk: int = 8) -> canary_scores.Scores:
  """R real trainings (`rounds.run` with the defense's hooks) with canaries; their scores.

  Every argument that varies between replicates carries a leading axis R: `params` (w_0),
  `clients` (the real clients' `ClientData`, with the canary rows for record canaries),
  `keys` [R], `planted` (`Planted`). The replicates run `chunk` at a time under `vmap` in one
  compiled program (cached by its static arguments; the hooks' `Partial` fields are traced,
  `split_hooks`); each is the training `rounds.run` runs alone, keyed by its own key.

  Args:
    apply_fn: the model's `apply`.
    params, clients, keys, planted: per replicate (above).
    hooks, num_rounds, optimizer, epochs, batch_size, participation: as `rounds.run` takes
      them (the defense's hooks, the participation that runs; for gradient canaries the
      training wraps the hooks' `loss` in `gradient_canary_loss` with each replicate's
      coordinates and `planted.code_sign`).
    kind: 'client', 'gradient' or 'input'.
    clip_norm: C of the known contributions (canary clients; the record kinds do not read it).
    owner: [m] the client of each canary row ('gradient', 'input': `Examples.owner`).
    reading: the `all_steps` reading of gradient canaries (None: not read).
    test_x, test_y: for the final models' accuracy.
    num_classes, canary_norm: the labels' classes and the gradient canaries' norm ('gradient').
    always: the canary clients take part in every round (`rounds.Injected.always`).
    chunk: replicates per compiled call.
  """
  keys = jnp.asarray(keys)
  r = int(keys.shape[0])
  num_real = int(np.shape(clients.x)[1])
  static, traced = split_hooks(hooks)
  if reading is not None:
    traced['step_noise_std'] = jnp.asarray(float(reading.noise_std))
  compiled = _compiled(apply_fn, kind=kind, hooks=static, num_rounds=num_rounds,
                       optimizer=optimizer, epochs=epochs, batch_size=batch_size,
                       participation=participation, clip_norm=float(clip_norm),
                       num_real=num_real, owner=owner, reading=reading,
                       num_classes=int(num_classes), canary_norm=float(canary_norm),
                       always=bool(always))
  tx = None if test_x is None else jnp.asarray(test_x)
  ty = None if test_y is None else jnp.asarray(test_y)
  parts = []
  size = min(int(chunk), r)
  for lo in range(0, r, size):
    # The last chunk is padded with replicates of this chunk (then dropped), so every call
    # has the compiled program's shape.
    idx = np.minimum(np.arange(lo, lo + size), r - 1)
    take = lambda tree: jax.tree_util.tree_map(lambda a: None if a is None else a[idx], tree)
    got = jax.device_get(compiled(take(params), take(clients), keys[idx], take(planted),
                                  traced, tx, ty))
    keep = min(size, r - lo)
    parts.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[:keep], got))
  out = jax.tree_util.tree_map(lambda *a: np.concatenate(a), *parts)
  return _scores(out, kind, owner, test_y)


_ACCURACY: dict = {}


def accuracy(apply_fn, params, clients: rounds.ClientData, *, keys, hooks, num_rounds: int,
             optimizer, epochs: int, batch_size: int, participation: float, test_x,
             test_y) -> np.ndarray:
  """The final test accuracy [R] of R trainings without canaries (a canaried training's
  twin: the same keys, shards and w_0), vmapped and compiled once per static configuration
  (the hooks' `Partial` fields traced)."""
  static, traced = split_hooks(hooks)
  key = (apply_fn, static, num_rounds, optimizer, epochs, batch_size, participation)
  if key not in _ACCURACY:
    loss_fn = losses.make_loss_fn(apply_fn)

    def one(p, c, k, traced_hooks, tx, ty):
      final, _ = rounds.run(loss_fn, p, c, key=k, num_rounds=num_rounds, optimizer=optimizer,
                            epochs=epochs, batch_size=batch_size,
                            hooks=static._replace(**traced_hooks), participation=participation)
      return jnp.sum(jnp.argmax(apply_fn(final, tx), -1) == ty)
    _ACCURACY[key] = jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None, None, None)))
  correct = _ACCURACY[key](params, clients, jnp.asarray(keys), traced, jnp.asarray(test_x),
                           jnp.asarray(test_y))
  # Counts over the test set, as `train` reports them.
  return np.asarray(correct, np.float64) / len(test_y)


def _scores(out, kind: str, owner: np.ndarray | None, test_y) -> canary_scores.Scores:
  """The raw outputs of R replicates as `Scores` (canaries concatenated replicate by
  replicate)."""
  observed, per_round, count, first, last, correct = out
  r = per_round.shape[0]
  per_round, first, last = (np.asarray(a) for a in (per_round, first, last))
  steps = moments = reads = None
  if kind == 'client':
    own, known = (np.asarray(a) for a in observed)
  else:
    pos = _slot_positions(owner)
    pick = lambda a: np.asarray(a)[:, owner, pos]
    if isinstance(observed, tuple):
      own, steps, moments = (pick(a) for a in observed[:3])
      reads = pick(observed[3]) if len(observed) > 3 else None   # [R, m, T, S]
    else:
      own = pick(observed)
    known = np.zeros_like(per_round)
  m = per_round.shape[-1]
  before = np.concatenate([first[:, None], per_round[:, :-1]], axis=1)   # [R, T, m]
  # Projections are read as w_t - w_{t+1} (what moved towards the canary); the input
  # canaries' projection is minus their loss, so there the same reading is a loss decrease
  # with the other sign.
  sign = -1.0 if kind == 'input' else 1.0
  flat_tm = lambda a: np.transpose(np.asarray(a), (1, 0, 2)).reshape(a.shape[1], r * m)
  parts = np.broadcast_to(np.asarray(count, np.float64)[:, :, None], (r, count.shape[1], m))
  acc = (np.full(r, math.nan) if test_y is None
         else np.asarray(correct, np.float64) / len(test_y))
  return canary_scores.Scores(uploads=np.asarray(own).reshape(r * m),
                aggregates=sign * flat_tm(before - per_round), known=flat_tm(known),
                participants=flat_tm(parts), last=(sign * (first - last)).reshape(r * m),
                test_accuracy=acc,
                steps=None if steps is None else steps.reshape(r * m),
                step_moments=None if moments is None else moments.reshape(r * m, 3),
                step_readings=None if reads is None else reads.reshape(r * m, -1))


__all__ = ['StepReading', 'Planted', 'gradient_canary_loss', 'slot_table', 'split_hooks',
           'train', 'accuracy']
