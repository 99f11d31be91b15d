#!/usr/bin/env python
"""Privacy and robustness of FedRecon on MovieLens-100K: what an honest-but-curious server learns
from what it receives, what differential privacy costs, and how aggregators hold up against
malicious clients.

Rows (all ReconEval on held-out users, users split 80/10/10):
  utility   plain mean; user-level DP at several noise levels (ε from dp-accounting, δ given);
            secure aggregation (smaller cohorts: the masks cost O(m²·catalog) per round)
  leakage   the server's view of one round's uploads: precision/recall of each client's rated
            set from its uploaded row ids (plain, DP only — uploads stay visible), and from its
            masked dense vector under secure aggregation; the user embedding recovered from
            FedReconImplicitMF(full_negatives=True)'s K×K upload (|cosine| to the true p)
  attacks   10 % sign-flip (×10) clients, a 10 % promotion (shilling) attack on one item, and
            the same push hidden in honest uploads (0.1 and 0.3 × the upload's norm): mean vs
            norm clipping, trimmed mean, coordinate median (with and without per-row clipping)
            and FoolsGold similarity weights; the target item's hit rate in benign test users'
            top 10

Example: python scripts/privacy_benchmark.py --json eval/results/privacy.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import load_movielens, make_synthetic_ratings
from fedcf.eval import recon_eval, top_k, user_split
from fedcf.federated import (
    CoordinateMedian,
    DifferentialPrivacy,
    DPGaussianMean,
    FoolsGoldMean,
    NormClippedMean,
    RoundHyperparams,
    RunContext,
    SecureAggregation,
    Selector,
    TrimmedMean,
)
from fedcf.federated.aggregators import secagg_audit
from fedcf.federated.aggregators.attacks import attacked
from fedcf.federated.algorithms.implicit import FedReconImplicitMF
from fedcf.models.implicit_mf import implicit_fold_in
from fedcf.provenance import run_meta, write_json

# every row on the paper's server step and last round ("auto" would hold users out for early
# stopping in the plain rows only, and the rows would not compare)
PAPER_SERVER = {"server_optimizer": "sgd", "early_stopping": None}


def row(name, model, test, t0, **extra):
    res = recon_eval(model, test, n_repeats=20)
    h = model.history_
    return {"name": name, "aggregator": repr(model.aggregator), "rmse": res["rmse"],
            "accuracy": res["accuracy"], "epsilon": h[-1].get("epsilon"),
            # against a server that knows every cohort: no amplification by sampling
            "epsilon_server": model._fitted("epsilon_server_"),
            "values_up": float(np.mean([r["values_up"] for r in h])),
            "seconds": time.perf_counter() - t0, **extra}


def utility_rows(train, test, args):
    # the 1-5 scale is public (DP takes μ and the scale from public figures, not the data)
    base = dict(n_factors=args.factors, n_rounds=args.rounds, clients_per_round=args.clients,
                random_state=0, rating_scale=(1, 5), **PAPER_SERVER)
    rows = []
    t0 = time.perf_counter()
    rows.append(row("plain mean", FedReconMF(**base).fit(train), test, t0))
    for sigma in args.noise:
        t0 = time.perf_counter()
        m = FedReconMF(**base, aggregator=DPGaussianMean(args.clip, sigma, delta=args.delta,
                                                         weight_cap=args.weight_cap))
        rows.append(row(f"DP σ={sigma}", m.fit(train), test, t0, delta=args.delta,
                        noise_multiplier=sigma))
    rows += clip_rows(train, test, args, base)
    small = {**base, "clients_per_round": args.secagg_clients}
    t0 = time.perf_counter()
    rows.append(row(f"plain mean, {args.secagg_clients} clients/round",
                    FedReconMF(**small).fit(train), test, t0))
    t0 = time.perf_counter()
    secure = dict(value_bound=args.value_bound, min_cohort=args.min_cohort)
    m = FedReconMF(**small, aggregator=SecureAggregation(**secure))
    rows.append(row(f"secure aggregation, {args.secagg_clients} clients/round", m.fit(train),
                    test, t0))
    sigma = args.noise[len(args.noise) // 2]
    for noise in ("server", "distributed"):
        t0 = time.perf_counter()
        m = FedReconMF(**small, aggregator=DifferentialPrivacy(
            SecureAggregation(**secure), args.clip, sigma,
            delta=args.delta, weight_cap=args.weight_cap, noise=noise))
        rows.append(row(f"secure aggregation + DP σ={sigma} ({noise} noise), "
                        f"{args.secagg_clients} clients/round", m.fit(train), test, t0,
                        delta=args.delta, noise_multiplier=sigma))
    return rows


def clip_rows(train, test, args, base):
    """Adaptive clipping (Andrew et al. 2021, the clip follows the median upload norm from
    noised counts) against fixed clips around ``--clip``, all at the middle σ."""
    sigma, rows = args.noise[len(args.noise) // 2], []
    runs = [(f"DP σ={sigma}, clip {c:g}", dict(clip_norm=c)) for c in args.clip_sweep
            if c != args.clip]
    runs += [(f"DP σ={sigma}, adaptive clip (quantile {q:g}, from {args.clip:g})",
              dict(clip_norm=args.clip, target_quantile=q,  # σ_b = m/20 (the paper's)
                   clip_count_stddev=max(args.clients / 20.0, sigma))) for q in (0.5, 0.9)]
    for name, kw in runs:
        t0 = time.perf_counter()
        m = FedReconMF(**base, aggregator=DPGaussianMean(
            noise_multiplier=sigma, delta=args.delta, weight_cap=args.weight_cap, **kw))
        rows.append(row(name, m.fit(train), test, t0, delta=args.delta, noise_multiplier=sigma,
                        clip=kw["clip_norm"], adaptive="target_quantile" in kw))
    return rows


def leakage_rows(train, args):
    return _leakage(train, args, "random") + _leakage(train, args, "none")[:1] + \
        transcript_rows(train, args) + sum_rows(train, args)


def _leakage(train, args, split):
    """Rated-set recovery from one round's uploads as the server sees them: plain, and under
    central DP (the DP aggregator clips and noises on the server, after it has read them)."""
    rows = []
    for name, agg in (("plain uploads", None),
                      ("DP only, uploads still seen one by one",
                       DPGaussianMean(args.clip, 1.0, delta=args.delta))):
        model = FedReconMF(n_factors=args.factors, n_rounds=20, clients_per_round=args.clients,
                           **PAPER_SERVER, split=split, random_state=0, rating_scale=(1, 5),
                           aggregator=agg).fit(train)
        cohort = Selector(0, np.arange(train.n_users), args.clients)(999)
        out = model.client_uploads(train, cohort.clients, round_idx=999)
        rec, prec = [], []
        for k, u in enumerate(cohort.clients[:args.leak_clients]):
            rated = set(train.items[train.indptr[u]:train.indptr[u + 1]].tolist())
            sent = set(out.items[out.offsets[k]:out.offsets[k + 1]].tolist()) - {-1}
            rec.append(len(sent & rated) / len(rated))
            if sent:
                prec.append(len(sent & rated) / len(sent))
        rows.append({"name": f"leakage: {name} (split='{split}')",
                     "rated_set_recall": float(np.mean(rec)),
                     "rated_set_precision": float(np.mean(prec))})
    return rows


def _round(train, args, m):
    """One round's real uploads of m clients (``ClientOutputs``), their rated sets and the
    rows each upload touches."""
    model = FedReconMF(n_factors=args.factors, n_rounds=20, clients_per_round=m,
                       random_state=0, **PAPER_SERVER).fit(train)
    cohort = Selector(0, np.arange(train.n_users), m)(999)
    out = model.client_uploads(train, cohort.clients, round_idx=999)
    rated = [set(train.items[train.indptr[u]:train.indptr[u + 1]].tolist())
             for u in cohort.clients]
    touched = [set(out.items[out.offsets[k]:out.offsets[k + 1]].tolist()) - {-1}
               for k in range(len(cohort.clients))]
    return out, rated, touched


def transcript_rows(train, args):
    """Attacks (a)–(d) of ``fedcf.federated.aggregators.secagg_audit`` on a real round's transcript: the
    clients quantize their uploads as ``SecureAggregation`` does (dense over the catalog,
    weights normalised by the public maximum)."""
    m = args.secagg_clients
    out, rated, _ = _round(train, args, m)
    agg = SecureAggregation(min_cohort=2).bind(RunContext(
        n_eligible=train.n_users, clients_per_round=m, n_rounds=1, n_items=train.n_items,
        n_factors=args.factors, seed=0))
    q, _ = agg.encoding(m).encode(out, RoundHyperparams(1.0, {}, 1.0))
    t = agg.threshold_for(m)
    res = secagg_audit.transcript_attacks(q, rated, train.n_items, args.factors, t,
                                          min(args.leak_clients, m))
    names = {"plain": "the quantized upload itself (no masks)",
             "a": "(a) honest-but-curious server, full transcript",
             "b": "(b) server that knows random_state, replays the masks",
             "c": "(c) server that lies about who dropped",
             "d": "(d) late-arriving client"}
    return [{"name": f"leakage: secure aggregation, {names[k]}", "rated_set_recall": res[k],
             "chance": res["chance"], "chance_halfwidth": res["chance_halfwidth"],
             "cohort": m, "threshold": t} for k in names]


def sum_rows(train, args):
    """What the unmasked sum reveals by cohort size: the union of the members' rows."""
    _, rated, touched = _round(train, args, train.n_users)
    rng = np.random.default_rng(0)
    rows = []
    for m in args.sum_cohorts:
        r = secagg_audit.sum_leakage(touched, rated, train.n_items, m, 20, rng)
        rows.append({"name": f"leakage: the sum of a cohort of {r['cohort']}",
                     "rated_set_recall": r["recall"], "rated_set_precision": r["precision"],
                     "lift": r["lift"], "cohort": r["cohort"]})
    return rows


