"""fl-privacy: how much a federated-learning client's data leaks to the server, in JAX.

Layers (each imports only from those before it): `validate`, `data`, `models`,
`mechanisms`, `fl`, `eval`, `report`, `attacks`. See docs/ARCHITECTURE.md.
"""

__version__ = '0.1.0'
