"""eval/HYPER.md: learned round hyperparameters."""

from __future__ import annotations

import numpy as np
from report_common import (
    _bench_constant,
    claim,
    provenance,
    results_file,
    seed_interval,
    table,
)


def hyper_summary(doc):
    """(summary table, best-of-n table) of the random-start trials of one hyper JSON."""
    trials = [r for r in doc["rows"] if r["section"] == "trials"]
    modes = list(doc["best_of_n"])

    def rmse(x):
        return "diverged" if not np.isfinite(x) else f"{x:.4f}"

    summary = []
    for m in modes:
        rs = [r["rmse"] for r in trials if r["mode"] == m]
        summary.append((m, sum(not np.isfinite(x) for x in rs), rmse(float(np.median(rs))),
                        rmse(max(rs)), rmse(min(rs))))
    ns = [n for n in (1, 2, 5, 10, 20, 50) if n <= len(doc["best_of_n"][modes[0]])]
    return (table(["values", "diverged", "median RMSE", "worst RMSE", "best RMSE"], summary),
            table(["n trials", *map(str, ns)],
                  [(m, *(rmse(doc["best_of_n"][m][n - 1]) for n in ns)) for m in modes]))


def weighting_claims(weighting) -> str:
    """Each learned-α run against the better fixed weighting of its population, in ReconEval
    RMSE and in the query loss of the last fifty rounds, worded from the numbers."""
    lines, ahead = [], []
    for pop in dict.fromkeys(r["population"] for r in weighting):
        rows = {r["name"]: r for r in weighting if r["population"] == pop}
        loss = {k: np.mean(r["loss_curve"][-50:]) for k, r in rows.items() if r["loss_curve"]}
        fixed = min(("uniform", "examples"), key=lambda k: rows[k]["rmse"])
        ahead.append(rows["uniform"]["rmse"] < rows["examples"]["rmse"]
                     or loss["uniform"] < loss["examples"])
        for start in ("learned from 0", "learned from 1"):
            r = rows[start]
            d_rmse = r["rmse"] / rows[fixed]["rmse"] - 1
            d_loss = loss[start] / loss[fixed] - 1
            lines.append(
                f"- {pop}, α {start.split()[-1]} → {r['alpha_final']:.2f}: ReconEval RMSE "
                f"{d_rmse * 100:+.2f} % and query loss {d_loss * 100:+.2f} % against {fixed} "
                f"weighting (the better fixed one by RMSE); "
                + ("no worse on both" if d_rmse <= 0 and d_loss <= 0 else
                   "worse on both" if d_rmse > 0 and d_loss > 0 else "better on one, worse on "
                   "the other"))
    if weighting:
        claim("HYPER.md", "in none of the matrix-factorization populations did uniform weighting "
              "come out ahead (RMSE or query loss)", not any(ahead))
    return "\n".join(lines)


def hyper_claims(doc, doc_1m) -> None:
    """The comparisons HYPER.md's prose states about the random starts."""
    trials = [r for r in doc["rows"] if r["section"] == "trials"]
    bo = doc["best_of_n"]
    worst = {m: max(r["rmse"] for r in trials if r["mode"] == m) for m in bo}
    best = {m: min(r["rmse"] for r in trials if r["mode"] == m) for m in bo}
    own_end = [r["server_learning_rate_final"] for r in trials
               if r["mode"] == "learned (own cohort)" and "server_learning_rate_final" in r]
    starts = [r["lr0"] for r in trials if r["mode"] == "fixed"]
    claim("HYPER.md", "a single learned start beats a single fixed one on average",
          bo["learned"][0] < bo["fixed"][0])
    claim("HYPER.md", "the best of five learned starts is at least as good as the best of all "
          "fixed ones", bo["learned"][4] <= bo["fixed"][-1])
    claim("HYPER.md", "no random-start run diverged",
          all(np.isfinite(r["rmse"]) for r in trials))
    claim("HYPER.md", "the worst learned run is far better (by half the gap to the best) than "
          "the worst fixed one", worst["fixed"] - worst["learned"] >
          0.5 * (worst["fixed"] - best["fixed"]))
    claim("HYPER.md", "learned from the own cohort, the end learning rates span less than the "
          "starts do", own_end and np.ptp(np.log(own_end)) < np.ptp(np.log(starts)))
    claim("HYPER.md", "learned from the own cohort, the best run is worse than the best fixed "
          "one (good starts get worse)", best["learned (own cohort)"] > best["fixed"])
    if doc_1m:
        b = doc_1m["best_of_n"]
        claim("HYPER.md", "on the ML-1M-size population both learned variants help a single "
              "start", b["learned"][0] < b["fixed"][0] and
              b["learned (own cohort)"][0] < b["fixed"][0])


