#!/usr/bin/env python
"""Cold start: how good is a new user's model after 1, 2, 3, 5, 10, 20 ratings on the device?

Steps
-----
1. ML-100K ratings; the users are split at random (per seed) into training users (80 %) and new
   users (20 %). Every model is trained on the training users only.
2. A new user with at least ``--min-ratings`` ratings keeps them in time order. For each n, the
   model gets the user's first n ratings (the support, on the device) and nothing else:
   FedRecon reconstructs the user; FURL and centralized ALS fold the user in by the same exact
   ridge solve against their frozen item rows; popularity needs no user.
3. Scored on the same held-out part for every n, so the curve compares like with like: RMSE on
   the user's ratings after their first 20, and HR@10 of the newest rating against 99 negatives
   drawn once per user from the catalog items they never rated (ties against the model).

Models: FedReconMF with exact ALS (ridge) reconstruction and with the paper's SGD
reconstruction, each with and without a learned default (``OpenCatalog(learned_default=True)``:
the ridge prior mean / the SGD start); FURLMF (stateful: user rows trained across rounds on the
device); centralized ALS; popularity (μ + b_i for RMSE, rating counts for HR).

Example: python scripts/cold_start_curve.py --json eval/results/cold_start.json
Quick look: python scripts/cold_start_curve.py --rounds 30 --seeds 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from fedcf import FURLMF, CentralizedMF, FedReconMF
from fedcf.datasets import Interactions, load_movielens, make_synthetic_ratings
from fedcf.eval.loo import rank_of_target
from fedcf.eval.splits import user_split_indices
from fedcf.federated import ClientUpdate, OpenCatalog, RidgeReconstruction, SGDReconstruction
from fedcf.provenance import report_result, run_meta

SIZES = (1, 2, 3, 5, 10, 20)


def models(args, seed) -> dict:
    fed = dict(n_factors=args.factors, n_rounds=args.rounds, clients_per_round=args.clients,
               random_state=seed, server_optimizer="sgd")
    last = dict(early_stopping=None)  # FedRecon's rows: every round, as FURL's
    # the main job's two configurations (scripts/movielens_benchmark.py: OURS and the paper's)
    als = dict(biases=True, reconstruction=RidgeReconstruction(0.1))
    sgd = dict(biases=False, reconstruction=SGDReconstruction(50, learning_rate=0.1),
               client_update=ClientUpdate(0.5, batch_size=5, steps=50), split="random")
    out = {}
    for name, kw in (("FedRecon, ALS reconstruction", als), ("FedRecon, SGD reconstruction", sgd)):
        out[name] = FedReconMF(**fed, **kw, **last)
        out[name + " + learned default"] = FedReconMF(
            **fed, **kw, **last, item_space=OpenCatalog(learned_default=True))
    out["FURL (stateful), fold-in"] = FURLMF(**fed)
    out["centralized ALS, fold-in"] = CentralizedMF(args.factors, solver="als",
                                                   regularization=0.1, n_epochs=15,
                                                   random_state=seed)
    return out


def new_users(inter: Interactions, users, model_items, n_model, min_ratings, rng):
    """Per new user with enough ratings of catalog items: those (model item ids, ratings) in
    time order, and 99 negatives from the catalog items they never rated."""
    out = []
    for u in users:
        sl = slice(inter.indptr[u], inter.indptr[u + 1])
        items, vals = model_items[inter.items[sl]], inter.values[sl]
        keep = items >= 0
        items, vals = items[keep], vals[keep]
        if len(items) < min_ratings:
            continue
        free = np.setdiff1d(np.arange(n_model), items)
        out.append({"items": items, "values": vals,
                    "negatives": rng.choice(free, 99, replace=False)})
    return out


def scores_for(model, users, n):
    """Every catalog item's score for each user reconstructed from their first n ratings."""
    ids = np.asarray(model.item_ids_)
    sup = Interactions.from_arrays(
        np.repeat(np.arange(len(users)), n), ids[np.concatenate([u["items"][:n] for u in users])],
        np.concatenate([u["values"][:n] for u in users]),
        user_catalog=np.arange(len(users)), item_catalog=ids)
    P, c = model.reconstruct_users(sup)
    return model.score_all_items(P, c)


