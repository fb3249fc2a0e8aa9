"""PASTEL's trainings: the regulariser and its DP baselines run as segmented FedAvg rounds.

The PASTEL experiment (Elhattab and Bouchenak) trains one model per (defense, strength,
optimizer): no defense, the regulariser of `defenses.pastel` at each lambda, and the DP
baselines `ldp` (`dp_sgd`), `cdp` (`central_dp`) and `wdp` (`weak_dp`), each calibrated through
the defense registry (`configured.sweep_point`). Rounds run in segments
(`run_segments`), one jitted program per segment, so the server's view of a recorded round (the
K uploads Delta_k and the global model w_t, `server_view`) can be read between segments without
accumulating anything over rounds. The strength (lambda, or the DP noise multiplier) is traced,
so every lambda and every epsilon of one kind reuse one compiled training.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import validate
from fl_privacy.defenses import configured
from fl_privacy.defenses import pastel as pastel_lib
from fl_privacy.defenses import registry
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.fl import rounds as rounds_lib

# PASTEL's DP baselines, by the defense registry's names.
DP_NAMES = {'ldp': 'dp_sgd', 'cdp': 'central_dp', 'wdp': 'weak_dp'}


def client_data(x: np.ndarray, y: np.ndarray, members: Sequence[np.ndarray],
                heldout: Sequence[np.ndarray]) -> rounds_lib.ClientData:
  """Members as padded client shards; the held-out rows as `aux` (PASTEL's V); jax arrays."""
  clients = rounds_lib.pad_clients([x[m] for m in members], [y[m] for m in members])
  aux = pastel_lib.heldout_aux([x[h] for h in heldout], [y[h] for h in heldout])
  return rounds_lib.ClientData(*(None if a is None else jax.tree_util.tree_map(jnp.asarray, a)
                                 for a in clients._replace(aux=aux)))


def regularised_layers(model, example_shape: Sequence[int], requested: tuple,
                       representation: str, model_name: str,
                       field: str = 'pastel.pastel_layers') -> tuple:
  """The layers PASTEL's JS term reads: `requested`, or () = every Dense layer; from shapes only.

  Raises `validate.ConfigError(field, ...)` for a name the model lacks (listing the available
  names) or, with the `gradient` representation, a layer without a kernel.
  """
  x1 = jax.ShapeDtypeStruct((1,) + tuple(example_shape), jnp.float32)
  # Shapes only: under eval_shape no random number is drawn from this key.
  shapes = jax.eval_shape(model.init, jax.random.key(0), x1)
  available = pastel_lib.available_layers(model.apply, shapes, x1)
  layers = tuple(requested) or pastel_lib.dense_layers(shapes)
  for name in layers:
    validate.require(name in available, field, f'names of layers of {model_name}: {available}',
                     tuple(requested))
  if representation == 'gradient':
    for name in layers:
      sub = shapes['params'].get(name, {})
      has_kernel = any(getattr(p[-1], 'key', None) == 'kernel'
                       for p, _ in jax.tree_util.tree_flatten_with_path(sub)[0])
      validate.require(has_kernel, field,
                       "layers with a kernel for pastel_representations 'gradient'", name)
  return layers


@functools.lru_cache(maxsize=None)
def optimizer(name: str, learning_rate: float, field: str = 'pastel.optimizer'):
  """One optax optimizer per (name, lr): it is a static argument of the jitted rounds."""
  return optimizers_lib.make(name, learning_rate, field=field)


@functools.lru_cache(maxsize=None)
def hook_factory(kind: str, apply_fn, layers: tuple, representation: str, temperature: float,
                 batch_size: int, clip_norm: float, max_batch_size: int | None = None,
                 num_examples: int | None = None, steps_per_epoch: int | None = None):
  """`strength -> ClientHooks` of one kind, cached: a static argument of the jitted rounds.

  The strength (lambda, or the DP noise multiplier) is traced, so every lambda of PASTEL, and
  every epsilon of a DP mechanism, reuses one compiled training (wdp and cdp share one: they
  are the same mechanism at different noise).
  """
  if kind == 'pastel':
    return lambda w: pastel_lib.make(apply_fn, weight=w, layers=layers,
                                     representation=representation, temperature=temperature,
                                     heldout_batch_size=batch_size)
  if kind in ('ldp', 'server_dp'):
    # The registry's builders, with the noise multiplier traced; `central_dp` and `weak_dp`
    # are the same DP-FedAvg mechanism at different noise.
    build = registry.DEFENSES['dp_sgd' if kind == 'ldp' else 'central_dp'].build
    # Poisson DP-SGD runs the public schedule of its declaration (rate B / N, S steps an
    # epoch, N the declared member count), as `dp_accounting` reports it.
    extra = {} if kind == 'server_dp' else dict(
        sampling='shuffle' if max_batch_size is None else 'poisson', batch_size=batch_size,
        num_examples=batch_size if num_examples is None else num_examples,
        max_batch_size=max_batch_size, steps_per_epoch=steps_per_epoch)
    return lambda z: build(clip_norm=clip_norm, noise_multiplier=z, **extra)
  raise ValueError(f'unknown hook kind {kind!r}')


def dp_setting(member_counts: Sequence[int], *, batch_size: int, epochs: int,
               rounds: int) -> registry.Setting:
  """The run as the DP accounting sees it: n the smallest client's member count, J =
  ceil(n / B) steps per epoch, E epochs, T rounds, K clients (all take part); the largest
  client sizes the padded Poisson batch."""
  n, b = min(member_counts), int(batch_size)
  return registry.Setting(batch_size=b, num_examples=n, epochs=int(epochs),
                          steps_per_epoch=math.ceil(n / b), rounds=int(rounds),
                          num_clients=len(member_counts), max_examples=max(member_counts))


def dp_accounting(defense: str, target_epsilon: float, setting: registry.Setting, *,
                  clip_norm: float, update_clip_norm: float, ldp_sampling: str, delta: float,
                  experiment: str = 'pastel', prefix: str = 'pastel') -> dict:
  """Noise multiplier, epsilons and declaration of one DP baseline (the defense registry's
  declaration, calibrated by `fl_privacy.accounting` with dp-accounting's RDP accountant).

  - `ldp` (`dp_sgd`, record level, against the server): `ldp_sampling` 'poisson' (E J T
    steps of the Poisson-subsampled Gaussian at q = B / n, n the smallest client's members) or
    'shuffle' (E T epochs, one replace-one release each, no amplification).
  - `cdp` (`central_dp`, client level, replace-one, readers of the aggregate): T rounds.
  - `wdp` (`weak_dp`): calibrated for ONE round (PASTEL's weak DP); `dp_epsilon` is its
    composition over T rounds.

  Returns:
    {'noise_multiplier', 'dp_epsilon' (over the run), 'dp_epsilon_per_round' (nan but for
    wdp), 'dp_steps', 'dp_sampling_rate', the declaration's `dp_unit`, `dp_relation`,
    `dp_adversary`, `dp_sampling`, and `dp_max_batch_size` for Poisson DP-SGD}.
  """
  name = DP_NAMES.get(defense)
  if name is None:
    raise ValueError(f'not a DP baseline: {defense!r}')
  clip = float(clip_norm if defense == 'ldp' else update_clip_norm)
  fixed = {'clip_norm': clip}
  if defense == 'ldp':
    fixed['sampling'] = ldp_sampling
  built = configured.sweep_point(
      name, None, setting, experiment=experiment, prefix=prefix, fixed=fixed,
      delta=float(delta), target_epsilon=float(target_epsilon))
  m = dict(built.metrics)
  m.setdefault('dp_epsilon_per_round', math.nan)
  m['dp_steps'] = m['dp_compositions']
  return m


def setup(defense: str, strength: float, dp: Callable[[], dict], *, apply_fn, layers: tuple,
          representation: str, temperature: float, batch_size: int, clip_norm: float,
          update_clip_norm: float):
  """(hook factory, its strength, DP info) of one training.

  The factory is None for `none`; the strength is lambda for `pastel` and the calibrated noise
  multiplier for the DP baselines (`dp()` returns `dp_accounting`'s dict; called only for
  them).
  """
  info = dict(noise_multiplier=math.nan, dp_epsilon=math.nan, dp_epsilon_per_round=math.nan)
  b = int(batch_size)
  if defense == 'none':
    return None, 0.0, info
  if defense == 'pastel':
    factory = hook_factory('pastel', apply_fn, tuple(layers), representation,
                           float(temperature), b, 0.0)
    return factory, float(strength), info
  m = dp()
  info.update({k: m[k] for k in info})
  if defense == 'ldp':
    factory = hook_factory('ldp', apply_fn, (), '', 1.0, b, float(clip_norm),
                           m.get('dp_max_batch_size'), m.get('dp_public_examples'),
                           m.get('dp_steps_per_epoch'))
  else:
    factory = hook_factory('server_dp', apply_fn, (), '', 1.0, b, float(update_clip_norm))
  return factory, m['noise_multiplier'], info


_STATIC = ('apply_fn', 'optimizer', 'epochs', 'batch_size', 'hook_factory')


def server_view(key, t, k, global_params, upload):
  """What the server keeps of client k in round t: its upload and the global model w_t."""
  del key, t, k
  return upload, global_params


@functools.partial(jax.jit, static_argnames=_STATIC + ('num_rounds',))
def segment(params, clients, key, first, strength, *, apply_fn, optimizer, epochs, batch_size,
            hook_factory, num_rounds):
  """Rounds first .. first + num_rounds - 1 in one program.

  Returns (w_{first + num_rounds}, the last round's K uploads, that round's w_t): the default
  `reduce` keeps only the last round's observations, so nothing accumulates over rounds.
  """
  hooks = None if hook_factory is None else hook_factory(strength)
  zeros = jax.tree_util.tree_map(
      lambda a: jnp.zeros((clients.num_clients,) + a.shape, a.dtype), params)
  final, log = rounds_lib.run(losses.make_loss_fn(apply_fn), params, clients, key=key,
                              num_rounds=num_rounds, first_round=first, optimizer=optimizer,
                              epochs=epochs, batch_size=batch_size, hooks=hooks,
                              observe=server_view, init=(zeros, zeros))
  uploads, globals_ = log.observed
  return final, uploads, jax.tree_util.tree_map(lambda a: a[0], globals_)


def recorded_rounds(num_rounds: int, record_every: int) -> list[int]:
  """0-based indices of the recorded rounds: every-1, 2 every-1, ..., num_rounds-1."""
  return list(range(record_every - 1, num_rounds, record_every))


def run_segments(params, clients: rounds_lib.ClientData, key, strength: float, recorded:
                 Sequence[int], **static) -> Iterator[tuple[int, Any, Any, Any]]:
  """Trains up to each recorded round r in turn; yields (r, w_{r+1}, w_r, uploads of round r).

  `static`: `apply_fn`, `optimizer`, `epochs`, `batch_size`, `hook_factory` (see `segment`).
  The rounds after the last recorded one are not run.
  """
  t = 0
  for r in recorded:
    # Rounds t .. r in one program; `w_r` is the recorded round's global model.
    new_params, uploads, w_r = segment(params, clients, key, t, jnp.float32(strength),
                                       num_rounds=r + 1 - t, **static)
    yield r, new_params, w_r, uploads
    params, t = new_params, r + 1


def local_model(global_params, uploads, i: int):
  """Client i's model of a recorded round: w_t - Delta_i."""
  return jax.tree_util.tree_map(lambda w, u: w - u[i], global_params, uploads)
