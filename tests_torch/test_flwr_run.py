"""`flwr run flower_torch_app` on a local deployment: one SuperLink, two SuperNodes, one round.

The same run config in process gives the same record (seeded torch and Opacus draws per
node and round): the deployment runs the app itself, not a stand-in. The simulation-mode
SuperLink runs the same command (docs/experiments/flower_torch.md measured it; left out
here for CI time).
"""

from __future__ import annotations

import numpy as np

from fl_privacy.flower.parts import torch_part


def test_flwr_run_on_a_local_deployment_matches_in_process(tmp_path):
  cfg = torch_part.run_config(**{'num-server-rounds': 1, 'grad-canaries': 32,
                                 'input-canaries': 8, 'seed': 1, 'canary-seed': 1})
  deployed = torch_part.run(cfg, 2, 'deployment', tmp_path)
  local = torch_part.run(cfg, 2, 'inprocess')
  assert deployed['errors'] == [] and len(deployed['test_accuracy']) == 2
  assert deployed['steps'].shape == local['steps'].shape and deployed['steps'].shape[0] > 0
  for k in ('test_accuracy', 'steps', 'upload', 'input_loss_upload', 'epsilon_rdp'):
    np.testing.assert_allclose(deployed[k], local[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_part_knows_the_apps_plants():
  from torch_audit_app import opacus_hooks  # pylint: disable=import-outside-toplevel
  from torch_audit_app import server_app  # pylint: disable=import-outside-toplevel
  assert torch_part.PLANTS == opacus_hooks.PLANTS
  assert torch_part.CLIENT_DP == server_app.CLIENT_DP
