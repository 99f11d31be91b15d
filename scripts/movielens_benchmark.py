#!/usr/bin/env python
"""MovieLens benchmark: the rows of Tables 1 and 3 of the Federated Reconstruction paper.

Protocols
---------
paper  (default) StandardEval rows: each user's ratings split 80/10/10 by time, train on all train
       parts, score the test parts. ReconEval rows: users split 80/10/10 at random (seed), train on
       the train users, and each test user reconstructs from a random half of their ratings and is
       scored on the other half. RMSE / accuracy pooled, plus the paper's bootstrap (sample 50 test
       users, repeat) as mean ± std.
random centralized models only, ratings split 90/10 at random.
time   centralized models only, per-user 80/10/10 time split.

Examples
--------
python scripts/movielens_benchmark.py --json results.json
python scripts/movielens_benchmark.py --protocol random --json out.json
python scripts/movielens_benchmark.py --dataset synthetic --quick
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import pandas as pd
from sklearn.exceptions import FitFailedWarning
from sklearn.model_selection import GridSearchCV
from tqdm.auto import tqdm

from fedcf import CentralizedMF, FedAvgMF, FedReconMF
from fedcf.datasets import VARIANTS, Interactions, load_movielens, load_ratings_file, make_synthetic_ratings
from fedcf.eval import (
    per_user_time_split,
    random_embedding_eval,
    random_split,
    rating_metrics,
    recon_eval,
    standard_eval,
    user_split,
)
from fedcf.federated import ClientUpdate, Hypergradients
from fedcf.model_selection import UserShuffleSplit, recon_scorer
from fedcf.provenance import run_meta, write_json
from fedcf.registry import lookup
from fedcf.warmup import BackgroundCompile, CompileClock

CENTRAL = dict(solver="als", regularization=0.1, n_epochs=15)
# the paper's FedRecon configuration (App. C.1): plain p·q model, k_r = k_u <= 50 steps of batch 5,
# recon lr 0.1, client lr 0.5, server SGD lr 1.0, support = random half
PAPER = dict(biases=False, reconstruction="sgd", recon_steps=50, update_steps=50, batch_size=5,
             recon_learning_rate=0.1, learning_rate=0.5, server_learning_rate=1.0, split="random")
OURS = dict(biases=True, reconstruction="als", recon_regularization=0.1)
# fedcf.warmup paths compiled by two worker processes while the rows run, dealt in turn
# (worker 1: centralized, fedavg, fedrecon-als; worker 2: fedrecon-sgd, hypergradient, variants)
BACKGROUND = ["centralized", "fedrecon-sgd", "fedavg", "hypergradient", "fedrecon-als",
              "fedrecon-variants"]


CLIENT = {"learning_rate": "learning_rate", "batch_size": "batch_size", "update_steps": "steps",
          "update_epochs": "epochs", "regularization": "regularization"}
RECON = {"recon_steps": "steps", "recon_epochs": "epochs", "recon_learning_rate": "learning_rate",
         "recon_init": "init", "recon_regularization": "regularization"}


def estimator(cls, params: dict):
    """The estimator of a row from its recorded (JSON) parameters, flat as the result files keep
    them: the server optimizer by name with ``server_learning_rate``, the client update's
    ``learning_rate``/``batch_size``/``update_steps``/..., FedRecon's reconstruction by name with
    ``recon_*`` settings, and ``learn_hyperparams`` (a list) become those phase objects."""
    p = dict(params)
    if "server_learning_rate" in p:
        opt = lookup("server_optimizer", p.get("server_optimizer", "sgd"))
        p["server_optimizer"] = opt(learning_rate=p.pop("server_learning_rate"))
    if "learn_hyperparams" in p:
        p["hypergradients"] = Hypergradients(p.pop("learn_hyperparams"))
    if cls is not CentralizedMF:
        client = {CLIENT[k]: p.pop(k) for k in list(p) if k in CLIENT}
        p["client_update"] = ClientUpdate(**client)
    rec = {RECON[k]: p.pop(k) for k in list(p) if k in RECON}
    if cls is FedReconMF:  # the paper's protocol: its server step, every round ("auto" is not)
        p.setdefault("server_optimizer", "sgd")
        p.setdefault("early_stopping", None)
    if cls is FedReconMF or (rec and cls is not CentralizedMF):
        p["reconstruction"] = lookup("reconstruction", p.get("reconstruction", "als"))(**rec)
    return cls(**p)


def compile_path(cls, params) -> str:
    """The fedcf.warmup path whose kernels a row's model uses."""
    if cls is CentralizedMF:
        return "centralized"
    if cls is FedAvgMF:
        return "fedavg"
    if params.get("learn_hyperparams"):
        return "hypergradient"
    if params.get("reconstruction") == "als":
        return "fedrecon-als"
    if (params.get("split") == "none" or params.get("joint")
            or params.get("server_optimizer", "sgd") != "sgd"):
        return "fedrecon-variants"
    return "fedrecon-sgd"


