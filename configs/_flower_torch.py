"""The `flower_audit.torch` config section: the PyTorch + Opacus Flower App audited per record.

Read by the `torch` part of `python -m experiments.flower_audit`
(`--config.flower_audit.parts='("torch",)'`; needs `pip install -e '.[torch]'`), which runs
`flower_torch_app/` once per setting on `flower_audit.engine` ('inprocess': the app's
ServerApp and ClientApp on fl_privacy's in-process grid; 'deployment' / 'simulation': `flwr
run flower_torch_app` on a local SuperLink with SuperNodes, or on a simulation-mode
SuperLink) and audits each run's record (`fl_privacy.flower.parts.torch_part`,
`fl_privacy.flower.audits.opacus_record`). Expected results: docs/experiments/flower_torch.md.
"""

from __future__ import annotations

import ml_collections

PLANTS = ('none', 'noise_mismatch', 'no_poisson', 'batch_mean_clip', 'batchnorm')


def _setting(plant: str = 'none', target_epsilon: float = 2.0, grad_canaries: int = 512,
             input_canaries: int = 64, plant_factor: float = 0.25, client_dp: str = 'none',
             client_canaries: int = 0, client_dp_noise: float = 1.0
             ) -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.client_dp = client_dp
  s.client_canaries = int(client_canaries)
  s.client_dp_noise = float(client_dp_noise)
  s.plant = plant
  s.target_epsilon = float(target_epsilon)
  s.grad_canaries = int(grad_canaries)
  s.input_canaries = int(input_canaries)
  s.plant_factor = float(plant_factor)
  return s


def section(smoke: bool) -> ml_collections.ConfigDict:
  """The `flower_audit.torch` section.

  Fields:
    num_nodes: Flower nodes (SuperNodes); node 0 holds the canaries: 2.
    num_rounds: FedAvg rounds, one local epoch each (5; smoke 2).
    batch_size, learning_rate: each node's Opacus DP-SGD (64: 16 steps a round on its 719
      digits plus its IN canaries; plain SGD at 2.0).
    delta: Opacus's target delta (1e-5).
    confidence: family-wise confidence of each setting's verdict (0.95).
    settings: name -> `plant` (one of 'none', 'noise_mismatch', 'no_poisson',
      'batch_mean_clip', 'batchnorm'), `target_epsilon` (> 0: the node picks Opacus's noise
      for it over its whole training), `grad_canaries` and `input_canaries` (>= 0; both 0:
      the app without canaries, utility only), `plant_factor` (noise_mismatch: optimizer
      noise = factor x the accounted); client level: `client_dp` ('none', 'server_fixed':
      Flower's server-side fixed-clipping wrapper at clip 1 with its own RDP accountant,
      'local_dp': LocalDpMod), `client_dp_noise` (the wrapper's z) and `client_canaries`
      (canary SuperNodes beside the real nodes, the vendored in-app canaries, audited by
      `audits.user_app`; 0: none). Default: claims 2 and 8 without a plant, the app
      without canaries at claim 2, and the four plants at claim 2 (noise_mismatch at 0.25x
      and 0.1x). Smoke: claim 1 without a plant, noise_mismatch at 0.1x and batchnorm, on
      256 gradient and 16 input-space canaries.
  """
  s = ml_collections.ConfigDict()
  s.num_nodes = 2
  s.num_rounds = 2 if smoke else 5
  s.batch_size = 64
  s.learning_rate = 2.0
  s.delta = 1e-5
  s.confidence = 0.95
  d = ml_collections.ConfigDict()
  if smoke:
    # Claim 1 (not 2): 256 canaries over 2 rounds certify at most about 2.5, and a verdict
    # must not sit at the claim.
    d.eps1 = _setting(target_epsilon=1.0, grad_canaries=256, input_canaries=16)
    d.noise_mismatch_0_1 = _setting('noise_mismatch', target_epsilon=1.0, grad_canaries=256,
                                    input_canaries=16, plant_factor=0.1)
    d.batchnorm = _setting('batchnorm', target_epsilon=1.0, grad_canaries=256,
                           input_canaries=16)
  else:
    d.eps2 = _setting()
    d.eps8 = _setting(target_epsilon=8.0)
    d.eps2_no_canaries = _setting(grad_canaries=0, input_canaries=0)
    d.noise_mismatch_0_25 = _setting('noise_mismatch')
    d.noise_mismatch_0_1 = _setting('noise_mismatch', plant_factor=0.1)
    d.no_poisson = _setting('no_poisson')
    d.batch_mean_clip = _setting('batch_mean_clip')
    d.batchnorm = _setting('batchnorm')
    # Client level: Flower's server-side fixed clipping (z 1) around the torch app, 64 canary
    # SuperNodes beside the 2 real nodes, no record-level canaries.
    d.client_server_fixed = _setting(grad_canaries=0, input_canaries=0,
                                     client_dp='server_fixed', client_canaries=64)
  s.settings = d
  return s
