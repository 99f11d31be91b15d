"""Where Numba keeps fedcf's compiled kernels: a per-user cache folder, never the package folder.

By default Numba writes its cache next to the source file (``site-packages/fedcf/_kernels/
__pycache__``). Files written there after installation are unknown to pip: ``pip uninstall``
leaves a ``site-packages/fedcf`` folder behind, and Python then imports that leftover folder as an
empty namespace package in place of a later editable install. So unless the user chose a cache
folder (``NUMBA_CACHE_DIR``), fedcf points Numba at ``$FEDCF_NUMBA_CACHE``, else
``$XDG_CACHE_HOME/fedcf/numba``, else ``~/.cache/fedcf/numba``. This module must be imported
before the kernel modules (``fedcf/_kernels/__init__.py`` does). It also asks OpenMP for passive
waiting (``_passive_threads``).

The cache is kept tidy (``tidy``): Numba names each cached module's folder by a hash of its
source folder and never removes anything, so every uninstalled copy, deleted checkout or edited
kernel used to leave its compiled code behind (hundreds of MB over a few installs). When fedcf
first loads kernels from a source folder it has not seen in this state, it removes the folders
of source folders that no longer exist and the entries of kernels edited since they were cached.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

NOTE = "fedcf-source"  # in each kernel folder of the cache: the source folder it was built from
UNKNOWN_AGE = 30 * 86400  # a folder without a note (older fedcf) is removed once this old


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
    try:
        tidy(path, Path(__file__).resolve().parent / "_kernels")
    except OSError:  # a cache we cannot tidy only costs disk space
        pass


def _folder(root: Path, sources: Path) -> Path:
    """The folder where Numba caches the kernels of ``sources`` (its own naming rule)."""
    from numba.core.caching import _CacheLocator

    return root / _CacheLocator.get_suitable_cache_subpath(str(sources / "x.py"))


def _state(sources: Path) -> str:
    files = sorted(sources.glob("*.py"))
    return "\n".join([str(sources)] + [f"{f.name} {f.stat().st_mtime_ns} {f.stat().st_size}"
                                       for f in files])


def tidy(root: Path, sources: Path) -> bool:
    """Remove from the cache ``root`` what no fedcf can load any more: the kernel folders of
    source folders that are gone (or, written by an older fedcf without a note, untouched for
    30 days), and in ``sources``' own folder the entries of kernel files edited since. Runs only
    when ``sources`` changed since the last tidy (one small read otherwise); returns whether it
    ran. Safe beside other processes: it touches nothing a live source folder can load."""
    own, state = _folder(root, sources), _state(sources)
    note = own / NOTE
    if note.is_file() and note.read_text() == state:
        return False
    for folder in root.glob(f"{sources.name}_*"):
        if folder != own and folder.is_dir() and _orphaned(folder):
            shutil.rmtree(folder, ignore_errors=True)
    for index in own.glob("*.nbi"):
        src = sources / f"{index.name.split('.', 1)[0]}.py"
        if not src.exists() or src.stat().st_mtime_ns > index.stat().st_mtime_ns:
            for f in [index, *own.glob(f"{index.name[:-len('nbi')]}*.nbc")]:
                f.unlink(missing_ok=True)
    own.mkdir(parents=True, exist_ok=True)
    tmp = own / f".{NOTE}.{os.getpid()}"
    tmp.write_text(state)
    os.replace(tmp, note)
    return True


def _orphaned(folder: Path) -> bool:
    note = folder / NOTE
    if note.is_file():
        return not Path(note.read_text().split("\n", 1)[0]).is_dir()
    newest = max((f.stat().st_mtime for f in folder.iterdir()), default=0.0)
    return time.time() - newest > UNKNOWN_AGE


def _passive_threads() -> None:
    """OpenMP workers that sleep when idle instead of spinning: with the default (active)
    wait, a parallel kernel's workers spin while their partner is descheduled, and fedcf on a
    machine shared with other busy processes ran several times slower. Set before the OpenMP
    runtime loads (at the first parallel kernel); a value the user chose is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_passive_threads()
_configure()
