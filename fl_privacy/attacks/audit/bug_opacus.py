"""DP bugs of Opacus (1.6.0, the `torch` extra), reproduced through Opacus's own optimizers.

The model is `GradSampleModule(nn.Linear(d, 1, bias=False))` with the loss sum(w . x), so an
example's per-sample gradient is its feature vector x (a Dirac canary when x = 2C e_1, the
known examples C e_2): Opacus's real `DPOptimizer` / `AdaClipDPOptimizer` clip, noise, count
and normalise it. One optimizer step per game with plain SGD at lr 1, so the release (the
parameter update) is the step's noisy gradient exactly as Opacus computes it. Each game seeds
torch's global generator (Opacus draws its noise there without `secure_mode`) from its own
numpy generator; the caller's torch state is restored afterwards.

- `opacus_571` / `opacus_819`: `expected_batch_size = int(len(dataset) * sample_rate)`
  (opacus 1.6.0 privacy_engine.py line 441) is computed from the private dataset's size, so
  the normaliser of the noisy sum differs between neighbouring datasets when N q crosses an
  integer (#571: tiny datasets; #819: the leak grows with the output dimension, every
  coordinate's noise being scaled by it). Twin: the normaliser of the public N.
- `opacus_adaclip_accounting`: `AdaClipDPOptimizer` adds the gradient noise at
  z' = (z^-2 - (2 sigma_b)^-2)^-1/2 > z (Andrew et al. 2021, Theorem 1); 1.6.0 keeps z where
  the accountant reads it, while earlier code (as quoted in Opacus issue #757, 2025) assigned
  z' to `self.noise_multiplier`, which the accountant's step hook reads (in 1.6.0; that the
  earlier hook read the same attribute is inferred, not read), so the
  accountant composed less privacy loss than the round (gradient + noisy unclipped count)
  spends. Reproduced as a subclass that stores z' where `step_hook` reads it.

The BatchNorm entry is `bug_opacus_norm`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator

import numpy as np

from fl_privacy.attacks.audit import bug_entries as be

DELTA = 1e-5
C = 1.0
LIB = 'Opacus 1.6.0 (torch extra)'


@contextlib.contextmanager
def torch_state() -> Iterator[None]:
  """The caller's torch generator state restored afterwards; one intra-op thread meanwhile
  (the games' tensors are a few floats: threads only contend with JAX's)."""
  import torch  # pylint: disable=g-import-not-at-top
  state = torch.random.get_rng_state()
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.random.set_rng_state(state)
    torch.set_num_threads(threads)


def _model(dim: int):
  import torch  # pylint: disable=g-import-not-at-top
  from opacus import GradSampleModule  # pylint: disable=g-import-not-at-top
  lin = torch.nn.Linear(dim, 1, bias=False)
  with torch.no_grad():
    lin.weight.zero_()
  return GradSampleModule(lin)


def _step(model, optimizer, rows) -> np.ndarray:
  """One Opacus step on `rows` [n, d]; the update w_before - w_after (lr 1)."""
  import torch  # pylint: disable=g-import-not-at-top
  w0 = model._module.weight.detach().clone()  # pylint: disable=protected-access
  optimizer.zero_grad()
  loss = model(torch.as_tensor(rows, dtype=torch.float32)).sum()
  loss.backward()
  optimizer.step()
  w1 = model._module.weight.detach().clone()  # pylint: disable=protected-access
  with torch.no_grad():
    model._module.weight.copy_(w0)  # pylint: disable=protected-access
  return (w0 - w1).numpy().reshape(-1).astype(np.float64)


def opacus_epsilon(z: float, q: float, steps: int) -> float:
  from opacus.accountants import RDPAccountant  # pylint: disable=g-import-not-at-top
  acc = RDPAccountant()
  acc.history = [(float(z), float(q), int(steps))]
  return float(acc.get_epsilon(DELTA))


# -------------------------------------------------- the private normaliser (#571, #819) ---

KNOWN = 3      # the known examples of the out-world dataset (C e_2 each)
RATE = 0.5     # Poisson sampling rate q
Z = 1.0


def ebs(num_examples: int, rate: float) -> int:
  """Opacus 1.6.0's expected batch size (privacy_engine.py line 441), from a dataset size."""
  return int(num_examples * rate)


