"""Image array helpers: resizing uint8 NHWC images."""

from __future__ import annotations

import numpy as np
from PIL import Image


def center_square(image: np.ndarray) -> np.ndarray:
  """The largest centred square crop of an [H, W, C] image."""
  h, w = image.shape[:2]
  side = min(h, w)
  top, left = (h - side) // 2, (w - side) // 2
  return image[top:top + side, left:left + side]


def resize_image(image: np.ndarray, size: int) -> np.ndarray:
  """Centre-crops an [H, W, C] uint8 image to a square and resizes it to size x size.

  Cropping first keeps the aspect ratio (CelebA is 218 x 178); PIL's bilinear filter
  widens its support when shrinking, so downsampling is antialiased.
  """
  image = np.asarray(image, dtype=np.uint8)
  if image.ndim == 2:
    image = image[..., None]
  square = center_square(image)
  if square.shape[0] == size and square.shape[1] == size:
    return np.ascontiguousarray(square)
  channels = square.shape[-1]
  pil = Image.fromarray(square[..., 0] if channels == 1 else square)
  out = np.asarray(pil.resize((size, size), Image.BILINEAR), dtype=np.uint8)
  return out.reshape(size, size, channels)


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
  """`resize_image` applied to every image of a uint8 [N, H, W, C] array."""
  out = np.empty((len(x), size, size, x.shape[-1]), np.uint8)
  for i, image in enumerate(x):
    out[i] = resize_image(image, size)
  return out
