#!/usr/bin/env python
"""Tune a differentially private FedReconMF with scikit-learn's GridSearchCV: the server
optimizer's learning rate and the DP aggregator's clip norm, as nested parameters of the phase
objects (``server_optimizer__learning_rate``, ``aggregator__clip_norm``), on held-out users
(``UserShuffleSplit``) scored by ReconEval; beside the fixed clips, adaptive clipping
(``aggregator__target_quantile``) from a small starting clip.

The search itself is not differentially private: every setting sees the same users, and the
selection is not accounted. ε reported per setting is that of one training run.

Examples
--------
python scripts/grid_search.py --json eval/results/grid_search.json
python scripts/grid_search.py --dataset synthetic --quick
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import FitFailedWarning
from sklearn.model_selection import GridSearchCV

from fedcf import FedReconMF
from fedcf.datasets import load_movielens, make_synthetic_ratings
from fedcf.federated import SGD, DPGaussianMean
from fedcf.model_selection import UserShuffleSplit, recon_scorer
from fedcf.provenance import run_meta, write_json

GRID = [{"server_optimizer__learning_rate": [0.5, 1.0, 2.0],
         "aggregator__clip_norm": [0.05, 0.2, 1.0]},
        # adaptive clipping (Andrew et al. 2021): the clip follows the median upload norm
        # (its clip grows to the median norm, so it pairs with smaller server steps)
        {"server_optimizer__learning_rate": [0.125, 0.25, 0.5], "aggregator__clip_norm": [0.05],
         "aggregator__target_quantile": [0.5]}]
NOISE = 1.0  # noise multiplier σ of every setting
DELTA = 1e-4


def base_estimator(args) -> FedReconMF:
    return FedReconMF(early_stopping=None, n_factors=args.factors, n_rounds=args.rounds,
                      clients_per_round=args.clients, server_optimizer=SGD(1.0),
                      rating_scale=(1, 5),  # public: DP takes μ and the scale from it
                      aggregator=DPGaussianMean(clip_norm=0.2, noise_multiplier=NOISE,
                                                delta=DELTA),
                      random_state=args.seed)


def search(X, args) -> dict:
    """One GridSearchCV over GRID; every setting's validation scores, the best, and ε."""
    cv = UserShuffleSplit(n_splits=args.splits, test_size=0.2, random_state=args.seed)
    scoring = {m: recon_scorer(m, random_state=args.seed) for m in ("rmse", "accuracy")}
    gs = GridSearchCV(base_estimator(args), GRID, cv=cv, scoring=scoring, refit="rmse",
                      error_score=np.nan)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitFailedWarning)  # a diverged setting scores NaN
        warnings.filterwarnings("ignore", "One or more of the test scores are non-finite")
        gs.fit(X.drop(columns="rating"), X["rating"])
    seconds = time.perf_counter() - t0
    res = gs.cv_results_
    rows = [{"params": {k: float(v) for k, v in p.items()},
             "rmse": float(-res["mean_test_rmse"][k]), "rmse_sd": float(res["std_test_rmse"][k]),
             "accuracy": float(res["mean_test_accuracy"][k]),
             "fit_seconds": float(res["mean_fit_time"][k]),
             "rank": int(res["rank_test_rmse"][k])} for k, p in enumerate(res["params"])]
    return {"rows": rows, "best": {k: float(v) for k, v in gs.best_params_.items()},
            "epsilon": float(gs.best_estimator_.epsilon_), "delta": DELTA,
            "noise_multiplier": NOISE, "search_seconds": seconds,
            "n_users": int(X["user"].nunique()), "n_ratings": len(X)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=("100k", "synthetic"), default="100k")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--factors", type=int, default=20)
    ap.add_argument("--splits", type=int, default=3, help="held-out user draws per setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.clients, args.factors, args.splits = 4, 20, 4, 1
    if args.dataset == "100k":
        X = load_movielens("100k", as_frame=True)
    else:
        X = make_synthetic_ratings(300, 80, 6000, random_state=args.seed).to_dataframe()
    X = X[["user", "item", "rating"]]
    out = {"meta": run_meta("grid_search.py", argv), "dataset": args.dataset,
           "settings": {"rounds": args.rounds, "clients_per_round": args.clients,
                        "n_factors": args.factors, "splits": args.splits, "seed": args.seed},
           **search(X, args)}
    for r in out["rows"]:
        print(f"{r['params']}: ReconEval RMSE {r['rmse']:.4f} ± {r['rmse_sd']:.4f}", flush=True)
    print(f"best {out['best']}; ε = {out['epsilon']:.2f} (δ = {DELTA}) per run; "
          f"{out['search_seconds']:.0f} s")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "grid_search.py")
