#!/usr/bin/env python
"""MovieLens benchmark: centralized matrix factorization baselines.

Examples
--------
python scripts/movielens_benchmark.py --protocol random --json out.json
python scripts/movielens_benchmark.py --protocol time --dataset 1m
python scripts/movielens_benchmark.py --dataset /path/to/u.data --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

import numpy as np
from tqdm.auto import tqdm

from fedcf import CentralizedMF
from fedcf.datasets import VARIANTS, load_movielens, load_ratings_file
from fedcf.eval import per_user_time_split, random_split, rating_metrics


def load_dataset(name: str):
    if name in VARIANTS:
        return load_movielens(name)
    if os.path.exists(name):
        return load_ratings_file(name)
    raise SystemExit(f"--dataset must be one of {VARIANTS} or an existing file, got {name!r}")


def centralized_rows(train, test, args, protocol):
    configs = [
        ("centralized ALS (biased)", dict(solver="als", regularization=0.1, n_epochs=15)),
        ("centralized SGD (biased)", dict(solver="sgd", regularization=0.1, learning_rate=0.007,
                                          n_epochs=60)),
        ("centralized ALS (no biases)", dict(solver="als", biases=False, regularization=0.1,
                                             n_epochs=15)),
    ]
    if args.quick:
        configs = [(n, {**c, "n_epochs": min(c["n_epochs"], 3)}) for n, c in configs]
    rows = []
    test_df = test.to_dataframe()
    for name, cfg in tqdm(configs, desc="models", disable=args.no_progress):
        t0 = time.perf_counter()
        model = CentralizedMF(n_factors=args.factors, random_state=args.seed, **cfg).fit(train)
        fit_s = time.perf_counter() - t0
        pred = model.predict(test_df)
        m = rating_metrics(test_df["rating"].to_numpy(), pred, model.rating_scale_)
        rows.append({"name": name, "protocol": protocol, "rmse": m["rmse"], "mae": m["mae"],
                     "accuracy": m["accuracy"], "seconds": fit_s, "n_test": len(test_df),
                     "params": cfg})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="100k", help=f"one of {VARIANTS} or a ratings file path")
    ap.add_argument("--protocol", choices=("random", "time"), default="random",
                    help="random: ratings split 90/10 at random; time: per-user 80/10/10 by time "
                         "(test = newest 10%%)")
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="few epochs (CI-sized)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    inter = load_dataset(args.dataset)
    if args.protocol == "random":
        train, test = random_split(inter, (0.9, 0.1), random_state=args.seed)
    else:
        train, _val, test = per_user_time_split(inter, (0.8, 0.1, 0.1))
    rows = centralized_rows(train, test, args, args.protocol)

    print(f"\nMovieLens {args.dataset}: {inter!r}; protocol={args.protocol}, K={args.factors}, "
          f"seed={args.seed}")
    print(f"{'model':<32} {'RMSE':>7} {'MAE':>7} {'acc':>7} {'seconds':>8}")
    for r in rows:
        print(f"{r['name']:<32} {r['rmse']:7.4f} {r['mae']:7.4f} {r['accuracy']:7.4f} "
              f"{r['seconds']:8.2f}")
    if args.json:
        meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
                "python": sys.version.split()[0], "numpy": np.__version__,
                "command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])])}
        for r in rows:
            r["meta"] = meta
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
