"""`extract`: a dataset's examples -> float32 feature vectors, cached on disk.

Extractors:
  'identity': flattened `to_float(x)` (images in [0, 1]) times `scale`.
  'cnn': the hidden layer of `extractors.SmallCNN` trained with Adam for a few epochs
    on the adversary's public labelled split `public`.
  'resnet18': the 512-d average-pooled output of an ImageNet-style ResNet-18 in
    inference mode, weights from a user .npz (`extractors` documents the keys);
    without weights the network is random and a WARNING says so.

Features of 'cnn' and 'resnet18' are written to `cache_dir` (when given) under a
hash of everything they depend on: dataset name, the bytes and shape of x, the
extractor and its settings, the weights file's bytes, the public split and (where
the network is random or trained) the key.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.data import extractors
from fl_privacy.data.dataset import Dataset, rng_from_key, to_float

logger = logging.getLogger(__name__)

EXTRACTORS = ('identity', 'cnn', 'resnet18')
_CACHE_VERSION = b'fl_privacy.features/1'


def _hash_array(h, x: np.ndarray) -> None:
  x = np.ascontiguousarray(x)
  h.update(f'{x.dtype.str}{x.shape}'.encode())
  h.update(memoryview(x).cast('B'))


def cache_key(dataset: Dataset, extractor: str, settings: dict, *, weights=None,
              public: Dataset | None = None, key=None) -> str:
  """Hex digest naming the cached features of `dataset` under these settings."""
  h = hashlib.sha256(_CACHE_VERSION)
  h.update(f'{dataset.name}|{extractor}|{sorted(settings.items())}'.encode())
  _hash_array(h, dataset.x)
  if weights is not None:
    with open(weights, 'rb') as f:
      for chunk in iter(lambda: f.read(1 << 20), b''):
        h.update(chunk)
  if public is not None:
    _hash_array(h, public.x)
    _hash_array(h, public.y)
  if key is not None:
    _hash_array(h, np.asarray(jax.random.key_data(key)))
  return h.hexdigest()


def save_atomic(path: str, array: np.ndarray) -> None:
  """np.save to a temporary file in the same directory, then rename over `path`."""
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, suffix='.npy.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      np.save(f, array)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def apply_batched(fn, x: np.ndarray, batch_size: int) -> np.ndarray:
  """Maps a jitted `fn` over batches of x; the last batch is padded to keep one shape."""
  out = []
  for start in range(0, len(x), batch_size):
    batch = x[start:start + batch_size]
    n = len(batch)
    if n < batch_size and len(x) > batch_size:
      pad = np.zeros((batch_size - n,) + batch.shape[1:], batch.dtype)
      batch = np.concatenate([batch, pad])
    out.append(np.asarray(fn(batch))[:n])
  return np.concatenate(out).astype(np.float32)


def identity_features(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
  """Flattened `to_float(x)` times scale (images in [0, scale])."""
  return (to_float(x).reshape(len(x), -1) * np.float32(scale)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _cnn_trainer(num_classes: int, embed_dim: int, learning_rate: float):
  """(model, optimizer, jitted step), built once per configuration to reuse compiles."""
  model = extractors.SmallCNN(num_classes, embed_dim)
  opt = optax.adam(learning_rate)

  @jax.jit
  def step(params, state, x, y):
    def loss_fn(p):
      logits = model.apply({'params': p}, to_float_jnp(x))
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    grads = jax.grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return model, opt, step


@functools.partial(jax.jit, static_argnums=(0,))
def _cnn_init(model, key, x):
  return model.init(key, to_float_jnp(x))['params']


def train_cnn(key, public: Dataset, *, epochs: int = 3, batch_size: int = 128,
              learning_rate: float = 1e-3, embed_dim: int = 128) -> dict:
  """Trains `SmallCNN` with Adam on the adversary's public split; returns its params.

  Args:
    key: Initialisation uses fold_in(key, 0); epoch e shuffles with fold_in(key, e + 1).
    public: Labelled images the adversary owns.
    epochs: Passes over `public` (the last partial batch of each is dropped).
    batch_size: Training minibatch size.
    learning_rate: Adam step size.
    embed_dim: Width of the hidden layer used as features.
  """
  if not public.is_image:
    raise ValueError(f"'cnn' features need images; {public.name} holds vectors")
  model, opt, step = _cnn_trainer(public.num_classes, embed_dim, float(learning_rate))
  params = _cnn_init(model, jax.random.fold_in(key, 0), public.x[:1])
  state = opt.init(params)
  batch_size = min(batch_size, len(public))
  for epoch in range(epochs):
    order = rng_from_key(jax.random.fold_in(key, epoch + 1)).permutation(len(public))
    for start in range(0, len(order) - batch_size + 1, batch_size):
      idx = order[start:start + batch_size]
      params, state = step(params, state, public.x[idx], public.y[idx])
  return params


@functools.partial(jax.jit, static_argnums=(0, 1))
def _cnn_embed(num_classes: int, embed_dim: int, params, x):
  model = extractors.SmallCNN(num_classes, embed_dim)
  return model.apply({'params': params}, to_float_jnp(x), method=extractors.SmallCNN.embed)


def cnn_features(x: np.ndarray, params, num_classes: int, embed_dim: int,
                 batch_size: int) -> np.ndarray:
  """Hidden-layer features of a trained `SmallCNN`."""
  return apply_batched(functools.partial(_cnn_embed, num_classes, embed_dim, params),
                       x, batch_size)


def to_float_jnp(x) -> jax.Array:
  """Device-side uint8 -> [0, 1] float32."""
  return jnp.asarray(x, jnp.float32) / 255.0


@functools.partial(jax.jit, static_argnums=(0,))
def _resnet18_embed(resize: int | None, variables, b):
  b = extractors.imagenet_normalise(jnp.repeat(b, 3, -1) if b.shape[-1] == 1 else b)
  if resize is not None:
    b = jax.image.resize(b, (b.shape[0], resize, resize, 3), 'bilinear', antialias=True)
  return extractors.ResNet18Features().apply(variables, b)


def resnet18_features(x: np.ndarray, variables, batch_size: int,
                      resize: int | None = None) -> np.ndarray:
  """512-d ResNet-18 features; greyscale is repeated to RGB, optional bilinear resize."""
  # Weights are an argument of the jitted function, not constants baked into it:
  # one compile per input shape, whatever the weights.
  return apply_batched(functools.partial(_resnet18_embed, resize, variables), x,
                       batch_size)


def extract(dataset: Dataset, extractor: str, *, key, cache_dir: str | None = None,
            batch_size: int = 256, public: Dataset | None = None,
            weights: str | None = None, scale: float = 1.0, resize: int | None = None,
            epochs: int = 3, embed_dim: int = 128) -> np.ndarray:
  """Feature vectors of every example of `dataset`.

  Args:
    dataset: Images (all extractors) or vectors ('identity' only).
    extractor: One of `EXTRACTORS`.
    key: JAX key: initialises and shuffles 'cnn', initialises 'resnet18' when no
      weights are given; unused by 'identity'.
    cache_dir: Where 'cnn'/'resnet18' features are cached (None: no cache).
    batch_size: Inference batch size (does not change the features).
    public: 'cnn' only: the labelled split the extractor is trained on.
    weights: 'resnet18' only: path to an .npz of weights.
    scale: 'identity' only: multiplies the [0, 1] values.
    resize: 'resnet18' only: resize images to resize x resize first (e.g. 224).
    epochs: 'cnn' training epochs.
    embed_dim: 'cnn' feature dimension.

  Returns:
    float32 [N, d].
  """
  if extractor not in EXTRACTORS:
    raise ValueError(f'extractor must be one of {EXTRACTORS}, got {extractor!r}')
  if extractor == 'identity':
    return identity_features(dataset.x, scale)
  if not dataset.is_image:
    raise ValueError(f'{extractor!r} features need images; {dataset.name} holds vectors')
  if extractor == 'cnn':
    if public is None:
      raise ValueError("'cnn' features need `public`, the adversary's labelled split")
    if public.x.shape[1:] != dataset.x.shape[1:]:
      raise ValueError(f'public images {public.x.shape[1:]} differ from dataset images '
                       f'{dataset.x.shape[1:]}')
    settings = {'epochs': epochs, 'embed_dim': embed_dim}
    digest = cache_key(dataset, extractor, settings, public=public, key=key)
  else:
    if weights is None:
      # Warned on cache hits too: cached random features are no better than fresh ones.
      logger.warning(
          '!!! resnet18 features of %s come from an UNTRAINED, randomly initialised '
          'network (no weights file given); they are not ImageNet features. Pass '
          'weights=<.npz> (see fl_privacy/data/extractors.py). !!!', dataset.name)
    settings = {'resize': resize}
    digest = cache_key(dataset, extractor, settings, weights=weights,
                       key=None if weights else key)
  path = None
  if cache_dir is not None:
    path = os.path.join(cache_dir, f'{extractor}-{digest[:40]}.npy')
    if os.path.exists(path):
      logger.info('features cache hit: %s', path)
      return np.load(path)
  feats = _compute(dataset, extractor, key=key, batch_size=batch_size, public=public,
                   weights=weights, resize=resize, epochs=epochs, embed_dim=embed_dim)
  if path is not None:
    save_atomic(path, feats)
  return feats


def _compute(dataset, extractor, *, key, batch_size, public, weights, resize, epochs,
             embed_dim) -> np.ndarray:
  if extractor == 'cnn':
    params = train_cnn(key, public, epochs=epochs, embed_dim=embed_dim)
    return cnn_features(dataset.x, params, public.num_classes, embed_dim, batch_size)
  if weights is None:
    variables = extractors.init_resnet18(key)
  else:
    variables = extractors.load_resnet18_weights(weights)
  return resnet18_features(dataset.x, variables, batch_size, resize)
