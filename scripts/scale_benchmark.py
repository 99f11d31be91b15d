#!/usr/bin/env python
"""Round time of FedRecon at population scale: the local executor vs the Ray executor, same run.

For every population size N (``--users``) and cohort size M (``--clients-per-round``) and each
executor, one fit runs in a fresh subprocess (so its peak memory is its own) on a
``SyntheticPopulation`` (~``--ratings-per-user`` star ratings per user): the local executor
builds the population in the driver and runs the client kernel there on every core; the Ray
executor starts ``--shards`` actors on a local Ray instance, each building its own shard from the
spec. Reported per row: time to build the population (Ray: actors started and shards built),
median round time after ``--warmup`` rounds and its breakdown (Ray: broadcast of the global
model, client work in the actors incl. returning partial sums; both: the driver's reduce and the
server step), client updates per second, the driver's and the workers' peak resident memory.
``ray_overhead`` is Ray's median round time over the local one at the same (N, M), minus 1.

Example: python scripts/scale_benchmark.py --json eval/results/ray_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

MIB = 2 ** 20


def fit_once(args) -> dict:
    """One fit in this process; the row as a dict."""
    from fedcf import FedReconMF
    from fedcf.datasets import SyntheticPopulation
    from fedcf.federated import RayExecutor

    spec = SyntheticPopulation(args.users, args.items, ratings_per_user=args.ratings_per_user,
                               random_state=0)
    kw = dict(n_factors=args.factors, n_rounds=args.warmup + args.rounds,
              clients_per_round=args.clients_per_round, random_state=0,
              server_optimizer="sgd", early_stopping=None)  # the paper's round
    executor, data, build = None, spec, None
    if args.executor == "ray":
        from fedcf.federated.executors.ray_executor import LOOPBACK, connect

        if args.address:  # a running cluster (see eval/SCALE.md)
            connect(args.address)
        else:  # a local instance on 127.0.0.1 only
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            import ray

            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                     **LOOPBACK)
        executor = RayExecutor(args.shards)
    else:
        t0 = time.perf_counter()
        data = spec.to_interactions()
        build = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = FedReconMF(**kw, executor=executor).fit(data)
    fit_s = time.perf_counter() - t0
    data = model.interactions_
    build = getattr(data, "build_seconds", build)  # Ray: actors up and shards built
    timed = model.history_[args.warmup:]

    def med(key):
        vals = [h[key] for h in timed if key in h]
        return float(np.median(vals)) if vals else None

    workers = getattr(data.executor, "worker_peak_bytes", None)  # Ray: the shards' peaks
    return {"executor": args.executor, "users": args.users, "items": args.items,
            "ratings": int(data.nnz), "clients_per_round": args.clients_per_round,
            "shards": args.shards if args.executor == "ray" else None,
            "build_seconds": build, "fit_seconds": fit_s,
            "round_seconds": med("seconds"), "work_seconds": med("work_seconds"),
            "broadcast_seconds": med("broadcast_seconds"),
            "client_seconds": med("client_seconds"), "reduce_seconds": med("reduce_seconds"),
            "server_seconds": med("server_seconds"),
            "shard_bytes_up": med("shard_bytes_up"), "driver_bytes_up": med("driver_bytes_up"),
            "client_updates_per_second": args.clients_per_round / med("seconds"),
            "driver_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_mib": None if workers is None else [w / MIB for w in workers],
            "shard_restarts": sum(h.get("shard_restarts", 0) for h in model.history_),
            "loss": float(model.history_[-1]["loss"])}


def run_row(args, executor, users, m) -> dict:
    cmd = [sys.executable, __file__, "--one", "--executor", executor, "--users", str(users),
           "--clients-per-round", str(m), "--items", str(args.items),
           "--ratings-per-user", str(args.ratings_per_user), "--factors", str(args.factors),
           "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--shards", str(args.shards), "--cpus", str(args.cpus),
           *(["--address", args.address] if args.address else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{executor} N={users} M={m} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executor", nargs="+", choices=("local", "ray"), default=["local", "ray"])
    ap.add_argument("--users", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--clients-per-round", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--ratings-per-user", type=float, default=20.0)
    ap.add_argument("--factors", type=int, default=50, help="K (the paper's for MovieLens)")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per row")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.one:
        args.executor, args.users, args.clients_per_round = \
            args.executor[0], args.users[0], args.clients_per_round[0]
        print(json.dumps(fit_once(args)))
        return None
    from fedcf.provenance import run_meta, write_json

    rows = []
    for users in args.users:
        for m in args.clients_per_round:
            pair = {}
            for ex in args.executor:
                r = pair[ex] = run_row(args, ex, users, m)
                rows.append(r)
                workers = r["worker_peak_mib"]
                print(f"{ex:<5} N={users:>9,} M={m:>6,}  build {r['build_seconds']:7.1f} s  "
                      f"round {r['round_seconds'] * 1e3:8.1f} ms  "
                      f"{r['client_updates_per_second']:9.0f} updates/s  driver "
                      f"{r['driver_peak_mib']:7.0f} MiB  workers "
                      f"{'-' if workers is None else ' + '.join(f'{w:.0f}' for w in workers)}"
                      " MiB", flush=True)
            if set(pair) == {"local", "ray"}:
                pair["ray"]["ray_overhead"] = \
                    pair["ray"]["round_seconds"] / pair["local"]["round_seconds"] - 1
                print(f"      Ray overhead at N={users:,} M={m:,}: "
                      f"{pair['ray']['ray_overhead']:+.0%}")
    if args.json:
        meta = run_meta("scale_benchmark.py", argv, packages=("ray",))
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "scale_benchmark.py")
