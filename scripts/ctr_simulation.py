#!/usr/bin/env python
"""Expression-recommendation CTR rehearsal: simulate a population, train FedRecon on implicit
shares the deployment's way, measure online CTR and lift, evaluate off-policy estimators against
simulated truth, and check them on the real Open Bandit logs.

Steps
-----
1. Population (``--users``, ``--items`` spread over GIF / sticker / emoji-kitchen types), shares
   over a training period; users split 80/10/10 (train / validation / held-out test).
2. FedReconImplicitMF trained with per-round client availability, oversampling, dropouts and
   support = query, without and with item and user biases; CTR of the held-out users' slates
   tracked every ``--eval-every`` rounds. Centralized weighted ALS (ImplicitMF) on the same
   train users as the server-side baseline: the earlier setting (no biases, λ = 0.05) and with
   biases and ``--central-lambda``.
3. Online CTR test on held-out users (reconstructed from their own shares): every model,
   popularity, random, and FedRecon re-ranking the share-count prior (``fedrecon_prior``, its
   weight chosen on the validation users' held-out shares); lift over popularity with a paired
   bootstrap interval; expected CTR by the users' number of shares; AUC of each model's score
   against clicks on uniformly logged impressions, drawn and expected (each impression weighted
   by its exact click probability).
4. The Open Bandit sample (real logs): BTS's CTR estimated from the uniform-random log by every
   estimator, the slate ones included.
Off-policy estimators against simulated truth at scale: ``ope_study.py``.

Example: python scripts/ctr_simulation.py --json ctr.json
Scale of the simulator alone: python scripts/ctr_simulation.py --population-only --users 1000000
--items 38000 --json population.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fedcf import FedReconImplicitMF, ImplicitMF
from fedcf.datasets import CAMPAIGNS, load_open_bandit
from fedcf.eval import off_policy_check, top_k, user_split
from fedcf.eval.ctr import click_auc, expected_click_auc, online_ctr_test, simulate_log
from fedcf.eval.prior import choose_prior_weight, popularity_prior
from fedcf.eval.simulation import expression_types, make_expression_population
from fedcf.provenance import run_meta, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared settings beside it
from population_cli import add_population_args  # noqa: E402


def scores_for(model, inter):
    """Every item's score b_i + c_u + p·q for each user of ``inter``, reconstructed."""
    return model.score_all_items(*model.reconstruct_users(inter))


def ctr_by_activity(pop, slates, users, counts, edges=((1, 1), (2, 2), (3, 5), (6, None))):
    """Each policy's exact expected CTR over the users with a given number of shares."""
    rows = []
    for name, slate in slates.items():
        pos = np.broadcast_to(np.arange(slate.shape[1]), slate.shape)
        per_user = pop.click_probability(users, slate, pos).mean(axis=1)
        for lo, hi in edges:
            sel = (counts >= lo) & (counts <= (hi if hi is not None else counts.max()))
            rows.append({"policy": name, "shares": f"{lo}" if lo == hi else
                         (f"{lo}-{hi}" if hi else f"{lo}+"), "users": int(sel.sum()),
                         "ctr_expected": float(per_user[sel].mean())})
    return rows


def population_only(args, argv=None):
    """Time the simulator alone (population + shares) at the requested size."""
    import resource

    t0 = time.perf_counter()
    pop = make_expression_population(args.users, expression_types(args.items), random_state=args.seed)
    t_pop = time.perf_counter() - t0
    t0 = time.perf_counter()
    shares = pop.shares(random_state=args.seed + 1)
    t_sh = time.perf_counter() - t0
    counts = shares.counts()
    res = {"users": pop.n_users, "items": pop.n_items, "share_pairs": int(shares.nnz),
           "population_seconds": t_pop, "shares_seconds": t_sh,
           "share_at_most_2": float(np.mean(counts <= 2)), "max_shares": int(counts.max()),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "meta": run_meta("ctr_simulation.py", argv)}
    print(f"{pop.n_users:,} users x {pop.n_items:,} items: population {t_pop:.1f} s, "
          f"{shares.nnz:,} share pairs in {t_sh:.1f} s; users with <= 2 shares "
          f"{res['share_at_most_2']:.0%}; peak RSS {res['peak_rss_mib']:.0f} MiB")
    if args.json:
        write_json(args.json, res)
    return res


