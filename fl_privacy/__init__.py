"""fl-privacy: how much a federated-learning client's data leaks to the server, in JAX.

Layers (each imports only from those before it): `validate`, `catalog` (the one registration
of every experiment), `data`, `models`,
`mechanisms` (with `registry`, the one name -> mechanism dispatch), `fl` (the client protocol
and its hook points), `defenses` (every defense as client hooks, DP accounting with
dp-accounting), `eval`, `report` (results store, per-point `ArtifactStore` and `point_key`),
`attacks`, `pipelines`. See docs/ARCHITECTURE.md.
"""

__version__ = '0.1.0'
