#!/usr/bin/env python
"""What fedcf's install and its test extras bring into an environment: the distributions each
pulls in (its requirements, followed through the installed packages' metadata with their
environment markers) and their size on disk, measured in the environment the script runs in.

    python scripts/install_footprint.py --json eval/results/install.json
"""

from __future__ import annotations

import argparse
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str, extras=()) -> dict[str, metadata.Distribution]:
    """The installed distributions ``root[extras]`` needs, itself included, by canonical name.
    A requirement that is not installed is an error (the figure would be short)."""
    found, todo = {}, [(root, tuple(extras))]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is required but not installed here; install "
                             f"fedcf[{','.join(extras) or ''}] first") from None
        found[key] = dist
        for line in dist.requires or ():
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                if canonicalize_name(req.name) not in found or req.extras:
                    todo.append((req.name, tuple(req.extras)))
    return found


def size_bytes(dist: metadata.Distribution) -> int:
    total = 0
    for f in dist.files or ():
        try:
            total += dist.locate_file(f).stat().st_size
        except OSError:  # a listed file that is gone (e.g. a removed cache)
            pass
    return total


def footprint(extras=()) -> dict:
    dists = closure("fedcf", extras)
    dists.pop("fedcf")
    sizes = {k: size_bytes(d) for k, d in dists.items()}
    return {"extras": list(extras), "distributions": len(dists),
            "mib": sum(sizes.values()) / 2**20,
            "largest": sorted(((k, v / 2**20) for k, v in sizes.items()), key=lambda kv: -kv[1])[:5]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from fedcf.provenance import report_result, run_meta

    out = {"meta": run_meta("install_footprint.py", argv),
           "rows": [footprint(()), footprint(("test",))]}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "install_footprint.py", strict=True)
