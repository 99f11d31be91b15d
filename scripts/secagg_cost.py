#!/usr/bin/env python
"""What secure aggregation costs: one aggregation of m clients' dense uploads over a catalog of
n items (K factors, a bias and a weight per row, as FedRecon's uploads) with fedcf's protocol
(``fedcf.federated.secagg_protocol``), every client half in this process.

Per configuration: seconds in all client halves divided by m (what one device spends: key
agreement, Shamir sharing, share encryption, m − 1 ChaCha20 mask expansions over the whole
vector), seconds in the server half (relaying, and unmasking: a Shamir reconstruction per
survivor and per dropped client, masks regenerated for the dropped), bytes each client uploads
(its masked vector dominates; averaged over every client that advertised keys, the dropped
included), and the same vector's plain size for comparison. ``--drop``
clients vanish after sharing their keys, so the server also rebuilds their masks.

Example: python scripts/secagg_cost.py --json eval/results/secagg_cost.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedcf.federated.secagg import SecureAggregation
from fedcf.federated.secagg_protocol import simulate
from fedcf.provenance import run_meta, write_json


def one(m: int, n_items: int, K: int, drop: float, rng) -> dict:
    d = n_items * (K + 1) + 2  # rows, the weight, the clip count
    X = rng.integers(0, 2**32, (m, d), dtype=np.uint64).astype(np.uint32)
    t = SecureAggregation(min_cohort=2).threshold_for(m)
    dropped = rng.choice(m, int(round(drop * m)), replace=False)
    clock = {}
    t0 = time.perf_counter()
    total, u3, server = simulate(X, range(m), t, drop_after_shares=dropped, clock=clock)
    wall = time.perf_counter() - t0
    assert np.array_equal(total, X[u3].sum(axis=0, dtype=np.uint64).astype(np.uint32))
    return {"clients": m, "n_items": n_items, "K": K, "threshold": t, "dropped": len(dropped),
            "client_seconds": clock["clients"] / m, "server_seconds": clock["server"],
            "round_seconds": wall, "bytes_up_per_client": server.bytes_received() / m,
            "plain_bytes": 4 * d}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--items", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--drop", type=float, default=0.1)
    ap.add_argument("--max-words", type=float, default=2e9,
                    help="skip configurations whose masks exceed this many words (m² · d)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for m in args.clients:
        for n in args.items:
            if m * m * n * (args.factors + 1) > args.max_words:
                print(f"m={m}, {n:,} items: skipped (over --max-words)")
                continue
            r = one(m, n, args.factors, args.drop, rng)
            rows.append(r)
            print(f"m={m:<5} items={n:<7,} client {r['client_seconds']:.3f} s  server "
                  f"{r['server_seconds']:.2f} s  up {r['bytes_up_per_client'] / 2**20:.2f} MiB "
                  f"per client (plain {r['plain_bytes'] / 2**20:.2f} MiB)", flush=True)
    if args.json:
        meta = {**run_meta("secagg_cost.py", argv), "settings": vars(args)}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    main()
