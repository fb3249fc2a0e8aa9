"""What a server recovers of a client's inputs: imprint, analytic and inversion attacks.

The dishonest server sends a model with the imprint block of Fowl et al. (ICLR 2022) in front
(bins on the mean brightness, set from the public split) and reads the client's examples from
one upload; the honest-but-curious server reads a one-example upload through the first dense
layer (Phong et al. 2018) or inverts the upload by optimisation (Geiping et al., NeurIPS 2020,
labels by iDLG). Each client trains one FedAvg round through `fl.local.client_update` (B, J
minibatches, E epochs, SGD) under the `defense` section, then under every swept defense
(`reconstruction.defenses`, three strengths each, epsilon labels, utility beside).

  python -m experiments.reconstruction                                   # digits, <= 6 min
  python -m experiments.reconstruction --config=configs/digits.py:smoke  # seconds (CI)
  python -m experiments.reconstruction --config.reconstruction.attacks="('imprint',)"
  python -m experiments.reconstruction --config.defense.name=update_noise --config.defense.sigma=1e-3
  python -m experiments.reconstruction --config=configs/cifar10.py       # colour images, GPU

Writes, beside results.json: `reconstructions.png` (true vs recovered images per attack),
`defenses.png` (fraction recovered vs strength, with intervals and utility), `batch.png`
(exact recovery vs B, J, E), `table.md` and `images.json`.
Code: fl_privacy/pipelines/reconstruction.py, fl_privacy/attacks/reconstruction/.
Fields: configs/_reconstruction.py. Expected results: docs/experiments/reconstruction.md.
"""

from __future__ import annotations

import os

# On CPU this experiment is compile-bound: dozens of small programs (one per client shape and
# defense strength), each running its trials in under a second. XLA's backend optimisation
# level 0 compiles them about 2.5x faster (measured: the smoke run 2m11 -> 1m04 with the
# runner's one-trial groups); outcomes agree (the same numbers to 3 decimals). Set before JAX
# starts; a flag the user gives wins.
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()

from experiments import common  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  common.run('reconstruction')