def load_dataset(name: str, seed: int):
    if name in VARIANTS:
        return load_movielens(name)
    if name == "synthetic":
        return make_synthetic_ratings(943, 1682, 100_000, random_state=seed)
    if os.path.exists(name):
        return load_ratings_file(name)
    raise SystemExit(f"--dataset must be one of {VARIANTS}, 'synthetic' or an existing ratings "
                     f"file (u.data, ratings.dat, ratings.csv, .inter), got {name!r}")


def row(name, protocol, result, seconds, **extra):
    out = {"name": name, "protocol": protocol, "rmse": result["rmse"], "mae": result["mae"],
           "accuracy": result["accuracy"], "seconds": seconds, "n_users": result.get("n_users"),
           "n_ratings": result.get("n_ratings")}
    if "bootstrap" in result:
        bs = result["bootstrap"]
        out.update(rmse_boot_mean=bs["rmse_mean"], rmse_boot_std=bs["rmse_std"],
                   accuracy_boot_mean=bs["accuracy_mean"], accuracy_boot_std=bs["accuracy_std"])
    out.update(extra)
    return out


def paper_rows(inter, args, background=None):
    seed = args.seed
    fed_common = dict(n_factors=args.factors, n_rounds=args.rounds,
                      clients_per_round=args.clients, random_state=seed)
    central = {**CENTRAL, "n_factors": args.factors, "random_state": seed}
    if args.quick:
        central["n_epochs"] = 3
    tr_t, _va_t, te_t = per_user_time_split(inter, (0.8, 0.1, 0.1))
    tr_u, _va_u, te_u = user_split(inter, (0.8, 0.1, 0.1), random_state=seed)
    ev = dict(n_repeats=args.bootstrap, random_state=seed)
    jobs = [
        ("centralized + StandardEval", "standard", CentralizedMF, central, "standard"),
        ("centralized + StandardEval (unseen)", "recon", CentralizedMF, central, "random"),
        ("centralized + ReconEval", "recon", CentralizedMF, central, "recon"),
        ("FedAvg + StandardEval", "standard", FedAvgMF, {**fed_common}, "standard"),
        ("FedAvg + ReconEval", "recon", FedAvgMF, {**fed_common}, "recon"),
        ("FedRecon (paper config, SGD reconstruction)", "recon", FedReconMF,
         {**fed_common, **PAPER}, "recon"),
        ("FedRecon (ALS reconstruction, biases)", "recon", FedReconMF, {**fed_common, **OURS},
         "recon"),
        ("FedRecon (learned server lr)", "recon", FedReconMF,
         {**fed_common, **OURS, "learn_hyperparams": ["server_learning_rate"]}, "recon"),
        ("FedRecon (ALS) + StandardEval", "standard", FedReconMF, {**fed_common, **OURS},
         "standard"),
        ("FedRecon (no split)", "recon", FedReconMF, {**fed_common, **PAPER, "split": "none"},
         "recon"),
        # joint steps on user and item rows diverge at the paper's client lr 0.5 (measured): 0.1
        ("FedRecon (joint training, client lr 0.1)", "recon", FedReconMF,
         {**fed_common, **PAPER, "joint": True, "learning_rate": 0.1}, "recon"),
        ("FedRecon (Adagrad server)", "recon", FedReconMF,
         {**fed_common, **PAPER, "server_optimizer": "adagrad", "server_learning_rate": 0.5},
         "recon"),
        ("FedRecon (Adam server)", "recon", FedReconMF,
         {**fed_common, **PAPER, "server_optimizer": "adam", "server_learning_rate": 0.01},
         "recon"),
        ("FedRecon (Yogi server)", "recon", FedReconMF,
         {**fed_common, **PAPER, "server_optimizer": "yogi", "server_learning_rate": 0.01},
         "recon"),
    ]
    train_of = {"standard": tr_t, "recon": tr_u}
    if args.tune:
        best, grid_rows, train_of["tuned"] = tune_paper_config(tr_u, _va_u, fed_common, args)
        jobs.insert(6, ("FedRecon (paper config, lrs tuned on validation users)", "tuned",
                        FedReconMF, {**fed_common, **PAPER, **best}, "recon"))
    rows, fitted = [], {}
    for name, split, cls, params, how in tqdm(jobs, desc="rows", disable=args.no_progress):
        key = (cls.__name__, split, json.dumps(params, sort_keys=True))
        if background is not None:
            waited = background.wait(compile_path(cls, params))
            if not rows:
                args.first_row_wait = waited
        t0 = time.perf_counter()
        if key not in fitted:
            fitted[key] = estimator(cls, params).fit(train_of[split])
        model = fitted[key]
        if how == "standard":
            res = standard_eval(model, te_t, **ev)
        elif how == "recon":
            res = recon_eval(model, te_u, **ev)
        else:
            res = random_embedding_eval(model, te_u, **ev)
        rows.append(row(name, "paper-" + ("recon" if split == "tuned" else split), res,
                        time.perf_counter() - t0, model=cls.__name__, params=params,
                        n_train_users=train_of[split].n_users,
                        bootstrap_repeats=args.bootstrap))
        if len(rows) == 1:
            args.first_row_done = time.perf_counter() - args.t_start
    if args.tune:
        rows.extend(grid_rows)
    return rows


