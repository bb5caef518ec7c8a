"""Where numba keeps its compiled kernels, so they are compiled once per machine, not once per run.

The quantizers are ``@njit(cache=True)``: numba writes the compiled machine code next to the source,
in the package's ``__pycache__``. A package installed read-only (system site-packages, a wheel in a
container image, a shared venv) has no writable ``__pycache__``; numba then compiles every kernel
again at each start (seconds for the K-quants), which dominates a small ``dflash-quantize`` run.
:func:`configure` points ``NUMBA_CACHE_DIR`` at a per-user cache (``$XDG_CACHE_HOME`` or
``~/.cache``/dflashkit/numba) in exactly that case. It must run before numba is imported (numba
reads the variable at import), and it never overrides a ``NUMBA_CACHE_DIR`` the user set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dflashkit" / "numba"


def configure(package_dir: str | os.PathLike[str]) -> str | None:
    """Set ``NUMBA_CACHE_DIR`` when ``package_dir``'s ``__pycache__`` cannot be written; returns the
    directory chosen (None: numba's default, next to the source, is usable or the user chose)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    pycache = Path(package_dir) / "__pycache__"
    target = pycache if pycache.is_dir() else Path(package_dir)
    if os.access(target, os.W_OK):
        return None
    cache = user_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # nowhere to cache: numba compiles in memory, as before
    os.environ["NUMBA_CACHE_DIR"] = str(cache)
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba already imported by someone else: it has read the variable
        config.CACHE_DIR = str(cache)
    return str(cache)
