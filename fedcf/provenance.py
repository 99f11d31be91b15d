"""Where a measured figure came from: the ``meta`` block every script writes into its JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata

import numpy as np

from .datasets._files import atomic_write


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def run_meta(script: str, argv=None, packages=()) -> dict:
    """Date, machine, versions (python, numpy, numba, fedcf and ``packages``) and the command."""
    args = [_relative(a) for a in (sys.argv[1:] if argv is None else list(argv))]
    versions = {p: _version(p) for p in ("numpy", "numba", "fedcf", *packages)}
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus, {platform.platform()}",
            "python": sys.version.split()[0], "numpy": versions["numpy"], "versions": versions,
            "command": " ".join([f"scripts/{script}", *args])}


def _relative(arg):
    """An absolute path inside the checkout the script runs from, shown relative to it (so the
    recorded command can be rerun from any clone)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0] or ".")))
    a = str(arg)
    if os.path.isabs(a) and a.startswith(root + os.sep):
        return os.path.relpath(a, root)
    return a


def write_json(path, obj) -> None:
    """Write a result JSON atomically (a crash never leaves half a file)."""
    text = json.dumps(obj, indent=2, default=_default) + "\n"
    atomic_write(path, lambda fh: fh.write(text.encode()))


def save_result(out: dict, path=None) -> dict:
    """A script's end: its result JSON written to ``path`` (if given) and named, returned."""
    if path:
        write_json(path, out)
        print(f"wrote {path}")
    return out


def report_result(out: dict, path=None) -> dict:
    """A script's end: its result JSON written to ``path`` (if given) and returned; what is
    printed is a short summary, the result's top-level figures (the whole result is in the
    file)."""
    if path:
        write_json(path, out)
    print(summary(out))
    print(f"wrote {path}" if path else "(--json FILE keeps the whole result)")
    return out


def summary(out: dict, width: int = 100) -> str:
    """One line per top-level number, flag or short text of a result, nested results and
    lists left to the file."""
    lines = []
    for key, value in out.items():
        if key == "meta":
            continue
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(value, float):
            lines.append(f"{key}: {value:.4g}")
        elif isinstance(value, (bool, int)) or (isinstance(value, str) and len(value) < width):
            lines.append(f"{key}: {value}")
        elif isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()) \
                and len(value) <= 6:
            lines.append(f"{key}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else
                                                 f"{k} {v}" for k, v in value.items()))
    return "\n".join(lines)


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
