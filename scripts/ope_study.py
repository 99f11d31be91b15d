#!/usr/bin/env python
"""Evaluate the offline CTR evaluators: 100 independent simulated slate logs per setting, every
estimator's bias, RMSE and 95 % interval coverage against the target's exact CTR, for logs of
10³ to 10⁷ impressions.

Steps
-----
1. The expression population of ``ctr_simulation.py`` (same arguments, same seed) and
   FedReconImplicitMF trained on it the same way; the held-out users' exact click
   probabilities over the catalog form the *world*.
2. A candidate set, the ``--candidates`` most-shared items (the retrieval stage of a two-stage
   recommender). Targets built from FedRecon's scores for those users over the candidates: a
   softmax with ``--temperature`` (drawn independently at each of the ``--slate`` positions)
   and ε-greedy around the user's top slate (``--target-epsilon``, exploring the candidates).
   Logging policies (context-free, each position independent, so propensities are exact):
   uniform over the whole catalog, uniform over the candidates, ε-greedy around the most-shared
   items exploring the candidates (``--logging-epsilon``), softmax over log share counts.
3. A logistic reward model (FedRecon score, log share count, position) fitted on a separate
   pilot log of each logging policy; DM, DR, cascade DR and DRos use it.
4. For every (logging, target) pair and log size: ``--logs`` logs drawn and evaluated by the
   streaming kernel (``fedcf.eval.ope_study``); per estimator: bias, RMSE, mean |relative
   error|, coverage of the normal 95 % intervals, mean effective sample size.
5. Peer, same run: the pandas estimators (``estimate_ctr`` + ``estimate_slate_ctr``) on one
   written-out log of ``--peer-size`` impressions, their time and peak traced memory against
   the kernel's on the same log.

Example: python scripts/ope_study.py --json eval/results/ope.json
Quick look: python scripts/ope_study.py --users 5000 --items 500 --sizes 1000,10000 --logs 20
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

from fedcf import FedReconImplicitMF
from fedcf.eval import OverlapWarning, estimate_ctr, estimate_slate_ctr, user_split
from fedcf.eval import ope_study as st
from fedcf.eval.simulation import expression_types, make_expression_population
from fedcf.provenance import run_meta, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared settings beside it
from population_cli import add_population_args  # noqa: E402

LOGGING = ("uniform_catalog", "uniform", "epsilon", "softmax")
TARGETS = ("softmax", "epsilon")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add_population_args(ap)
    ap.add_argument("--sizes", default="1000,10000,100000,1000000,10000000",
                    help="log sizes in impressions (slates × positions)")
    ap.add_argument("--logs", type=int, default=100, help="independent logs per setting and size")
    ap.add_argument("--candidates", type=int, default=100,
                    help="candidate items (most shared) the policies choose from")
    ap.add_argument("--temperature", type=float, default=0.05,
                    help="softmax target temperature, in units of FedRecon's scores")
    ap.add_argument("--target-epsilon", type=float, default=0.1)
    ap.add_argument("--logging-epsilon", type=float, default=0.3)
    ap.add_argument("--pilot", type=int, default=100_000, help="slates of each pilot log")
    ap.add_argument("--peer-size", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",")]
    bad = [n for n in args.sizes if n < args.slate or n % args.slate]
    if bad or args.logs < 2 or args.slate < 1:
        ap.error(f"--sizes must be multiples of --slate ({args.slate}) and --logs >= 2; "
                 f"got sizes {bad or args.sizes}, logs {args.logs}")
    if not args.slate <= args.candidates <= args.items:
        ap.error(f"--candidates must be between --slate ({args.slate}) and --items "
                 f"({args.items}), got {args.candidates}")
    return args


def build_world(args):
    """(world, FedRecon scores of the world's users, share counts, setup facts)."""
    pop = make_expression_population(args.users, expression_types(args.items),
                                     position_bias=np.linspace(1.0, 0.3, args.slate),
                                     random_state=args.seed)
    shares = pop.shares(random_state=args.seed + 1)
    train, _val, test = user_split(shares, (0.8, 0.1, 0.1), random_state=args.seed)
    fed = FedReconImplicitMF(args.factors, n_rounds=args.rounds, clients_per_round=args.clients,
                             oversample=0.3, dropout=0.1, random_state=args.seed)
    fed.fit(train, availability=lambda t: (lambda i: i[np.isin(i, train.user_ids)])(
        pop.available(t)))
    P, c = fed.reconstruct_users(test)
    S = fed.score_all_items(P, c)
    share_count = np.bincount(train.items, weights=train.values, minlength=train.n_items)
    world = st.SlateWorld.from_population(pop, test.user_ids)
    return world, S, share_count, {"users": pop.n_users, "items": pop.n_items,
                                   "world_users": int(len(test.user_ids))}


def reward_model(world, logging, S, log_pop, args, setting):
    """Logistic q̂ on [score, log share count, position] fitted on a pilot log of ``logging``."""
    dummy = st.epsilon_greedy_target(np.zeros((len(S), args.slate), np.int64), 1.0, S.shape[1])
    zero = st.RewardModel(np.zeros(S.shape, np.float32), np.zeros(args.slate))
    log, _ = st.draw_log(world, logging, dummy, zero, np.zeros((len(S), args.slate)),
                         args.pilot, seed=args.seed, setting=1000 + setting)
    u, a, k = log["context"].to_numpy(), log["action"].to_numpy(), log["position"].to_numpy()
    X = np.column_stack([S[u, a], log_pop[a], np.eye(args.slate)[k]])
    lr = LogisticRegression(C=1.0, max_iter=1000).fit(X, log["reward"].to_numpy())
    coef = lr.coef_[0]
    base = (coef[0] * S + coef[1] * log_pop[None, :] + lr.intercept_[0]).astype(np.float32)
    return st.RewardModel(base, coef[2:].astype(np.float64))


def summarise(est, truth):
    est = est.assign(error=est["estimate"] - truth,
                     covered=(est["low"] <= truth) & (truth <= est["high"]))
    g = est.groupby("estimator")
    return pd.DataFrame({
        "bias": g["error"].mean(), "rmse": g["error"].apply(lambda e: np.sqrt(np.mean(e ** 2))),
        "mean_abs_rel_error": g["error"].apply(lambda e: np.mean(np.abs(e)) / truth),
        "coverage": g["covered"].mean(), "finite": g["estimate"].apply(lambda e: np.isfinite(e).mean()),
        "ess_share": g["ess_share"].mean(), "max_weight": g["max_weight"].max()})


def peer(world, logging, target, model, qt, args):
    """The pandas estimators on one written-out log, against the kernel on the same log."""
    n_slates = args.peer_size // args.slate
    t0 = time.perf_counter()
    log, stats = st.draw_log(world, logging, target, model, qt, n_slates, seed=args.seed,
                             setting=999)
    kernel_s = time.perf_counter() - t0
    kernel_est = st.estimates_from_stats(stats, n_slates, args.slate).set_index("estimator")
    tracemalloc.start()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverlapWarning)
        flat = estimate_ctr(log["reward"], log["propensity"], log["target_probs"],
                            q_logged=log["q_logged"], q_target=log["q_target"],
                            estimators=("ips", "snips", "dm", "dr"), interval="normal")
        slate = estimate_slate_ctr(log, log["target_probs"], q_logged=log["q_logged"],
                                   q_target=log["q_target"], factored=True,
                                   factored_target=True, check_sums=False)
    pandas_s = time.perf_counter() - t0
    pandas_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    agree = max(abs(flat.loc["ips", "estimate"] - kernel_est.loc["ips", "estimate"]),
                abs(slate.loc["rips", "estimate"] - kernel_est.loc["rips", "estimate"]))
    return {"impressions": n_slates * args.slate, "kernel_seconds": kernel_s,
            "pandas_seconds": pandas_s, "pandas_peak_bytes": int(pandas_peak),
            "log_bytes": int(log.memory_usage(index=True).sum()),
            "kernel_state_bytes": int(stats.nbytes), "max_abs_difference": float(agree)}