def simulate(args, seed: int, quiet: bool = False) -> dict:
    """Steps 1-3 for one seed: the population, the models, the online CTR test and the click
    AUC on uniformly logged impressions."""
    rng = np.random.default_rng(seed)
    # 1. population ---------------------------------------------------------------------------
    pop = make_expression_population(args.users, expression_types(args.items),
                                     position_bias=np.linspace(1.0, 0.3, args.slate),
                                     random_state=seed)
    shares = pop.shares(random_state=seed + 1)
    train, val, test = user_split(shares, (0.8, 0.1, 0.1), random_state=seed)
    counts = shares.counts()
    per_type = {t: int(n) for t, n in zip(pop.type_names, np.bincount(pop.item_type))}
    print(f"population: {pop.n_users:,} users, {pop.n_items:,} items {per_type}, "
          f"{shares.nnz:,} (user, item) share pairs; users with <= 2 shares: "
          f"{np.mean(counts <= 2):.0%}; max {counts.max()}")
    setup = {"users": pop.n_users, "items": pop.n_items, "items_per_type": per_type,
             "share_pairs": int(shares.nnz), "share_at_most_2": float(np.mean(counts <= 2)),
             "max_shares": int(counts.max()), "mean_availability": float(pop.availability.mean()),
             "factors": args.factors, "rounds": args.rounds, "clients": args.clients,
             "slate": args.slate, "oversample": 0.3, "dropout": 0.1,
             "auc_impressions": args.auc_impressions,
             "epsilon": 0.3, "test_users": int(test.n_users),
             "position_bias": [float(x) for x in np.linspace(1.0, 0.3, args.slate)]}
    test_users = test.user_ids  # population ids of the held-out users
    eval_users = test_users[: min(len(test_users), 2000)]
    eval_rows = np.arange(len(eval_users))

    # 2. training -------------------------------------------------------------------------------
    curve = []

    def track(model, done):
        S = scores_for(model, test.subset_users(eval_rows))
        slates = top_k(S, args.slate)
        pos = np.broadcast_to(np.arange(args.slate), slates.shape)
        ctr = float(pop.click_probability(eval_users, slates, pos).mean())
        curve.append({"round": done, "ctr_expected": ctr})
        return {"ctr_expected": ctr}

    def available(t):  # raw ids of the training users reachable in round t
        ids = pop.available(t)
        return ids[np.isin(ids, train.user_ids)]

    fed_kw = dict(n_rounds=args.rounds, clients_per_round=args.clients,
                  oversample=setup["oversample"], dropout=setup["dropout"], split="none",
                  min_examples=1, random_state=seed)
    fed = FedReconImplicitMF(args.factors, eval_every=args.eval_every, **fed_kw)
    t0 = time.perf_counter()
    fed.fit(train, callback=track, availability=available)
    fed_s = time.perf_counter() - t0
    models = {"fedrecon": fed}
    for name, kw in [("fedrecon_biases", dict(biases=True)),
                     ("fedrecon_full_negatives", dict(full_negatives=True))]:
        models[name] = FedReconImplicitMF(args.factors, **kw, **fed_kw).fit(
            train, availability=available)
    t0 = time.perf_counter()
    models["centralized"] = ImplicitMF(args.factors, regularization=0.05, alpha=1.0,
                                       n_epochs=10, random_state=seed).fit(train)
    central_s = time.perf_counter() - t0
    models["centralized_biases"] = ImplicitMF(
        args.factors, regularization=args.central_lambda, alpha=1.0, n_epochs=10,
        biases=True, random_state=seed).fit(train)
    hist = fed.history_
    print(f"FedRecon: {args.rounds} rounds x {args.clients} clients in {fed_s:.1f} s; "
          f"mean clients used {np.mean([h['clients_used'] for h in hist]):.0f}, dropped "
          f"{np.mean([h['clients_dropped'] for h in hist]):.1f}, surplus "
          f"{np.mean([h['clients_surplus'] for h in hist]):.1f} per round; "
          f"centralized ALS {central_s:.1f} s")

    # 3. online CTR ----------------------------------------------------------------------------
    share_count = np.bincount(train.items, weights=train.values, minlength=train.n_items)
    k = args.slate
    scores = {name: scores_for(m, test) for name, m in models.items()}
    # FedRecon re-ranking the share-count prior, its weight chosen on the validation users
    prior_w, prior_table = choose_prior_weight(fed, val, share_count, random_state=seed)
    scores["fedrecon_prior"] = popularity_prior(scores["fedrecon"], share_count, prior_w)
    slates = {name: top_k(S, k) for name, S in scores.items()}
    slates["popularity"] = np.tile(np.argsort(-share_count, kind="stable")[:k],
                                   (len(test_users), 1))
    slates["random"] = rng.integers(0, pop.n_items, size=(len(test_users), k))
    table, lifts = online_ctr_test(pop, slates, test_users, n_bootstrap=args.bootstrap,
                                   random_state=seed)
    uni = simulate_log(pop, test_users, setup["auc_impressions"], policy="uniform", slate_size=k,
                       random_state=seed + 2)
    row_of = {u: r for r, u in enumerate(test_users)}
    rows = np.array([row_of[u] for u in uni["context"]])
    logged = {name: S[rows, uni["action"]] for name, S in scores.items()}
    logged["popularity"] = np.log1p(share_count[uni["action"]])
    logged["random"] = rng.random(len(uni))
    auc = {name: click_auc(x, uni["reward"]) for name, x in logged.items()}
    table["auc"] = pd.Series(auc)
    # the same impressions with each click counted by its exact probability (no draw noise)
    table["auc_expected"] = pd.Series({name: expected_click_auc(x, uni["expected_reward"])
                                       for name, x in logged.items()})
    activity = ctr_by_activity(pop, slates, test_users, test.counts())
    if not quiet:
        print("\nonline CTR on held-out users (10 sessions each):")
        print(table.round(5).to_string())
        print("\nlift over popularity (paired bootstrap over users):")
        print(lifts.round(4).to_string())
        print("\nexpected CTR by the user's number of shares:")
        print(pd.DataFrame(activity).pivot(index="policy", columns="shares",
                                           values="ctr_expected").round(5).to_string())
    return {"table": table, "lifts": lifts, "activity": activity, "curve": curve,
            "setup": setup, "fed_s": fed_s, "clicks": int(uni["reward"].sum()),
            "prior_weight": prior_w, "prior_validation": prior_table.to_dict(orient="records"),
            "auc_se": {name: auc_standard_error(a, int(uni["reward"].sum()),
                                                int(len(uni) - uni["reward"].sum()))
                       for name, a in auc.items()}}


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil's (1982) standard error of an AUC from n_pos clicks and n_neg
    non-clicks."""
    q1, q2 = auc / (2 - auc), 2 * auc ** 2 / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc ** 2) + (n_neg - 1) * (q2 - auc ** 2)) / \
        (n_pos * n_neg)
    return float(np.sqrt(max(var, 0.0)))


def seed_summary(seed: int, run: dict) -> dict:
    """What the headline needs from one seed: each policy's click AUC (with its standard error)
    and expected CTR, and each model's CTR lift over popularity."""
    t = run["table"]
    return {"seed": seed, "clicks": run["clicks"], "prior_weight": run["prior_weight"],
            "prior_validation": run["prior_validation"],
            "auc": {p: float(t.loc[p, "auc"]) for p in t.index},
            "auc_expected": {p: float(t.loc[p, "auc_expected"]) for p in t.index},
            "auc_se": run["auc_se"],
            "ctr_expected": {p: float(t.loc[p, "ctr_expected"]) for p in t.index},
            "lift": {p: float(run["lifts"].loc[p, "lift"]) for p in run["lifts"].index},
            "lift_expected": {p: float(run["lifts"].loc[p, "lift_expected"])
                              for p in run["lifts"].index}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add_population_args(ap)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--central-lambda", type=float, default=50.0,
                    help="λ of the centralized model with biases")
    ap.add_argument("--bootstrap", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=5,
                    help="seeds of the headline (lift, click AUC): --seed and the next ones")
    ap.add_argument("--auc-impressions", type=int, default=5_000_000,
                    help="uniformly logged impressions for the click AUC")
    ap.add_argument("--no-obd", action="store_true", help="skip the Open Bandit real-log check")
    ap.add_argument("--plot-dir", default="figures")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--population-only", action="store_true",
                    help="only build the population and its shares, report time and memory")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1 (the detailed run), got {args.seeds}")
    if args.auc_impressions < 1000:
        ap.error(f"--auc-impressions must be at least 1000 for a click AUC with any clicks, "
                 f"got {args.auc_impressions}")
    t_all = time.perf_counter()
    if args.population_only:
        return population_only(args, argv)

    first = simulate(args, args.seed)
    table, lifts, activity, curve = first["table"], first["lifts"], first["activity"], \
        first["curve"]
    setup, fed_s, k = first["setup"], first["fed_s"], args.slate
    seeds = [seed_summary(args.seed, first)]
    for seed in range(args.seed + 1, args.seed + args.seeds):
        print(f"seed {seed} of {args.seed + args.seeds - 1} ...", flush=True)
        seeds.append(seed_summary(seed, simulate(args, seed, quiet=True)))

    # 4. real logs -----------------------------------------------------------------------------
    obd_rows, obd_facts = [], {}
    if not args.no_obd:
        for camp in CAMPAIGNS:
            rnd, bts = load_open_bandit("random", camp), load_open_bandit("bts", camp)
            res = off_policy_check(rnd, bts, n_bootstrap=args.bootstrap, random_state=args.seed,
                                   slate_estimators=True)
            obd_facts[camp] = {"items": int(rnd["action"].nunique()), "rows": int(len(rnd)),
                               "clicks_random": int(rnd["reward"].sum()),
                               "clicks_bts": int(bts["reward"].sum()),
                               "min_bts_propensity": float(bts["propensity"].min()),
                               "distinct_timestamps": int(rnd["timestamp"].nunique()),
                               "uniform_propensity": float(rnd["propensity"].iloc[0])}
            for name, r in res["estimates"].iterrows():
                obd_rows.append({"campaign": camp, "estimator": name, "estimate": r["estimate"],
                                 "low": r["low"], "high": r["high"], "truth": res["truth"],
                                 "ess": r["ess"], "matched_share": r["matched_share"],
                                 "truth_low": res["truth_low"], "truth_high": res["truth_high"],
                                 "relative_error": r["relative_error"]})
        obd = pd.DataFrame(obd_rows)
        print("\nOpen Bandit: BTS CTR estimated from the uniform-random log (relative error):")
        print(obd.pivot_table(index="estimator", columns="campaign",
                              values="relative_error").round(3).to_string())
        print("BTS on-policy CTR:", {c: round(obd[obd.campaign == c].truth.iloc[0], 5)
                                     for c in CAMPAIGNS})

    # plots ------------------------------------------------------------------------------------
    if not args.no_plots:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        os.makedirs(args.plot_dir, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([c["round"] for c in curve], [c["ctr_expected"] for c in curve], marker="o",
                label="FedRecon (held-out users)")
        for name in ("popularity", "centralized", "centralized_biases", "fedrecon_biases"):
            ax.axhline(table.loc[name, "ctr_expected"], ls="--", lw=1, label=name)
        ax.set_xlabel("round")
        ax.set_ylabel(f"expected CTR of the top-{k} slate")
        ax.set_title("CTR by round (simulated expression population)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.plot_dir, "ctr_by_round.png"), dpi=120)
        plt.close(fig)
        print(f"\nwrote {args.plot_dir}/ctr_by_round.png")

    total = time.perf_counter() - t_all
    print(f"total {total:.1f} s")
    fed_lift = lifts.loc["fedrecon"]
    result = {
        "ctr": {p: table.loc[p].to_dict() for p in table.index},
        "lift": float(fed_lift["lift"]), "lift_low": float(fed_lift["lift_low"]),
        "lift_high": float(fed_lift["lift_high"]), "lift_expected": float(fed_lift["lift_expected"]),
        "lifts": lifts.reset_index().to_dict(orient="records"),
        "ctr_by_round": curve, "ctr_by_activity": activity, "open_bandit": obd_rows,
        "open_bandit_facts": obd_facts, "seeds": seeds,
        "seconds": total,
        "setup": {**setup, "central_lambda": args.central_lambda}, "seconds_fedrecon": fed_s,
        "meta": run_meta("ctr_simulation.py", argv, packages=("scikit-learn",)),
    }
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "ctr_simulation.py")
