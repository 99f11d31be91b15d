#!/usr/bin/env python
"""Learned client weighting in the paper's own regime (Federated Automatic Differentiation, §6 and
Appendix B: Figures 8 and 13): FedAvg on the Synthetic(1, 1) logistic-regression task of Li et
al. (2020), where uniform weighting ends ahead of example weighting, and the weight exponent α of
w_i = n_i^α learned by federated hypergradient descent.

No matrix-factorization population we tried puts uniform weighting ahead (eval/HYPER.md §3), so
this script runs the paper's task instead: 100 clients whose sizes follow Li et al.'s shifted
log-normal, 50 sampled per round, local mini-batch SGD, server SGD at rate 1. The learned rows use
fedcf's hyper-optimizer (``HyperLearner``: Adam on α, α kept in its default range) on the
hypergradient the paper's Algorithm 2 forms from sums only: the cohort's loss gradients at the
broadcast model, dotted with the last step's tangent ∂x/∂α = η Σ w_i (ln n_i − L̄) u_i / Σ w_i
(L̄ the weighted mean of ln n_i, u_i a client's update), over the cohort's examples.

    python scripts/learned_weighting_benchmark.py --json eval/results/learned_weighting.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedcf.federated.algorithms.hyper import HyperLearner
from fedcf.federated.round.phases import RoundHyperparams
from fedcf.provenance import run_meta, save_result

DIM, CLASSES = 60, 10
MODES = {"uniform": (0.0, False), "example": (1.0, False),
         "learned from example": (1.0, True), "learned from uniform": (0.0, True)}


def make_clients(n_clients: int, seed: int, alpha=1.0, beta=1.0, test_share=0.2) -> list:
    """Synthetic(α, β) of Li et al. (2020): client k has a softmax model W_k, b_k ~ N(u_k, 1)
    with u_k ~ N(0, α), features x ~ N(v_k, Σ) with v_k ~ N(B_k, 1), B_k ~ N(0, β),
    Σ = diag(j^-1.2), labels argmax(W_k x + b_k), and ⌊lognormal(4, 2)⌋ + 50 examples.
    Returns [(X_train, y_train, X_test, y_test)] with a bias column appended to X."""
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, n_clients).astype(np.int64) + 50
    u, B = rng.normal(0, alpha, n_clients), rng.normal(0, beta, n_clients)
    sd = np.arange(1, DIM + 1) ** -0.6  # √ of Σ's diagonal
    clients = []
    for k in range(n_clients):
        W, b = rng.normal(u[k], 1, (DIM, CLASSES)), rng.normal(u[k], 1, CLASSES)
        X = rng.normal(B[k], 1, DIM) + rng.normal(0, 1, (sizes[k], DIM)) * sd
        y = np.argmax(X @ W + b, axis=1)
        X = np.hstack([X, np.ones((sizes[k], 1))])
        cut = max(1, int(round(sizes[k] * (1 - test_share))))
        clients.append((X[:cut], y[:cut], X[cut:], y[cut:]))
    return clients


def loss_and_grad(x: np.ndarray, X: np.ndarray, y: np.ndarray):
    """Summed softmax cross-entropy of the model x (DIM + 1, CLASSES) and its gradient."""
    z = X @ x
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-300).sum()
    p[np.arange(len(y)), y] -= 1.0
    return float(loss), X.T @ p


def local_update(x, X, y, lr, epochs, batch, rng):
    """u = x_local − x after ``epochs`` of mini-batch SGD (mean loss per batch)."""
    w = x.copy()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for s in range(0, len(y), batch):
            idx = order[s:s + batch]
            w -= lr * loss_and_grad(w, X[idx], y[idx])[1] / len(idx)
    return w - x


def weighted_step(updates, sizes, alpha):
    """The weighted mean update ū (w_i = n_i^α) and its derivative ∂ū/∂α."""
    logn = np.log(sizes)
    w = np.exp(alpha * logn)
    mean = np.tensordot(w, updates, 1) / w.sum()
    d = np.tensordot(w * (logn - w @ logn / w.sum()), updates, 1) / w.sum()
    return mean, d


def server_step(x, updates, sizes, alpha, eta):
    """x' = x + η ū(α) and the tangent ∂x'/∂α = η ∂ū/∂α the next round's hypergradient uses."""
    mean, d_alpha = weighted_step(updates, sizes, alpha)
    return x + eta * mean, eta * d_alpha


