"""eval/CTR.md: the CTR simulation and the offline evaluation of logged impressions."""

from __future__ import annotations

import numpy as np
import pandas as pd
from report_common import claim, pct, provenance, results_file, seed_interval, signed_pct, table


def ctr_values(ctr, impl, pop) -> dict:
    by = {(r["name"], r["protocol"]): r for r in impl}
    fs = by[("FedReconImplicitMF (sampled negatives)", "unseen")]
    ff = by[("FedReconImplicitMF (full negatives)", "unseen")]
    s = ctr["setup"]
    v = {"impl_provenance": provenance(impl[0]["meta"], "implicit.json"),
         "table_impl": table(
             ["model", "protocol", "precision@10", "recall@10", "NDCG@10", "MAP@10", "hit@10",
              "AUC", "seconds", "numbers uploaded / round"],
             [(r["name"], r["protocol"], f"{r['precision']:.4f}", f"{r['recall']:.4f}",
               f"{r['ndcg']:.4f}", f"{r['map']:.4f}", f"{r['hit_rate']:.4f}", f"{r['auc']:.4f}",
               f"{r['seconds']:.2f}",
               f"{r['values_up_per_round']:,.0f}" if "values_up_per_round" in r else "")
              for r in impl]),
         "impl_ours": f"{by[('fedcf ImplicitMF (weighted ALS)', 'seen')]['precision']:.3f}",
         "impl_chol": f"{by[('implicit ALS (Cholesky)', 'seen')]['precision']:.3f}",
         "impl_cg": f"{by[('implicit ALS (CG)', 'seen')]['precision']:.3f}",
         "impl_fs": f"{fs['precision']:.3f}", "impl_ff": f"{ff['precision']:.3f}",
         "impl_cen": f"{by[('centralized ImplicitMF + fold-in', 'unseen')]['precision']:.3f}",
         "impl_pop": f"{by[('popularity', 'unseen')]['precision']:.3f}",
         "impl_fs_up": f"{fs['values_up_per_round']:,.0f}",
         "impl_ff_up": f"{ff['values_up_per_round']:,.0f}",
         "impl_fs_s": f"{fs['seconds']:.1f}", "impl_ff_s": f"{ff['seconds']:.1f}",
         "impl_biases": "; ".join(
             f"{name} {by[(biased, proto)]['precision']:.3f} against {by[(plain, proto)]['precision']:.3f}"
             for name, biased, plain, proto in IMPLICIT_BIAS_PAIRS if (biased, proto) in by),
         "ctr_provenance": provenance(ctr["meta"], "ctr.json"),
         "users": f"{s['users']:,}", "items": f"{s['items']:,}",
         "types": ", ".join(f"{n:,} {t}" for t, n in s["items_per_type"].items()),
         "at_most_2": pct(s["share_at_most_2"], 0), "max_shares": f"{s['max_shares']:,}",
         "availability": pct(s["mean_availability"], 0),
         "position_bias": " → ".join(f"{x:.2f}" for x in s["position_bias"]),
         "slate": s["slate"], "K": s["factors"], "rounds": s["rounds"], "clients": s["clients"],
         "oversample": pct(s["oversample"], 0), "dropout": pct(s["dropout"], 0),
         "fed_s": f"{ctr['seconds_fedrecon']:.1f}", "test_users": f"{s['test_users']:,}",
         "auc_impressions": f"{s['auc_impressions']:,}", "epsilon": s["epsilon"],
         "table_ctr": table(["policy", "CTR", "95 % interval", "exact expected CTR", "click AUC",
                             "expected click AUC"],
                            [(p, f"{x['ctr']:.5f}", f"[{x['ctr_low']:.5f}, {x['ctr_high']:.5f}]",
                              f"{x['ctr_expected']:.5f}", f"{x['auc']:.3f}",
                              f"{x['auc_expected']:.4f}")
                             for p, x in ctr["ctr"].items()]),
         "table_lift": table(["policy", "CTR lift over popularity", "95 % interval",
                              "exact expected lift"],
                             [(x["policy"], signed_pct(x["lift"]), f"{signed_pct(x['lift_low'])} "
                               f"… {signed_pct(x['lift_high'])}", signed_pct(x["lift_expected"]))
                              for x in ctr["lifts"]]),
         "central_lambda": f"{s['central_lambda']:g}"}
    v.update(ctr_claims(ctr))
    v.update(seeds_values(ctr))
    act = pd.DataFrame(ctr["ctr_by_activity"])
    users = act.drop_duplicates("shares").set_index("shares")["users"]
    piv = act.pivot(index="policy", columns="shares", values="ctr_expected")[list(users.index)]
    v["table_activity"] = table(
        ["policy", *(f"{k} share{'' if k == '1' else 's'} ({users[k]:,} users)"
                     for k in users.index)],
        [(p, *(f"{x:.5f}" for x in r.values)) for p, r in piv.loc[list(ctr["ctr"])].iterrows()])
    v.update(activity_claims(piv))
    b = pd.DataFrame(ctr["open_bandit"])
    names = [k for k in OBD_ESTIMATORS if k in set(b.estimator)]
    rows = []
    for camp in ("all", "men", "women"):
        e = b[b.campaign == camp].set_index("estimator")
        rows.append((camp, f"{e.truth.iloc[0]:.5f} [{e.truth_low.iloc[0]:.5f}, "
                           f"{e.truth_high.iloc[0]:.5f}]", f"{e.loc['ips', 'ess']:.0f}",
                     *(f"{e.loc[k, 'estimate']:.5f} ({e.loc[k, 'relative_error'] * 100:.0f} %)"
                       + ("" if e.loc[k, "low"] <= e.loc[k, "truth"] <= e.loc[k, "high"] else " ✗")
                       for k in names)))
    v["table_obd"] = table(["campaign", "BTS on-policy CTR [95 % interval]", "ESS", *names], rows)
    covered = (b["low"] <= b["truth"]) & (b["truth"] <= b["high"])
    v["obd_covered"] = f"{int(covered.sum())} of {len(b)}"
    v.update(obd_published(b))
    facts = ctr["open_bandit_facts"]
    clicks = [f[k] for f in facts.values() for k in ("clicks_random", "clicks_bts")]
    w = facts["women"]
    v.update(obd_err_range=f"{b.relative_error.min():.0%}–{b.relative_error.max():.0%}",
             obd_timestamps=", ".join(f"{f['distinct_timestamps']:,} of {f['rows']:,}"
                                      for f in facts.values()),
             obd_clicks=f"{min(clicks)}–{max(clicks)}",
             obd_min_prop=f"{w['min_bts_propensity']:g}",
             obd_max_weight=f"{w['uniform_propensity'] / w['min_bts_propensity']:,.0f}",
             pop_provenance=provenance(pop["meta"], "population.json"),
             pop_line=(f"{pop['users']:,} users × {pop['items']:,} items: population in "
                       f"{pop['population_seconds']:.1f} s, {pop['share_pairs']:,} (user, item) "
                       f"share pairs in {pop['shares_seconds']:.1f} s, peak RSS "
                       f"{pop['peak_rss_mib']:.0f} MiB; {pct(pop['share_at_most_2'], 0)} of users "
                       f"have at most two shares, the most active {pop['max_shares']:,}."))
    return v


