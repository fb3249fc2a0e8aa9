"""Reconstructing clients' inputs from their uploads (issue 30).

`imprint`: the imprint block of Fowl et al. (ICLR 2022) put in front of any of our Flax models
(`inject`), crafted by the server (`craft`) and read from one upload (`recover_update`);
`analytic`: one example recovered exactly through a dense layer with a bias (Phong et al.
2018); `inversion`: Geiping et al.'s cosine + total-variation optimisation (NeurIPS 2020) and
iDLG labels; `game`: one trial (server model, the client's real round, the attack) for
`eval.runner.run_trials`; `metrics`: PSNR, SSIM, the one-to-one matching, per-trial scores and
a point's rates with their intervals; `value_grid`: the data's known values and recoveries
rounded to them; `paired`: two servers' per-client difference and its interval (issue 49).
"""

from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import game
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.attacks.reconstruction import paired
from fl_privacy.attacks.reconstruction import value_grid

__all__ = ['analytic', 'game', 'imprint', 'inversion', 'metrics', 'paired', 'value_grid']