def main(argv=None):
    args = parse(argv)
    t_all = time.perf_counter()
    world, S, share_count, setup = build_world(args)
    log_pop = np.log1p(share_count)
    L, n_items = args.slate, S.shape[1]
    cand = np.argsort(-share_count, kind="stable")[:args.candidates]
    in_cand = np.isin(np.arange(n_items), cand)
    soft = np.where(in_cand, share_count, 0.0) / share_count[cand].sum()
    loggings = {"uniform_catalog": st.uniform_logging(n_items, L),
                "uniform": st.uniform_logging(n_items, L, support=cand),
                "epsilon": st.epsilon_greedy_logging(share_count, args.logging_epsilon, L,
                                                     support=cand),
                "softmax": st.context_free(np.tile(soft, (L, 1)))}
    S_c = np.where(in_cand[None, :], S, -np.inf)
    slates = np.argsort(-S_c, axis=1, kind="stable")[:, :L]
    targets = {"softmax": st.softmax_target(S_c, args.temperature),
               "epsilon": st.epsilon_greedy_target(slates, args.target_epsilon, n_items,
                                                   support=cand)}
    values = {name: st.target_value(world, t) for name, t in targets.items()}
    values["greedy"] = st.target_value(world, st.epsilon_greedy_target(slates, 1e-12, n_items))
    values["uniform_candidates"] = st.target_value(
        world, st.epsilon_greedy_target(slates, 1.0, n_items, support=cand))
    values["popularity"] = st.target_value(world, st.epsilon_greedy_target(
        np.tile(cand[:L], (len(S), 1)), 1e-12, n_items))
    print("exact CTR:", {k: round(v, 5) for k, v in values.items()})
    rows, timing = [], []
    for li, lname in enumerate(LOGGING):
        model = reward_model(world, loggings[lname], S, log_pop, args, li)
        for ti, tname in enumerate(TARGETS):
            qt = model.expected(targets[tname])
            for n in args.sizes:
                t0 = time.perf_counter()
                stats = st.study_stats(world, loggings[lname], targets[tname], model, qt, n // L,
                                       args.logs, seed=args.seed, setting=100 * li + 10 * ti)
                secs = time.perf_counter() - t0
                est = st.estimates_from_stats(stats, n // L, L)
                summ = summarise(est, values[tname])
                for name, r in summ.iterrows():
                    rows.append({"logging": lname, "target": tname, "n": n, "estimator": name,
                                 "truth": values[tname], **r.to_dict()})
                timing.append({"logging": lname, "target": tname, "n": n, "seconds": secs})
                print(f"{lname:8s} -> {tname:8s} n={n:>9,} {secs:6.1f} s  rel. RMSE "
                      + " ".join(f"{e}={summ.loc[e, 'rmse'] / values[tname]:.3f}"
                                 for e in ("ips", "snips", "dr", "pi", "sips")), flush=True)
    model = reward_model(world, loggings["uniform"], S, log_pop, args, 1)
    cmp = peer(world, loggings["uniform"], targets["softmax"], model,
               model.expected(targets["softmax"]), args)
    print("peer:", cmp)
    result = {"setup": {**setup, **{k: getattr(args, k) for k in (
        "factors", "rounds", "clients", "slate", "sizes", "logs", "candidates", "temperature",
        "target_epsilon", "logging_epsilon", "pilot", "seed")}},
        "values": values, "rows": rows, "timing": timing, "peer": cmp,
        "seconds": time.perf_counter() - t_all,
        "meta": run_meta("ope_study.py", argv, packages=("scikit-learn",))}
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "ope_study.py")