PAPER_GRID = {"server_optimizer__learning_rate": [0.1, 0.5, 1.0],
              "reconstruction__learning_rate": [0.1, 0.5],
              "client_update__learning_rate": [0.1, 0.5]}
GRID_NAMES = {"server_optimizer__learning_rate": "server_learning_rate",  # as rows record them
              "reconstruction__learning_rate": "recon_learning_rate",
              "client_update__learning_rate": "learning_rate"}


SHORT = {"server_learning_rate": "eta_s", "recon_learning_rate": "eta_r", "learning_rate": "eta_u"}


def tune_paper_config(train, val, fed_common, args):
    """The paper's App. C.1 grid for FedRecon as one GridSearchCV call: held-out validation users
    (UserShuffleSplit over the train + validation users, the validation share of the 80/10
    split) scored by ReconEval; diverged settings score NaN and are never selected. Returns the
    selected values, the grid's rows and the grid's training users (as many as ``train``), on
    which the tuned row is fitted: the very fit that was validated."""
    X = pd.concat([train.to_dataframe(), val.to_dataframe()], ignore_index=True)
    cv = UserShuffleSplit(n_splits=1, test_size=val.n_users / (train.n_users + val.n_users),
                          random_state=args.seed)
    scoring = {m: recon_scorer(m, random_state=args.seed) for m in ("rmse", "mae", "accuracy")}
    search = GridSearchCV(estimator(FedReconMF, {**fed_common, **PAPER}), PAPER_GRID, cv=cv,
                          scoring=scoring, refit=False, error_score=np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitFailedWarning)  # diverged settings: NaN, reported
        warnings.filterwarnings("ignore", "One or more of the test scores are non-finite")
        search.fit(X.drop(columns="rating"), X["rating"])
    res = search.cv_results_
    named = [{GRID_NAMES.get(p, p): v for p, v in lrs.items()} for lrs in res["params"]]
    best = named[int(np.nanargmax(res["mean_test_rmse"]))]
    grid_rows = []
    for k, lrs in enumerate(named):
        val_res = {"rmse": -res["mean_test_rmse"][k], "mae": -res["mean_test_mae"][k],
                   "accuracy": res["mean_test_accuracy"][k]}
        name = "grid " + " ".join(f"{short}={lrs[p]}" for p, short in SHORT.items())
        grid_rows.append(row(name, "paper-recon-val", val_res,
                             float(res["mean_fit_time"][k] + res["mean_score_time"][k]),
                             params=lrs, selected=lrs == best))
    print(f"selected on validation users: {best} (validation RMSE "
          f"{-np.nanmax(res['mean_test_rmse']):.4f})")
    train_idx, _ = next(cv.split(X))
    return best, grid_rows, Interactions.coerce(X.iloc[train_idx])


