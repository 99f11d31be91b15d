"""Where Numba keeps fedcf's compiled kernels: a per-user cache folder, never the package folder.

By default Numba writes its cache next to the source file (``site-packages/fedcf/_kernels/
__pycache__``). Files written there after installation are unknown to pip: ``pip uninstall``
leaves a ``site-packages/fedcf`` folder behind, and Python then imports that leftover folder as an
empty namespace package in place of a later editable install. So unless the user chose a cache
folder (``NUMBA_CACHE_DIR``), fedcf points Numba at ``$FEDCF_NUMBA_CACHE``, else
``$XDG_CACHE_HOME/fedcf/numba``, else ``~/.cache/fedcf/numba``. This module must be imported
before the kernel modules (``fedcf/_kernels/__init__.py`` does). It also asks OpenMP for passive
waiting (``_passive_threads``).
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


def _passive_threads() -> None:
    """OpenMP workers that sleep when idle instead of spinning: with the default (active)
    wait, a parallel kernel's workers spin while their partner is descheduled, and fedcf on a
    machine shared with other busy processes ran several times slower. Set before the OpenMP
    runtime loads (at the first parallel kernel); a value the user chose is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_passive_threads()
_configure()
