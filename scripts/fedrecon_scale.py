#!/usr/bin/env python
"""Wall time of the paper-scale FedRecon run on a dataset of ML-1M's size.

500 rounds × 100 clients, K = 50, batch 5, ≤ 50 reconstruction and ≤ 50 update steps, on the
synthetic generator at 6,040 users × 3,706 items × ~1M ratings (users split 80/20, like the
paper's train users). Compile (warm-up) time is measured separately: a first 1-round fit on a tiny
population triggers (or loads from cache) every kernel; the timed fits run after it.

Example: python scripts/fedrecon_scale.py --json scale.json
"""

from __future__ import annotations

import argparse
import time

import numba

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.eval import recon_eval, user_split
from fedcf.federated import SGDReconstruction
from fedcf.provenance import run_meta, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=6040)
    ap.add_argument("--items", type=int, default=3706)
    ap.add_argument("--ratings", type=int, default=1_000_209)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    numba.set_num_threads(args.threads)

    t0 = time.perf_counter()
    tiny = make_synthetic_ratings(50, 30, 600, random_state=0)
    for recon in ("als", "sgd"):
        FedReconMF(server_optimizer="sgd", early_stopping=None,
                   n_factors=4, n_rounds=1, clients_per_round=5, reconstruction=recon,
                   random_state=0).fit(tiny)
    compile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    inter = make_synthetic_ratings(args.users, args.items, args.ratings, random_state=0)
    train, test = user_split(inter, (0.8, 0.2), random_state=0)
    data_s = time.perf_counter() - t0
    rows = []
    for recon in ("sgd", "als"):
        model = FedReconMF(server_optimizer="sgd", early_stopping=None,
                           n_factors=args.factors, n_rounds=args.rounds,
                           clients_per_round=args.clients, random_state=0,
                           reconstruction=SGDReconstruction(learning_rate=0.5)
                           if recon == "sgd" else "als")
        t0 = time.perf_counter()
        model.fit(train)
        fit_s = time.perf_counter() - t0
        res = recon_eval(model, test, n_repeats=20)
        updates = sum(h["clients_used"] for h in model.history_)
        rows.append({"name": f"FedRecon paper-scale ({recon} reconstruction)",
                     "reconstruction": recon, "fit_seconds": fit_s,
                     "client_updates_per_second": updates / fit_s,
                     "rounds": args.rounds, "clients_per_round": args.clients,
                     "recon_eval_rmse": res["rmse"], "threads": numba.get_num_threads()})
    print(f"data: {inter!r} ({data_s:.1f} s to generate); train users {train.n_users}")
    print(f"compile / cache load of all kernels: {compile_s:.1f} s")
    for r in rows:
        print(f"{r['name']:<44} fit {r['fit_seconds']:6.2f} s  "
              f"{r['client_updates_per_second']:9.0f} client updates/s  "
              f"ReconEval RMSE {r['recon_eval_rmse']:.4f}  ({r['threads']} threads)")
    if args.json:
        meta = {**run_meta("fedrecon_scale.py", argv), "compile_seconds": compile_s,
                "data": repr(inter), "train_users": train.n_users}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "fedrecon_scale.py")
