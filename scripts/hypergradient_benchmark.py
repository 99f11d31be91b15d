#!/usr/bin/env python
"""Learned server hyperparameters and client weighting by federated hypergradient descent
(Rush, Charles, Garrett et al., "Federated Automatic Differentiation", Figures 6-8 on our tasks).

1. ``trials``: FedRecon (server SGD with momentum) from random starting values — server learning
   rate log-uniform over [1e-2, 10], momentum uniform over [0, 0.95) — with those values fixed,
   and with both learned from the same start. Per trial: ReconEval RMSE / accuracy on the test
   users, divergence; the bootstrap estimate of the best RMSE found with n trials (Figure 6); the
   learned trajectories of the best trial (Figure 7).
2. ``weighting``: uniform (α = 0) vs example (α = 1) client weighting vs α learned from 0 and from
   1 (from the training cohort's derivatives, as the paper's Figure 8 does, and from held-out users'),
   on a population with very unequal client sizes and on the dataset: query loss per round
   (Figure 8) and ReconEval RMSE.

    python scripts/hypergradient_benchmark.py --json eval/results/hyper.json --plot-dir figures
    python scripts/hypergradient_benchmark.py --sections weighting --json eval/results/hyper_weighting.json
    python scripts/hypergradient_benchmark.py --sections stability --json eval/results/hyper_stability.json
    python scripts/hypergradient_benchmark.py --sections seeds --seeds 5 --trials 10 \\
        --json eval/results/hyper_seeds.json
    python scripts/hypergradient_benchmark.py --dataset synthetic-1m --sections seeds --seeds 5 \\
        --trials 4 --json eval/results/hyper_1m_seeds.json

3. ``stability``: the paper's stability claim — random starts over a server learning-rate range
   wide enough that fixed settings diverge, fixed against learned by Adam and by SGD on the raw
   coordinates (log η, logit β), counting the runs that diverge.
4. ``seeds``: section 1's random starts repeated over ``--seeds`` seeds (each a new split of the
   users, new starts and new training), so every comparison has an interval across seeds.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import VARIANTS, load_movielens, make_synthetic_ratings
from fedcf.eval import recon_eval, user_split
from fedcf.federated import Hypergradients, Momentum
from fedcf.provenance import run_meta, save_result

LEARN = ("server_learning_rate", "momentum")
LR_RANGE = (1e-2, 10.0)  # starting server learning rate: log-uniform over this range
MOMENTUM_RANGE = (0.0, 0.95)  # starting momentum: uniform over [low, high)
# learned: derivatives from held-out validation users (FedReconMF's default holdout, 0.1);
# own cohort: from the round's training clients (holdout = 0, the paper's parallel form)
MODES = {"fixed": {}, "learned": {"hypergradients": Hypergradients(LEARN)},
         "learned (own cohort)": {"hypergradients": Hypergradients(LEARN, holdout=0.0)}}
# the stability study (the paper's "23 of 50 fixed settings diverge"): starting rates up to
# where fixed ones diverge, learned by Adam (the default) and by SGD on log η / logit β (the
# paper's Section 5 hyper-optimizer) at two hyper learning rates
WIDE_LR_RANGE = (1e-2, 1e3)
STABILITY_MODES = {"fixed": {}, "learned (Adam, 0.01)": {"hypergradients": Hypergradients(LEARN)},
                   **{f"learned (SGD, {lr:g})": {"hypergradients": Hypergradients(
                       LEARN, optimizer="sgd", learning_rate=lr)} for lr in (0.01, 0.1)}}


def load(name: str, seed: int):
    if name in VARIANTS:
        return load_movielens(name)
    if name == "synthetic-1m":  # ML-1M's size: 6040 users, 3706 items, ~1M ratings
        return make_synthetic_ratings(6040, 3706, 1_000_209, random_state=seed)
    if name == "synthetic":
        return make_synthetic_ratings(943, 1682, 100_000, random_state=seed)
    raise SystemExit(f"--dataset must be one of {VARIANTS}, 'synthetic' or 'synthetic-1m'")


def fit_eval(params, train, test, seed):
    """(row fields, fitted model or None): RMSE/accuracy on unseen users, or diverged."""
    t0 = time.perf_counter()
    try:
        model = FedReconMF(**{"early_stopping": None, **params}).fit(train)  # every round
        res = recon_eval(model, test, n_repeats=2, random_state=seed)
    except FloatingPointError:
        return {"rmse": float("inf"), "accuracy": 0.0, "diverged": True,
                "seconds": time.perf_counter() - t0}, None
    return {"rmse": res["rmse"], "accuracy": res["accuracy"], "diverged": False,
            "seconds": time.perf_counter() - t0}, model


def trial_rows(train, test, args, section="trials", modes=MODES, lr_range=LR_RANGE, seed=None):
    """Random starts, each fixed and learned (``LEARN``) in every one of ``modes``; ``seed``
    (default ``--seed``) draws the starts and seeds the training."""
    seed = args.seed if seed is None else seed
    rows, curves = [], {}
    for i in range(args.trials):
        rng = np.random.default_rng([seed, i])
        lr = float(np.exp(rng.uniform(np.log(lr_range[0]), np.log(lr_range[1]))))
        beta = float(rng.uniform(*MOMENTUM_RANGE))
        base = dict(n_rounds=args.rounds, server_optimizer=Momentum(lr, momentum=beta),
                    random_state=seed)
        for mode, extra in modes.items():
            params = {**base, **extra}
            res, model = fit_eval(params, train, test, seed)
            rows.append({"section": section, "seed": seed, "trial": i, "mode": mode, "lr0": lr,
                         "momentum0": beta, **res})
            if model is not None and mode != "fixed":
                curves[i] = {k: [h[k] for h in model.history_][::5] for k in LEARN}
                rows[-1].update({f"{k}_final": v for k, v in model.learned_hyperparams_.items()})
            print(f"seed {seed} trial {i:2d} {mode:20s} lr0 {lr:7.3f} β0 {beta:.2f}: RMSE {res['rmse']:.4f}"
                  f"{' (diverged)' if res['diverged'] else ''}", flush=True)
    best = min((r for r in rows if r["mode"] == "learned" and not r["diverged"]),
               key=lambda r: r["rmse"], default=None)
    if best is not None and section == "trials":
        best["trajectory"] = curves[best["trial"]]
    return rows


def best_of_n(rmses: np.ndarray, n_max: int, n_boot: int = 2000, seed: int = 0) -> list:
    """Bootstrap mean of the best (lowest) RMSE among n trials drawn with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(rmses), size=(n_boot, n_max))
    best = np.minimum.accumulate(rmses[draws], axis=1)
    return [float(np.mean(best[:, n - 1])) for n in range(1, n_max + 1)]


