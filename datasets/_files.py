"""Atomic file writes (the one implementation; fedcf's model and checkpoint saves use it too)."""

from __future__ import annotations

import os
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
    KeyboardInterrupt)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
