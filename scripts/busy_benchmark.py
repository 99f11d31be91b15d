#!/usr/bin/env python
"""fedcf on a busy machine: the same FedRecon fit alone and beside CPU-bound neighbours, with
OpenMP's passive wait (fedcf's default: it sets ``OMP_WAIT_POLICY=PASSIVE``), with the variable
unset (OpenMP's own default: idle workers spin a while, then sleep) and with the active wait
(workers spin).

Each fit runs in a fresh process (the kernels' cache warm: a warm-up fit runs first) and reports
the seconds of ``fit`` alone; neighbours are processes that spin on one core each until the fit
ends. The ratio busy / idle of each wait policy is the figure: near 1 + neighbours / cores is
fair sharing; far above it is the workers spinning against descheduled partners.

    python scripts/busy_benchmark.py --json eval/results/busy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FIT = """
import json, os, sys, time
from fedcf import FedReconMF  # loads the kernels: fedcf sets its wait policy here
from fedcf.datasets import make_synthetic_ratings
{policy}  # before the first parallel kernel loads the OpenMP runtime
users, items, ratings, rounds = {size}
inter = make_synthetic_ratings(users, items, ratings, n_factors=8, random_state=0)
t0 = time.perf_counter()
FedReconMF(server_optimizer="sgd", early_stopping=None,
           n_factors=50, n_rounds=rounds, clients_per_round=100, random_state=0).fit(inter)
print(json.dumps(time.perf_counter() - t0))
"""
SPIN = "while True:\n    pass\n"


POLICIES = ("PASSIVE", "unset", "ACTIVE")  # unset: OpenMP's own default (spin, then sleep)


def fit_seconds(policy: str, size: tuple) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    line = 'os.environ.pop("OMP_WAIT_POLICY", None)' if policy == "unset" else \
        f'os.environ["OMP_WAIT_POLICY"] = "{policy}"'
    out = subprocess.run([sys.executable, "-c", FIT.format(size=size, policy=line)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the fit failed: {out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(policy: str, neighbours: int, size: tuple, repeats: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(neighbours)]
    try:
        time.sleep(0.5 if neighbours else 0.0)
        runs = [fit_seconds(policy, size) for _ in range(repeats)]
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return {"policy": policy, "neighbours": neighbours, "seconds_min": min(runs),
            "seconds_median": statistics.median(runs), "runs": runs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neighbours", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a small fit, no warm-up (for the tests)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated, from {list(POLICIES)}")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from fedcf.provenance import report_result, run_meta

    policies = [p for p in args.policies.split(",") if p]
    if not policies or any(p not in POLICIES for p in policies):
        ap.error(f"--policies takes names from {list(POLICIES)}, got {args.policies!r}")
    size = (300, 100, 6000, 3) if args.quick else (943, 1682, 100_000, 500)
    if not args.quick:
        fit_seconds("PASSIVE", size)  # warm-up: compile or load the kernels
    rows = [measure(policy, n, size, args.repeats) for policy in policies
            for n in (0, args.neighbours)]
    for policy in policies:
        idle, busy = (r for r in rows if r["policy"] == policy)
        busy["ratio_to_idle"] = busy["seconds_median"] / idle["seconds_median"]
    out = {"meta": run_meta("busy_benchmark.py", argv), "cores": os.cpu_count(),
           "fit": {"users": size[0], "items": size[1], "ratings": size[2], "rounds": size[3],
                   "clients_per_round": 100, "n_factors": 50}, "rows": rows}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "busy_benchmark.py", strict=True)