SWEEPS = {
    "recon-steps": ("recon_steps", [0, 1, 2, 5, 10, 50]),
    "update-steps": ("update_steps", [1, 2, 5, 10, 50]),
    "server-optimizer": ("server_optimizer", ["sgd", "momentum", "adagrad", "adam", "yogi"]),
}
SERVER_LR = {"sgd": 1.0, "momentum": 0.1, "adagrad": 0.5, "adam": 0.01, "yogi": 0.01}


def sweep_rows(inter, args):
    """Figure 3 (vary k_r or k_u) and Figure 4 (loss per round per server optimizer)."""
    param, values = SWEEPS[args.sweep]
    tr_u, _va, te_u = user_split(inter, (0.8, 0.1, 0.1), random_state=args.seed)
    rows = []
    for v in tqdm(values, desc=args.sweep, disable=args.no_progress):
        params = dict(PAPER, n_factors=args.factors, n_rounds=args.rounds,
                      clients_per_round=args.clients, random_state=args.seed)
        params[param] = v
        if param == "server_optimizer":
            params["server_learning_rate"] = SERVER_LR[v]
        t0 = time.perf_counter()
        model = estimator(FedReconMF, params).fit(tr_u)
        res = recon_eval(model, te_u, n_repeats=args.bootstrap, random_state=args.seed)
        rows.append(row(f"FedRecon {param}={v}", "paper-recon", res, time.perf_counter() - t0,
                        sweep=param, value=v, params=params,
                        loss_curve=[h["loss"] for h in model.history_]))
    return rows