IMPLICIT_BIAS_PAIRS = (
    ("ImplicitMF (seen users)", "fedcf ImplicitMF with biases", "fedcf ImplicitMF (weighted ALS)",
     "seen"),
    ("FedReconImplicitMF", "FedReconImplicitMF (sampled negatives, biases)",
     "FedReconImplicitMF (sampled negatives)", "unseen"),
    ("centralized + fold-in", "centralized ImplicitMF with biases + fold-in",
     "centralized ImplicitMF + fold-in", "unseen"))
OBD_ESTIMATORS = ("replay", "ips", "snips", "dm", "dr", "rips", "sips", "pi", "cascade_dr",
                  "dros")


def ctr_claims(ctr) -> dict:
    """Sentences comparing policies, worded from the numbers."""
    t, lift = ctr["ctr"], {x["policy"]: x for x in ctr["lifts"]}

    def vs_pop(name):
        a, p = t[name]["auc"], t["popularity"]["auc"]
        word = "above" if a > p else ("level with" if a == p else "below")
        return f"{a:.3f}, {word} popularity's {p:.3f}"

    def lift_words(name):
        x = lift[name]
        sure = "above zero" if x["lift_low"] > 0 else ("below zero" if x["lift_high"] < 0 else
                                                     "includes zero")
        return (f"{signed_pct(x['lift'])} (95 % interval {signed_pct(x['lift_low'])} … "
                f"{signed_pct(x['lift_high'])}, {sure})")
    return {"auc_fed": vs_pop("fedrecon"), "auc_fed_b": vs_pop("fedrecon_biases"),
            "auc_fed_p": vs_pop("fedrecon_prior"), "lift_fed_p": lift_words("fedrecon_prior"),
            "auc_cen_b": vs_pop("centralized_biases"), "lift_fed": lift_words("fedrecon"),
            "lift_fed_b": lift_words("fedrecon_biases"),
            "lift_cen": lift_words("centralized"), "lift_cen_b": lift_words("centralized_biases")}


