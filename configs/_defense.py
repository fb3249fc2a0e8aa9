"""The `defense` config section: the defense every client of an experiment runs.

Honoured by `experiments.dishonest_mia` (the client's FedAvg round trains with the defense's
hooks; the server observes the upload) and `experiments.ami` (the client applies the defense to
the batch it trains on: `none`, `mixup`, `augment`, `sampling`). The other experiments refuse
any defense but `none` here (FedMIA and PASTEL sweep their own, from the same specification),
and a command-line override of any other field of the section (exit 2): a field the run does
not read, as is a field the named defense does not read where the section is honoured
(`pipelines.base.defense_unused`).
A defense whose guarantee holds only against readers of the aggregate (`central_dp`,
`weak_dp`) is refused where the adversary is the server that reads each upload.

Every field, its default and its one rule come from `fl_privacy.defenses.registry.FIELDS`
(the same rules FedMIA's and PASTEL's defense sweeps use); `python -m configs digits` prints
them. Built by `fl_privacy.defenses.configure`; every results point's params carry `defense`
and the parameters the defense used (`defense_<field>`), and a DP defense's metrics carry
`dp_epsilon` with its `dp_unit`, `dp_relation` and `dp_adversary`.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from fl_privacy.defenses import registry


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `defense` section (the same for every dataset: defaults are each paper's values).

  Fields: `name` (one of `fl_privacy.defenses.NAMES`, default 'none') and each field of
  `fl_privacy.defenses.registry.FIELDS` read from the section, with its default; only the
  fields of the named defense are used. The DP defenses (`dp_sgd`, `update_dp`, `central_dp`,
  `weak_dp`) take `clip_norm` and `noise_multiplier`, or `target_epsilon` (then the accountant
  finds the noise multiplier for the declared unit, relation and adversary), `delta` and
  `accountant`; `dp_sgd_sampling` is 'poisson' (default, accounted exactly) or 'shuffle'.
  """
  del dataset, smoke
  s = ml_collections.ConfigDict()
  s.name = 'none'
  for name, field in registry.FIELDS.items():
    if not field.section:
      continue
    if field.default is None:
      # Optional fields keep their type for command-line overrides.
      s[name] = config_dict.placeholder(float if name == 'target_epsilon' else int)
    else:
      s[name] = field.default
  return s