def evaluate(S, users, scale, rank_by=None) -> dict:
    """RMSE of the clipped predictions S on each user's ratings after their first 20, and HR@10
    of their newest rating ranked by ``rank_by`` (default S) against their negatives."""
    rank_by = S if rank_by is None else rank_by
    err, ranks = [], []
    for r, u in enumerate(users):
        pred = np.clip(S[r, u["items"][20:]], *scale)
        err.append(pred - u["values"][20:])
        cand = np.concatenate([[u["items"][-1]], u["negatives"]])
        ranks.append(rank_of_target(rank_by[r:r + 1, cand], np.array([0]))[0])
    e, ranks = np.concatenate(err), np.array(ranks)
    return {"rmse": float(np.sqrt(np.mean(e ** 2))), "hr@10": float(np.mean(ranks < 10))}


def run_seed(inter, args, seed) -> list:
    train_users, new = user_split_indices(inter.n_users, (0.8, 0.2), random_state=seed)
    train = inter.subset_users(np.sort(train_users))
    rows = []
    for name, model in models(args, seed).items():
        t0 = time.perf_counter()
        model.fit(train)
        users = new_users(inter, new, _model_items(model, inter), len(model.item_ids_),
                          args.min_ratings, np.random.RandomState(seed))
        for n in SIZES:
            S = scores_for(model, users, n)
            rows.append({"model": name, "seed": seed, "n": n, "n_users": len(users),
                         "seconds": time.perf_counter() - t0,
                         **evaluate(S, users, _scale(inter))})
        print(f"seed {seed} {name:<44} " + " ".join(f"{r['rmse']:.3f}" for r in rows[-6:]))
    rows += popularity_rows(inter, train, new, args, seed)
    return rows


def _scale(inter):
    stats = inter.value_stats()
    return stats["min"], stats["max"]


def _model_items(model, inter):
    return model._item_index(inter.item_ids).astype(np.int64)  # −1: not in the model


def popularity_rows(inter, train, new, args, seed) -> list:
    mu = train.values.mean()
    counts = np.bincount(train.items, minlength=train.n_items).astype(float)
    sums = np.bincount(train.items, weights=train.values - mu, minlength=train.n_items)
    b = sums / (counts + 25.0)  # item bias with shrinkage toward μ
    users = new_users(inter, new, np.arange(train.n_items), train.n_items, args.min_ratings,
                      np.random.RandomState(seed))
    shape = (len(users), train.n_items)
    res = evaluate(np.broadcast_to(mu + b, shape), users, _scale(inter),
                   rank_by=np.broadcast_to(counts, shape))
    return [{"model": "popularity", "seed": seed, "n": n, "n_users": len(users),
             "seconds": 0.0, **res} for n in SIZES]


def plot(doc, path) -> None:
    """RMSE and HR@10 against n, one line per model (mean over seeds), from a result JSON."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = pd.DataFrame(doc["rows"]).groupby(["model", "n"], sort=False)[["rmse", "hr@10"]].mean()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        part = df.loc[model]
        for ax, metric in zip(axes, ("rmse", "hr@10")):
            ax.plot(part.index, part[metric], marker="o", label=model)
    for ax, metric in zip(axes, ("RMSE (lower is better)", "HR@10 (higher is better)")):
        ax.set_xscale("log")
        ax.set_xticks(doc["sizes"], [str(n) for n in doc["sizes"]])
        ax.set_xlabel("ratings of the new user on the device")
        ax.set_title(metric)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    plt.rcParams["svg.hashsalt"] = "fedcf"  # the same JSON gives the same file
    fig.savefig(path, metadata={"Date": None})
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="100k",
                    help="MovieLens variant, or 'synthetic' (make_synthetic_ratings, ML-100K size)")
    ap.add_argument("--offline", action="store_true", help="never download (use the cache)")
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--min-ratings", type=int, default=25)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="SVG", help="also draw the curves to this file")
    ap.add_argument("--plot-from", metavar="JSON", help="only draw the curves of this result")
    args = ap.parse_args(argv)
    if args.plot_from:
        import json
        return plot(json.loads(open(args.plot_from).read()), args.plot or "cold_start.svg")
    inter = (make_synthetic_ratings(943, 1682, 100_000, random_state=0)
             if args.dataset == "synthetic" else
             load_movielens(args.dataset, download=not args.offline))
    t0 = time.perf_counter()
    rows = [r for s in range(args.seeds) for r in run_seed(inter, args, s)]
    out = {"meta": run_meta("cold_start_curve.py", argv), "dataset": args.dataset,
           "sizes": list(SIZES),
           "settings": vars(args) | {"json": None}, "wall_seconds": time.perf_counter() - t0,
           "rows": rows}
    report_result(out, args.json)
    if args.plot:
        plot(out, args.plot)
    return out


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "cold_start_curve.py")
