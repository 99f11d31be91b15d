#!/usr/bin/env python
"""How long the test suite takes: README's test command (``python -m pytest -q``) run from this
checkout on an idle machine, then beside ``--hogs`` CPU-bound processes (what a shared CI
machine does to it), with the wall time, pytest's own summary and the line in which the test
processes report the Numba kernels they compiled (``tests/conftest.py``; the session's warm-up
compiles the rest ahead of them, in two worker processes). Machines differ from day to day, so
each run also times a reference workload on the idle machine: ``busy_benchmark.py``'s idle fit
(FedRecon with ALS reconstruction, 500 rounds, all cores; the median of three after one that
loads its kernels), so two measurements can be read side by side.

Example: python scripts/suite_time.py --json eval/results/suite.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedcf.provenance import run_meta, write_json

ROOT = Path(__file__).resolve().parents[1]
HOG = "while True:\n    pass\n"


def run_suite(pytest_args: list[str], hogs: int, timeout: float, cold: bool = False) -> dict:
    """One run of the suite beside ``hogs`` busy processes (stopped afterwards, also on
    failure); ``cold``: with an empty Numba cache of its own (as a fresh clone has), so the
    session's warm-up first compiles every code path's kernels — inside the wall time, outside
    pytest's."""
    busy = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    cache = tempfile.TemporaryDirectory(prefix="fedcf-suite-cache-") if cold else None
    env = {**os.environ, **({"FEDCF_NUMBA_CACHE": cache.name} if cache else {})}
    try:
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=ROOT,
                             capture_output=True, text=True, timeout=timeout, env=env)
        seconds = time.perf_counter() - t0
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if cache is not None:
            cache.cleanup()
    lines = res.stdout.splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "")
    compiled = next((ln for ln in lines if ln.startswith("fedcf: ") and "Numba" in ln), "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    pytest_s = re.search(r" in ([\d.]+)s", summary)
    return {"hogs": hogs, "cold": cold, "returncode": res.returncode, "wall_seconds": seconds,
            "pytest_seconds": float(pytest_s.group(1)) if pytest_s else None,
            "summary": summary.strip("= "), "compiled": compiled,
            "failures": [ln.split(" ", 2)[1] for ln in lines if ln.startswith(("FAILED ", "ERROR "))],
            **counts}


def reference_seconds(rounds: int) -> float:
    """Median seconds of busy_benchmark.py's idle fit with ``rounds`` rounds (fresh processes,
    after one that loads or compiles its kernels)."""
    spec = importlib.util.spec_from_file_location("busy_benchmark",
                                                  ROOT / "scripts" / "busy_benchmark.py")
    busy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(busy)
    size, cores = (943, 1682, 100_000, rounds), os.cpu_count() or 1
    busy.fit_seconds("default", "als", cores, size)
    return statistics.median(busy.fit_seconds("default", "als", cores, size)["seconds"]
                             for _ in range(3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 2],
                    help="runs to make, by the number of CPU-bound neighbours (0: idle)")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--cold", action="store_true",
                    help="each run with an empty Numba cache of its own, as a fresh clone")
    ap.add_argument("--reference-rounds", type=int, default=500,
                    help="rounds of the reference fit timed once per invocation (0: none)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (default: "
                    "none, the README command)")
    args = ap.parse_args(argv)
    if any(h < 0 for h in args.hogs) or args.timeout <= 0 or args.reference_rounds < 0:
        ap.error(f"--hogs takes counts >= 0 (got {args.hogs}), --timeout seconds > 0 (got "
                 f"{args.timeout}) and --reference-rounds a count >= 0 (got "
                 f"{args.reference_rounds})")
    reference = reference_seconds(args.reference_rounds) if args.reference_rounds else None
    if reference is not None:
        print(f"reference fit ({args.reference_rounds} rounds): {reference:.2f} s", flush=True)
    rows = []
    for hogs in args.hogs:
        r = run_suite(args.pytest_args, hogs, args.timeout, args.cold)
        rows.append({**r, "reference_fit_seconds": reference})
        print(f"{hogs} CPU-bound neighbours: {r['wall_seconds'] / 60:.1f} min, "
              f"{r['summary']}; {r['compiled']}", flush=True)
    if args.json:
        meta = {**run_meta("suite_time.py", argv), "settings": vars(args)}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "suite_time.py")
