"""The FedMIA pipeline's defenses (`fedmia.defenses`), from the defense registry.

Each defense of a training is built once per (defense, strength, E, K) by
`defenses.configured.sweep_point`, which gives its client hooks and its DP metrics (update_dp:
T rounds against the server, client-level, replace-one, `accounting.update_dp`).
"""

from __future__ import annotations

from fl_privacy import defenses

NAME = 'fedmia'
# The defenses FedMIA's Sect. 4.4 / Appendix A.2 sweeps (and quantisation, which its code has).
DEFENSES = ('update_noise', 'update_dp', 'sparsify', 'quantize', 'mixup', 'augment',
            'sampling', 'augment_sampling')


def validate_config(config) -> None:
  """`fedmia.defenses` and the fields its defenses share, by the defense registry's rules."""
  s = config.fedmia
  defenses.configured.validate_sweep(s.defenses, DEFENSES, 'fedmia.defenses')
  fields = defenses.registry.FIELDS
  fields['clip_norm'].rule.check('fedmia.dp_clip', s.dp_clip)
  fields['delta'].rule.check('fedmia.dp_delta', s.dp_delta)
  fields['augment_level'].rule.check('fedmia.augment_sampling_level', s.augment_sampling_level)
  fields['mixup_public_code'].rule.check('fedmia.mixup_public_code', s.mixup_public_code)
  defenses.check_honoured(config.defense, NAME, ('none',),
                          'FedMIA sweeps its own defenses in fedmia.defenses')


def defense_for(config, state, tr: dict) -> defenses.Configured:
  """The defense of training `tr` from the defense registry (hooks, and DP metrics), built
  once per training (update_dp: T rounds against the server, replace-one,
  `accounting.update_dp`)."""
  cache = state.setdefault('defenses', {})
  key = (tr['defense'], tr['defense_param'], tr['local_epochs'], tr['num_clients'])
  if key not in cache:
    s, train = config.fedmia, state['train']
    name, value = tr['defense'], tr['defense_param']
    setting = defenses.Setting(
        num_classes=int(train.num_classes),
        image_shape=train.x.shape[1:] if train.is_image else None,
        batch_size=int(s.batch_size), epochs=int(tr['local_epochs']),
        rounds=int(s.num_rounds), num_clients=int(tr['num_clients']))
    fixed = {'update_dp': {'clip_norm': float(s.dp_clip)},
             'mixup': {'public_code': bool(s.mixup_public_code)},
             'augment_sampling': {'level': int(s.augment_sampling_level)}}.get(name, {})
    cache[key] = defenses.configured.sweep_point(
        name, int(value) if name in ('quantize', 'augment') else value, setting,
        experiment=NAME, prefix='fedmia.defenses', fixed=fixed, delta=float(s.dp_delta))
  return cache[key]