def activity_claims(piv) -> dict:
    """Where each model stands against popularity, by the users' number of shares."""
    pop = piv.loc["popularity"]

    def where(name):
        r = piv.loc[name]
        below = [k for k in piv.columns if r[k] < pop[k]]
        above = [k for k in piv.columns if r[k] >= pop[k]]
        return (f"below popularity in the groups of {', '.join(below)} shares" if below else
                "at or above popularity in every group") + \
            (f", at or above it in {', '.join(above)}" if below and above else "")
    return {"act_cen": where("centralized"), "act_cen_b": where("centralized_biases"),
            "act_fed": where("fedrecon"), "act_fed_b": where("fedrecon_biases")}


def obd_published(b) -> dict:
    pub = results_file("obp_published.json")
    ours = b[b.campaign == "all"].set_index("estimator")["relative_error"]
    rows = [(k.upper(), f"{pub['relative_error'][k]:.3f}", f"{ours[k]:.3f}")
            for k in ("dm", "ips", "dr")]
    return {"obp_source": pub["source"], "obp_setting": pub["setting"],
            "table_obp": table(["estimator", "obp example (published)", "fedcf (this run)"],
                               rows)}


OPE_MAIN = ("ips", "snips", "dr", "dm", "rips", "sips", "pi", "cascade_dr", "dros")


def _by_setting(at, values, fmt):
    piv = at.assign(setting=at.logging + " → " + at.target).pivot(
        index="setting", columns="estimator", values=values)[list(OPE_MAIN)]
    return table(["logging → target", *OPE_MAIN],
                 [(k, *(fmt.format(x) for x in row.values)) for k, row in piv.iterrows()])


def ope_values(ope) -> dict:
    r = pd.DataFrame(ope["rows"])
    r["rel_rmse"] = r["rmse"] / r["truth"]
    s, val = ope["setup"], ope["values"]
    ref = 10 ** 6 if 10 ** 6 in set(r.n) else int(r.n.max())
    at = r[r.n == ref]
    v = {"ope_provenance": provenance(ope["meta"], "ope.json"), "ope_logs": s["logs"],
         "ope_candidates": s["candidates"], "ope_temperature": f"{s['temperature']:g}",
         "ope_teps": f"{s['target_epsilon']:g}", "ope_leps": f"{s['logging_epsilon']:g}",
         "ope_world": f"{s['world_users']:,}", "ope_ref": f"{ref:,}",
         "ope_sizes": ", ".join(f"{n:,}" for n in s["sizes"]), "ope_pilot": f"{s['pilot']:,}",
         "ope_values": "; ".join(f"{k.replace('_', ' ')} {x:.5f}" for k, x in val.items()),
         "ope_minutes": f"{ope['seconds'] / 60:.0f}",
         "table_ope_rmse": _by_setting(at, "rel_rmse", "{:.3f}"),
         "table_ope_cov": _by_setting(at, "coverage", "{:.2f}"),
         "ope_undercover": undercover(at)}
    ess = at[at.estimator == "ips"]
    v["table_ope_ess"] = table(["logging → target", "ESS share", "largest weight"],
                               [(f"{row.logging} → {row.target}", f"{row.ess_share:.4f}",
                                 f"{row.max_weight:,.0f}") for row in ess.itertuples()])
    by_n = r[(r.target == "softmax") & r.estimator.isin(["ips", "dr", "pi", "sips"])]
    pv = by_n.assign(key=by_n.logging + " / " + by_n.estimator).pivot(
        index="key", columns="n", values="rel_rmse")
    v["table_ope_n"] = table(["logging / estimator", *(f"n = {n:,}" for n in pv.columns)],
                             [(k, *(f"{x:.3f}" for x in row.values)) for k, row in pv.iterrows()])
    v.update(ope_claims(r, ref))
    p = ope["peer"]
    v["ope_peer"] = (f"on one log of {p['impressions']:,} impressions the pandas estimators took "
                     f"{p['pandas_seconds']:.2f} s and a traced peak of "
                     f"{p['pandas_peak_bytes'] / 2**20:.0f} MiB (the log itself "
                     f"{p['log_bytes'] / 2**20:.0f} MiB); the kernel drew and evaluated the same "
                     f"log in {p['kernel_seconds']:.2f} s with {p['kernel_state_bytes']} bytes of "
                     f"state ({p['pandas_seconds'] / p['kernel_seconds']:.0f}× faster); the "
                     f"estimates agree to {p['max_abs_difference']:.0e}")
    return v


