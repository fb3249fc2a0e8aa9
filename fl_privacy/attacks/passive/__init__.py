"""Passive (honest-but-curious) membership attacks on recorded FL models.

`whitebox`: Nasr et al. (2019), the white-box attack PASTEL is judged by, and the loss threshold.
"""