def weighting_rows(name, train, test, args):
    """Uniform, example and learned client weighting on one population."""
    rows = []
    own = {"hypergradients": Hypergradients(["weight_exponent"], holdout=0.0)}
    runs = [("uniform", "uniform", {}), ("examples", "num_examples", {}),
            ("learned from 0", "uniform", own), ("learned from 1", "num_examples", own),
            ("learned from 1 (validation users)", "num_examples",
             {"hypergradients": Hypergradients(["weight_exponent"])})]
    for label, weighting, extra in runs:
        learn = extra.get("hypergradients")
        params = dict(n_rounds=args.rounds, client_weighting=weighting, random_state=args.seed,
                      **extra)
        res, model = fit_eval(params, train, test, args.seed)
        loss = [h["loss"] for h in model.history_] if model is not None else []
        alpha = [h["weight_exponent"] for h in model.history_][::5] if learn and model else None
        rows.append({"section": "weighting", "population": name, "name": label, **res,
                     "loss_curve": loss, "alpha_curve": alpha,
                     "alpha_final": alpha[-1] if alpha else None})
        print(f"{name}: {label:34s} RMSE {res['rmse']:.4f}", flush=True)
    return rows


def heterogeneous_population(seed: int):
    """Very unequal client sizes (log-normal, σ = 2) and strong personal preferences."""
    return make_synthetic_ratings(2000, 800, 100_000, activity_sigma=2.0, factor_scale=1.5,
                                  bias_scale=0.5, noise=0.3, random_state=seed)