def plot_sweep(rows, args):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("--sweep plots need matplotlib: pip install matplotlib "
                         "(or pip install 'fedcf[bench]')") from exc
    os.makedirs(args.plot_dir, exist_ok=True)
    param = rows[0]["sweep"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if param == "server_optimizer":
        for r in rows:
            ax.plot(np.arange(1, len(r["loss_curve"]) + 1), r["loss_curve"],
                    label=f"{r['value']} (lr {SERVER_LR[r['value']]})", lw=1)
        ax.set_xlabel("round")
        ax.set_yscale("log")
        ax.set_ylabel("client query MSE before the update (log)")
        ax.set_title(f"FedRecon on {args.dataset}: loss per round by server optimizer")
        ax.legend()
    else:
        xs = [r["value"] for r in rows]
        acc = [r["accuracy"] for r in rows]
        err = [r.get("accuracy_boot_std", 0.0) for r in rows]
        ax.errorbar(range(len(xs)), acc, yerr=err, marker="o", capsize=3)
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_xlabel({"recon_steps": "reconstruction steps k_r",
                       "update_steps": "client update steps k_u"}[param])
        ax.set_ylabel("ReconEval accuracy (± bootstrap std)")
        ax.set_title(f"FedRecon on {args.dataset}, {args.rounds} rounds")
    fig.tight_layout()
    path = os.path.join(args.plot_dir, f"sweep_{args.sweep}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def centralized_rows(inter, args):
    if args.protocol == "random":
        train, test = random_split(inter, (0.9, 0.1), random_state=args.seed)
    else:
        train, _val, test = per_user_time_split(inter, (0.8, 0.1, 0.1))
    configs = [
        ("centralized ALS (biased)", CENTRAL),
        ("centralized SGD (biased)", dict(solver="sgd", regularization=0.1, learning_rate=0.007,
                                          n_epochs=60)),
        ("centralized ALS (no biases)", {**CENTRAL, "biases": False}),
    ]
    if args.quick:
        configs = [(n, {**c, "n_epochs": min(c["n_epochs"], 3)}) for n, c in configs]
    rows = []
    test_df = test.to_dataframe()
    for name, cfg in tqdm(configs, desc="models", disable=args.no_progress):
        t0 = time.perf_counter()
        model = CentralizedMF(n_factors=args.factors, random_state=args.seed, **cfg).fit(train)
        pred = model.predict(test_df)
        m = rating_metrics(test_df["rating"].to_numpy(), pred, model.rating_scale_)
        m.update(n_users=test.n_users, n_ratings=len(test_df))
        rows.append(row(name, args.protocol, m, time.perf_counter() - t0, params=cfg))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="100k",
                    help=f"one of {VARIANTS}, 'synthetic', or a ratings file path")
    ap.add_argument("--protocol", choices=("paper", "random", "time"), default="paper")
    ap.add_argument("--factors", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=500,
                    help="federated rounds (paper: 500 on ML-1M; kept at 500 on ML-100K, where "
                         "each training user is then visited ~66 times instead of ~10)")
    ap.add_argument("--clients", type=int, default=100, help="clients per round")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap repeats (50 users each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", choices=sorted(SWEEPS),
                    help="instead of the table: vary k_r or k_u (Figure 3) or the server "
                         "optimizer (Figure 4, loss per round) and save a PNG plot")
    ap.add_argument("--plot-dir", default="figures", help="where --sweep writes its PNG")
    ap.add_argument("--tune", action="store_true",
                    help="also run the paper's learning-rate grid (App. C.1) for the paper-config "
                         "FedRecon, select on validation users, report the choice on test users")
    ap.add_argument("--quick", action="store_true", help="CI-sized: 20 rounds, 3 epochs")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--no-background-compile", action="store_true",
                    help="do not compile the federated rows' kernels in a worker process while "
                         "the first rows run (it only matters when the Numba cache is empty)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 20)
        args.bootstrap = min(args.bootstrap, 20)

    t_start = args.t_start = time.perf_counter()
    paper = args.protocol == "paper" and not args.sweep
    background = (BackgroundCompile(BACKGROUND) if paper and not args.no_background_compile
                  else None)
    args.first_row_done, args.first_row_wait = None, 0.0
    try:
        with CompileClock() as clock:
            inter = load_dataset(args.dataset, args.seed)
            if args.sweep:
                rows = sweep_rows(inter, args)
                plot_sweep(rows, args)
            elif paper:
                rows = paper_rows(inter, args, background)
            else:
                rows = centralized_rows(inter, args)
    finally:
        if background is not None:
            background.close()

    print(f"\nDataset {args.dataset}: {inter!r}; protocol={args.protocol}, K={args.factors}, "
          f"seed={args.seed}" + (f", {args.rounds} rounds x {args.clients} clients"
                                 if args.protocol == "paper" else ""))
    print(f"{'row':<46} {'RMSE':>7} {'± boot':>7} {'acc':>7} {'± boot':>7} {'seconds':>8}")
    for r in rows:
        print(f"{r['name']:<46} {r['rmse']:7.4f} {r.get('rmse_boot_std', float('nan')):7.4f} "
              f"{r['accuracy']:7.4f} {r.get('accuracy_boot_std', float('nan')):7.4f} "
              f"{r['seconds']:8.2f}")
    compiling = {"compile_seconds": clock.seconds, "first_row_done_seconds": args.first_row_done,
                 "first_row_wait_seconds": args.first_row_wait,
                 "background_compile": background is not None,
                 "background_wait_seconds": background.waited if background else 0.0}
    print(f"total {time.perf_counter() - t_start:.1f} s; compiling kernels in this process "
          f"{clock.seconds:.1f} s" + (f", waiting for the background compile "
                                      f"{background.waited:.1f} s" if background else ""))
    if args.json:
        meta = {**run_meta("movielens_benchmark.py", argv),
                "total_seconds": time.perf_counter() - t_start, "dataset": repr(inter),
                **compiling}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "movielens_benchmark.py")
