"""Models by config name."""

from __future__ import annotations

import flax.linen as nn

from fl_privacy import validate
from fl_privacy.models.alexnet import AlexNetCifar
from fl_privacy.models.cnn import AuditCNN, FlowerCNN
from fl_privacy.models.mlp import MLP
from fl_privacy.models.resnet import ResNet18GN

MODELS = ('flower_cnn', 'audit_cnn', 'alexnet_cifar', 'resnet18_gn', 'mlp')


def make(name: str, num_classes: int, *, field: str = 'model',
         **kwargs) -> nn.Module:
  """The model called `name`, built with `num_classes` outputs.

  Args:
    name: One of `MODELS`.
    num_classes: Number of output logits.
    field: Config field named in the error for an unknown `name`.
    **kwargs: Extra attributes: `padding` (flower_cnn, audit_cnn), `hidden`
      (mlp).

  Returns:
    An unbound Flax module.

  Raises:
    ConfigError: `name` is not in `MODELS`.
  """
  validate.require(name in MODELS, field, f'one of {MODELS}', name)
  cls = {'flower_cnn': FlowerCNN, 'audit_cnn': AuditCNN,
         'alexnet_cifar': AlexNetCifar, 'resnet18_gn': ResNet18GN,
         'mlp': MLP}[name]
  if 'hidden' in kwargs:
    kwargs['hidden'] = tuple(kwargs['hidden'])
  return cls(num_classes=num_classes, **kwargs)
