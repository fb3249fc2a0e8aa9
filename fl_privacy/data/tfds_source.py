"""TFDS datasets read through `tfds.data_source` (random access, no TensorFlow).

Nothing here downloads: a dataset must already be prepared in `data_dir`. When it
is not, `DataUnavailableError` says so at once, rather than after TFDS's download
retries (about 200 s on a machine without network).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from fl_privacy.data.dataset import Dataset, DataUnavailableError
from fl_privacy.data.images import resize_image

logger = logging.getLogger(__name__)

# Splits each source offers, under the names the library uses. SVHN's 'extra' split
# is left out on purpose; Imagenette has no test split, only 'validation'.
SPLITS = {
    'mnist': ('train', 'test'),
    'fashion_mnist': ('train', 'test'),
    'cifar10': ('train', 'test'),
    'cifar100': ('train', 'test'),
    'svhn_cropped': ('train', 'test'),
    'celeb_a': ('train', 'validation', 'test'),
    'imagenette': ('train', 'validation'),
}

# Imagenette's images vary in size, so they must be resized to be stacked.
DEFAULT_IMAGE_SIZE = {'imagenette': 64}

CELEBA_ATTRIBUTES = (
    '5_o_Clock_Shadow', 'Arched_Eyebrows', 'Attractive', 'Bags_Under_Eyes', 'Bald',
    'Bangs', 'Big_Lips', 'Big_Nose', 'Black_Hair', 'Blond_Hair', 'Blurry', 'Brown_Hair',
    'Bushy_Eyebrows', 'Chubby', 'Double_Chin', 'Eyeglasses', 'Goatee', 'Gray_Hair',
    'Heavy_Makeup', 'High_Cheekbones', 'Male', 'Mouth_Slightly_Open', 'Mustache',
    'Narrow_Eyes', 'No_Beard', 'Oval_Face', 'Pale_Skin', 'Pointy_Nose',
    'Receding_Hairline', 'Rosy_Cheeks', 'Sideburns', 'Smiling', 'Straight_Hair',
    'Wavy_Hair', 'Wearing_Earrings', 'Wearing_Hat', 'Wearing_Lipstick',
    'Wearing_Necklace', 'Wearing_Necktie', 'Young')

_MANUAL = {
    'celeb_a': ('CelebA is hosted on Google Drive, whose quota often blocks scripted '
                'downloads; if `tfds build` fails, download the files by hand into '
                '<data_dir>/downloads/manual as described in BUILD.md. '),
    'imagenette': ('Imagenette (full-size-v2) is a ~1.5 GB download; build it on a '
                   'connected machine. '),
}


def _builder(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds  # Deferred: importing TFDS costs time.
  return tfds.builder(name, data_dir=data_dir)


def unavailable_message(name: str, looked_in: str, data_dir: str | None) -> str:
  """What to tell a user whose dataset is not prepared."""
  target = data_dir if data_dir else '~/tensorflow_datasets'
  return (f'dataset {name!r} is not prepared in {looked_in} (data_dir={data_dir!r}); '
          f'nothing is downloaded at run time. On a machine with network access run '
          f'`tfds build {name} --data_dir={target}` and copy that directory here. '
          f'{_MANUAL.get(name, "")}See BUILD.md.')


def check_prepared(name: str, data_dir: str | None):
  """The TFDS builder of `name`, or `DataUnavailableError` if it is not prepared.

  Only the local files are inspected, so this returns (or raises) in well under a
  second whether or not the machine has network access.
  """
  builder = _builder(name, data_dir)
  if not builder.is_prepared():
    raise DataUnavailableError(unavailable_message(name, os.fspath(builder.data_dir),
                                                   data_dir))
  return builder


def _num_classes(name: str, builder) -> int:
  if name == 'celeb_a':
    return 2
  return int(builder.info.features['label'].num_classes)


def _read_split(name: str, source, *, attribute: str, image_size: int | None,
                max_examples: int | None) -> tuple:
  n = len(source) if max_examples is None else min(len(source), max_examples)
  images, labels = [], []
  attributes = {a: np.zeros(n, bool) for a in CELEBA_ATTRIBUTES} if name == 'celeb_a' else None
  for i in range(n):
    example = source[i]
    image = np.asarray(example['image'], np.uint8)
    if image_size is not None:
      image = resize_image(image, image_size)
    images.append(image)
    if attributes is not None:
      for a in CELEBA_ATTRIBUTES:
        attributes[a][i] = bool(example['attributes'][a])
      labels.append(attributes[attribute][i])
    else:
      labels.append(example['label'])
  if n == 0:
    raise ValueError(f'{name}: split is empty')
  x = np.stack(images)
  if x.ndim == 3:
    x = x[..., None]
  return x, np.asarray(labels, np.int32), attributes


def load_tfds(name: str, *, data_dir: str | None = None, attribute: str = 'Smiling',
              image_size: int | None = None,
              max_examples: int | None = None) -> dict[str, Dataset]:
  """Reads every split of a prepared TFDS dataset into memory.

  Args:
    name: A key of `SPLITS`.
    data_dir: TFDS data directory (None = TFDS default, ~/tensorflow_datasets).
    attribute: CelebA only: the binary attribute used as label (all 40 are kept in
      `Dataset.attributes`).
    image_size: Resize every image to image_size x image_size (centre square crop
      first); None keeps the native size (Imagenette then defaults to 64).
    max_examples: Keep only the first max_examples of each split (only those are read).
      Mind memory: CelebA's train split at native size is ~19 GB of uint8.

  Returns:
    Splits keyed 'train', 'test' and/or 'validation' (see `SPLITS`).

  Raises:
    DataUnavailableError: The dataset is not prepared in `data_dir`.
  """
  import tensorflow_datasets as tfds
  builder = check_prepared(name, data_dir)
  if image_size is None:
    image_size = DEFAULT_IMAGE_SIZE.get(name)
  num_classes = _num_classes(name, builder)
  out = {}
  for split in SPLITS[name]:
    # download=False: the check above already established the files are there; never
    # let a missing split fall through to a slow download attempt.
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    x, y, attributes = _read_split(name, source, attribute=attribute,
                                   image_size=image_size, max_examples=max_examples)
    out[split] = Dataset(x=x, y=y, num_classes=num_classes, name=f'{name}/{split}',
                         attributes=attributes)
    logger.info('loaded %s/%s: x %s', name, split, x.shape)
  return out
