"""PASTEL's DP baselines under a config: their accounting and the check, before any training,
that every target epsilon can be calibrated (`fl_privacy.pipelines.pastel` re-exports both)."""

from __future__ import annotations

from fl_privacy import validate
from fl_privacy.attacks.passive import pastel as passive_pastel
from fl_privacy.defenses import pastel_training

NAME = 'pastel'
DP_DEFENSES = ('wdp', 'ldp', 'cdp')


def dp_accounting(config, split: dict, defense: str, target_epsilon: float) -> dict:
  """`defenses.pastel_training.dp_accounting` of one DP baseline under this config's run."""
  return accounting_for(config, [len(m) for m in split['members']], defense, target_epsilon)


def accounting_for(config, members: list[int], defense: str, target_epsilon: float) -> dict:
  """`dp_accounting` for clients holding `members` rows each."""
  s = config.pastel
  setting = pastel_training.dp_setting(members,
                                       batch_size=int(s.batch_size), epochs=int(s.local_epochs),
                                       rounds=int(s.num_rounds))
  return pastel_training.dp_accounting(
      defense, target_epsilon, setting, clip_norm=s.clip_norm,
      update_clip_norm=s.update_clip_norm, ldp_sampling=s.ldp_sampling,
      delta=float(s.dp_delta), experiment=NAME, prefix='pastel')


def check_calibrations(config, num_train: int) -> None:
  """Every DP baseline calibrated to every target epsilon before any training (one the
  accountant cannot reach, e.g. 1e9, stopped the run after the undefended trainings). The
  members per client do not depend on the key (`attacks.passive.pastel.member_counts`)."""
  s = config.pastel
  members = passive_pastel.member_counts(num_train, int(s.num_clients),
                                         float(s.validation_fraction),
                                         None if s.per_client is None else int(s.per_client))
  for defense in (d for d in s.defenses if d in DP_DEFENSES):
    for eps in s.epsilons:
      try:
        accounting_for(config, members, defense, float(eps))
      except (validate.ConfigError, ValueError) as e:
        # The registry's target_epsilon may be None; an entry of pastel.epsilons may not.
        why = (e.allowed if isinstance(e, validate.ConfigError) else str(e)).removeprefix(
            'None or ')
        raise validate.ConfigError('pastel.epsilons', f'{why} ({defense} at epsilon {eps:g})',
                                   tuple(s.epsilons)) from None
