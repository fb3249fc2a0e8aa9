"""Reconstructing clients' inputs from their uploads (issue 30, first pieces).

`metrics`: PSNR, SSIM and the one-to-one matching of recovered to true inputs; `analytic`:
one example recovered exactly through a dense layer with a bias; `imprint`: the imprint
layer of Fowl et al. (ICLR 2022), its bins and the recovery of the examples alone in a bin.
"""

from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics

__all__ = ['analytic', 'imprint', 'metrics']
