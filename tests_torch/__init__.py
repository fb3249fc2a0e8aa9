"""Tests of the PyTorch + Opacus Flower App (CI step of their own; needs the torch extra)."""
