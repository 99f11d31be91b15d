#!/usr/bin/env python
"""What secure aggregation costs: one aggregation of m clients' dense uploads over a catalog of
n items (K factors, a bias and a weight per row, as FedRecon's uploads) with fedcf's protocol
(``fedcf.federated.aggregators.secagg_protocol``).

The client halves run in ``--processes`` worker processes (default: the machine's cores), side
by side as devices do; the server half runs in the script's own process. Per configuration:
seconds in all client halves divided by m (what one device spends: key agreement, Shamir
sharing, share encryption, an AES-CTR mask expansion over the whole vector per peer), seconds
in the server half (relaying, and unmasking: a Shamir reconstruction per survivor and per
dropped client, masks regenerated for the dropped), the round's wall time (the five message
rounds; starting the processes is not in it), bytes each client uploads (its masked vector
dominates; averaged over every client that advertised keys, the dropped included), and the
same vector's plain size for comparison. ``--drop`` clients vanish after sharing their keys,
so the server also rebuilds their masks.

Cohorts run with every pair masking (Bonawitz et al.), with the SecAgg+ graph of degree k
(``--neighbours``), whose per-client work grows with k rather than m, and with the degree
``SecureAggregation()`` picks by default for the cohort (``neighbours="auto"``).

Example: python scripts/secagg_cost.py --repeats 3 --json eval/results/secagg_cost.json
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from fedcf.federated.aggregators.secagg import SecureAggregation
from fedcf.federated.aggregators.secagg_client import simulate
from fedcf.provenance import run_meta, write_json


def one(m: int, n_items: int, K: int, drop: float, rng, neighbours: int | None,
        processes: int = 1) -> dict:
    d = n_items * (K + 1) + 9  # rows, then the statistics and the clip count
    X = rng.integers(0, 2**32, (m, d), dtype=np.uint64).astype(np.uint32)
    agg = SecureAggregation(min_cohort=2, neighbours=neighbours)
    t = agg.threshold_for(m)
    dropped = rng.choice(m, int(round(drop * m)), replace=False)
    clock = {}
    total, u3, server = simulate(X, range(m), t, drop_after_shares=dropped, clock=clock,
                                 neighbours=neighbours, processes=processes)
    assert np.array_equal(total, X[u3].sum(axis=0, dtype=np.uint64).astype(np.uint32))
    return {"clients": m, "n_items": n_items, "K": K, "neighbours": neighbours,
            "holders": agg.holders(m), "threshold": t, "dropped": len(dropped),
            "client_seconds": clock["clients"] / m, "server_seconds": clock["server"],
            "round_seconds": clock["round"], "processes": processes,
            "bytes_up_per_client": server.bytes_received() / m,
            "plain_bytes": 4 * d}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000])
    ap.add_argument("--items", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--drop", type=float, default=0.1)
    ap.add_argument("--neighbours", type=int, nargs="+", default=[0, 40, -1],
                    help="graph degrees to run: 0 = every pair (Bonawitz et al.), k = SecAgg+, "
                         "-1 = the default SecureAggregation() picks for the cohort "
                         "(neighbours='auto'; skipped where that is every pair)")
    ap.add_argument("--max-words", type=float, default=2e10,
                    help="skip configurations whose masks exceed this many words (m·k·d)")
    ap.add_argument("--max-holders", type=int, default=1000,
                    help="skip configurations with more share holders per client (sharing "
                         "costs holders² field operations per client)")
    ap.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)),
                    help="worker processes the client halves run in, side by side as devices "
                         "do (default: this machine's cores; 1: all in this process)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per configuration; the row is the one with the fastest round "
                         "(a busy machine only ever slows a run down)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    for name in ("processes", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a count >= 1, got {getattr(args, name)}")
    rng = np.random.default_rng(0)
    rows = []
    for m in args.clients:
        for k in sorted(set(args.neighbours), key=abs):
            auto = k < 0
            if auto:
                k = SecureAggregation(drop_after_setup=args.drop).degree(m) or 0
                if not k or k in args.neighbours:
                    continue  # every pair, or a degree run anyway
            h = SecureAggregation(neighbours=k or None).holders(m)
            if k and h >= m:
                continue  # the graph is complete at this cohort: the k = 0 row
            for n in args.items:
                words = m * (h - 1) * n * (args.factors + 1)
                if words > args.max_words or h > args.max_holders:
                    print(f"m={m}, k={k}, {n:,} items: skipped (over the budget)")
                    continue
                r = min((one(m, n, args.factors, args.drop, rng, k or None, args.processes)
                         for _ in range(args.repeats)), key=lambda r: r["round_seconds"])
                r["auto"] = auto
                rows.append(r)
                print(f"m={m:<5} k={k:<3} items={n:<7,} round {r['round_seconds']:.2f} s  "
                      f"client {r['client_seconds']:.3f} s  "
                      f"server {r['server_seconds']:.2f} s  up "
                      f"{r['bytes_up_per_client'] / 2**20:.2f} MiB per client (plain "
                      f"{r['plain_bytes'] / 2**20:.2f} MiB)", flush=True)
    if args.json:
        meta = {**run_meta("secagg_cost.py", argv), "settings": vars(args)}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "secagg_cost.py")
