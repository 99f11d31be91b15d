"""eval/RESULTS.md: the paper protocol, the sweeps, the budget at the paper's rounds."""

from __future__ import annotations

import numpy as np
from report_common import claim, pct, provenance, rmse_acc, seed_interval, table


def paper_table(rows) -> str:
    return table(["row", "RMSE", "± boot", "accuracy", "± boot", "seconds"],
                 [(r["name"], f"{r['rmse']:.4f}", f"{r['rmse_boot_std']:.4f}",
                   f"{r['accuracy']:.4f}", f"{r['accuracy_boot_std']:.4f}", f"{r['seconds']:.1f}")
                  for r in rows])


def sweep_table(rows, label, fmt) -> str:
    return table([label, *(fmt(r) for r in rows)],
                 [("RMSE", *(f"{r['rmse']:.3f}" for r in rows)),
                  ("accuracy", *(pct(r["accuracy"]) for r in rows))])


def budget_selections(rows, d, n) -> dict:
    """Per protocol, the validation-selected FedRecon row of each seed at (dataset d, n rounds),
    with centralized + ReconEval's test RMSE on the same split: "per seed" takes each split's
    lowest validation RMSE; "once" takes the candidate whose validation RMSE, averaged over the
    seeds, is lowest, and reports it on every seed. Test RMSEs never enter a choice."""
    at = [r for r in rows if r["dataset"] == d and r["rounds"] == n]
    central = {r["seed"]: r["test_rmse"] for r in rows if r["dataset"] == d and r["rounds"] is None}
    seeds = sorted({r["seed"] for r in at})
    models = list(dict.fromkeys(r["model"] for r in at))
    pooled = min(models, key=lambda m: np.mean([r["val_rmse"] for r in at if r["model"] == m]))
    per_seed = [min((r for r in at if r["seed"] == s), key=lambda r: r["val_rmse"]) for s in seeds]
    once = [next(r for r in at if r["seed"] == s and r["model"] == pooled) for s in seeds]
    return {"per seed": [(r, central[r["seed"]]) for r in per_seed],
            "once": [(r, central[r["seed"]]) for r in once]}


def central_names(rows) -> list:
    return list(dict.fromkeys(r["dataset"] for r in rows if r["rounds"] is None))


def no_grid_lines(rows, key, central) -> list:
    """The one setting chosen without a grid (the row whose name says "no grid"): its test RMSE
    minus centralized + ReconEval's per (dataset, budget), mean and 95 % interval over seeds."""
    out = []
    for d, n in key:
        rs = [r for r in rows if r["dataset"] == d and r["rounds"] == n and "no grid" in r["model"]]
        if not rs:
            continue
        gap = [r["test_rmse"] - central[(d, r["seed"])]["test_rmse"] for r in rs]
        m, lo, hi = seed_interval(gap)
        kept = [r.get("kept_round") for r in rs]
        out.append(f"- {d}, {n} rounds, {rs[0]['model']}: test RMSE minus centralized + "
                   f"ReconEval's {m:+.4f} (95 % interval over {len(rs)} seeds [{lo:+.4f}, "
                   f"{hi:+.4f}]; within 0.003 on the mean: {'yes' if m <= 0.003 else 'no'}); "
                   f"kept rounds {', '.join(str(k) for k in kept)}")
    return out


def default_claims(rows, central) -> None:
    """What RESULTS.md says in words about the defaults' row at 500 rounds."""
    def gap(d, pred):
        return np.mean([r["test_rmse"] - central[(d, r["seed"])]["test_rmse"] for r in rows
                        if r["dataset"] == d and r["rounds"] == 500 and pred(r["model"])])
    auto = {d: gap(d, lambda m: "no grid" in m) for d in ("100k", "synthetic-1m")}
    paper = {d: gap(d, lambda m: m.startswith("SGD 1")) for d in ("100k", "synthetic-1m")}
    claim("RESULTS.md", "at 500 rounds the defaults meet the target on the mean on both "
          "populations, where the paper's SGD step is far behind (over 0.1) on the ML-1M-size one",
          max(auto.values()) <= 0.003 and paper["synthetic-1m"] > 0.1)
    gaps = [r["test_rmse"] - central[("100k", r["seed"])]["test_rmse"] for r in rows
            if r["dataset"] == "100k" and r["rounds"] == 500 and "no grid" in r["model"]]
    claim("RESULTS.md", "on ML-100K the defaults' interval across seeds reaches above the target",
          seed_interval(gaps)[2] > 0.003)


