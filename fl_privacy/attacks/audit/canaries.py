"""Canaries inside the training that runs: the audit of a whole FL training.

A training audit adds canaries to a real federated training (the experiments' own client
protocol, round loop, participation sampling, upload hook and defense hooks: `fl.rounds.run`)
and reads what the adversary of the defense's declaration may read:

- **Canary clients** (client-level mechanisms: `update_dp`, `central_dp`, `weak_dp`,
  `ldp_sgd`): J clients of the federation (`fl.rounds.Injected`) that train through
  `fl.local.client_update` like every client, on a local loss whose update is a fixed unit
  direction v_j scaled to `norm` (above the clip, so the defense's clip must act), Andrew,
  Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for
  Federated Learning" (ICLR 2024, arXiv:2302.03098), Sect. 3. Each canary's world is a fair
  coin (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
  arXiv:2305.08846, Algorithm 1): under a replace-one declaration the client is present in
  both worlds and uploads +v_j (IN) or -v_j (OUT); under add/remove it uploads v_j (IN) or
  reports no examples (OUT: weight 0, out of every mean). The directions of one training are a
  uniformly random orthonormal frame (`directions`: each a uniform unit vector, exactly
  orthogonal to the others) or Dirac vectors.
- **Canary examples** (record-level `dp_sgd`, Poisson or shuffled): m extra rows spread over
  the real clients' shards, going through the real sampler, masks, per-example gradients and
  clip. Two kinds: `gradient` (white-box: the row's loss is s v . w for a Dirac v on its own
  coordinate, so its per-example gradient is the Dirac vector of norm `norm` whatever the
  model, the canary Nasr et al., "Tight Auditing of Differentially Private Machine Learning",
  USENIX Security 2023, arXiv:2302.07956, let the adversary insert) and `input` (black-box: an
  image no client holds, with a wrong label). Add/remove (Poisson): the row is real (IN) or
  padding (OUT); replace-one (shuffle): the row is real in both worlds, +Dirac / -Dirac, or the
  wrong / the true label.

Threats (what the adversary reads; `THREATS`):
- `all_steps` (gradient canaries of DP-SGD): DP-SGD's own adversary, which sees every noisy
  step and knows every other example's clipped gradient (Nasr et al. 2023). A trace of every
  local step (`fl.local.Step`) gives, on each canary's coordinate, the step's noisy sum minus
  the other rows' clipped gradients: the canary's own clipped gradient when the step drew it,
  plus that coordinate's noise. Scored by the likelihood ratio of the Poisson-subsampled
  Gaussian (`step_llr`), or, for shuffled batches, whose claim (no amplification) covers an
  adversary who knows the batches, summed over the steps that hold the canary. Each score is a
  function of the canary's coin, its own inclusion draws and its own coordinate's noise:
  independent trials.
- `all_iterates`: every release the declaration's adversary reads at every round: each upload
  of the canary's client when it is the server (for DP-SGD: one upload per round, the sum of
  its steps), each round's aggregate for a reader of the aggregate.
- `last_iterate`: only the final model w_T against w_0.
Scores (higher = IN): the projection of each release on the canary's direction summed over
rounds (the server knows who took part and sums the rounds its canary did; an aggregate reader
does not, and under participation sampling uses the likelihood ratio of the subsampled
mixture, `mixture_llr`), for input canaries the loss decrease on the wrong label.

The statistics (bounds, verdict, what the canaries could certify at best, estimates) are in
`attacks.audit.canary_statistics` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

# The statistics' public names, re-exported (their home is canary_statistics).
from fl_privacy.attacks.audit.canary_statistics import audit  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import counted_bounds  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import gaussian_fit_epsilon  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import NO_ESTIMATE  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import NON_GAUSSIAN  # noqa: F401
from fl_privacy.defenses import dp
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.mechanisms import gaussian

CANARY_KINDS = ('client', 'gradient', 'input')
THREATS = ('all_steps', 'all_iterates', 'last_iterate')
DIRECTIONS = ('random', 'dirac')

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
  """[num, dim] unit directions, num <= dim: a uniformly random orthonormal frame (`random`:
  the QR factor of a Gaussian matrix whose row i is drawn from `fold_in(key, i)`, signs fixed
  so that the frame is Haar-distributed; each row is then a uniform unit vector and the rows
  are exactly orthogonal) or Dirac vectors on distinct random coordinates (`dirac`)."""
  if kind not in DIRECTIONS:
    raise ValueError(f'direction must be one of {DIRECTIONS} (got {kind!r})')
  if num > dim:
    raise ValueError(f'{num} orthogonal canary directions need as many coordinates (the model '
                     f'has {dim})')
  k = jax.random.fold_in(key, DIRECTION_SALT)
  if kind == 'dirac':
    coords = np.asarray(jax.random.permutation(k, dim)[:num])
    out = np.zeros((num, dim), np.float32)
    out[np.arange(num), coords] = 1.0
    return out
  g = np.asarray(jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(k, i), (dim,)))(
      jnp.arange(num)), np.float64)
  q, r = np.linalg.qr(g.T)
  q = q * np.sign(np.diag(r))[None, :]  # the sign convention that makes the frame Haar
  return np.ascontiguousarray(q.T, np.float32)


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
                     relation: str, size: float, always: bool = False) -> rounds.Injected:
  """The canary clients as `rounds.Injected`: update sign x norm x v_j every round; under
  add/remove an OUT canary reports 0 examples (out of every mean and of the participants).
  `always`: every canary takes part in every round (the server's choice). (`Planted` holds
  its deltas and sizes as a pair.)"""
  flat = dirs * (float(norm) * signs(relation, world))[:, None]
  present = np.ones(len(world), np.float32) if relation == 'replace_one' else world
  deltas = jax.vmap(unravel)(jnp.asarray(flat))
  return rounds.Injected(deltas=deltas, sizes=jnp.asarray(present * float(size), jnp.float32),
                         always=bool(always))


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


def step_llr(x: jax.Array, q: float, shift: float, sigma: float) -> jax.Array:
  """log(1 - q + q e^{(x D - D^2/2)/s^2}) elementwise: one step's log-likelihood ratio of an
  add/remove canary drawn with probability q (shift D) against its absence, in noise s (the
  Poisson-subsampled Gaussian; for q = 1, (x D - D^2/2) / s^2)."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  if q >= 1:
    return a
  return jnp.logaddexp(jnp.log1p(-q), jnp.log(q) + a)


