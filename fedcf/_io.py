"""Safe files: atomic writes of ``.npz`` archives and loads that name the file when it is bad."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from .datasets._files import atomic_write


def atomic_savez(path, arrays: dict, meta: dict, *, meta_key: str) -> Path:
    """Write ``arrays`` plus JSON ``meta`` to ``path`` atomically (``datasets._files.atomic_write``:
    readers see the old file or the whole new one; concurrent writers never share a temporary
    file; nothing is left behind when the write fails or is interrupted)."""
    payload = {meta_key: np.array(json.dumps(meta, default=_json_default)), **arrays}
    return atomic_write(path, lambda fh: np.savez(fh, **payload))


def load_npz(path, *, meta_key: str, what: str):
    """(arrays, meta) from a file written by ``atomic_savez``; a missing, truncated, empty or
    foreign file raises ValueError naming the path (FileNotFoundError when it does not exist)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    if path.is_file():
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head and head != b"PK\x03\x04":  # every .npz is a zip archive
            raise ValueError(f"{str(path)!r} is not a readable fedcf {what} file: a {what} file is a "
                             f".npz (zip) archive and this one starts with {head!r} — a data "
                             "file or something else passed in its place?")
    try:
        with np.load(path, allow_pickle=False) as z:
            if meta_key not in z.files:
                raise ValueError(f"it has no {meta_key!r} entry")
            meta = json.loads(str(z[meta_key]))
            arrays = {k: z[k] for k in z.files if k != meta_key}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, KeyError) as exc:
        raise ValueError(f"{str(path)!r} is not a readable fedcf {what} file (empty, truncated or "
                         f"written by something else: {exc}); restore it or write it again"
                         ) from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{str(path)!r} is not a fedcf {what} file: its metadata is not a dict")
    return arrays, meta


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
