"""Every experiment reads a defense field through the defense registry's one rule.

FedMIA's defense sweep, PASTEL's DP baselines and the two audits name some registry fields
their own way (`fedmia.dp_clip` is `clip_norm`, `pastel.dp_delta` is `delta`). A bad value of
each must be refused with the registry rule's own text: a second rule written for the same field
(a different interval, a different message) fails here.
"""

from __future__ import annotations

import importlib

import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.defenses import registry

# (pipeline, config field, registry field, bad value, sequence of values?, other overrides)
ALIASES = [
    ('fedmia', 'fedmia.dp_clip', 'clip_norm', -1.0, False, {}),
    ('fedmia', 'fedmia.dp_delta', 'delta', 1.5, False, {}),
    ('fedmia', 'fedmia.augment_sampling_level', 'augment_level', 7, False, {}),
    ('pastel', 'pastel.dp_delta', 'delta', 1.0, False, {}),
    ('pastel', 'pastel.clip_norm', 'clip_norm', 0.0, False, {}),
    ('pastel', 'pastel.update_clip_norm', 'clip_norm', float('inf'), False, {}),
    ('pastel', 'pastel.ldp_sampling', 'dp_sgd_sampling', 'uniform', False, {}),
    ('pastel', 'pastel.epsilons', 'epsilon', (1.0, -2.0), True, {}),
    ('dp_audit', 'dp_audit.delta', 'delta', 0.0, False, {}),
    ('dp_audit', 'dp_audit.clip_norm', 'clip_norm', -1.0, False, {}),
    ('dp_audit', 'dp_audit.epsilons', 'epsilon', (0.0,), True, {}),
    ('ldp_audit', 'ldp_audit.clip_norm', 'clip_norm', 0.0, False, {}),
    ('ldp_audit', 'ldp_audit.epsilons', 'epsilon', (), True, {}),
    ('ldp_audit', 'ldp_audit.delta', 'delta', 1.0, False, {'mechanism': 'gaussian'}),
]


@pytest.mark.parametrize('module,field,registry_field,bad,sequence,overrides', ALIASES,
                         ids=[a[1] for a in ALIASES])
def test_alias_is_refused_with_the_registry_rule(module, field, registry_field, bad, sequence,
                                                 overrides):
  pipeline = importlib.import_module(f'fl_privacy.pipelines.{module}')
  config = digits.get_config('smoke')
  section, name = field.split('.')
  for k, v in overrides.items():
    config[section][k] = v
  pipeline.validate_config(config)  # the defaults pass
  config[section][name] = bad
  with pytest.raises(validate.ConfigError) as e:
    pipeline.validate_config(config)
  rule = registry.rule(registry_field)
  expected = f'non-empty, every item {rule.allowed}' if sequence else rule.allowed
  assert e.value.field == field
  assert e.value.allowed == expected


def test_each_accepts_what_the_rule_accepts_item_by_item():
  r = registry.each('epsilon')
  assert r.ok(1.0) and r.ok((1.0, 4.0)) and r.ok([0.5])
  assert not r.ok(()) and not r.ok((1.0, 0.0)) and not r.ok(float('inf'))
  assert r.allowed == 'non-empty, every item a finite number > 0'