@dataclasses.dataclass(frozen=True)
class StepReading:
  """How the `all_steps` adversary reads a DP-SGD client's steps (public facts of the claim):
  the lot size `batch_size` the noisy sum is divided by, `poisson` (else shuffled: the
  adversary knows which step holds its canary), the clip C, the claimed rate q
  and noise std z C of the likelihood ratio, and `base_rows`: the shard rows before the canary
  rows (`place_examples` appends them). The noise std travels as a traced operand of the
  compiled training (`static` drops it), so the claims of a sweep share one program."""
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


class Scores(NamedTuple):
  """What the trainings gave the adversaries, per canary (replicates concatenated): the sum
  over the rounds it took part in of the server-read projections of its own uploads
  (`uploads` [m]), the per-round aggregate projections w_t - w_{t+1} (`aggregates` [T, m]),
  the real clients' clipped uploads projected and summed per round (`known` [T, m], what a
  white-box reader of the aggregate subtracts), the participants per round of the canary's
  training (`participants` [T, m]), the last iterate's projection w_0 - w_T (`last` [m]; the
  loss decrease for input canaries), the `all_steps` score (`steps` [m]) and the per-step
  moments behind it (`step_moments` [m, 3]: sum of L, of L^2, and the client's live steps,
  every step for Poisson batches: `canary_statistics.subsampled_fit_epsilon` reads them), and
  each training's
  final test accuracy (`test_accuracy` [R], NaN without a test split)."""
  uploads: np.ndarray
  aggregates: np.ndarray
  known: np.ndarray
  participants: np.ndarray
  last: np.ndarray
  test_accuracy: np.ndarray
  steps: np.ndarray | None = None
  step_moments: np.ndarray | None = None


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


