"""Where Numba keeps fedcf's compiled kernels: a per-user cache folder, never the package folder.

By default Numba writes its cache next to the source file (``site-packages/fedcf/_kernels/
__pycache__``). Files written there after installation are unknown to pip: ``pip uninstall``
leaves a ``site-packages/fedcf`` folder behind, and Python then imports that leftover folder as an
empty namespace package in place of a later editable install. So unless the user chose a cache
folder (``NUMBA_CACHE_DIR``), fedcf points Numba at ``$FEDCF_NUMBA_CACHE``, else
``$XDG_CACHE_HOME/fedcf/numba``, else ``~/.cache/fedcf/numba``. This module must be imported
before the kernel modules (``fedcf/__init__.py`` does).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("FEDCF_NUMBA_CACHE"):
        return Path(os.environ["FEDCF_NUMBA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedcf" / "numba"


def _configure() -> None:
    import numba.core.config as config

    if os.environ.get("NUMBA_CACHE_DIR") or config.CACHE_DIR:
        return  # the user chose; respect it
    path = cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # unwritable home: Numba falls back to its own user-wide cache locator
    config.CACHE_DIR = str(path)


_configure()