def plot(rows, n_max, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.plot_dir, exist_ok=True)
    trials = [r for r in rows if r["section"] == "trials"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for mode in MODES:
        rm = np.array([r["rmse"] for r in trials if r["mode"] == mode])
        axes[0].plot(range(1, n_max + 1), best_of_n(rm, n_max), label=mode)
    axes[0].set(xlabel="trials", ylabel="best ReconEval RMSE (bootstrap mean)",
                title="best of n random starts", xscale="log")
    axes[0].legend()
    best = next((r for r in trials if "trajectory" in r), None)
    if best is not None:
        x = np.arange(len(best["trajectory"]["server_learning_rate"])) * 5
        axes[1].plot(x, best["trajectory"]["server_learning_rate"], label="server lr")
        axes[1].plot(x, best["trajectory"]["momentum"], label="momentum")
        axes[1].set(xlabel="round", title=f"learned values, best trial ({best['trial']})",
                    yscale="log")
        axes[1].legend()
    for r in (r for r in rows if r["section"] == "weighting" and r["population"] == "hetero"):
        if r["loss_curve"]:
            k = 10
            sm = np.convolve(r["loss_curve"], np.ones(k) / k, mode="valid")
            axes[2].plot(np.arange(len(sm)) + k, sm, label=r["name"])
    axes[2].set(xlabel="round", ylabel="client query loss (moving mean of 10)",
                title="client weighting, heterogeneous population", yscale="log")
    axes[2].legend()
    fig.tight_layout()
    path = os.path.join(args.plot_dir, "hypergradients.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="100k")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=5,
                    help="the seeds section: --seed and the next ones, each a new split, "
                         "new starts and new training")
    ap.add_argument("--sections", default="trials,weighting",
                    help="comma-separated: trials (random starts), weighting, stability "
                         "(random starts over a range wide enough to diverge), seeds (the "
                         "random starts repeated over --seeds splits)")
    ap.add_argument("--skip-weighting", action="store_true", help="= --sections trials")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot-dir", help="write hypergradients.png here")
    args = ap.parse_args(argv)
    meta = run_meta("hypergradient_benchmark.py", argv)
    t0 = time.perf_counter()
    sections = {"trials"} if args.skip_weighting else set(args.sections.split(","))
    if unknown := sections - {"trials", "weighting", "stability", "seeds"}:
        ap.error(f"--sections: {sorted(unknown)} not among trials, weighting, stability, seeds")
    if "seeds" in sections and args.seeds < 2:
        ap.error(f"--seeds must be at least 2 for the seeds section, got {args.seeds}")
    if args.trials < 1:
        ap.error(f"--trials must be at least 1, got {args.trials}")
    inter = load(args.dataset, args.seed)
    train, _, test = user_split(inter, (0.8, 0.1, 0.1), random_state=args.seed)
    rows = trial_rows(train, test, args) if "trials" in sections else []
    if "seeds" in sections:
        for seed in range(args.seed, args.seed + args.seeds):
            s_train, _, s_test = user_split(load(args.dataset, seed), (0.8, 0.1, 0.1),
                                            random_state=seed)
            rows += trial_rows(s_train, s_test, args, "seeds", seed=seed)
    if "stability" in sections:
        rows += trial_rows(train, test, args, "stability", STABILITY_MODES, WIDE_LR_RANGE)
    if "weighting" in sections:
        h_train, _, h_test = user_split(heterogeneous_population(args.seed), (0.8, 0.1, 0.1),
                                        random_state=args.seed)
        rows += weighting_rows("hetero", h_train, h_test, args)
        rows += weighting_rows(args.dataset, train, test, args)
    n_max = args.trials
    summary = {mode: best_of_n(np.array([r["rmse"] for r in rows if r["section"] == "trials"
                                         and r["mode"] == mode]),
                               n_max) for mode in MODES} if "trials" in sections else {}
    meta.update(total_seconds=time.perf_counter() - t0, dataset=args.dataset, trials=args.trials,
                rounds=args.rounds, **({"seeds": args.seeds} if "seeds" in sections else {}))
    out = {"meta": meta, "rows": rows, "best_of_n": summary}
    if args.plot_dir and "trials" in sections:
        plot(rows, n_max, args)
    return save_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "hypergradient_benchmark.py")
