"""pytest collection of the library's doctests (`--doctest-modules` over `fl_privacy`).

`fl_privacy/flower/` needs the optional Flower extra (`pip install -e '.[flower]'`, also in
`.[test]` and `.[dev]`); without Flower installed its modules are not collected, instead of
failing the collection of the whole suite with the package's ImportError.
"""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec('flwr') else ['flower']