def budget_values(doc) -> dict:
    """FedRecon against centralized + ReconEval at two round budgets (budget.json): mean RMSE
    over seeds per candidate, and per (dataset, budget) the validation-selected candidate's test
    RMSE against centralized's, seed by seed, under both selection protocols."""
    if not doc:
        return {"budget_provenance": "", "table_budget": "Not measured yet.", "budget_lines": "",
                "budget_lambdas": ""}
    rows = doc["rows"]
    key = [(d, n) for d in dict.fromkeys(r["dataset"] for r in rows)
           for n in sorted({r["rounds"] for r in rows if r["dataset"] == d and r["rounds"]})]
    central = {(r["dataset"], r["seed"]): r for r in rows if r["rounds"] is None}

    def mean(rs, k):
        return f"{np.mean([r[k] for r in rs]):.4f}"
    out, lines, chosen, every = [], [], {}, {}
    for d in dict.fromkeys(r["dataset"] for r in rows):
        cs = [r for r in rows if r["dataset"] == d and r["rounds"] is None]
        out.append((d, "—", "centralized + ReconEval", mean(cs, "val_rmse"), mean(cs, "test_rmse"),
                    ""))
    for d, n in key:
        models = list(dict.fromkeys(r["model"] for r in rows
                                    if r["dataset"] == d and r["rounds"] == n))
        for m in models:
            rs = [r for r in rows if r["dataset"] == d and r["rounds"] == n and r["model"] == m]
            met = sum(r["test_rmse"] <= central[(d, r["seed"])]["test_rmse"] for r in rs)
            out.append((d, n, m, mean(rs, "val_rmse"), mean(rs, "test_rmse"),
                        f"{met} of {len(rs)}"))
        for how, picks in budget_selections(rows, d, n).items():
            met = sum(b["test_rmse"] <= c for b, c in picks)
            if how == "once":
                chosen[(d, n)] = picks[0][0]["model"]
                every[(d, n)] = met == len(picks) and picks[0][0]["model"].startswith("Adam")
            lines.append(f"- {d}, {n} rounds, selected {how}: "
                         + ", ".join(f"seed {b['seed']} {b['model']} ({b['test_rmse']:.4f} "
                                     f"against {c:.4f})" for b, c in picks)
                         + f"; target (≤ centralized + ReconEval) met in {met} of {len(picks)} "
                         "seeds")
    lines += no_grid_lines(rows, key, central)
    if ("synthetic-1m", 500) in every:
        claim("RESULTS.md", "only at 500 rounds on the ML-1M-size population does the setting "
              "selected once meet the target on every seed (an Adam row)",
              every[("synthetic-1m", 500)] and not any(v for k, v in every.items()
                                                       if k != ("synthetic-1m", 500)))
        default_claims(rows, central)
    at = [r for r in rows if r["dataset"] == "synthetic-1m" and r["rounds"] == 125]
    if at:
        claim("RESULTS.md", "at a quarter of the budget nothing meets the target on the "
              "ML-1M-size population", not any(r["test_rmse"] <= central[(
                  "synthetic-1m", r["seed"])]["test_rmse"] for r in at))
    step = {k: float(m.split()[1]) if m.startswith("Adam ") else None for k, m in chosen.items()}
    if ("100k", 125) in step and ("synthetic-1m", 500) in step:
        claim("RESULTS.md", "the winning Adam step is larger for the ML-1M-size catalog and "
              "smaller for the longer ML-100K run", None not in step.values()
              and all(step[("synthetic-1m", n)] > step[("100k", n)] for n in (125, 500))
              and step[("100k", 500)] < step[("100k", 125)])
    picked = {d: sorted({r.get("regularization") for r in rows if r["dataset"] == d
                         and r["rounds"] is None}, key=str) for d in central_names(rows)}
    return {"budget_provenance": provenance(doc["meta"], "budget.json"),
            "budget_lambdas": "; ".join(f"chosen for {d}: {', '.join(f'{x:g}' for x in v)}"
                                        if None not in v else f"{d}: λ = 0.1, fixed"
                                        for d, v in picked.items()),
            "table_budget": table(["dataset", "rounds", "model", "validation RMSE (mean)",
                                   "test RMSE (mean)", "test ≤ centralized (seeds)"], out),
            "budget_lines": "\n".join(lines)}