def _example_observers(kind: str, reading: StepReading | None, slot_of: jax.Array,
                       coords: jax.Array | None, cx, cy, per_example_ce, ravel: Callable,
                       noise_std=None):
  """observe / reduce / init / trace of canary examples: the server's per-round reading of the
  owner's upload (`all_iterates`), and with `reading` the per-step one (`all_steps`)."""
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
      score = jnp.sum(step_llr(own, reading.rate, reading.clip_norm, noise_std)
                      * live[:, None], axis=0)
    else:
      score = jnp.sum(own * held, axis=0)
    moments = jnp.stack([own.sum(0), (own ** 2).sum(0),
                         jnp.broadcast_to(live.sum(), (per,))], axis=-1)
    return server_view(i, global_params, upload), score, moments

  def reduce(state, t, seen, part):
    del t
    w = part[:, None] * live_slot
    return tuple(s + v * (w if v.ndim == 2 else w[..., None]) for s, v in zip(state, seen))

  init = (jnp.zeros((num_real, per)), jnp.zeros((num_real, per)),
          jnp.zeros((num_real, per, 3)))
  return observe, reduce, init, _step_trace(reading, coords, per, ravel)


def _slot_positions(owner: np.ndarray) -> np.ndarray:
  """Canary i's position among its client's canaries (the order `place_examples` used)."""
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
      observe, reduce, init, trace = _example_observers(
          kind, reading, slot_of, coords, planted.x, planted.y, per_example_ce, ravel,
          noise_std)
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
          chunk: int = 8) -> Scores:
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


def _scores(out, kind: str, owner: np.ndarray | None, test_y) -> Scores:
  """The raw outputs of R replicates as `Scores` (canaries concatenated replicate by
  replicate)."""
  observed, per_round, count, first, last, correct = out
  r = per_round.shape[0]
  per_round, first, last = (np.asarray(a) for a in (per_round, first, last))
  steps = moments = None
  if kind == 'client':
    own, known = (np.asarray(a) for a in observed)
  else:
    pos = _slot_positions(owner)
    pick = lambda a: np.asarray(a)[:, owner, pos]
    if isinstance(observed, tuple):
      own, steps, moments = (pick(a) for a in observed)
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
  return Scores(uploads=np.asarray(own).reshape(r * m),
                aggregates=sign * flat_tm(before - per_round), known=flat_tm(known),
                participants=flat_tm(parts), last=(sign * (first - last)).reshape(r * m),
                test_accuracy=acc,
                steps=None if steps is None else steps.reshape(r * m),
                step_moments=None if moments is None else moments.reshape(r * m, 3))


def threat_scores(scores: Scores, threat: str, adversary: str, *, participation: float,
                  shift: float | None = None, sigma: float | None = None,
                  known: bool = False) -> np.ndarray:
  """The scores [m] of the adversary `adversary` ('server' or 'aggregate') under `threat`.

  all_steps: the per-step reading of gradient canaries (`Scores.steps`).
  all_iterates: the server reads its canaries' uploads (summed over the rounds each took
  part in); a reader of the aggregate reads every round's aggregate: with `known`, the
  white-box reader of DP's definition, who knows every other client's contribution, takes
  k_t x aggregate minus the real participants' clipped uploads (what is left on a canary's
  direction is its own clipped update and the noise); it sums them over rounds, or under
  participation sampling (participation < 1, `shift` and `sigma` of that difference
  given) scores them by `mixture_llr`.
  last_iterate: w_0 - w_T projected (the loss decrease for input canaries).
  """
  if threat == 'last_iterate':
    return np.asarray(scores.last, np.float64)
  if threat == 'all_steps':
    if scores.steps is None:
      raise ValueError('all_steps needs the per-step reading of gradient canaries')
    return np.asarray(scores.steps, np.float64)
  if threat != 'all_iterates':
    raise ValueError(f'threat must be one of {THREATS} (got {threat!r})')
  if adversary == 'server':
    return np.asarray(scores.uploads, np.float64)
  agg = np.asarray(scores.aggregates, np.float64)
  if known:
    agg = agg * np.asarray(scores.participants, np.float64) - scores.known
  if participation < 1 and shift is not None and sigma is not None and sigma > 0:
    return np.asarray(mixture_llr(jnp.asarray(agg.T), float(participation), float(shift),
                                  float(sigma)), np.float64)
  return agg.sum(axis=0)


__all__ = ['CANARY_KINDS', 'THREATS', 'coins', 'directions', 'dirac_coordinates', 'signs',
           'injected_clients', 'place_examples', 'gradient_canary_loss', 'mixture_llr',
           'step_llr', 'StepReading', 'Planted', 'Scores', 'slot_table', 'train',
           'threat_scores', 'counted_bounds', 'gaussian_fit_epsilon', 'audit']
