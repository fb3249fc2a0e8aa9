"""A catalog of real, documented DP bugs of FL stacks, each beside its correct twin.

What `python -m experiments.dp_bugs` audits (fl_privacy/pipelines/dp_bugs.py). Statistical DP
testers (StatDP, DP-Sniper, Delta-Siege, DP-Auditorium) benchmark themselves on catalogs of
buggy mechanisms; this one holds the bugs FL deployments shipped, each reproduced through the
library it lives in (`bug_flower`: Flower's DP functions; `bug_opacus`, `bug_opacus_norm`:
Opacus, with the `torch` extra; `bug_own`: fl-privacy's own defenses, accountant and
sampler) and audited by the audit that fits its threat (`bug_audit`). Entries beyond the
reach of a black- or white-box audit stay here, marked out of reach, with the reason
(`OUT_OF_REACH`).

Adding a bug: a module-level `bug_entries.Entry` (or a function returning one) in any
importable module, named on the command line as `--config.dp_bugs.extra=module:attr`
(`load_extra`); its `build(variant, severity)` returns a `bug_entries.Game`, e.g. through
`bug_entries.numpy_game` around a Flower mod's functions or `bug_entries.jax_game`.
"""

from __future__ import annotations

import importlib
from typing import Callable

from fl_privacy.attacks.audit import bug_entries as be


def _no_claim(epsilon: float, unit: str, relation: str, stated_by: str
              ) -> Callable[[float | None], be.Claim]:
  return lambda s: be.Claim(epsilon, 1e-5, unit, relation, 'the server', 'none', stated_by)


OUT_OF_REACH = (
    be.Entry(
        'floating_point_sampler', 'textbook floating-point Laplace / Gaussian samplers: which '
        'doubles an output can be depends on the input, so the low-order bits of one release '
        'can reveal it exactly',
        'I. Mironov, "On Significance of the Least Significant Bits for Differential '
        'Privacy", ACM CCS 2012',
        'any sampler that adds float noise to a float (numpy, torch, jax, Flower, Opacus '
        'without secure_mode)', 'out of reach', _no_claim(1.0, 'record', 'add_remove',
                                                          'the mechanism\'s epsilon'), None,
        reach='our audits score a release by a projection of it, in float32 or float64 '
        'arithmetic: the leak is in which floats occur, not in their distribution over the '
        'reals; a bit-level distinguisher (Mironov 2012; Jin et al., "Are We There Yet? '
        'Timing and Floating-Point Attacks on Differential Privacy Systems", IEEE S&P 2022, '
        'arXiv:2112.05307) is not one of our games',
        verified='paper'),
    be.Entry(
        'non_cryptographic_generator', 'DP noise drawn from a non-cryptographic generator '
        '(Flower 1.42 draws from numpy\'s global MT19937 state): an adversary who learns the '
        'state (624 outputs, or the seed) predicts the noise and subtracts it',
        'flwr 1.42 supercore/differential_privacy.py add_gaussian_noise_inplace '
        '(np.random.normal); Opacus offers secure_mode (torchcsprng) for this reason',
        'Flower (flwr 1.42.0)', 'out of reach',
        _no_claim(1.0, 'client', 'zero_out', 'LocalDpMod epsilon argument'), None,
        reach='our audits treat the noise as ideal draws and never see the generator\'s '
        'state; a state-recovery attack on MT19937 is a cryptanalytic game, not a '
        'membership game on releases',
        verified='flwr 1.42 source read'),
)


def catalog(include_torch: bool = True) -> tuple[be.Entry, ...]:
  """Every entry, in table order: Flower, Opacus (listed even without torch: its rows say
  they were not run), our own stack, then the out-of-reach ones."""
  from fl_privacy.attacks.audit import bug_flower  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks.audit import bug_opacus  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks.audit import bug_opacus_norm  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks.audit import bug_own  # pylint: disable=g-import-not-at-top
  del include_torch
  return (bug_flower.entries() + bug_opacus.entries() + (bug_opacus_norm.entry(),)
          + bug_own.entries() + OUT_OF_REACH)


def names() -> tuple[str, ...]:
  return tuple(e.name for e in catalog())


def missing_extras(entry: be.Entry) -> tuple[str, ...]:
  """The extras `entry` needs that are not importable here ('torch': torch and opacus)."""
  modules = {'torch': ('torch', 'opacus'), 'flower': ('flwr',)}
  missing = []
  for extra in entry.needs:
    for m in modules.get(extra, (extra,)):
      try:
        importlib.import_module(m)
      except ImportError:
        missing.append(extra)
        break
  return tuple(missing)


class ExtraError(ValueError):
  """A `--config.dp_bugs.extra` spec that cannot be loaded (its message names why)."""


def load_extra(spec: str) -> be.Entry:
  """The entry `module:attr` names: an `Entry`, or a callable returning one."""
  if not isinstance(spec, str) or spec.count(':') != 1 or not all(spec.split(':')):
    raise ExtraError(f'{spec!r} is not module:attr')
  module_name, attr = spec.split(':')
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ExtraError(f'cannot import {module_name!r} ({e})') from None
  if not hasattr(module, attr):
    raise ExtraError(f'{module_name!r} has no {attr!r}')
  value = getattr(module, attr)
  if callable(value) and not isinstance(value, be.Entry):
    try:
      value = value()
    except TypeError as e:
      raise ExtraError(f'{spec} is neither an Entry nor a function of no arguments returning '
                       f'one ({e})') from None
  if not isinstance(value, be.Entry):
    raise ExtraError(f'{spec} is not a bug_entries.Entry (got {type(value).__name__})')
  if value.build is None:
    raise ExtraError(f'{spec} has no builder')
  return value