def results_values(paper, cold, tuned, sweeps, scale, random_rows) -> dict:
    by = {r["name"]: r for r in paper}
    als = by["FedRecon (ALS reconstruction, biases)"]
    recon = next(r for r in paper if r["protocol"] == "paper-recon")
    pc = by["FedRecon (paper config, SGD reconstruction)"]["params"]
    v = {"paper_provenance": provenance(paper[0]["meta"], "movielens_paper.json"),
         "dataset": paper[0]["meta"]["dataset"], "K": pc["n_factors"],
         "n_train": recon["n_train_users"], "n_test": recon["n_users"],
         "rounds": pc["n_rounds"], "clients": pc["clients_per_round"], "batch": pc["batch_size"],
         "recon_steps": pc["recon_steps"], "update_steps": pc["update_steps"],
         "boot": recon["bootstrap_repeats"], "table_paper": paper_table(paper),
         "warm_s": f"{paper[0]['meta']['total_seconds']:.0f}",
         "cold": cold_sentence(paper, cold),
         "cold_provenance": f"{cold[0]['meta']['date'][:10]}, `eval/results/"
                            "movielens_paper_cold.json`, run with an empty `FEDCF_NUMBA_CACHE`",
         "als": rmse_acc(als), "fedavg": rmse_acc(by["FedAvg + ReconEval"]),
         "central_recon": rmse_acc(by["centralized + ReconEval"]),
         "central_std": rmse_acc(by["centralized + StandardEval"]),
         "central_unseen": rmse_acc(by["centralized + StandardEval (unseen)"]),
         "als_std": rmse_acc(by["FedRecon (ALS) + StandardEval"]),
         "paper_config": rmse_acc(by["FedRecon (paper config, SGD reconstruction)"]),
         "nosplit": rmse_acc(by["FedRecon (no split)"]),
         "joint": rmse_acc(by["FedRecon (joint training, client lr 0.1)"]),
         "adagrad": rmse_acc(by["FedRecon (Adagrad server)"]),
         "adam": rmse_acc(by["FedRecon (Adam server)"]),
         "yogi": rmse_acc(by["FedRecon (Yogi server)"]),
         "learned": rmse_acc(by["FedRecon (learned server lr)"])
         if "FedRecon (learned server lr)" in by else "not measured yet"}
    grid = [r for r in tuned if r["protocol"] == "paper-recon-val"]
    best = next(r for r in grid if r.get("selected"))
    chosen = next(r for r in tuned if "tuned on validation" in r["name"])
    v.update(tune_provenance=provenance(tuned[0]["meta"], "movielens_tuned.json"),
             table_tune=table(["η_s", "η_r", "η_u", "validation RMSE", "validation accuracy"],
                              sorted((r["params"]["server_learning_rate"],
                                      r["params"]["recon_learning_rate"],
                                      r["params"]["learning_rate"],
                                      *(("diverged", "—") if not np.isfinite(r["rmse"]) else
                                        (f"{r['rmse']:.4f}", pct(r["accuracy"]))))
                                     for r in grid)),
             tune_selected=", ".join(f"{k} = {x}" for k, x in best["params"].items()),
             tune_val_rmse=f"{best['rmse']:.4f}", tune_test=rmse_acc(chosen))
    names = {"recon-steps": "k_r (recon steps)", "update-steps": "k_u (update steps)",
             "server-optimizer": "server optimizer (lr)"}
    for key, rows in sweeps.items():
        fmt = ((lambda r: f"{r['value']} ({r['params']['server_learning_rate']})")
               if key == "server-optimizer" else (lambda r: str(r["value"])))
        v[f"table_sweep_{key.split('-')[0] if key != 'server-optimizer' else 'opt'}"] = \
            sweep_table(rows, names[key], fmt)
    opt = sweeps.get("server-optimizer") or []
    claim("RESULTS.md", "all five server optimizers finish without diverging",
          len(opt) == 5 and all(np.isfinite(r["rmse"]) for r in opt))
    v["sweep_provenance"] = " ".join(provenance(s[0]["meta"], f"sweep_{k}.json")
                                     for k, s in sweeps.items())
    sm = scale[0]["meta"]
    v.update(scale_provenance=provenance(sm, "scale.json"),
             scale_data=f"Synthetic population {sm['data']} ({sm['train_users']} train users)",
             scale_rounds=scale[0]["rounds"], scale_clients=scale[0]["clients_per_round"],
             scale_compile=f"{sm['compile_seconds']:.1f}",
             table_scale=table(["reconstruction", "fit wall time", "client updates / s",
                                "ReconEval RMSE (held-out users)", "threads"],
                               [(r["reconstruction"], f"{r['fit_seconds']:.2f} s",
                                 f"{r['client_updates_per_second']:,.0f}",
                                 f"{r['recon_eval_rmse']:.3f}", r["threads"]) for r in scale]))
    v.update(random_provenance=provenance(random_rows[0]["meta"], "movielens_random.json"),
             table_random=random_table(random_rows))
    return v


def random_table(rows) -> str:
    return table(["model", "RMSE", "MAE", "accuracy", "fit seconds"],
                 [(r["name"], f"{r['rmse']:.4f}", f"{r['mae']:.4f}", f"{r['accuracy']:.4f}",
                   f"{r['seconds']:.2f}") for r in rows])


def cold_sentence(paper, cold) -> str:
    """How the main job went on an empty Numba cache (movielens_paper_cold.json's meta)."""
    w, c = paper[0]["meta"], cold[0]["meta"]
    return (f"{c['total_seconds']:.0f} s on an empty cache: its first row was done after "
            f"{c['first_row_done_seconds']:.0f} s ({w['first_row_done_seconds']:.0f} s warm), "
            f"{c['first_row_wait_seconds']:.0f} s of it waiting for its kernels; two worker "
            f"processes compiled the kernels while the rows ran, the job waited "
            f"{c['background_wait_seconds']:.0f} s for them in all and compiled "
            f"{c['compile_seconds']:.0f} s itself")
