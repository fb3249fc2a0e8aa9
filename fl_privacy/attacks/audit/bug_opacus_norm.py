"""A BatchNorm layer inside Opacus 1.6.0's DP-SGD: per-example clipping no longer bounds one
example's influence (the `opacus_batchnorm` entry of the DP-bug catalog).

In training mode a BatchNorm layer normalises each example by its batch's mean and variance,
so one example's presence changes every other example's activations, and with them the
"per-sample" gradients Opacus computes and clips: the sum of clipped gradients moves by up to
(B + 1) C when one record is added, while the accountant assumes C. Opacus says so in the
message `ModuleValidator.validate` gives an affine BatchNorm ("BatchNorm makes each sample's
normalized value depend on its peers in a batch"); Opacus issue #308's maintainers named
BatchNorm as the root cause of a report (ffuuugor, 2022-04-27, as quoted in this project's
issue-50 notes, not re-read: "addressed in #340", which PR #353, "Add replace_bn_with_in
boolean flag to BatchNorm fix method", closes); PR #261 ("Enable validation for
GradSampleModule", 2021) added the GradSampleModule check for this reason ("wrong results
altogether (if there's something like `BatchNorm` is involved)").

What Opacus 1.6.0 allows (read in its source and checked by `checks`): the validators run only
on *trainable* submodules (`ModuleValidator.validate` iterates `trainable_modules`, and so does
`GradSampleModule`'s strict check), so a BatchNorm without trainable parameters (affine=False,
or its affine parameters frozen, as in fine-tuning) is never looked at: `validate` returns no
error, `GradSampleModule(strict=True)` and `PrivacyEngine.make_private` accept the model, and
`ModuleValidator.fix` leaves the BatchNorm in place. We found no upstream report of this gap
(two searches of Opacus's issues; #472 asks for BatchNorm with frozen running statistics,
i.e. in eval mode, which does not mix the batch): the entry is a class of bug reachable
through Opacus 1.6.0, not a reproduction of a filed one. An affine BatchNorm is refused
(`ShouldReplaceModuleError`), and forcing it through `GradSampleModule(strict=False)` fails in
1.6.0's functorch path ("This layer has buffers and is not supported by Opacus").

The game (one full-batch step, no sampling): the model is BatchNorm1d(1, affine=False) ->
Flatten -> Linear(2, 1) on inputs of shape (1, 2), wrapped in `GradSampleModule` and stepped
by Opacus's `DPOptimizer` (per-sample clip C, Gaussian noise z C, plain SGD at lr 1, loss
sum_i t_i f(x_i)). The B known records are zeros labelled -1, the canary (1, 0) labelled +1.
Without the canary the batch's variance is 0 and every gradient is 0; with it the known
records normalise to -1 / sqrt(2B + 1) each, so each known record's clipped gradient moves
by sqrt(2 / (2B + 1)) C along (1, 1): the update moves by about sqrt(B) C (4.7 C at B = 16;
`shift`), not C. The adversary knows everything but the noise: it replays the step without
noise in both worlds (the same Opacus path at z = 0) and scores the update's projection on the
difference, the optimal statistic of two Gaussians of one covariance. The twin is the same
model with the BatchNorm replaced by Opacus's own fixer (`ModuleValidator.FIXERS[BatchNorm1d]`:
GroupNorm, which normalises each example by itself), accounted the same way.
"""

from __future__ import annotations

import functools

import numpy as np

from fl_privacy.attacks.audit import bug_entries as be
from fl_privacy.attacks.audit import bug_opacus

DELTA = bug_opacus.DELTA
C = bug_opacus.C
Z = 2.0        # the noise multiplier: Opacus's RDPAccountant claims 2.17 for one step
LENGTH = 2     # each record is one channel of LENGTH values


def _model(fixed: bool):
  """BatchNorm1d(1, affine=False) -> Flatten -> Linear(LENGTH, 1) at zero weights; `fixed`:
  the BatchNorm replaced by Opacus's registered fixer (GroupNorm)."""
  import torch  # pylint: disable=g-import-not-at-top
  from opacus import GradSampleModule  # pylint: disable=g-import-not-at-top
  from opacus.validators import ModuleValidator  # pylint: disable=g-import-not-at-top
  norm = torch.nn.BatchNorm1d(1, affine=False)
  if fixed:
    norm = ModuleValidator.FIXERS[type(norm)](norm)
  lin = torch.nn.Linear(LENGTH, 1, bias=False)
  with torch.no_grad():
    lin.weight.zero_()
  # strict=True (the default): 1.6.0 accepts the affine-free BatchNorm (module docstring).
  return GradSampleModule(torch.nn.Sequential(norm, torch.nn.Flatten(), lin),
                          loss_reduction='sum'), lin


def _batch(known: int, present: bool):
  """The world's batch: `known` zero records labelled -1, the canary (1, 0) labelled +1."""
  rows = np.zeros((known + int(present), 1, LENGTH))
  labels = -np.ones(known + int(present))
  if present:
    rows[0, 0, 0], labels[0] = 1.0, 1.0
  return rows, labels


def _step(model, lin, optimizer, rows, labels) -> np.ndarray:
  """One Opacus step on the batch (loss sum_i t_i f(x_i)); the update w_before - w_after."""
  import torch  # pylint: disable=g-import-not-at-top
  w0 = lin.weight.detach().clone()
  optimizer.zero_grad()
  out = model(torch.as_tensor(rows, dtype=torch.float32)).reshape(-1)
  (out * torch.as_tensor(labels, dtype=torch.float32)).sum().backward()
  optimizer.step()
  u = (w0 - lin.weight.detach()).numpy().reshape(-1).astype(np.float64)
  with torch.no_grad():
    lin.weight.copy_(w0)
  return u


