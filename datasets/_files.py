"""Atomic file writes (the one implementation; fedcf's model and checkpoint saves use it too)."""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path


def ram_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def fits_in_ram(nbytes: float) -> tuple[bool, float]:
    """(whether nbytes is within 80 % of the RAM, the RAM in GiB); unknown RAM: always fits."""
    total = ram_bytes()
    return (True, float("nan")) if total is None else (nbytes <= 0.8 * total, total / 2**30)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path, write) -> Path:
    """Call ``write(fh)`` on a new, uniquely named temporary file beside ``path``, flush it to
    disk and rename it over ``path``: readers see the old file or the whole new one, two writers
    never share a temporary file, and the temporary file is removed if anything fails (also on
    KeyboardInterrupt). A temporary file of the same target left by a writer that was killed
    (its process, on this host, is gone) is removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a saved file is not
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def _temp_prefix(path: Path, pid: int | None = None) -> str:
    """``.<name>.<host>.<pid>.``: whose temporary file it is, so a later write can tell a
    killed writer's leftover from a live writer's file."""
    return f".{path.name}.{_host()}.{os.getpid() if pid is None else pid}."


def _remove_stale_temporaries(path: Path) -> None:
    """Remove temporary files of ``path`` whose writer process on this host no longer runs
    (writers on other hosts sharing the folder are left alone)."""
    head = f".{path.name}.{_host()}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(head) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid = name[len(head):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:  # another writer cleaned it first
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
