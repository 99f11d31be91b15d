#!/usr/bin/env python
"""Two limits of a population-scale run, each against a peer measured in the same run.

*Selection*: the time to draw one round's cohort from N eligible users (``--users``, default
10⁸) with an expected cohort of M (``--clients-per-round``): Poisson sampling as differential
privacy needs it (geometric gaps, from the OS's secure generator and from the seed) against
uniform sampling of M without replacement. Medians over ``--rounds`` rounds.

*Shard memory*: the bytes the first Ray shard holds (its rows' stream keys, CSR index, items
and ratings) for a ``SyntheticPopulation`` of ``--shard-users`` users cut into 2, 4, 8 and
16 shards, against what the same shard would hold with an index over every user id (the layout
before shards indexed only their users: 8 bytes per user of the population plus its ratings).
The shard is built in this process exactly as a Ray actor builds it (``Shard``), without Ray.

*Reduce bytes*: on a local Ray instance, the bytes of partial sums the shards send per round
and what the driver fetches once reducer tasks have added them, for 1, 2, 4 and 8 shards
(``--reduce-shards``; the model is the same bits for each).

Example: python scripts/scale_limits.py --json eval/results/scale_limits.json
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

MIB = 2 ** 20


def selection(users: int, m: int, rounds: int) -> dict:
    """Median seconds per round of each way of drawing a cohort."""
    from fedcf.federated import Selector

    eligible = np.arange(users, dtype=np.int64)
    ways = {"poisson_secure": dict(poisson=True, secret=True),
            "poisson_seeded": dict(poisson=True), "uniform": {}}
    out = {"users": users, "clients_per_round": m, "rounds": rounds}
    for name, kw in ways.items():
        select, times, sizes = Selector(0, eligible, m, **kw), [], []
        for t in range(rounds):
            t0 = time.perf_counter()
            sizes.append(len(select(t).clients))
            times.append(time.perf_counter() - t0)
        out[name] = {"seconds": float(np.median(times)), "mean_cohort": float(np.mean(sizes))}
    out["poisson_over_uniform"] = out["poisson_secure"]["seconds"] / out["uniform"]["seconds"]
    return out


def shard_memory(users: int, ratings_per_user: float, shard_counts) -> list[dict]:
    """Shard 0's held bytes for each shard count, and with an index over all users."""
    from fedcf.datasets import SyntheticPopulation
    from fedcf.federated.executors.ray_shard import Shard

    spec = SyntheticPopulation(users, 10_000, ratings_per_user=ratings_per_user, random_state=0)
    rows = []
    for n in shard_counts:
        t0 = time.perf_counter()
        shard = Shard(0, n, 1, spec)
        held = shard.held_bytes()
        ratings = shard.data[1].nbytes + shard.data[2].nbytes
        rows.append({"shards": n, "shard_users": len(shard.keys) - 2,
                     "shard_ratings": int(shard.data[0][-1]), "held_mib": held / MIB,
                     "index_over_all_users_mib": (8 * (users + 1) + ratings) / MIB,
                     "build_seconds": time.perf_counter() - t0})
        del shard
    return rows


def reduce_bytes(users: int, m: int, rounds: int, shard_counts, cpus: int) -> list[dict]:
    """Per shard count: the bytes of partial sums the shards send per round, and what the
    driver fetches after the reducer tasks have added them (medians over the rounds)."""
    import ray

    from fedcf import FedReconMF
    from fedcf.datasets import SyntheticPopulation
    from fedcf.federated import RayExecutor
    from fedcf.federated.executors.ray_executor import LOOPBACK

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, **LOOPBACK)
    try:
        spec = SyntheticPopulation(users, 10_000, random_state=0)
        rows = []
        for n in shard_counts:
            model = FedReconMF(server_optimizer="sgd", early_stopping=None,
                               n_factors=50, n_rounds=rounds, clients_per_round=m,
                               random_state=0, executor=RayExecutor(n)).fit(spec)
            h = model.history_[1:] or model.history_
            rows.append({"shards": n, "users": users, "clients_per_round": m,
                         "shard_bytes_up": float(np.median([r["shard_bytes_up"] for r in h])),
                         "driver_bytes_up": float(np.median([r["driver_bytes_up"] for r in h])),
                         "item_factors_sum": float(model.item_factors_.sum())})
        return rows
    finally:
        ray.shutdown()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=100_000_000, help="eligible users (selection)")
    ap.add_argument("--clients-per-round", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--shard-users", type=int, default=10_000_000)
    ap.add_argument("--ratings-per-user", type=float, default=20.0)
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--reduce-users", type=int, default=100_000)
    ap.add_argument("--reduce-clients", type=int, default=10_000)
    ap.add_argument("--reduce-rounds", type=int, default=3)
    ap.add_argument("--reduce-shards", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="Ray shard counts for the reduce bytes (none: skip, no Ray needed)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    for name in ("users", "clients_per_round", "rounds", "shard_users", "reduce_users",
                 "reduce_clients", "reduce_rounds", "cpus"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.ratings_per_user >= 1:
        ap.error(f"--ratings-per-user must be >= 1, got {args.ratings_per_user}")
    bad = [n for n in [*args.shards, *args.reduce_shards] if not 1 <= n <= 64]
    if bad:
        ap.error(f"shard counts must be in [1, 64] (a shard holds whole reduce groups), got {bad}")
    from fedcf.provenance import report_result, run_meta

    out = {"selection": selection(args.users, args.clients_per_round, args.rounds),
           "shard_memory": {"users": args.shard_users, "ratings_per_user": args.ratings_per_user,
                            "rows": shard_memory(args.shard_users, args.ratings_per_user,
                                                 args.shards)},
           "reduce": reduce_bytes(args.reduce_users, args.reduce_clients, args.reduce_rounds,
                                  args.reduce_shards, args.cpus) if args.reduce_shards else [],
           "meta": run_meta("scale_limits.py", argv, packages=("ray",))}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "scale_limits.py")
