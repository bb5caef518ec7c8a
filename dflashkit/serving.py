"""The old import path of `dflashkit.accept.serving` (τ, speed-up and identical output through llama-server),
kept because users and benchmarks import ``dflashkit.serving``."""

import sys

from .accept import serving

sys.modules[__name__] = serving  # the very module: its names, and a monkeypatch reaches the code that uses them