def ope_claims(r, ref) -> dict:
    """The targets, stated from the rows: relative RMSE of IPS / SNIPS / DR at ``ref`` with the
    softmax target, their coverage, and the slate estimators against slate IPS."""
    soft = r[(r.n == ref) & (r.target == "softmax")]
    lines = []
    for lg, g in soft.groupby("logging", sort=False):
        e = g.set_index("estimator")
        worst = max(e.loc[k, "rel_rmse"] for k in ("ips", "snips", "dr"))
        covs = [e.loc[k, "coverage"] for k in ("ips", "snips", "dr")]
        ok_cov = 0.9 <= min(covs) and max(covs) <= 0.98
        lines.append(f"- {lg}: largest relative RMSE of IPS / SNIPS / DR {worst:.3f} "
                     f"({'meets' if worst <= 0.05 else 'misses'} ≤ 0.05); their coverage "
                     f"{min(covs):.2f}–{max(covs):.2f} ({'within' if ok_cov else 'outside'} "
                     "0.90–0.98)")
    beat = []
    for (lg, tg), g in r[r.n == ref].groupby(["logging", "target"], sort=False):
        e = g.set_index("estimator")["rmse"]
        wins = [k for k in ("ips", "rips", "pi", "cascade_dr", "dros") if e[k] < e["sips"]]
        beat.append(f"- {lg} → {tg} (slate IPS {e['sips']:.5f}): {', '.join(wins) or 'none'}")
    return {"ope_target_lines": "\n".join(lines), "ope_slate_lines": "\n".join(beat)}


def undercover(at) -> str:
    """The (setting, estimator) pairs whose normal 95 % interval covered the exact value in
    fewer than 90 % of the logs: intervals not to rely on there."""
    low = at[at.coverage < 0.9].sort_values(["logging", "target", "estimator"])
    if low.empty:
        return "Every interval covered the exact value in at least 90 % of the logs."
    return "Intervals that covered the exact value in fewer than 90 % of the logs: " + "; ".join(
        f"{row.estimator} ({row.logging} → {row.target}: {row.coverage:.2f})"
        for row in low.itertuples()) + "."