def stability_values(doc) -> dict:
    """The stability study (hyper_stability.json): per mode, how many random starts diverged,
    and the learned modes against the fixed one on the starts that diverged fixed."""
    if not doc:
        return {"stability_provenance": "", "table_stability": "Not measured yet.",
                "stability_lines": "", "stability_range": "—", "n_common": "—"}
    rows = [r for r in doc["rows"] if r["section"] == "stability"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {m: {r["trial"]: r for r in rows if r["mode"] == m} for m in modes}
    lost = [t for t, r in by["fixed"].items() if r["diverged"]]

    def med(rs):
        ok = [r["rmse"] for r in rs if not r["diverged"]]
        return f"{np.median(ok):.4f}" if ok else "—"
    common = [t for t in by["fixed"] if not any(by[m][t]["diverged"] for m in modes)]
    table_rows = [(m, f"{sum(r['diverged'] for r in by[m].values())} of {len(by[m])}",
                   med(by[m][t] for t in common), med(by[m][t] for t in lost)) for m in modes]
    adam, sgd = modes[1], modes[-1]
    median = {m: np.median([by[m][t]["rmse"] for t in common]) for m in modes}
    claim("hyper.py (Hypergradients docstring)", f"{sgd} diverges on fewer starts than "
          f"{adam}", sum(r["diverged"] for r in by[sgd].values()) <
          sum(r["diverged"] for r in by[adam].values()))
    claim("hyper.py (Hypergradients docstring)", f"on the starts every variant finished, "
          f"{adam} ends better than {sgd} (median RMSE)", median[adam] < median[sgd])
    lines = []
    for m in modes[1:]:
        saved = [t for t in lost if not by[m][t]["diverged"]]
        new = [t for t, r in by[m].items() if r["diverged"] and not by["fixed"][t]["diverged"]]
        lines.append(f"- {m}: finished {len(saved)} of the {len(lost)} starts that diverged "
                     f"with fixed values, and diverged on {len(new)} start(s) that finished "
                     "fixed.")
    return {"stability_provenance": provenance(doc["meta"], "hyper_stability.json"),
            "stability_range": "[{:g}, {:g}]".format(*_bench_constant("WIDE_LR_RANGE")),
            "n_common": str(len(common)),
            "table_stability": table(["values", "diverged",
                                      "median RMSE on the starts every variant finished",
                                      "median RMSE on the starts that diverged fixed"],
                                     table_rows),
            "stability_lines": "\n".join(lines)}


def figure8_values(doc) -> dict:
    """HYPER.md §3, the paper's own regime (learned_weighting.json): per weighting, the training
    loss averaged over seeds at a few rounds, the test accuracy and α at the end; the learned
    runs' α every fifty rounds; and the checks of the comparisons the prose states."""
    if not doc:
        return {"figure8_provenance": "", "table_figure8": "Not measured yet.",
                "table_figure8_alpha": "", "figure8_settings": "—"}
    rows, st = doc["rows"], doc["meta"]["settings"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    rounds = sorted({r["round"] for r in rows})

    def at(mode, t, k):
        return float(np.mean([r[k] for r in rows if r["mode"] == mode and r["round"] == t]))
    last = rounds[-1]
    shown = [t for t in rounds if t and (t % 100 == 0 or t == 50)] or rounds[1:]
    early = shown[0]
    loss = {m: at(m, last, "train_loss") for m in modes}
    claim("HYPER.md", "example weighting is ahead of uniform weighting early",
          at("example", early, "train_loss") < at("uniform", early, "train_loss"))
    claim("HYPER.md", "uniform weighting ends ahead of example weighting",
          loss["uniform"] < loss["example"])
    path = [at("learned from example", t, "alpha") for t in rounds]
    claim("HYPER.md", "learned from example weighting, α first rises above its start, then "
          "ends below it", max(path[: len(path) // 4 + 1]) > path[0] > path[-1])
    up = [at("learned from uniform", t, "alpha") for t in rounds]
    claim("HYPER.md", "started from uniform weighting, α rises, peaks below example weighting "
          "and drifts back down", 0 < up[-1] < max(up) < 1)
    claim("HYPER.md", "both learned runs end with a lower training loss than either fixed "
          "weighting", max(loss[m] for m in modes if m.startswith("learned"))
          < min(loss["uniform"], loss["example"]))
    return {
        "figure8_provenance": provenance(doc["meta"], "learned_weighting.json"),
        "figure8_settings": (
            f"{st['clients']} clients, {st['cohort']} per round, {st['rounds']} rounds, local "
            f"mini-batch SGD (epochs {st['epochs']}, batch {st['batch']}, step "
            f"{st['client_lr']:g}), server SGD at {st['server_lr']:g}, Adam step "
            f"{st['hyper_lr']:g} on α, {st['seeds']} seeds"),
        "table_figure8": table(
            ["weighting", *(f"training loss, round {t}" for t in shown),
             f"test accuracy, round {last}", f"α, round {last}"],
            [(m, *(f"{at(m, t, 'train_loss'):.4f}" for t in shown),
              f"{at(m, last, 'test_accuracy'):.4f}", f"{at(m, last, 'alpha'):.3f}")
             for m in modes]),
        "table_figure8_alpha": table(
            ["round", *(f"α, {m}" for m in modes if m.startswith("learned"))],
            [(t, *(f"{at(m, t, 'alpha'):.3f}" for m in modes if m.startswith("learned")))
             for t in rounds if t % 50 == 0 or t == 10]),
    }


def hyper_values(doc, doc_1m=None) -> dict:
    rows, meta = doc["rows"], doc["meta"]
    trials = [r for r in rows if r["section"] == "trials"]
    modes = list(doc["best_of_n"])
    by = {m: [r for r in trials if r["mode"] == m] for m in modes}

    def rmse(x):
        return "diverged" if not np.isfinite(x) else f"{x:.4f}"

    best = next((r for r in trials if "trajectory" in r), None)
    traj = []
    if best is not None:
        tr = best["trajectory"]
        traj = [(5 * k, f"{tr['server_learning_rate'][k]:.3g}", f"{tr['momentum'][k]:.3f}")
                for k in range(0, len(tr["momentum"]), 20)]
    order = np.argsort([r["lr0"] for r in by[modes[0]]])

    def end(r, k, fmt):
        return format(r[k], fmt) if k in r else "—"

    trial_rows = [(f"{by[modes[0]][i]['lr0']:.3g}", f"{by[modes[0]][i]['momentum0']:.2f}",
                   *(rmse(by[m][i]["rmse"]) for m in modes),
                   end(by["learned"][i], "server_learning_rate_final", ".3g"),
                   end(by["learned"][i], "momentum_final", ".3f")) for i in order]
    w_doc = results_file("hyper_weighting.json")
    weighting = [r for r in (w_doc["rows"] if w_doc else []) if r["section"] == "weighting"]
    hyper_claims(doc, doc_1m)
    bo = doc["best_of_n"]
    own = [r["server_learning_rate_final"] for r in by.get("learned (own cohort)", [])
           if "server_learning_rate_final" in r]
    return {
        "provenance": provenance(meta, "hyper.json"), "rounds": meta["rounds"],
        "lr_range": "[{:g}, {:g}]".format(*_bench_constant("LR_RANGE")),
        "momentum_range": "[{:g}, {:g})".format(*_bench_constant("MOMENTUM_RANGE")),
        "b1_learned": rmse(bo["learned"][0]), "b1_fixed": rmse(bo["fixed"][0]),
        "b5_learned": rmse(bo["learned"][4]), "b50_fixed": rmse(bo["fixed"][-1]),
        "own_lr_end": f"{np.median(own):.3g}" if own else "—",
        "own_lr_corr": own_start_end_correlation(by.get("learned (own cohort)", [])),
        "weighting_lines": weighting_claims(weighting),
        "trials": meta["trials"], "hyper_lr": "0.01",
        **dict(zip(("table_summary", "table_best_of_n"), hyper_summary(doc))),
        **(dict(zip(("table_summary_1m", "table_best_of_n_1m"), hyper_summary(doc_1m)),
                provenance_1m=provenance(doc_1m["meta"], "hyper_1m.json"),
                trials_1m=doc_1m["meta"]["trials"]) if doc_1m else
           {"table_summary_1m": "Not measured yet.", "table_best_of_n_1m": "",
            "provenance_1m": "", "trials_1m": "—"}),
        "best_trial": "none" if best is None else f"trial {best['trial']}, start lr "
        f"{best['lr0']:.3g}, momentum {best['momentum0']:.2f}",
        "table_trajectory": table(["round", "server lr", "momentum"], traj),
        "table_trials": table(["start lr", "start momentum", *(f"{m} RMSE" for m in modes),
                               "learned lr (end)", "learned momentum (end)"], trial_rows),
        "table_weighting": table(
            ["population", "weighting", "ReconEval RMSE", "query loss (last 50 rounds)",
             "α at the end"],
            [(r["population"], r["name"], rmse(r["rmse"]),
              f"{np.mean(r['loss_curve'][-50:]):.4f}" if r["loss_curve"] else "—",
              "" if r["alpha_final"] is None else f"{r['alpha_final']:.3f}")
             for r in weighting]),
    }


def own_start_end_correlation(rows) -> str:
    """Pearson correlation of log starting and log final learning rate over the runs that
    learned from their own cohort (how much the end still depends on the start)."""
    pairs = [(r["lr0"], r["server_learning_rate_final"]) for r in rows
             if "server_learning_rate_final" in r]
    if len(pairs) < 3:
        return "—"
    start, end = np.log(np.array(pairs, dtype=float)).T
    r = np.corrcoef(start, end)[0, 1]
    claim("HYPER.md", "learned from its own cohort, where the rate ends still depends on where it "
          "started (correlation of the logs above 0.3)", r > 0.3)
    return f"{r:.2f}"


def expected_best(rmses, n: int) -> float:
    """The expected best (lowest) RMSE among n starts drawn with replacement from ``rmses``,
    exactly (a diverged run, inf, is no result; inf when all n may diverge)."""
    x = np.sort(np.asarray(rmses, float))
    m = len(x)
    k = np.arange(m)
    p = ((m - k) / m) ** n - ((m - k - 1) / m) ** n  # P(the best draw is the k-th smallest)
    ok = p > 0
    return float(np.sum(p[ok] * x[ok])) if np.isfinite(x[ok]).all() else float("inf")


def hyper_seeds_values(doc, prefix="", name="hyper_seeds.json") -> dict:
    """§1 over seeds (``name``, its placeholders named with ``prefix``): per seed and values, a
    single start's expected RMSE, the best of five, the best and worst of all; the paired
    differences learned − fixed with their 95 % interval across seeds, and sentences worded
    from those intervals."""
    if not doc:
        return {f"{prefix}{k}": v for k, v in {
            "seeds_provenance": "", "table_hyper_seeds": "Not measured yet.",
            "table_hyper_seeds_diff": "", "hyper_seeds_lines": "", "hyper_seed_list": "—",
            "hyper_seed_trials": "—"}.items()}
    rows = [r for r in doc["rows"] if r["section"] == "seeds"]
    seeds = sorted({r["seed"] for r in rows})
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    stat = {"one start": lambda x: expected_best(x, 1), "best of 5": lambda x: expected_best(x, 5),
            "best of all": min, "worst": max}
    per = {(m, s): [r["rmse"] for r in rows if r["mode"] == m and r["seed"] == s]
           for m in modes for s in seeds}
    val = {(m, s, k): f(per[m, s]) for (m, s) in per for k, f in stat.items()}

    def iv(xs, fmt="{:.4f}"):
        mean, lo, hi = seed_interval(xs)
        return "diverged" if not np.isfinite(mean) else \
            f"{fmt.format(mean)} [{fmt.format(lo)} … {fmt.format(hi)}]"
    t1 = [(m, *(iv([val[m, s, k] for s in seeds]) for k in stat),
           sum(not np.isfinite(x) for s in seeds for x in per[m, s])) for m in modes]
    pairs = [("learned", "one start", "fixed", "one start"),
             ("learned (own cohort)", "one start", "fixed", "one start"),
             ("learned", "best of 5", "fixed", "best of all"),
             ("learned", "worst", "fixed", "worst")]
    t2, diffs = [], {}
    for a, ka, b, kb in pairs:
        d = [val[a, s, ka] - val[b, s, kb] for s in seeds]
        diffs[a, ka, kb] = seed_interval(d)
        t2.append((f"{a}, {ka} − fixed, {kb}", iv(d, "{:+.4f}"),
                   f"{sum(x < 0 for x in d)} of {len(seeds)}"))

    def words(key, what):
        _, lo, hi = diffs[key]
        return f"- {what}: " + ("lower on the interval across seeds." if hi < 0 else
                                "higher on the interval across seeds." if lo > 0 else
                                "the interval across seeds includes zero.")
    lines = [words(("learned", "one start", "one start"),
                   "A single learned start (held-out users) against a single fixed one"),
             words(("learned (own cohort)", "one start", "one start"),
                   "A single start learned from the own cohort against a single fixed one"),
             words(("learned", "best of 5", "best of all"),
                   "The best of five learned starts against the best of all fixed ones"),
             words(("learned", "worst", "worst"),
                   "The worst learned start against the worst fixed one")]
    if not prefix:
        claim("HYPER.md", "over seeds, a single learned start beats a single fixed one",
              diffs["learned", "one start", "one start"][2] < 0)
    else:
        claim("HYPER.md", f"over seeds ({name}), both learned variants help a single start",
              diffs["learned", "one start", "one start"][2] < 0
              and diffs["learned (own cohort)", "one start", "one start"][2] < 0)
    return {f"{prefix}{k}": v for k, v in {
            "seeds_provenance": provenance(doc["meta"], name),
            "hyper_seed_list": ", ".join(map(str, seeds)),
            "hyper_seed_trials": str(doc["meta"]["trials"]),
            "table_hyper_seeds": table(["values", *(f"{k} (mean, 95 % interval over seeds)"
                                                   for k in stat), "diverged runs"], t1),
            "table_hyper_seeds_diff": table(["paired difference in RMSE",
                                             "mean, 95 % interval over seeds",
                                             "seeds where learned is lower"], t2),
            "hyper_seeds_lines": "\n".join(lines)}.items()}
