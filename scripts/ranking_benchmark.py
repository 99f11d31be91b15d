#!/usr/bin/env python
"""The federated-recommendation ranking benchmark: leave-one-out on implicit feedback, every
model under every protocol of ``fedcf.eval.loo``, several seeds, mean ± std.

Protocols (test item = each user's newest interaction, validation item = the one before):
  clean-99, clean-999  the held-out item against 99 / 999 negatives drawn once per user from
                       items they never interacted with; the training sampler never draws
                       the held-out items or that protocol's negatives (a training each: the
                       99 are a random subset of the 999; users with fewer than 999 free
                       items are left out of clean-999 and counted)
  paper-compat-99      the same 99 negatives, but training negatives drawn as the published
                       implementations draw them (never an item of the user's whole log, so
                       the held-out item is the one candidate never pushed down). Leaky; it
                       differs from clean-99's training only in drawing the 99.
  full                 against the whole catalog, the user's other interactions masked,
                       training negatives from everything but the user's training items
  federation-off       PFedRec with the server switched off (each device trains its own copy
                       for as many epochs as the federated run has rounds), paper-compat and
                       clean: the size of the leak

Users: per seed, 80 % are seen in fit and 20 % are held out whole; every protocol is scored for
both ("… unseen" rows): an unseen user's model comes from their training items alone, by
reconstruction (FedRecon, and ImplicitMF's fold-in) or by training the user part on their
device with everything global frozen (the sampled baselines; PFedRec then finetunes its
personal item rows as in a round).

Models: popularity; centralized ImplicitMF (weighted ALS); FedReconImplicitMF; FedMF; FedNCF;
PFedRec; centralized NCF (NeuMF: FedNCF's network trained on one server). Weighted ALS treats
every unobserved item as a weak negative, the held-out item included, so no sampler can leak:
ImplicitMF and FedRecon are trained once per seed and evaluated under every protocol (their
paper-compat-99 figure is their clean-99 one). The sampled-negative models are trained once per
sampler, with the papers' settings. Weighted ALS's (alpha, λ) are chosen on the validation item,
never the test item, separately for ImplicitMF and FedRecon.

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

from fedcf import NCF, FedReconImplicitMF, ImplicitMF
from fedcf.datasets import Interactions, SyntheticPopulation, load_movielens
from fedcf.eval.loo import (
    leave_one_out,
    loo_ranks,
    rank_metrics,
    sample_negatives,
    training_exclusions,
)
from fedcf.eval.splits import user_split_indices
from fedcf.federated import FedMF, FedNCF, PFedRec, RidgeReconstruction, SampledUpdate
from fedcf.provenance import report_result, run_meta

SAMPLED = {"FedMF": FedMF, "FedNCF": FedNCF, "PFedRec": PFedRec, "NCF": NCF}
MODELS = ("popularity", "ImplicitMF", "FedReconImplicitMF", *SAMPLED)


SYNTHETIC = {"synthetic-1m": dict(n_users=6040, n_items=3706, ratings_per_user=165.6),
             "synthetic-small": dict(n_users=400, n_items=300, ratings_per_user=30.0)}


def load(args) -> Interactions:
    if args.dataset in SYNTHETIC:  # every rated item is a positive; no timestamps
        inter = SyntheticPopulation(**SYNTHETIC[args.dataset], random_state=0).to_interactions()
    else:
        inter = load_movielens(args.dataset, download=not args.offline)
    inter = Interactions(inter.indptr, inter.items, np.ones(inter.nnz), inter.timestamps,
                         inter.user_ids, inter.item_ids)
    if args.users:
        inter = inter.subset_users(np.arange(min(args.users, inter.n_users)))
    return inter.subset_users(np.flatnonzero(inter.counts() >= 3))


def split_of(inter, ties: str = "random"):
    """Leave-one-out by time (equal times ordered by ``ties``, seeded), or at random (seeded)
    for data without timestamps."""
    return leave_one_out(inter, order="time" if inter.timestamps is not None else "random",
                         ties=ties, random_state=0)


def tie_effect(args) -> dict | None:
    """How much the tie rule for equal timestamps matters: the share of users whose newest
    (or second newest) time is shared by several of their items, the share whose held-out item
    the rule changes, and popularity's and ImplicitMF's HR@k (clean-99 and full, every user,
    each seed's 99 negatives) under each rule. None for data without timestamps."""
    inter = load(args)
    if inter.timestamps is None:
        return None
    splits = {t: split_of(inter, t) for t in ("random", "item")}
    last = inter.indptr[1:] - 1
    out = {"tied_newest": float(np.mean(inter.timestamps[last] == inter.timestamps[last - 1])),
           "tied_second": float(np.mean(inter.timestamps[last - 1] == inter.timestamps[last - 2])),
           "test_changed": float(np.mean(splits["random"].test != splits["item"].test)),
           "validation_changed": float(np.mean(splits["random"].validation
                                               != splits["item"].validation)), "rows": []}
    for seed in range(args.seeds):
        for ties, split in splits.items():
            small, _ = protocol_sets(split, seed, args.large)
            model = _build("ImplicitMF", args, seed).fit(split.train)
            pop = np.bincount(split.train.items, minlength=split.train.n_items).astype(float)
            for name, fn in (("popularity", lambda u: np.tile(pop, (len(u), 1))),
                             ("ImplicitMF", lambda u: model.score_all_items(
                                 *model._user_params(u)))):
                for proto, neg in (("clean-99", small), ("full", None)):
                    m = rank_metrics(loo_ranks(fn, split, negatives=neg), args.k)
                    out["rows"].append({"ties": ties, "seed": seed, "model": name,
                                        "protocol": proto, **m})
    return out


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


def _scores(model, split, seen, unseen, exclude=None, chunk: int = 512) -> np.ndarray:
    """Every user's scores, computed once and served to each protocol: users seen in fit from
    the model (PFedRec finetunes per device to score), unseen users from their training items
    alone (reconstructed, or trained on their device with everything global frozen)."""
    S = np.empty((split.n_users, split.train.n_items))
    new = split.train.subset_users(unseen)
    if isinstance(model, tuple(SAMPLED.values())):
        fn = model.user_scores
        S[unseen] = model.score_new_users(new, None if exclude is None
                                          else exclude.subset_users(unseen))
    else:
        def fn(u):
            return model.score_all_items(*model._user_params(u))
        S[unseen] = model.score_all_items(*model.reconstruct_users(new))
    S[seen] = np.vstack([fn(np.arange(s, min(s + chunk, len(seen))))
                         for s in range(0, len(seen), chunk)])
    return S


GRID = ((1.0, 1.0), (1.0, 10.0), (5.0, 10.0), (20.0, 10.0), (1.0, 50.0))
TUNED = {"ImplicitMF": ("alpha", "regularization"),
         "FedReconImplicitMF": ("recon_alpha", "recon_regularization")}


def select(args, name) -> tuple[list, tuple]:
    """(alpha, λ) of ``name``'s weighted ALS with the best HR@k on the *validation* item
    (seed 0's 99 negatives), never the test item. Ties go to the first in GRID."""
    split = split_of(load(args), args.ties)
    small, _ = protocol_sets(split, 0, args.large)
    tried = []
    for alpha, lam in GRID:
        trial = argparse.Namespace(**{**vars(args), **dict(zip(TUNED[name], (alpha, lam)))})
        model = _build(name, trial, 0).fit(split.train)
        hr = rank_metrics(loo_ranks(lambda u: model.score_all_items(*model._user_params(u)),
                                    split, negatives=small, part="validation"),
                          args.k)[f"hr@{args.k}"]
        tried.append({"model": name, "alpha": alpha, "regularization": lam,
                      f"validation_hr@{args.k}": hr})
    best = max(tried, key=lambda r: r[f"validation_hr@{args.k}"])  # first of equals
    return tried, (best["alpha"], best["regularization"])


def _evaluate(S, split, small, big, protocols, k, users) -> dict:
    """{protocol: metrics} of ``users`` from the score matrix S; "clean-large" is named after
    the large negative count."""
    negs = {"clean-99": small, "clean-large": big, "paper-compat-99": small, "full": None,
            "federation-off-paper": small, "federation-off-clean": small}
    return {(f"clean-{big.shape[1]}" if name == "clean-large" else name):
            rank_metrics(loo_ranks(lambda u: S[u], split, negatives=negs[name], users=users), k)
            for name in protocols}


def _build(name, args, seed):
    if name == "ImplicitMF":
        return ImplicitMF(args.factors, alpha=args.alpha, regularization=args.regularization,
                          n_epochs=15, random_state=seed)
    if name == "FedReconImplicitMF":
        return FedReconImplicitMF(args.factors, alpha=args.recon_alpha,
                                  reconstruction=RidgeReconstruction(args.recon_regularization),
                                  n_rounds=args.recon_rounds, clients_per_round=args.recon_clients,
                                  random_state=seed)
    if name == "NCF":
        return NCF(args.factors, n_epochs=args.ncf_epochs, random_state=seed)
    return SAMPLED[name](args.factors, n_rounds=args.rounds, random_state=seed)


def run_task(task):
    """One (model, seed): its trainings and the protocols each serves."""
    name, seed, args = task
    import numba
    from threadpoolctl import threadpool_limits
    if args.workers > 1:  # one core per worker: no BLAS or Numba threads on top
        numba.set_num_threads(1)
    with threadpool_limits(1 if args.workers > 1 else None):
        return _run_task(name, seed, args)


BASE = ("clean-99", "clean-large", "full")
LEAKY = ("paper-compat", "federation-off-paper")


def _run_task(name, seed, args):
    split = split_of(load(args), args.ties)
    small, big = protocol_sets(split, seed, args.large)
    seen, unseen = (np.sort(p) for p in user_split_indices(split.n_users, (0.8, 0.2),
                                                            random_state=seed))
    rows = []

    def record(protocols, S, seconds, with_unseen=True):
        for users, tag in ((seen, ""), (unseen, " unseen"))[:1 + with_unseen]:
            for proto, m in _evaluate(S, split, small, big, protocols, args.k, users).items():
                rows.append({"model": name, "protocol": proto + tag, "seed": seed,
                             "seconds": seconds, "leaky": proto.startswith(LEAKY), **m})

    def train(model, exclude=None):
        t = time.perf_counter()
        extra = {} if exclude is None else {"exclude": exclude.subset_users(seen)}
        model.fit(split.train.subset_users(seen), **extra)
        return _scores(model, split, seen, unseen, exclude), time.perf_counter() - t

    if name == "popularity":
        pop = np.bincount(split.train.subset_users(seen).items,
                          minlength=split.train.n_items).astype(float)
        record(BASE, np.broadcast_to(pop, (split.n_users, len(pop))), 0.0)
    elif name not in SAMPLED:
        record(BASE, *train(_build(name, args, seed)))
    else:
        # clean-99 differs from paper-compat-99 in the leak only (its 99 are never drawn);
        # clean-large also keeps the large protocol's negatives out (−1, a user without them,
        # is skipped)
        runs = {"clean": (("clean-99",), training_exclusions(split, "clean", small)),
                "clean-large": (("clean-large",),
                                training_exclusions(split, "clean", np.hstack([small, big]))),
                "paper-compat": (("paper-compat-99",), training_exclusions(split, "paper-compat")),
                "full": (("full",), training_exclusions(split, "full"))}
        for protocols, ex in runs.values():
            record(protocols, *train(_build(name, args, seed), ex))
        if name == "PFedRec" and args.probe:  # seen users only: it has no federation to join
            for mode, proto in (("paper-compat", "federation-off-paper"),
                                ("clean", "federation-off-clean")):
                off = PFedRec(args.factors, n_rounds=1, client_update=SampledUpdate(epochs=args.rounds),
                              upload_items=False, random_state=seed)
                record((proto,), *train(off, runs[mode][1]), with_unseen=False)
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
    ap.add_argument("--dataset", default="100k",
                    help=f"MovieLens variant, or {' / '.join(SYNTHETIC)} (fedcf's synthetic "
                         "population; held-out items at random, as it has no timestamps)")
    ap.add_argument("--offline", action="store_true", help="never download (use the cache)")
    ap.add_argument("--users", type=int, default=0, help="first N users only (0: all)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--factors", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=100, help="rounds of the sampled baselines")
    ap.add_argument("--ncf-epochs", type=int, default=20, help="epochs of centralized NCF")
    ap.add_argument("--recon-rounds", type=int, default=1000)
    ap.add_argument("--recon-clients", type=int, default=300)
    ap.add_argument("--alpha", type=float, default=None,
                    help="weighted-ALS confidence slope (default: chosen on the validation item)")
    ap.add_argument("--regularization", type=float, default=None,
                    help="weighted-ALS λ (default: chosen with --alpha)")
    ap.add_argument("--recon-alpha", type=float, default=None,
                    help="FedRecon's confidence slope (default: chosen on the validation item)")
    ap.add_argument("--recon-regularization", type=float, default=None,
                    help="FedRecon's reconstruction λ (default: chosen with --recon-alpha)")
    ap.add_argument("--large", type=int, default=999, help="negatives of the large protocol")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--ties", choices=("random", "item"), default="random",
                    help="order of a user's interactions with equal timestamps: at random "
                         "(seeded; default) or by item id (the held-out item is then the "
                         "largest id among equals)")
    ap.add_argument("--no-probe", dest="probe", action="store_false")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model {bad[0]!r}; choose from {', '.join(MODELS)}")
    if args.large < 100:
        ap.error(f"--large must be at least 100 (its negatives hold the 99), got {args.large}")
    inter = load(args)
    t0 = time.perf_counter()
    selection = []
    for name, (a, lam) in TUNED.items():
        if name in models and (getattr(args, a) is None or getattr(args, lam) is None):
            tried, chosen = select(args, name)
            selection += tried
            setattr(args, a, chosen[0])
            setattr(args, lam, chosen[1])
    print(f"{inter!r}; {len(models)} models x {args.seeds} seeds on {args.workers} workers; "
          f"weighted ALS alpha, lambda: ImplicitMF {args.alpha}, {args.regularization}; "
          f"FedRecon {args.recon_alpha}, {args.recon_regularization}")
    cost = {"FedNCF": 0, "NCF": 1, "PFedRec": 2, "FedMF": 3}  # longest first: workers end together
    tasks = sorted(((m, s, args) for s in range(args.seeds) for m in models),
                   key=lambda t: (cost.get(t[0], 3), t[1]))
    if args.workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
            rows = [r for rs in pool.map(run_task, tasks) for r in rs]
    else:
        rows = [r for t in tasks for r in run_task(t)]
    table = summarize(rows, args.k)
    ties = tie_effect(args) if "ImplicitMF" in models else None
    for r in table:
        print(f"{r['model']:<20} {r['protocol']:<22} HR@{args.k} {r[f'hr@{args.k}']:.4f} "
              f"± {r[f'hr@{args.k}_std']:.4f}  NDCG {r[f'ndcg@{args.k}']:.4f}"
              + ("  (leaky)" if r["leaky"] else ""))
    out = {"meta": run_meta("ranking_benchmark.py", argv), "dataset": args.dataset,
           "n_users": inter.n_users, "n_items": inter.n_items, "nnz": inter.nnz,
           "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
           "wall_seconds": time.perf_counter() - t0, "selection": selection, "table": table,
           "tie_effect": ties, "runs": rows}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "ranking_benchmark.py")
