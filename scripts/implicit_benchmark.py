#!/usr/bin/env python
"""Implicit-feedback ranking on MovieLens-100K (every rating becomes a binary interaction).

Two protocols, precision / recall / NDCG / MAP / hit-rate at 10 and AUC, seen items filtered:

- seen users: interactions split 80/20 at random; fedcf's centralized weighted ALS (ImplicitMF)
  against the ``implicit`` library's ALS run in the same process with the same factors,
  regularization, iterations and confidence (implicit's alpha = 1 + ours), plus popularity;
- unseen users (ReconEval): users split 80/10/10; models trained on the train users; each test
  user is reconstructed from a random half of their interactions and ranked on the other half:
  FedReconImplicitMF, centralized ImplicitMF folded in, popularity.

Example: python scripts/implicit_benchmark.py --json implicit.json
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from fedcf import FedReconImplicitMF, ImplicitMF
from fedcf.datasets import Interactions, load_movielens, load_ratings_file
from fedcf.eval import random_split, ranking_metrics, support_query_split, user_split
from fedcf.federated import RidgeReconstruction
from fedcf.provenance import run_meta, write_json

METRICS = ("precision", "recall", "ndcg", "map", "hit_rate", "auc")


def binarize(inter):
    return Interactions(inter.indptr, inter.items, np.ones(inter.nnz), inter.timestamps,
                        inter.user_ids, inter.item_ids)


def report(name, protocol, res, seconds):
    row = {"name": name, "protocol": protocol, "seconds": seconds, "n_users": res["n_users"]}
    row.update({m: res[m] for m in METRICS})
    print(f"{name:<44} {protocol:<8} " + " ".join(f"{res[m]:.4f}" for m in METRICS)
          + f" {seconds:7.2f}")
    return row


def dot_scores(P, Q):
    return lambda u: P[u].astype(np.float64) @ Q.T.astype(np.float64)


def model_scores(model, P, c):
    """b_i + c_u + p·q for the users' rows (P, c) of ``model``."""
    return lambda u: model.score_all_items(P[u], c[u])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="100k", help="MovieLens variant or a ratings file")
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--regularization", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=1.0, help="confidence 1 + alpha*r (ours)")
    ap.add_argument("--biased-regularization", type=float, default=50.0,
                    help="λ of the centralized rows with item and user biases")
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    src = args.dataset
    inter = binarize(load_ratings_file(src) if os.path.exists(src) else load_movielens(src))
    print(f"{inter!r}, K={args.factors}, lambda={args.regularization}, alpha={args.alpha}")
    print(f"{'model':<44} {'protocol':<8} " + " ".join(f"{m[:6]:>6}" for m in METRICS)
          + "  seconds")
    rows = []

    # seen users: random 80/20 split of interactions
    tr, te = random_split(inter, (0.8, 0.2), random_state=args.seed)
    t0 = time.perf_counter()
    ours = ImplicitMF(args.factors, regularization=args.regularization, alpha=args.alpha,
                      n_epochs=args.iterations, random_state=args.seed).fit(tr)
    rows.append(report("fedcf ImplicitMF (weighted ALS)", "seen",
                       ranking_metrics(dot_scores(ours.user_factors_, ours.item_factors_), tr, te),
                       time.perf_counter() - t0))
    try:
        from implicit.cpu.als import AlternatingLeastSquares
    except ImportError:
        AlternatingLeastSquares = None
        print("implicit is not installed: pip install implicit (or fedcf[bench])")
    if AlternatingLeastSquares is not None:
        for use_cg in (False, True):
            with threadpool_limits(1, "blas"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                m = AlternatingLeastSquares(factors=args.factors, regularization=args.regularization,
                                            alpha=1.0 + args.alpha, iterations=args.iterations,
                                            use_cg=use_cg, random_state=args.seed)
                m.fit(sp.csr_matrix(tr.to_csr()), show_progress=False)
                secs = time.perf_counter() - t0
            rows.append(report(f"implicit ALS ({'CG' if use_cg else 'Cholesky'})", "seen",
                               ranking_metrics(dot_scores(m.user_factors, m.item_factors), tr, te),
                               secs))
    t0 = time.perf_counter()
    ob = ImplicitMF(args.factors, regularization=args.biased_regularization, alpha=args.alpha,
                    n_epochs=args.iterations, biases=True,
                    random_state=args.seed).fit(tr)
    rows.append(report("fedcf ImplicitMF with biases", "seen",
                       ranking_metrics(model_scores(ob, ob.user_factors_, ob.user_biases_), tr,
                                       te), time.perf_counter() - t0))
    popc = np.bincount(tr.items, minlength=tr.n_items).astype(float)
    rows.append(report("popularity", "seen",
                       ranking_metrics(lambda u: np.tile(popc, (len(u), 1)), tr, te), 0.0))

    # unseen users: ReconEval
    tr_u, _va, te_u = user_split(inter, (0.8, 0.1, 0.1), random_state=args.seed)
    sup, qry = support_query_split(te_u, "random", 0.5, random_state=args.seed)
    for full, biases in ((False, False), (True, False), (False, True)):
        t0 = time.perf_counter()
        fed = FedReconImplicitMF(args.factors, alpha=args.alpha,
                                 reconstruction=RidgeReconstruction(args.regularization),
                                 n_rounds=args.rounds,
                                 clients_per_round=args.clients, full_negatives=full,
                                 biases=biases,
                                 random_state=args.seed).fit(tr_u)
        P, c = fed.reconstruct_users(sup)
        up = float(np.mean([h["values_up"] for h in fed.history_]))
        name = f"{'full' if full else 'sampled'} negatives{', biases' if biases else ''}"
        row = report(f"FedReconImplicitMF ({name})", "unseen",
                     ranking_metrics(model_scores(fed, P, c), sup, qry),
                     time.perf_counter() - t0)
        row["values_up_per_round"] = up
        print(f"{'':<44} numbers uploaded per round: {up:,.0f}")
        rows.append(row)
    t0 = time.perf_counter()
    cen = ImplicitMF(args.factors, regularization=args.regularization, alpha=args.alpha,
                     n_epochs=args.iterations, random_state=args.seed).fit(tr_u)
    Pc, _ = cen.reconstruct_users(sup)
    rows.append(report("centralized ImplicitMF + fold-in", "unseen",
                       ranking_metrics(dot_scores(Pc, cen.item_factors_), sup, qry),
                       time.perf_counter() - t0))
    t0 = time.perf_counter()
    cb = ImplicitMF(args.factors, regularization=args.biased_regularization, alpha=args.alpha,
                    n_epochs=args.iterations, biases=True,
                    random_state=args.seed).fit(tr_u)
    rows.append(report("centralized ImplicitMF with biases + fold-in", "unseen",
                       ranking_metrics(model_scores(cb, *cb.reconstruct_users(sup)), sup, qry),
                       time.perf_counter() - t0))
    popu = np.bincount(tr_u.items, minlength=tr_u.n_items).astype(float)
    rows.append(report("popularity", "unseen",
                       ranking_metrics(lambda u: np.tile(popu, (len(u), 1)), sup, qry), 0.0))
    if args.json:
        meta = run_meta("implicit_benchmark.py", argv, packages=("implicit",))
        write_json(args.json, [{**r, "meta": meta} for r in rows])
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "implicit_benchmark.py")
