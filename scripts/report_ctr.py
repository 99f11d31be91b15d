#!/usr/bin/env python
"""Write eval/CTR.md from the JSON of ctr_simulation.py and implicit_benchmark.py.

python scripts/implicit_benchmark.py --json implicit.json
python scripts/ctr_simulation.py --json ctr.json
python scripts/ctr_simulation.py --population-only --users 1000000 --items 38000 --json population.json
python scripts/report_ctr.py --ctr ctr.json --implicit implicit.json --population population.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd


def build(ctr: dict, impl: list) -> str:
    date = ctr["meta"]["date"][:10]
    L = ["# Implicit feedback, CTR simulation and offline CTR evaluation", "",
         f"Figures from the commands below, measured {date} on the project's 2-core x86_64 Linux "
         "machine (Python 3.11.7, numba 0.68.1, implicit 0.7.3); every run is seeded. This file "
         "is written by `scripts/report_ctr.py` from the two JSON outputs.", "",
         "## Implicit-feedback ranking on MovieLens-100K", "",
         "```", "python scripts/implicit_benchmark.py --json implicit.json", "```", "",
         "Every rating is a binary interaction (943 users, 1,682 items, 100,000 interactions); "
         "K = 50, λ = 0.05, confidence 1 + α·r with α = 1 (the `implicit` library's `alpha=2` "
         "solves the same problem), 15 iterations. Metrics at 10 with seen items filtered; AUC "
         "over all unseen items.", "",
         "| model | protocol | precision@10 | recall@10 | NDCG@10 | MAP@10 | hit@10 | AUC | "
         "seconds | numbers uploaded / round |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in impl:
        up = f"{r['values_up_per_round']:,.0f}" if "values_up_per_round" in r else ""
        L.append(f"| {r['name']} | {r['protocol']} | {r['precision']:.4f} | {r['recall']:.4f} | "
                 f"{r['ndcg']:.4f} | {r['map']:.4f} | {r['hit_rate']:.4f} | {r['auc']:.4f} | "
                 f"{r['seconds']:.2f} | {up} |")
    by = {(r["name"], r["protocol"]): r for r in impl}
    ours = by[("fedcf ImplicitMF (weighted ALS)", "seen")]["precision"]
    chol = by.get(("implicit ALS (Cholesky)", "seen"), {}).get("precision", float("nan"))
    cg = by.get(("implicit ALS (CG)", "seen"), {}).get("precision", float("nan"))
    fs = by[("FedReconImplicitMF (sampled negatives)", "unseen")]
    ff = by[("FedReconImplicitMF (full negatives)", "unseen")]
    cen = by[("centralized ImplicitMF + fold-in", "unseen")]["precision"]
    popu = by[("popularity", "unseen")]["precision"]
    L += ["",
          f"- **Anchor**: fedcf's centralized weighted ALS matches the `implicit` library on the "
          f"same split: precision@10 {ours:.3f} vs {chol:.3f} (Cholesky) / {cg:.3f} (CG), with "
          "NDCG, MAP and AUC equally close. `tests/test_implicit.py` keeps the two within 20 % of "
          "each other on a synthetic population in CI.",
          f"- **Unseen users** (users split 80/10/10; test users reconstruct from a random half and "
          f"are ranked on the other half): FedRecon reaches {fs['precision']:.3f} with sampled "
          f"negatives and {ff['precision']:.3f} with the exact full-catalog negative term, "
          f"{fs['precision'] / cen:.0%}–{ff['precision'] / cen:.0%} of the centralized model "
          f"folded in ({cen:.3f}), far above popularity ({popu:.3f}). Rows of the two protocols "
          "are not comparable (the unseen protocol holds out half of each user's items).",
          "", "### Sampled vs full negatives (FedReconImplicitMF)", "",
          "- *Full*: with p frozen, the full-catalog negative term moves every item row by a "
          "rank-1 map, so a client uploads its positive rows plus one K×K matrix and the server "
          "applies a dense −Q·M step (`full_negatives=True`; tested equal to stepping every "
          "catalog row explicitly).",
          f"- Measured on ML-100K: full {ff['precision']:.3f} vs sampled {fs['precision']:.3f} "
          f"precision@10; uploads {ff['values_up_per_round']:,.0f} vs "
          f"{fs['values_up_per_round']:,.0f} numbers per round; fit {ff['seconds']:.1f} s vs "
          f"{fs['seconds']:.1f} s (the dense server step costs O(n_items·K²) per round). On the "
          "simulated population below both give the same lift.",
          "- **Default: sampled.** The K×K matrix p pᵀ reveals the user's embedding up to its "
          "sign, so the full variant breaks FedRecon's promise that local parameters never leave "
          "the device unless the deployment runs secure aggregation; sampling sends only item "
          "rows, keeps the server step sparse, and loses little quality.", ""]
    L += ["## Expression-recommendation CTR simulation", "",
          "```", "python scripts/ctr_simulation.py --json ctr.json", "```", "",
          "Simulated population (`fedcf.eval.simulation`): 50,000 users, 3,800 expressions of "
          "three types (2,014 GIFs, 1,482 stickers, 304 emoji-kitchen), heavy-tailed popularity "
          "and activity (58 % of users have at most two shared expressions; the most active "
          "has 399), per-round availability Beta(2, 8) (20 % reachable on average), a "
          "ground-truth click model with position bias 1.0 → 0.3 over a 5-slot slate. "
          "FedReconImplicitMF (K = 16, 300 rounds × 200 clients drawn from the reachable ones, "
          "30 % oversampling, 10 % dropout, support = query) trains in ~5 s. Held-out users "
          "(10 %) are reconstructed from their own shares and shown their top-5 slate for 10 "
          "sessions; clicks are drawn from the click model.", "",
          "| policy | CTR | 95 % interval | exact expected CTR | click AUC |",
          "| --- | --- | --- | --- | --- |"]
    for p, v in ctr["ctr"].items():
        L.append(f"| {p} | {v['ctr']:.5f} | [{v['ctr_low']:.5f}, {v['ctr_high']:.5f}] | "
                 f"{v['ctr_expected']:.5f} | {v['auc']:.3f} |")
    cen_l = next(x for x in ctr["lifts"] if x["policy"] == "centralized")
    L += ["",
          f"**Lift of FedRecon over popularity: {ctr['lift'] * 100:+.1f} % (95 % paired bootstrap "
          f"interval over users {ctr['lift_low'] * 100:+.1f} % … {ctr['lift_high'] * 100:+.1f} %; "
          f"exact expected lift {ctr['lift_expected'] * 100:+.1f} %).** The centralized weighted "
          f"ALS folded in for the same users does worse than popularity ({cen_l['lift'] * 100:+.1f} %). "
          "Click AUC (FURL's Sticker metric, on 200,000 uniformly logged impressions): "
          "popularity beats FedRecon there because the simulated click model is dominated by "
          "item popularity and the implicit model has no item-bias term — FedRecon wins at the "
          "top of each user's ranking (the CTR of its slates), not on ranking arbitrary items. "
          "CTR by round: `figures/ctr_by_round.png`.", "",
          "## Off-policy estimators against simulated truth", "",
          "Same run. Target: FedRecon's deterministic top-5 slates for the held-out users. Logs of "
          "a uniform, an ε-greedy (ε = 0.3 around the five most-shared items) and a softmax (over "
          "log share counts) logging policy, each position drawn independently so propensities "
          "are exact. DM/DR use a logistic reward model on [FedRecon score, log popularity, "
          "position]. Relative error |estimate − truth| / truth, truth = the target's exact "
          "expected CTR on the logged (user, position) mix:", ""]
    o = pd.DataFrame(ctr["offline"])
    piv = o.pivot_table(index=["logging_policy", "estimator"], columns="n",
                        values="relative_error", dropna=False)
    L.append("| logging policy | estimator | " + " | ".join(f"n = {int(c):,}" for c in piv.columns)
             + " |")
    L.append("| --- | --- | " + " | ".join("---" for _ in piv.columns) + " |")
    for (lp, est), r in piv.iterrows():
        L.append(f"| {lp} | {est} | " + " | ".join("—" if np.isnan(v) else f"{v:.3f}"
                                                   for v in r.values) + " |")
    sd = o[o.estimator.isin(["ips", "dr"])].pivot_table(index="logging_policy",
                                                        columns=["estimator", "n"], values="std")
    big = int(o["n"].max())
    L += ["",
          "- **Convergence**: under the softmax logging policy, which often shows the target's "
          "items, IPS, SNIPS, Replay and DR converge towards the truth as the log grows. Under "
          "uniform logging over 3,800 items (and ε-greedy concentrated on five popular items) a "
          "deterministic top-5 target matches a logged impression about once in 4,000, so at these "
          "log sizes the importance-weighted estimates rest on a handful of matches and are far "
          "off — the expected behaviour of IPS with poor overlap, and why a deployment logs with "
          "a randomized policy close to what it will evaluate.",
          f"- **DR vs IPS**: bootstrap std at n = {big:,}: softmax "
          f"{sd.loc['softmax', ('dr', big)]:.5f} vs {sd.loc['softmax', ('ips', big)]:.5f}, "
          f"uniform {sd.loc['uniform', ('dr', big)]:.5f} vs {sd.loc['uniform', ('ips', big)]:.5f}, "
          f"ε-greedy {sd.loc['epsilon', ('dr', big)]:.5f} vs {sd.loc['epsilon', ('ips', big)]:.5f}. "
          "Under softmax and uniform logging DR's std is at or below IPS's, by a small margin "
          "because the reward model is only moderately good; under ε-greedy IPS's std can be "
          "smaller only because almost no logged impression matches the target (its estimate is "
          "far off, see the table). DM has the smallest variance and a persistent bias.",
          "- Estimators vs truth with intervals: `figures/estimators_vs_truth.png`.", "",
          "## Real logs: the Open Bandit Dataset sample", "",
          "Same command (step 5). Data from the `obp==0.5.7` source archive on PyPI (sha256 "
          "pinned). BTS's CTR estimated from the uniform-random log (80 items, 3 positions, "
          "10,000 impressions per file; both policies are context-free, so BTS's action "
          "distribution per position is estimated from its own log; DM/DR use a smoothed "
          "per-(item, position) click rate):", "",
          "| campaign | BTS on-policy CTR [95 % interval] | replay | IPS | SNIPS | DM | DR |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    b = pd.DataFrame(ctr["open_bandit"])
    for camp in ("all", "men", "women"):
        s = b[b.campaign == camp].set_index("estimator")
        if s.empty:
            continue
        cells = [f"{s.loc[e, 'estimate']:.5f} ({s.loc[e, 'relative_error'] * 100:.0f} %)"
                 for e in ("replay", "ips", "snips", "dm", "dr")]
        L.append(f"| {camp} | {s.truth.iloc[0]:.5f} [{s.truth_low.iloc[0]:.5f}, "
                 f"{s.truth_high.iloc[0]:.5f}] | " + " | ".join(cells) + " |")
    if len(b):
        lo, hi = b.relative_error.min(), b.relative_error.max()
        L += ["", f"Cells: estimate (relative error). Relative errors {lo:.0%}–{hi:.0%}: with "
              "38–69 clicks per file every estimate is noisy, and the intervals are wide "
              "(`tests/test_offline.py` checks that the IPS, SNIPS and DR intervals cover BTS's "
              "on-policy CTR on the `all` campaign). Measured data fact: the smallest BTS "
              "propensity in `bts/women` is 1e-06 (DATA_SOURCES.md says 0.0); as a logging "
              "propensity such a row would weigh 12,500 in IPS. Rows with propensity 0 are "
              "refused by `validate_log` unless `zero_propensity=\"drop\"`."]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctr", required=True)
    ap.add_argument("--implicit", required=True)
    ap.add_argument("--population", help="JSON of ctr_simulation.py --population-only (scale)")
    ap.add_argument("--out", default="eval/CTR.md")
    args = ap.parse_args(argv)
    with open(args.ctr) as fh:
        ctr = json.load(fh)
    with open(args.implicit) as fh:
        impl = json.load(fh)
    text = build(ctr, impl)
    if args.population:
        with open(args.population) as fh:
            pop = json.load(fh)
        text += ("\n## Simulator scale\n\n```\npython scripts/ctr_simulation.py --population-only "
                 f"--users {pop['users']} --items {pop['items']} --json population.json\n```\n\n"
                 f"{pop['users']:,} users × {pop['items']:,} items: population in "
                 f"{pop['population_seconds']:.1f} s, {pop['share_pairs']:,} (user, item) share "
                 f"pairs in {pop['shares_seconds']:.1f} s, peak RSS {pop['peak_rss_mib']:.0f} MiB "
                 f"({pop['meta']['date'][:10]}, same machine); {pop['share_at_most_2']:.0%} of "
                 f"users have at most two shares, the most active {pop['max_shares']:,}.\n")
    with open(args.out, "w") as fh:
        fh.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