def seeds_values(ctr) -> dict:
    """The headline over seeds: each policy's click AUC, its paired difference from popularity's
    (same impressions) and its CTR lift over popularity, with the interval across seeds; the
    sentence states only what holds on the interval."""
    seeds = ctr.get("seeds") or []
    if len(seeds) < 2:
        return {"n_seeds": len(seeds), "seed_list": "—", "min_clicks": "—", "max_auc_se": "—",
                "prior_weights": "—",
                "table_seeds": "Not measured over seeds yet: rerun the command above.",
                "seeds_headline": "The headline is not measured over seeds yet."}
    rows = []
    for p in seeds[0]["auc"]:
        auc = [s["auc"][p] for s in seeds]
        exp = [s["auc_expected"][p] for s in seeds]
        se = max(s["auc_se"][p] for s in seeds)
        above = sum(s["auc_expected"][p] >= s["auc_expected"]["popularity"] for s in seeds)
        diff = lift = pos = ""
        if p != "popularity":
            m, lo, hi = seed_interval(auc_gain(seeds, p))
            diff = f"{m:+.4f} [{lo:+.4f} … {hi:+.4f}]"
        if p in seeds[0]["lift"]:
            m, lo, hi = seed_interval([s["lift"][p] for s in seeds])
            lift = f"{signed_pct(m)} [{signed_pct(lo)} … {signed_pct(hi)}]"
            pos = f"{sum(s['lift'][p] > 0 for s in seeds)} of {len(seeds)}"
        rows.append((p, f"{np.mean(auc):.3f} ± {np.std(auc, ddof=1):.3f}", f"{se:.4f}",
                     f"{np.mean(exp):.4f} ± {np.std(exp, ddof=1):.4f}",
                     f"{above} of {len(seeds)}", diff, lift, pos))
    claim("CTR.md", "the bias-free FedRecon pools clicks worse than popularity in every seed",
          all(g < 0 for g in auc_gain(seeds, "fedrecon")))
    claim("CTR.md", "fedrecon_biases does not both rank above popularity and lift over it",
          "fedrecon_biases" not in both_ways(seeds))
    clicks = min(s["clicks"] for s in seeds)
    weights = sorted({s["prior_weight"] for s in seeds if "prior_weight" in s})
    return {"n_seeds": len(seeds), "seed_list": ", ".join(str(s["seed"]) for s in seeds),
            "min_clicks": f"{clicks:,}",
            "max_auc_se": f"{max(max(s['auc_se'].values()) for s in seeds):.4f}",
            "prior_weights": ", ".join(f"{w:g}" for w in weights) or "—",
            "table_seeds": table(["policy", "click AUC, drawn clicks (mean ± SD over seeds)",
                                  "largest SE of one seed's drawn AUC",
                                  "expected click AUC (mean ± SD)",
                                  "seeds with expected AUC ≥ popularity",
                                  "expected AUC − popularity's (mean, 95 % interval over seeds)",
                                  "CTR lift over popularity (mean, 95 % interval over seeds)",
                                  "seeds with lift > 0"], rows),
            "seeds_headline": seeds_headline(seeds)}


FEDERATED = ("fedrecon", "fedrecon_biases", "fedrecon_full_negatives", "fedrecon_prior")


def auc_gain(seeds, policy) -> list:
    """Per seed, the policy's expected click AUC minus popularity's on the same impressions."""
    return [s["auc_expected"][policy] - s["auc_expected"]["popularity"] for s in seeds]


def both_ways(seeds) -> list:
    """The federated policies whose paired AUC difference from popularity and whose CTR lift
    over it both have a 95 % interval across seeds above zero."""
    def low(values):
        return seed_interval(values)[1]
    return [p for p in FEDERATED if p in seeds[0]["auc"]
            and low(auc_gain(seeds, p)) > 0
            and low([s["lift"][p] for s in seeds]) > 0]


def seeds_headline(seeds) -> str:
    """Which federated configuration ranks clicks above popularity (the paired AUC difference's
    interval across seeds above zero) and lifts CTR over it on the interval, worded from the
    numbers."""
    lines = []
    for p in (p for p in FEDERATED if p in seeds[0]["auc"]):
        k = sum(g >= 0 for g in auc_gain(seeds, p))
        _, d_lo, d_hi = seed_interval(auc_gain(seeds, p))
        _, lo, hi = seed_interval([s["lift"][p] for s in seeds])
        ranks = "ranks clicks above popularity on the interval" if d_lo > 0 else (
            "ranks clicks below popularity on the interval" if d_hi < 0 else
            "has an AUC difference from popularity whose interval includes zero")
        lifts = "lifts CTR over popularity on the interval" if lo > 0 else (
            "lowers CTR below popularity on the interval" if hi < 0 else
            "has a lift whose interval includes zero")
        lines.append(f"- `{p}`: expected AUC at least popularity's in {k} of {len(seeds)} seeds; {ranks}, "
                     f"and {lifts}.")
    both = both_ways(seeds)
    lines.append("- A federated configuration that does both: " +
                 (", ".join(f"`{p}`" for p in both) if both else "none yet."))
    return "\n".join(lines)