def _optimizer(model, z: float):
  import torch  # pylint: disable=g-import-not-at-top
  from opacus.optimizers import DPOptimizer  # pylint: disable=g-import-not-at-top
  return DPOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), noise_multiplier=z,
                     max_grad_norm=C, expected_batch_size=1, loss_reduction='sum')


@functools.lru_cache(maxsize=None)
def mean_updates(known: int, fixed: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The noiseless updates (canary in, canary out): the same Opacus path at z = 0."""
  with bug_opacus.torch_state():
    model, lin = _model(fixed)
    opt = _optimizer(model, 0.0)
    return tuple(tuple(_step(model, lin, opt, *_batch(known, p))) for p in (True, False))


def shift(known: int, fixed: bool) -> float:
  """||mean update in - mean update out|| / C: the step's real sensitivity to the canary."""
  m_in, m_out = (np.asarray(m) for m in mean_updates(int(known), bool(fixed)))
  return float(np.linalg.norm(m_in - m_out) / C)


def validator_checks(seed: int) -> dict:
  """What Opacus 1.6.0's validators say (the row's notes): errors for this model, for the
  same model with an affine BatchNorm and with that BatchNorm's parameters frozen, and
  whether `ModuleValidator.fix` left this model's BatchNorm in place."""
  del seed
  import torch  # pylint: disable=g-import-not-at-top
  from opacus.validators import ModuleValidator  # pylint: disable=g-import-not-at-top

  def net(affine):
    return torch.nn.Sequential(torch.nn.BatchNorm1d(1, affine=affine), torch.nn.Flatten(),
                               torch.nn.Linear(LENGTH, 1, bias=False))
  refused = ModuleValidator.validate(net(True))
  fixed = ModuleValidator.fix(net(False))
  frozen = net(True)
  frozen[0].requires_grad_(False)
  return {'opacus_validate_errors_this_model': len(ModuleValidator.validate(net(False))),
          'opacus_validate_errors_frozen_affine_batchnorm':
              len(ModuleValidator.validate(frozen)),
          'opacus_validate_errors_affine_batchnorm': len(refused),
          'opacus_validate_affine_error': type(refused[0]).__name__ if refused else '',
          'opacus_fix_keeps_batchnorm': float(isinstance(fixed[0], torch.nn.BatchNorm1d))}


def game(known: int, buggy: bool) -> be.Game:
  """The canary game of one Opacus step over the world's batch (module docstring)."""
  import torch  # pylint: disable=g-import-not-at-top
  fixed = not buggy
  model, lin = _model(fixed)
  opt = _optimizer(model, Z)
  m_in, m_out = (np.asarray(m) for m in mean_updates(int(known), fixed))
  direction = m_in - m_out

  def world(rng, present):
    torch.manual_seed(int(rng.integers(2**62)))
    u = _step(model, lin, opt, *_batch(int(known), present))
    return float(np.dot(u - m_out, direction))

  def play(seed, n):
    with bug_opacus.torch_state():
      return be.numpy_game(world, 'gaussian').play(seed, n)
  return be.Game(play, 'gaussian', checks=validator_checks)


def _claim(known) -> be.Claim:
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return be.Claim(bug_opacus.opacus_epsilon(Z, 1.0, 1), DELTA, 'record',
                  'add_remove', 'reads the step\'s update', 'none',
                  'opacus RDPAccountant (z, q = 1, 1 step)', dp_accounting.GaussianDpEvent(Z))


def entry() -> be.Entry:
  return be.Entry(
      'opacus_batchnorm', 'a BatchNorm layer mixes the batch: one record\'s presence moves '
      'every other record\'s clipped "per-sample" gradient, so the step\'s sensitivity is '
      'about sqrt(B) C, not C',
      'Opacus issue #308 (maintainer ffuuugor, 2022-04-27: "We\'ve identified the root cause: '
      'it\'s BatchNorm", addressed in #340, closed by PR #353 "Add replace_bn_with_in boolean '
      'flag to BatchNorm fix method"); PR #261 "Enable validation for GradSampleModule" '
      '(2021); Opacus 1.6.0 validators/batch_norm.py (the refusal\'s text). The affine-free '
      'gap in the validators: no upstream report found (a class of bug). Issue 50 of this '
      'project named #819 for BatchNorm: #819 is the normaliser (opacus_819)',
      bug_opacus.LIB + ': GradSampleModule (strict) + DPOptimizer over '
      'BatchNorm1d(affine=False): the validators see only trainable modules, so it passes',
      'mechanism audit', _claim, lambda v, b: game(int(b), v == 'bug'),
      lambda b: be.gaussian_epsilon(shift(int(b), False) / Z, DELTA),
      knob='known records B in the batch', severity=16, severities=(2, 8, 16, 64),
      milder='lower', needs=('torch',), trials=1000,
      reach='one full-batch step (no sampling); an affine BatchNorm is refused by '
      'ModuleValidator.validate (ShouldReplaceModuleError) and fails in GradSampleModule '
      '(strict=False) in 1.6.0, so the affine-free BatchNorm the validators never inspect is '
      'the path that runs (the row\'s opacus_validate_* checks)',
      verified='#308\'s comment as quoted in issue-50 notes (not re-read); PRs #353 and '
      '#261 read through the search tool; opacus 1.6.0 source read and its behaviour '
      'checked in this row')