def normaliser_game(dim: int, buggy: bool) -> be.Game:
  """One Poisson step of DPOptimizer over the dataset of the world (KNOWN examples, + the
  canary in the in-world); the normaliser from that dataset's size (bug) or from the public
  KNOWN (twin). Score: minus the squared norm of the update's coordinates other than e_2
  (their noise is scaled by 1 / normaliser), plus the canary coordinate."""
  import torch  # pylint: disable=g-import-not-at-top
  from opacus.optimizers import DPOptimizer  # pylint: disable=g-import-not-at-top
  model = _model(dim)
  known = np.zeros((KNOWN, dim))
  known[:, 1] = C
  canary = np.zeros((1, dim))
  canary[0, 0] = 2.0 * C
  opts = {p: DPOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), noise_multiplier=Z,
                         max_grad_norm=C,
                         expected_batch_size=ebs(KNOWN + int(p) if buggy else KNOWN, RATE),
                         loss_reduction='mean') for p in (True, False)}

  def world(rng, present):
    torch.manual_seed(int(rng.integers(2**62)))
    rows = np.concatenate([canary, known]) if present else known
    take = rng.random(len(rows)) < RATE   # Poisson sampling of the step's batch
    opt = opts[present]
    batch = rows[take] if take.any() else np.zeros((0, dim))
    if len(batch) == 0:   # an empty Poisson batch: Opacus releases noise / normaliser
      batch = np.zeros((1, dim))
    u = _step(model, opt, batch)
    return float(u[0] - np.sum(u[1:] ** 2))

  def play(seed, n):
    with torch_state():
      return be.numpy_game(world, 'other').play(seed, n)
  event = _poisson_event(RATE, Z)
  return be.Game(play, 'other', event=event)


def _poisson_event(q, z):
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return dp_accounting.PoissonSampledDpEvent(float(q), dp_accounting.GaussianDpEvent(float(z)))


def _normaliser_claim(s) -> be.Claim:
  return be.Claim(opacus_epsilon(Z, RATE, 1), DELTA, 'record', 'add_remove',
                  'reads the step\'s update', 'poisson', 'opacus RDPAccountant (z, q, steps)',
                  _poisson_event(RATE, Z))


def _true_normaliser(dim):
  return None


# ------------------------------------------------- adaptive clipping (pre-fix, #757) ---

ADA_Z = 1.0


@functools.lru_cache(maxsize=None)
def _adaclip_class():
  from opacus.optimizers import AdaClipDPOptimizer  # pylint: disable=g-import-not-at-top

  class PreFixAdaClip(AdaClipDPOptimizer):
    """AdaClipDPOptimizer with the multiplier the accountant reads set to the adjusted z'
    (the noise actually added to the gradient), as before Opacus kept z for accounting."""

    def add_noise(self):
      super().add_noise()
      self.noise_multiplier = (self.noise_multiplier ** (-2)
                               - (2 * self.unclipped_num_std) ** (-2)) ** (-0.5)
  return PreFixAdaClip


def _adaclip_optimizer(model, cls, z, sigma_b):
  import torch  # pylint: disable=g-import-not-at-top
  return cls(torch.optim.SGD(model.parameters(), lr=1.0), noise_multiplier=z,
             target_unclipped_quantile=0.5, clipbound_learning_rate=0.2, max_clipbound=100.0,
             min_clipbound=1e-3, unclipped_num_std=sigma_b, max_grad_norm=C,
             expected_batch_size=1, loss_reduction='sum')


@functools.lru_cache(maxsize=None)
def accounted_multiplier(ratio: float) -> float:
  """What the accountant's `step_hook` reads after one step of the pre-fix subclass with
  sigma_b = ratio x z / 2: run it once and read `optimizer.noise_multiplier`."""
  with torch_state():
    model = _model(2)
    opt = _adaclip_optimizer(model, _adaclip_class(), ADA_Z, ratio * ADA_Z / 2)
    read = []
    opt.attach_step_hook(lambda o: read.append(float(o.noise_multiplier)))
    _step(model, opt, np.array([[2.0 * C, 0.0]]))
  return read[0]


def _twin_setting(target_mu: float) -> tuple[float, float]:
  """(z, sigma_b) of the shipped optimizer whose zero-out round (gradient at z' and the count
  at sigma_b, `adaclip_mu`) spends exactly `target_mu`: sigma_b = 20 z."""
  z = 1.0 / target_mu
  for _ in range(60):   # fixed point of mu(z, 20 z) = target
    z = z * adaclip_mu(z, 20.0 * z) / target_mu
  return z, 20.0 * z


def adjusted(z: float, sigma_b: float) -> float:
  """z' = (z^-2 - (2 sigma_b)^-2)^-1/2, the gradient noise AdaClipDPOptimizer adds."""
  return (z ** -2 - (2 * sigma_b) ** -2) ** -0.5


def adaclip_mu(z: float, sigma_b: float) -> float:
  """The Gaussian mu of the zero-out game's round: the gradient (shift C, noise z' C) and the
  unclipped count (shift 1, noise sigma_b) released together."""
  return math.sqrt(adjusted(z, sigma_b) ** -2 + sigma_b ** -2)


