#!/usr/bin/env python
"""The federated-recommendation ranking benchmark: leave-one-out on implicit feedback, every
model under every protocol of ``fedcf.eval.loo``, several seeds, mean ± std.

Protocols (test item = each user's newest interaction, validation item = the one before):
  clean-99, clean-999  the held-out item against 99 / 999 negatives drawn once per user from
                       items they never interacted with; no training sampler ever draws those
                       negatives or the held-out items (one training serves both: the 99 are a
                       random subset of the 999; users with fewer than 999 free items are left
                       out of clean-999 and counted)
  paper-compat-99      the same 99 negatives, but training negatives drawn as the published
                       implementations draw them (never an item of the user's whole log, so
                       the held-out item is the one candidate never pushed down). Leaky.
  full                 against the whole catalog, the user's other interactions masked,
                       training negatives from everything but the user's training items
  federation-off       PFedRec with the server switched off (each device trains its own copy
                       for as many epochs as the federated run has rounds), paper-compat and
                       clean: the size of the leak

Models: popularity; centralized ImplicitMF (weighted ALS); FedReconImplicitMF; FedMF; FedNCF;
PFedRec. Weighted ALS treats every unobserved item as a weak negative, the held-out item
included, so no sampler can leak: ImplicitMF and FedRecon are trained once per seed and
evaluated under every protocol (their paper-compat-99 figure is their clean-99 one). The
sampled-negative baselines are trained once per sampler, with the papers' settings. Weighted
ALS's (alpha, λ) are chosen on the validation item, never the test item.

Example: python scripts/ranking_benchmark.py --json eval/results/ranking.json
Quick look: python scripts/ranking_benchmark.py --users 200 --rounds 5 --seeds 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from fedcf import FedReconImplicitMF, ImplicitMF
from fedcf.datasets import Interactions, load_movielens
from fedcf.eval.loo import (
    leave_one_out,
    loo_ranks,
    rank_metrics,
    sample_negatives,
    training_exclusions,
)
from fedcf.federated.sampled import FedMF, FedNCF, PFedRec
from fedcf.provenance import report_result, run_meta

SAMPLED = {"FedMF": FedMF, "FedNCF": FedNCF, "PFedRec": PFedRec}
MODELS = ("popularity", "ImplicitMF", "FedReconImplicitMF", *SAMPLED)


def load(args) -> Interactions:
    inter = load_movielens(args.dataset, download=not args.offline)
    inter = Interactions(inter.indptr, inter.items, np.ones(inter.nnz), inter.timestamps,
                         inter.user_ids, inter.item_ids)
    if args.users:
        inter = inter.subset_users(np.arange(min(args.users, inter.n_users)))
    return inter.subset_users(np.flatnonzero(inter.counts() >= 3))


def protocol_sets(split, seed: int, short: int):
    """Negatives of one seed: 999 per user (or −1 when the user has too few free items) and 99
    drawn as a random subset of them (a separate draw for users without 999)."""
    rng = np.random.RandomState(seed)
    big = sample_negatives(split, short, random_state=rng, short_users="drop")
    small = sample_negatives(split, 99, random_state=rng)
    has = big[:, 0] >= 0
    pick = np.argsort(rng.random_sample((int(has.sum()), short)), axis=1)[:, :99]
    small[has] = np.take_along_axis(big[has], pick, axis=1)
    return small, big


def _scores(model, n_users: int, chunk: int = 512):
    """Every user's scores, computed once (PFedRec finetunes per user to score) and served to
    each protocol."""
    fn = model.user_scores if isinstance(model, tuple(SAMPLED.values())) else \
        (lambda u: model.score_all_items(*model._user_params(u)))
    S = np.vstack([fn(np.arange(s, min(s + chunk, n_users))) for s in range(0, n_users, chunk)])
    return lambda u: S[u]


def select_wals(args, grid=((1.0, 1.0), (1.0, 10.0), (5.0, 10.0), (20.0, 10.0), (1.0, 50.0))):
    """(alpha, λ) of weighted ALS with the best HR@k on the *validation* item (seed 0's 99
    negatives), never the test item; FedRecon uses the same."""
    split = leave_one_out(load(args))
    small, _ = protocol_sets(split, 0, args.large)
    best = []
    for alpha, lam in grid:
        model = ImplicitMF(args.factors, alpha=alpha, regularization=lam, n_epochs=15,
                           random_state=0).fit(split.train)
        hr = rank_metrics(loo_ranks(_scores(model, split.n_users), split, negatives=small,
                                    part="validation"), args.k)[f"hr@{args.k}"]
        best.append((hr, alpha, lam))
    return [{"alpha": a, "regularization": lam, f"validation_hr@{args.k}": hr}
            for hr, a, lam in best], max(best)[1:]


def _evaluate(score, split, small, big, protocols, k) -> dict:
    out = {}
    for name in protocols:
        neg = {"clean-99": small, "clean-999": big, "paper-compat-99": small, "full": None,
               "federation-off-paper": small, "federation-off-clean": small}[name]
        out[name] = rank_metrics(loo_ranks(score, split, negatives=neg), k)
    return out


def _build(name, args, seed):
    if name == "ImplicitMF":
        return ImplicitMF(args.factors, alpha=args.alpha, regularization=args.regularization,
                          n_epochs=15, random_state=seed)
    if name == "FedReconImplicitMF":
        return FedReconImplicitMF(args.factors, alpha=args.alpha,
                                  recon_regularization=args.regularization,
                                  n_rounds=args.recon_rounds, clients_per_round=args.recon_clients,
                                  random_state=seed)
    return SAMPLED[name](args.factors, n_rounds=args.rounds, random_state=seed)


def run_task(task):
    """One (model, seed): its trainings and the protocols each serves."""
    name, seed, args = task
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        return _run_task(name, seed, args)


def _run_task(name, seed, args):
    inter = load(args)
    split = leave_one_out(inter)
    small, big = protocol_sets(split, seed, args.large)
    t0 = time.perf_counter()
    rows = []

    def record(protocols, score, seconds):
        for proto, m in _evaluate(score, split, small, big, protocols, args.k).items():
            rows.append({"model": name, "protocol": proto, "seed": seed, "seconds": seconds,
                         "leaky": proto.startswith(("paper", "federation-off-paper")), **m})

    if name == "popularity":
        pop = np.bincount(split.train.items, minlength=split.train.n_items).astype(float)
        record(("clean-99", "clean-999", "full"),
               lambda u: np.broadcast_to(pop, (len(u), len(pop))), 0.0)
    elif name not in SAMPLED:
        model = _build(name, args, seed).fit(split.train)
        record(("clean-99", "clean-999", "full"), _scores(model, split.n_users),
               time.perf_counter() - t0)
    else:
        runs = {"clean": (("clean-99", "clean-999"),  # −1 (a user without 999) is skipped
                           training_exclusions(split, "clean", np.hstack([small, big]))),
                "paper-compat": (("paper-compat-99",), training_exclusions(split, "paper-compat")),
                "full": (("full",), training_exclusions(split, "full"))}
        for protocols, ex in runs.values():
            t = time.perf_counter()
            model = _build(name, args, seed).fit(split.train, exclude=ex)
            record(protocols, _scores(model, split.n_users), time.perf_counter() - t)
        if name == "PFedRec" and args.probe:
            for mode, proto in (("paper-compat", "federation-off-paper"),
                                ("clean", "federation-off-clean")):
                ex = runs[mode][1]
                t = time.perf_counter()
                model = PFedRec(args.factors, n_rounds=1, local_epochs=args.rounds,
                                server_learning_rate=0.0, random_state=seed).fit(split.train,
                                                                                 exclude=ex)
                record((proto,), _scores(model, split.n_users), time.perf_counter() - t)
    return rows


def summarize(rows, k) -> list:
    out = []
    keys = sorted({(r["model"], r["protocol"]) for r in rows},
                  key=lambda mp: (MODELS.index(mp[0]), mp[1]))
    for model, proto in keys:
        rs = [r for r in rows if r["model"] == model and r["protocol"] == proto]
        row = {"model": model, "protocol": proto, "runs": len(rs), "leaky": rs[0]["leaky"],
               "n_users": rs[0]["n_users"], "seconds": float(np.mean([r["seconds"] for r in rs]))}
        for m in (f"hr@{k}", f"ndcg@{k}", "mrr"):
            v = np.array([r[m] for r in rs])
            row[m], row[m + "_std"] = float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0
        out.append(row)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="100k", help="MovieLens variant")
    ap.add_argument("--offline", action="store_true", help="never download (use the cache)")
    ap.add_argument("--users", type=int, default=0, help="first N users only (0: all)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--factors", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=100, help="rounds of the sampled baselines")
    ap.add_argument("--recon-rounds", type=int, default=1000)
    ap.add_argument("--recon-clients", type=int, default=300)
    ap.add_argument("--alpha", type=float, default=None,
                    help="weighted-ALS confidence slope (default: chosen on the validation item)")
    ap.add_argument("--regularization", type=float, default=None,
                    help="weighted-ALS λ (default: chosen with --alpha)")
    ap.add_argument("--large", type=int, default=999, help="negatives of the large protocol")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--no-probe", dest="probe", action="store_false")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model {bad[0]!r}; choose from {', '.join(MODELS)}")
    inter = load(args)
    selection = []
    if args.alpha is None or args.regularization is None:
        selection, (args.alpha, args.regularization) = select_wals(args)
    print(f"{inter!r}; {len(models)} models x {args.seeds} seeds on {args.workers} workers; "
          f"weighted ALS alpha={args.alpha}, lambda={args.regularization}")
    cost = {"FedNCF": 0, "PFedRec": 1, "FedMF": 2}  # longest first: the workers end together
    tasks = sorted(((m, s, args) for s in range(args.seeds) for m in models),
                   key=lambda t: (cost.get(t[0], 3), t[1]))
    t0 = time.perf_counter()
    if args.workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
            rows = [r for rs in pool.map(run_task, tasks) for r in rs]
    else:
        rows = [r for t in tasks for r in run_task(t)]
    table = summarize(rows, args.k)
    for r in table:
        print(f"{r['model']:<20} {r['protocol']:<22} HR@{args.k} {r[f'hr@{args.k}']:.4f} "
              f"± {r[f'hr@{args.k}_std']:.4f}  NDCG {r[f'ndcg@{args.k}']:.4f}"
              + ("  (leaky)" if r["leaky"] else ""))
    out = {"meta": run_meta("ranking_benchmark.py", argv), "dataset": args.dataset,
           "n_users": inter.n_users, "n_items": inter.n_items, "nnz": inter.nnz,
           "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
           "wall_seconds": time.perf_counter() - t0, "selection": selection, "table": table,
           "runs": rows}
    return report_result(out, args.json)


if __name__ == "__main__":
    main()
