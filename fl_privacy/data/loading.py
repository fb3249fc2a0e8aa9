"""`load(data_config)`: one entry point for every data source, and its validation."""

from __future__ import annotations

import dataclasses
import os

from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.data import local_sources, tfds_source
from fl_privacy.data.dataset import Dataset
from fl_privacy.data.images import resize_images

TFDS_DATASETS = tuple(tfds_source.SPLITS)
DATASETS = ('digits', 'npz', 'synthetic') + TFDS_DATASETS

_DEFAULTS = {
    'data_dir': None, 'path': None, 'attribute': 'Smiling', 'image_size': None,
    'max_examples': None, 'num_examples': 512, 'num_classes': 10, 'shape': (8, 8, 1),
    'seed': 0,
}


def _get(cfg, field: str):
  try:
    value = cfg[field]
  except (KeyError, AttributeError, TypeError):
    return _DEFAULTS.get(field)
  return value


def _is_path(v) -> bool:
  return isinstance(v, (str, os.PathLike))


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


V = validate
_OPTIONAL_POSITIVE = V.Rule('None or a positive integer',
                            lambda v: v is None or (_is_int(v) and v > 0))
# The data section's fields and their rules (`validate_data_config` reads them with
# defaults for a plain mapping).
RULES = {
    'name': V.choice(DATASETS),
    'data_dir': V.Rule('None or a directory path', lambda v: v is None or _is_path(v)),
    'image_size': _OPTIONAL_POSITIVE, 'max_examples': _OPTIONAL_POSITIVE,
}
NPZ_RULES = {'path': V.Rule('an existing .npz file', lambda v: _is_path(v) and os.path.isfile(v))}
CELEBA_RULES = {'attribute': V.Rule(f'a CelebA attribute, one of {tfds_source.CELEBA_ATTRIBUTES}',
                                    lambda v: v in tfds_source.CELEBA_ATTRIBUTES)}
SYNTHETIC_RULES = {
    'num_examples': V.number(1, integer=True),
    'num_classes': V.number(2, local_sources.MAX_CLASSES, integer=True),
    'shape': V.Rule('(H, W, C) or (d,) of positive integers',
                    lambda v: isinstance(v, (tuple, list)) and len(v) in (1, 3) and
                    all(_is_int(x) and x > 0 for x in v)),
    'seed': V.number(integer=True),
}


def validate_data_config(data_config) -> None:
  """Checks a data config without loading anything.

  Fields: name (one of `DATASETS`), data_dir, path (npz: an existing file),
  attribute (celeb_a: one of its 40 attributes), image_size, max_examples, and for
  synthetic num_examples, num_classes, shape ((H, W, C) or (d,)), seed.

  Raises:
    ConfigError: naming `data.<field>`.
  """
  name = RULES['name'].check('data.name', _get(data_config, 'name'))
  # A location the loader does not read is refused, not recorded as if the data came from it
  # (`path=` on digits ran on digits and stored the path).
  for field, readers in (('path', ('npz',)), ('data_dir', TFDS_DATASETS)):
    if name not in readers:
      validate.require(_get(data_config, field) is None, f'data.{field}',
                       f'None for data.name={name!r} (read only by {", ".join(readers)})',
                       _get(data_config, field))
  rules = dict(RULES, **{'npz': NPZ_RULES, 'celeb_a': CELEBA_RULES,
                         'synthetic': SYNTHETIC_RULES}.get(name, {}))
  for field, rule in rules.items():
    rule.check(f'data.{field}', _get(data_config, field))
  if name == 'synthetic':
    validate.require(_get(data_config, 'image_size') is None or
                     len(_get(data_config, 'shape')) == 3,
                     'data.image_size', 'None for feature vectors',
                     _get(data_config, 'image_size'))


def _postprocess(ds: Dataset, image_size: int | None, max_examples: int | None) -> Dataset:
  if max_examples is not None and len(ds) > max_examples:
    ds = ds.subset(slice(0, max_examples))
  if image_size is not None and ds.is_image and ds.x.shape[1:3] != (image_size, image_size):
    # The resized uint8 images and the float32 copy every experiment trains on: 5 bytes a
    # pixel (a side of 10^5 aborted the process on its allocation).
    pixels = len(ds) * int(image_size) ** 2 * int(ds.x.shape[-1])
    memory.require_fits('data.image_size', image_size, 5 * pixels,
                        f'the resized images ({len(ds):,} images x {image_size}^2 pixels x '
                        f'{ds.x.shape[-1]} channels x 5 bytes: uint8 and float32)')
    ds = dataclasses.replace(ds, x=resize_images(ds.x, image_size))
  return ds


def load(data_config) -> dict[str, Dataset]:
  """Loads every split of the configured dataset.

  Args:
    data_config: A ConfigDict (or mapping) with the fields described in
      `validate_data_config`.

  Returns:
    Splits keyed 'train' and 'test' ('validation' too for celeb_a; imagenette has
    'train' and 'validation' only). max_examples keeps the first examples of each
    split; image_size centre-crops to a square and resizes.

  Raises:
    ConfigError: Invalid config.
    DataUnavailableError: A TFDS dataset is not prepared in data_dir (raised at once;
      nothing is downloaded).
  """
  validate_data_config(data_config)
  name = _get(data_config, 'name')
  image_size = _get(data_config, 'image_size')
  max_examples = _get(data_config, 'max_examples')
  if name in TFDS_DATASETS:
    # TFDS applies the cap and the resize while reading, so memory stays bounded.
    return tfds_source.load_tfds(name, data_dir=_get(data_config, 'data_dir'),
                                 attribute=_get(data_config, 'attribute'),
                                 image_size=image_size, max_examples=max_examples)
  if name == 'digits':
    splits = local_sources.load_digits()
  elif name == 'npz':
    splits = local_sources.load_npz(_get(data_config, 'path'))
  else:
    splits = local_sources.load_synthetic(
        num_examples=_get(data_config, 'num_examples'),
        num_classes=_get(data_config, 'num_classes'),
        shape=tuple(_get(data_config, 'shape')), seed=_get(data_config, 'seed'))
  return {k: _postprocess(v, image_size, max_examples) for k, v in splits.items()}


def require_examples(data_config, what: str, have: int, need: int, why: str) -> None:
  """Refuses a user's .npz file that holds fewer examples than the run needs.

  The minimum comes from a config field the user may never have set (`ami.num_targets`,
  `fedmia.num_clients`, ...), so for a file the fault is the file's size and the message
  names the file, the count and the minimum. For the built-in datasets this returns and
  the caller's own check names the field (their sizes are fixed; the field is the choice).

  Args:
    data_config: the `data` section.
    what: what was counted, e.g. "its 'train' split".
    have: how many examples that holds.
    need: the least the run needs.
    why: the fields that set `need`, e.g. 'ami.num_targets = 2 targets and one more'.

  Raises:
    DataFileError: the data is an .npz file and `have < need`.
  """
  if have >= need or _get(data_config, 'name') != 'npz':
    return
  raise local_sources.DataFileError(
      f'{_get(data_config, "path")}: too small for this run: {what} holds {have} examples; '
      f'needs at least {need} ({why})')
