"""What the parts of `flower_audit` share: the clients' model, the Flower engine the
deployments run on and where a deployment's job files go.
"""

from __future__ import annotations

import os

from fl_privacy import models as models_lib
from fl_privacy import validate


def make_model(config, train):
  """The clients' model: Flower's tutorial CNN ('SAME' convolutions on 8x8 digits) or an MLP
  with two hidden layers."""
  s = config.flower_audit
  if s.model == 'flower_cnn':
    validate.require(train.is_image, 'flower_audit.model', 'mlp on feature vectors',
                     s.model)
    return models_lib.FlowerCNN(train.num_classes, padding='SAME')
  return models_lib.make('mlp', train.num_classes, field='flower_audit.model',
                         hidden=tuple(int(h) for h in s.hidden))


def engine(config) -> str:
  """The Flower engine the deployments run on (`flower_audit.engine`)."""
  return str(config.flower_audit.get('engine', 'inprocess'))


def job_workdir(workdir: str | None, name: str) -> str | None:
  """Where a deployment's job, result and process logs go (`<workdir>/flower_jobs/<name>`)."""
  return None if workdir is None else os.path.join(workdir, 'flower_jobs', name)
