"""What the dishonest server's trunk needs of the images, checked before anything runs.

`require_features(config, model, pool, points)`: the trunk keeps features of the images (an
image too small for its poolings is named as the data's fault, not the padding's), and every
point's M fits them (2M + 1 units of fc1, M <= the feature dimension). Split out of
`pipelines.dishonest_mia.prepare` to keep the pipeline within its 350 lines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fl_privacy import validate

# The smallest image side whose features survive the trunk's poolings under 'SAME' padding.
MIN_SAME_SIZE = 4


def feature_shape(model, image_shape) -> tuple[int, int]:
  """(trunk feature dimension, width of fc1) of `model` on images of `image_shape`."""
  x = jax.ShapeDtypeStruct((1,) + tuple(image_shape), jnp.float32)
  # Shapes only: under eval_shape no random number is ever drawn from this key.
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  return variables['params']['fc1']['kernel'].shape


def require_features(config, model, pool, points) -> None:
  """ConfigError (exit 2) unless `model`'s trunk keeps features of `pool`'s images and every
  point's M fits them."""
  s = config.dishonest
  dims = f'{pool.x.shape[1]}x{pool.x.shape[2]}'
  try:
    feature_dim, width = feature_shape(model, pool.x.shape[1:])
  except (ValueError, TypeError, ZeroDivisionError):  # shape probe of a too-small input
    feature_dim, width = 0, 0
  if feature_dim <= 0:
    # Images smaller than MIN_SAME_SIZE are the fault under either padding (naming the
    # padding as the fix read "must be 'SAME' ... (got 'SAME')"); larger ones need 'SAME'.
    if min(pool.x.shape[1:3]) < MIN_SAME_SIZE:
      raise validate.ConfigError(
          'data', f'images of at least {MIN_SAME_SIZE}x{MIN_SAME_SIZE} for the dishonest '
          "server's trunk (its poolings leave no features of smaller ones under either "
          'padding)', f'{dims} images of {config.data.name}')
    validate.require(s.padding == 'SAME', 'dishonest.padding',
                     f"'SAME' for {dims} images (the VALID trunk needs at least 16x16)",
                     s.padding)
    raise validate.ConfigError('data', f'images the dishonest server\'s trunk keeps features '
                               'of', f'{dims} images of {config.data.name}')
  limit = min(feature_dim, width // 2)
  for p in points:
    field = 'dishonest.M' if p['M'] in tuple(s.M) else 'dishonest.center.M'
    validate.require(p['M'] <= limit, field, f'<= {limit} (feature dimension {feature_dim}, '
                     f'2M <= {width} units of fc1)', p['M'])
