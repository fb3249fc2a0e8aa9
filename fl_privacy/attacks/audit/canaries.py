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

The training audit's modules: this one holds the canaries (coins, directions, coordinates,
the canary clients and the canary rows); `attacks.audit.canary_training` the trainings that
carry them (`train`, `accuracy`) and their gradient-canary loss; `attacks.audit.canary_scores`
the threats (`THREATS`: what each adversary reads) and their scores (`threat_scores`);
`attacks.audit.canary_statistics` the statistics (bounds, verdict, what the canaries could
certify at best, estimates). The public names of those modules that callers read here are
re-exported.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# The public names of the training audit's other modules, re-exported (their homes are
# canary_scores, canary_training and canary_statistics).
from fl_privacy.attacks.audit.canary_scores import mixture_llr  # noqa: F401
from fl_privacy.attacks.audit.canary_scores import Scores  # noqa: F401
from fl_privacy.attacks.audit.canary_scores import step_llr  # noqa: F401
from fl_privacy.attacks.audit.canary_scores import threat_scores  # noqa: F401
from fl_privacy.attacks.audit.canary_scores import THREATS  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import audit  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import counted_bounds  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import gaussian_fit_epsilon  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import NO_ESTIMATE  # noqa: F401
from fl_privacy.attacks.audit.canary_statistics import NON_GAUSSIAN  # noqa: F401
from fl_privacy.attacks.audit.canary_training import accuracy  # noqa: F401
from fl_privacy.attacks.audit.canary_training import gradient_canary_loss  # noqa: F401
from fl_privacy.attacks.audit.canary_training import Planted  # noqa: F401
from fl_privacy.attacks.audit.canary_training import slot_table  # noqa: F401
from fl_privacy.attacks.audit.canary_training import split_hooks  # noqa: F401
from fl_privacy.attacks.audit.canary_training import StepReading  # noqa: F401
from fl_privacy.attacks.audit.canary_training import train  # noqa: F401
from fl_privacy.fl import rounds

CANARY_KINDS = ('client', 'gradient', 'input')
DIRECTIONS = ('random', 'dirac')

COIN_SALT = 0x7FFF2001
DIRECTION_SALT = 0x7FFF2002


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


__all__ = ['CANARY_KINDS', 'THREATS', 'coins', 'directions', 'dirac_coordinates', 'signs',
           'injected_clients', 'place_examples', 'gradient_canary_loss', 'mixture_llr',
           'step_llr', 'StepReading', 'Planted', 'Scores', 'slot_table', 'train',
           'threat_scores', 'counted_bounds', 'gaussian_fit_epsilon', 'audit']