def embedding_row(train, args):
    m = FedReconImplicitMF(args.factors, n_rounds=20, clients_per_round=args.clients,
                           full_negatives=True, random_state=0).fit(train)
    cohort = Selector(0, np.arange(train.n_users), args.clients)(999)
    out = m.client_uploads(train, cohort.clients, round_idx=999)
    sub = train.subset_users(cohort.clients)
    P_true, _ = implicit_fold_in(m.item_factors_, sub.indptr, sub.items, sub.values, m.alpha,
                                 m._recon_lam())
    cos = []
    for k in range(len(cohort.clients)):
        vals, vecs = np.linalg.eigh(out.rank_terms[k])
        p = P_true[k].astype(np.float64)
        if np.linalg.norm(p) > 0:
            cos.append(abs(vecs[:, -1] @ p) / np.linalg.norm(p))
    return {"name": "leakage: user embedding from the full-negatives K×K upload",
            "embedding_abs_cosine": float(np.mean(cos))}


ATTACKS = (("sign_flip", 10.0), ("promote", 5.0), ("promote_hidden", 0.1),
           ("promote_hidden", 0.3))


def attack_rows(train, test, args):
    base = dict(n_factors=args.factors, n_rounds=args.rounds, clients_per_round=args.clients,
                random_state=0, **PAPER_SERVER)
    counts = np.bincount(train.items, minlength=train.n_items)
    target = int(np.argsort(counts)[len(counts) // 2])  # a mid-popularity item
    aggs = [("mean", None), ("norm clip", NormClippedMean(args.clip)),
            ("trimmed mean β=0.2", TrimmedMean(0.2)), ("coordinate median", CoordinateMedian()),
            (f"trimmed mean β=0.2, rows clipped to {args.row_clip:g}",
             TrimmedMean(0.2, row_clip=args.row_clip)),
            (f"coordinate median, rows clipped to {args.row_clip:g}",
             CoordinateMedian(row_clip=args.row_clip)),
            ("FoolsGold similarity weights", FoolsGoldMean())]
    rows = []
    for kind, scale in ATTACKS:
        for name, agg in aggs:
            t0 = time.perf_counter()
            m = attacked(FedReconMF(**base, aggregator=agg), kind=kind, fraction=args.attackers,
                         scale=scale, target_item=target).fit(train)
            P, c = m.reconstruct_users(test)
            top = top_k(m.score_all_items(P, c), 10)
            hit = float(np.mean((top == target).any(axis=1)))
            label = f"{kind} (push {scale:g}×)" if kind == "promote_hidden" else kind
            rows.append(row(f"{label} {args.attackers:.0%} + {name}", m, test, t0,
                            attack=kind, attack_scale=scale, target_hit_rate=hit,
                            target_item=target))
    for name, agg in aggs:
        t0 = time.perf_counter()
        m = FedReconMF(**base, aggregator=agg).fit(train)
        P, c = m.reconstruct_users(test)
        hit = float(np.mean((top_k(m.score_all_items(P, c), 10) == target).any(axis=1)))
        rows.append(row(f"no attack + {name}", m, test, t0, attack=None, target_hit_rate=hit,
                        target_item=target))
    return rows


def population_rows(args):
    """User-level DP where it means something: a synthetic population of ``--population`` users
    (the generator's heavy-tailed activity), DP calibrated to ``--target-epsilon`` at
    ``--population-delta`` over the planned rounds, against the same run without DP."""
    n = args.population
    t0 = time.perf_counter()
    inter = make_synthetic_ratings(n, 3706, 15 * n, n_factors=8, random_state=0)
    gen_s = time.perf_counter() - t0
    train, _val, test = user_split(inter, (0.8, 0.1, 0.1), random_state=0)
    test = test.subset_users(np.arange(min(test.n_users, 20_000)))
    base = dict(n_factors=args.factors, n_rounds=args.population_rounds,
                clients_per_round=args.population_clients, random_state=0, rating_scale=(1, 5),
                **PAPER_SERVER)
    rows = []

    def dp(eps, **kw):  # secret noise, public μ and scale, PLD accounting
        return DPGaussianMean(args.population_clip, target_epsilon=eps,
                              delta=args.population_delta, weight_cap=args.population_weight_cap,
                              accounting="pld", **kw)
    runs = [("no DP", {}, None, False),
            ("no DP, equal client weights", {"client_weighting": "uniform"}, None, False)]
    runs += [(f"DP, target ε={eps:g}", {"aggregator": dp(eps)}, eps, False)
             for eps in sorted({*args.population_epsilons, args.target_epsilon})]
    runs.append((f"DP, target ε={args.target_epsilon:g}, adaptive clip (median)",
                 {"aggregator": dp(args.target_epsilon, target_quantile=0.5)},
                 args.target_epsilon, True))
    for name, kw, eps, adaptive in runs:
        t0 = time.perf_counter()
        m = FedReconMF(**base, **kw).fit(train)
        rows.append(row(f"{n:,} users: {name}", m, test, t0, population=n,
                        train_users=train.n_users, delta=args.population_delta if eps else None,
                        noise_multiplier=getattr(m, "noise_multiplier_", None),
                        target_epsilon=eps, adaptive=adaptive,
                        epsilon_rdp=(getattr(m, "epsilons_", None) or {}).get("rdp"),
                        generate_seconds=gen_s))
        print(f"{name}: RMSE {rows[-1]['rmse']:.4f}", flush=True)
    return rows


def plot_privacy_utility(rows, path):
    """RMSE against ε for the DP rows, with the non-private run as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    dp = sorted((r for r in rows if r.get("noise_multiplier") and "rmse" in r
                 and r.get("epsilon") and "clip" not in r), key=lambda r: r["epsilon"])
    plain = next((r for r in rows if r["name"] == "plain mean"), None)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["epsilon"] for r in dp], [r["rmse"] for r in dp], marker="o", label="user-level DP")
    if plain is not None:
        ax.axhline(plain["rmse"], ls="--", color="k", lw=1, label="no DP")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("ε (δ fixed)")
    ax.set_ylabel("ReconEval RMSE")
    ax.set_title("FedRecon: privacy–utility")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="100k", help="100k, or 'synthetic' (small, for CI)")
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--secagg-clients", type=int, default=20)
    ap.add_argument("--clip", type=float, default=0.5, help="DP clip norm C on ML-100K")
    ap.add_argument("--clip-sweep", type=float, nargs="+", default=[0.1, 0.25, 1.0, 2.0],
                    help="fixed clips compared with the adaptive clip on ML-100K")
    ap.add_argument("--min-cohort", type=int, default=10,
                    help="secure aggregation: smallest cohort a round is aggregated for")
    ap.add_argument("--value-bound", type=float, default=1.0,
                    help="secure aggregation: bound on each normalised value before "
                         "quantization")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--delta", type=float, default=1e-4)
    ap.add_argument("--attackers", type=float, default=0.1)
    ap.add_argument("--row-clip", type=float, default=0.3,
                    help="robust aggregators' per-client, per-row clip in the clipped variants")
    ap.add_argument("--leak-clients", type=int, default=20)
    ap.add_argument("--sum-cohorts", type=int, nargs="+", default=[2, 5, 10, 20, 100, 1000],
                    help="cohort sizes for what the secure sum reveals (capped at the users)")
    ap.add_argument("--population", type=int, default=0,
                    help="instead of the ML-100K rows: the DP run on a synthetic population of "
                         "this many users")
    ap.add_argument("--population-rounds", type=int, default=500)
    ap.add_argument("--population-clients", type=int, default=10_000)
    ap.add_argument("--target-epsilon", type=float, default=2.0)
    ap.add_argument("--population-clip", type=float, default=3.0)
    ap.add_argument("--population-epsilons", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.5, 1.0, 4.0, 8.0],
                    help="the privacy-utility curve's targets beside --target-epsilon")
    ap.add_argument("--population-weight-cap", type=float, default=100.0,
                    help="the population run's DP client weight cap (see --weight-cap)")
    ap.add_argument("--weight-cap", type=float, default=30.0,
                    help="DP client weight min(n, cap)/cap (McMahan et al.'s weighted estimator)")
    ap.add_argument("--population-delta", type=float, default=1e-6)
    ap.add_argument("--plot", metavar="PNG", help="write the privacy–utility curve here")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.population:
        rows = population_rows(args)
        for r in rows:
            print(f"{r['name']:<40} rmse={r['rmse']:.4f} accuracy={r['accuracy']:.4f} "
                  f"epsilon={r['epsilon']} sigma={r['noise_multiplier']} {r['seconds']:.1f} s")
        if args.json:
            meta = {**run_meta("privacy_benchmark.py", argv), "settings": vars(args)}
            write_json(args.json, [{**r, "meta": meta} for r in rows])
        return rows
    inter = load_movielens("100k") if args.dataset == "100k" else \
        make_synthetic_ratings(1500, 120, 30_000, n_factors=4, random_state=0)
    train, _val, test = user_split(inter, (0.8, 0.1, 0.1), random_state=0)
    rows = utility_rows(train, test, args) + leakage_rows(train, args) + \
        [embedding_row(train, args)] + attack_rows(train, test, args)
    for r in rows:
        cells = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                 if k in ("rmse", "epsilon", "rated_set_recall", "rated_set_precision",
                          "target_hit_rate", "embedding_abs_cosine", "chance", "seconds")
                 and v is not None]
        print(f"{r['name']:<58} " + "  ".join(cells))
    if args.plot:
        plot_privacy_utility(rows, args.plot)
    if args.json:
        meta = {**run_meta("privacy_benchmark.py", argv), "settings": vars(args)}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "privacy_benchmark.py")