def hypergradient(x, data, tangent) -> float:
    """d/dα of the cohort's mean loss at x through the last step: Σ_i ∇L_i(x) · tangent over
    Σ_i n_i, two sums over the cohort ``data`` ([(X, y)])."""
    num = sum(float(np.sum(loss_and_grad(x, X, y)[1] * tangent)) for X, y in data)
    return num / sum(len(y) for _, y in data)


def evaluate(x, clients) -> dict:
    loss = n = correct = n_test = 0
    for Xtr, ytr, Xte, yte in clients:
        loss += loss_and_grad(x, Xtr, ytr)[0]
        n += len(ytr)
        correct += int((np.argmax(Xte @ x, axis=1) == yte).sum())
        n_test += len(yte)
    return {"train_loss": loss / n, "test_accuracy": correct / max(n_test, 1)}


def run(clients, start, learn, args, seed) -> list:
    """FedAvg for ``args.rounds`` rounds; records every ``args.every`` rounds."""
    rng = np.random.default_rng(10_000 + seed)  # the same cohorts and batches for every mode
    x = np.zeros((DIM + 1, CLASSES))
    hp = RoundHyperparams(args.server_lr, {}, weight_exponent=start)
    learner = HyperLearner.start(("weight_exponent",), hp, args.hyper_lr, "adam") if learn \
        else None
    tangent, sizes_all, records = None, np.array([len(c[1]) for c in clients], float), []
    for t in range(args.rounds + 1):
        alpha = learner.values()["weight_exponent"] if learner else start
        if t % args.every == 0 or t == args.rounds:
            records.append({"round": t, "alpha": alpha, **evaluate(x, clients)})
        if t == args.rounds:
            break
        cohort = rng.choice(len(clients), args.cohort, replace=False)
        if learner is not None and tangent is not None:  # Algorithm 2: sums over the cohort
            learner.update(np.array([hypergradient(x, [clients[i][:2] for i in cohort],
                                                   tangent)]))
            alpha = learner.values()["weight_exponent"]
        updates = np.stack([local_update(x, *clients[i][:2], args.client_lr, args.epochs,
                                         args.batch, rng) for i in cohort])
        x, tangent = server_step(x, updates, sizes_all[cohort], alpha, args.server_lr)
    return records


def check_args(ap, args) -> None:
    """Counts at least one (the cohort no larger than the population), step sizes positive."""
    for name in ("seeds", "clients", "cohort", "rounds", "every", "epochs", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.cohort > args.clients:
        ap.error(f"--cohort {args.cohort} is larger than --clients {args.clients}: a round "
                 "samples its cohort from the clients without replacement")
    for name in ("client_lr", "server_lr", "hyper_lr"):
        v = getattr(args, name)
        if not (v > 0 and np.isfinite(v)):
            ap.error(f"--{name.replace('_', '-')} must be a positive finite number, got {v}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--cohort", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--client-lr", type=float, default=0.01)
    ap.add_argument("--server-lr", type=float, default=1.0)
    ap.add_argument("--hyper-lr", type=float, default=0.01)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    check_args(ap, args)
    meta = run_meta("learned_weighting_benchmark.py", argv)
    t0, rows = time.perf_counter(), []
    for seed in range(args.seeds):
        clients = make_clients(args.clients, seed)
        for mode, (start, learn) in MODES.items():
            for r in run(clients, start, learn, args, seed):
                rows.append({"seed": seed, "mode": mode, **r})
            last = rows[-1]
            print(f"seed {seed} {mode:22s} loss {last['train_loss']:.4f} "
                  f"acc {last['test_accuracy']:.4f} α {last['alpha']:.3f}", flush=True)
    meta.update(total_seconds=time.perf_counter() - t0,
                settings={k: v for k, v in vars(args).items() if k != "json"})
    out = {"meta": meta, "rows": rows}
    return save_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "learned_weighting_benchmark.py")
