#!/usr/bin/env python
"""fedcf on a busy machine and across threads: the same FedRecon fit (ALS and SGD
reconstruction) idle on all cores, idle on one thread, and beside CPU-bound neighbours, under
each OpenMP wait policy, all in one run.

Policies: ``PASSIVE`` (idle workers sleep at once), ``unset`` (OpenMP's own default: spin about
3 ms, then sleep), ``ACTIVE`` (spin), and ``spin:N`` (the variable unset and
``GOMP_SPINCOUNT=N``: spin N iterations, roughly N / 100 µs, then sleep); ``default`` is what
fedcf sets itself when the environment names no policy. Each fit runs in a fresh process (the
kernels' cache warm: a warm-up fit runs first) and reports the seconds of ``fit`` alone,
and of its rounds' phases as the rounds time them (the clients' work, the reduction, the
server step; the rest is the round's Python);
neighbours are processes that spin on one core each until the fit ends. The figures per policy
and reconstruction: idle 1 thread / idle all threads (the thread scaling) and beside neighbours
/ idle (near 1 + neighbours / cores is fair sharing; far above it is workers spinning against
descheduled partners).

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
from fedcf import FedReconMF  # fedcf sets its own wait policy here unless one is set
{policy}  # before the first parallel kernel (or set_num_threads) loads the OpenMP runtime
import numba
from fedcf.datasets import make_synthetic_ratings
numba.set_num_threads({threads})
users, items, ratings, rounds = {size}
inter = make_synthetic_ratings(users, items, ratings, n_factors=8, random_state=0)
t0 = time.perf_counter()
m = FedReconMF(server_optimizer="sgd", early_stopping=None, reconstruction="{recon}",
               n_factors=50, n_rounds=rounds, clients_per_round=100, random_state=0).fit(inter)
seconds = time.perf_counter() - t0
phase = {{p: sum(h[p + "_seconds"] for h in m.history_) for p in ("work", "reduce", "server")}}
print(json.dumps({{"seconds": seconds, **phase}}))
"""
SPIN = "while True:\n    pass\n"
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
POLICIES = ("default", "PASSIVE", "unset", "ACTIVE")  # and spin:N
RECONS = ("als", "sgd")


def policy_code(policy: str) -> str:
    """The lines that set ``policy`` in the fit's process after fedcf set its own."""
    if policy == "default":
        return "pass"
    code = "[os.environ.pop(v, None) for v in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]"
    if policy.startswith("spin:"):
        return code + f'; os.environ["GOMP_SPINCOUNT"] = "{int(policy[5:])}"'
    return code + ("" if policy == "unset" else f'; os.environ["OMP_WAIT_POLICY"] = "{policy}"')


def check_policy(policy: str) -> str:
    if policy in POLICIES:
        return policy
    if policy.startswith("spin:") and policy[5:].isdigit():
        return policy
    raise ValueError(f"unknown wait policy {policy!r}: choose from {list(POLICIES)} or spin:N "
                     "(N a whole number of spin iterations)")


def fit_seconds(policy: str, recon: str, threads: int, size: tuple) -> dict:
    """One fit in a fresh process: its seconds, and the seconds its rounds spent in the
    clients' work, the reduction and the server step (the rest is the round's Python)."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    code = FIT.format(size=size, policy=policy_code(policy), threads=threads, recon=recon)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the fit failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(runs_of, neighbours: int) -> list:
    """runs_of() with ``neighbours`` CPU-bound processes running beside it."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(neighbours)]
    try:
        time.sleep(0.5 if neighbours else 0.0)
        return runs_of()
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def row(policy, recon, neighbours, threads, fits) -> dict:
    runs = [f["seconds"] for f in fits]
    return {"policy": policy, "recon": recon, "neighbours": neighbours, "threads": threads,
            "seconds_min": min(runs), "seconds_median": statistics.median(runs), "runs": runs,
            "phases_median": {p: statistics.median(f[p] for f in fits)
                              for p in ("work", "reduce", "server")}}


def measure_policy(policy, recon, cores, neighbours, size, repeats) -> list:
    """Idle on all cores and on one thread (alternated), then beside the neighbours."""
    idle = {t: [] for t in dict.fromkeys((cores, 1))}  # one machine core: one row
    for _ in range(repeats):
        for threads in idle:
            idle[threads].append(fit_seconds(policy, recon, threads, size))
    busy = measure(lambda: [fit_seconds(policy, recon, cores, size) for _ in range(repeats)],
                   neighbours)
    rows = [row(policy, recon, 0, t, r) for t, r in idle.items()]
    top = rows[0]["seconds_median"]
    rows[0]["speedup_from_1_thread"] = rows[-1]["seconds_median"] / top
    rows[0]["work_speedup_from_1_thread"] = (rows[-1]["phases_median"]["work"]
                                             / rows[0]["phases_median"]["work"])
    rows.append(row(policy, recon, neighbours, cores, busy))
    rows[-1]["ratio_to_idle"] = rows[-1]["seconds_median"] / top
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neighbours", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a small fit, no warm-up (for the tests)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated, from {list(POLICIES)} or spin:N")
    ap.add_argument("--recons", default=",".join(RECONS), help=f"comma-separated, from {RECONS}")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from fedcf.provenance import report_result, run_meta

    try:
        policies = [check_policy(p) for p in args.policies.split(",") if p]
    except ValueError as exc:
        ap.error(f"--policies: {exc}")
    recons = [r for r in args.recons.split(",") if r]
    if not policies or not recons or any(r not in RECONS for r in recons):
        ap.error(f"--policies and --recons need at least one name each (--recons from {RECONS}), "
                 f"got {args.policies!r} and {args.recons!r}")
    if args.neighbours < 1 or args.repeats < 1:
        ap.error("--neighbours and --repeats must be at least 1")
    cores = os.cpu_count() or 1
    size = (300, 100, 6000, 3) if args.quick else (943, 1682, 100_000, 500)
    if not args.quick:
        for recon in recons:
            fit_seconds("default", recon, cores, size)  # warm-up: compile or load the kernels
    rows = [r for policy in policies for recon in recons
            for r in measure_policy(policy, recon, cores, args.neighbours, size, args.repeats)]
    out = {"meta": run_meta("busy_benchmark.py", argv), "cores": cores,
           "fit": {"users": size[0], "items": size[1], "ratings": size[2], "rounds": size[3],
                   "clients_per_round": 100, "n_factors": 50}, "rows": rows}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "busy_benchmark.py", strict=True)
