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

from experiments import common

if __name__ == '__main__':
  common.run('reconstruction')