def adaclip_game(ratio: float, buggy: bool) -> be.Game:
  """One example a step: the canary 2C e_1 (clipped: not counted as unclipped) in the
  in-world, a null example (zero gradient: counted) in the out-world (zero-out). The
  adversary reads the update and the next clip bound, which gives the noisy count back;
  score: the Gaussian log-likelihood ratio of both."""
  import torch  # pylint: disable=g-import-not-at-top
  from opacus.optimizers import AdaClipDPOptimizer  # pylint: disable=g-import-not-at-top
  model = _model(2)
  if buggy:
    cls, z, sigma_b = _adaclip_class(), ADA_Z, ratio * ADA_Z / 2
  else:   # Opacus as shipped, configured so that the round spends the claim
    z, sigma_b = _twin_setting(be.gaussian_mu(_adaclip_claim(ratio).epsilon, DELTA))
    cls = AdaClipDPOptimizer
  z_grad = adjusted(z, sigma_b)
  opt = _adaclip_optimizer(model, cls, z, sigma_b)

  def world(rng, present):
    torch.manual_seed(int(rng.integers(2**62)))
    # A fresh round: the initial clip and multiplier (the subclass overwrites the latter).
    opt.max_grad_norm, opt.noise_multiplier = C, z
    u = _step(model, opt, np.array([[2.0 * C if present else 0.0, 0.0]]))
    # The next clip bound C exp(-lr (count / 1 - 1/2)) gives the noisy count back.
    count = 0.5 - math.log(float(opt.max_grad_norm) / C) / 0.2
    return float(u[0] / (z_grad ** 2 * C) - count / sigma_b ** 2)

  def play(seed, n):
    with torch_state():
      return be.numpy_game(world, 'gaussian').play(seed, n)
  return be.Game(play, 'gaussian')


def _adaclip_claim(ratio) -> be.Claim:
  return be.Claim(opacus_epsilon(accounted_multiplier(float(ratio)), 1.0, 1), DELTA,
                  'record', 'zero_out', 'reads the update and the clip bound', 'none',
                  'opacus RDPAccountant at the multiplier step_hook reads')


def entries() -> tuple[be.Entry, ...]:
  """The Opacus entries (built only where torch and opacus import)."""
  return (
      be.Entry(
          'opacus_571', 'DP-SGD normalises by int(len(dataset) * sample_rate), a function of '
          'the private dataset size: on tiny datasets the update\'s scale tells N from N + 1',
          'Opacus issue #571 "Privacy Leakage at low sample size" (T. Cebere, 2023: reported '
          '~1.2, audited ~2.5; A. Sablayrolles: the expected batch size leaks the '
          'cardinality)', LIB + ': DPOptimizer with privacy_engine.py\'s expected_batch_size',
          'mechanism audit', _normaliser_claim,
          lambda v, s: normaliser_game(2, v == 'bug'), _true_normaliser,
          needs=('torch',), trials=1000,
          verified='issue text read through the search tool'),
      be.Entry(
          'opacus_819', 'the same data-dependent normaliser, its leak growing with the output '
          'dimension (every coordinate\'s noise is rescaled)',
          'Opacus issue #819 "Potential mismatch between FEASGM-style normalization and '
          'SGM-based privacy accounting" (open, opened 2026-05-18; a fix is open as PR #838 '
          '"Fix mismatch between FEASGM-style normalization and SGM-based privacy '
          'accounting"; extends #571). Not BatchNorm (issue 50 of this project called #819 a '
          'BatchNorm report; its text is about the normaliser; BatchNorm: opacus_batchnorm)',
          LIB + ': DPOptimizer with privacy_engine.py\'s expected_batch_size',
          'mechanism audit', _normaliser_claim,
          lambda v, d: normaliser_game(int(d), v == 'bug'), _true_normaliser,
          knob='output dimension d', severity=64, severities=(2, 8, 64), milder='lower',
          needs=('torch',), trials=1000,
          verified='issue #819 text and PR #838\'s title and state read through the search '
          'tool'),
      be.Entry(
          'opacus_adaclip_accounting', 'adaptive clipping adds gradient noise at the adjusted '
          'z\' > z and the accountant composed z\', not z: the noisy unclipped count went '
          'unaccounted',
          'pre-fix code assigned the adjusted z\' to self.noise_multiplier, the attribute '
          'the accountant\'s step hook reads (the code as quoted in Opacus issue #757 '
          '"AdaClipDPOptimizer noise_multiplier and unclipped_num_std combination '
          'constraints", 2025-05-11); opacus 1.6.0 AdaClipDPOptimizer.add_noise: "the original '
          'noise_multiplier is preserved for privacy accounting". Not PR #779 ("Fix '
          'AdaClipOptimizer", 2025-08-08, closed: it converts unclipped_num to float before '
          'drawing its noise, a dtype fix); #807 not found; the fixing commit not '
          'identified. G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, '
          '"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, '
          'arXiv:1905.03871, Theorem 1',
          LIB + ': AdaClipDPOptimizer subclass (the pre-fix accounting)', 'mechanism audit',
          _adaclip_claim, lambda v, r: adaclip_game(float(r), v == 'bug'),
          lambda r: be.gaussian_epsilon(adaclip_mu(ADA_Z, r * ADA_Z / 2), DELTA),
          knob='sigma_b / (z / 2)', severity=1.1, severities=(1.1, 1.5, 3.0), milder='higher',
          needs=('torch',), trials=1000,
          verified='the pre-fix code as quoted in issue #757 (search tool); #779 read as a '
          'dtype fix; #807 not found; opacus 1.6.0 source read'),
  )
