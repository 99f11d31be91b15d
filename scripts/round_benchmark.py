#!/usr/bin/env python
"""The plain FedRecon round on MovieLens-100K at the paper's settings, against its roofline,
in one run.

The round: ``FedReconMF`` as the main job's paper row runs it (plain p·q model, SGD
reconstruction and update of at most 50 steps of 5 ratings, one epoch each, a random half as
support, server SGD), 100 clients per round, K = 50, on every core, kernels warm.

- **marginal**: what one more round costs, (fit of R₂ rounds − fit of R₁ rounds) / (R₂ − R₁),
  each the minimum over repeats that alternate the two lengths (a slow spell of this shared
  machine hits both); what a fit does once (checking the data, setting up) cancels.
- **phases**: the rounds' own timers, median over the R₂ fit's rounds: the clients' work (the
  client kernel), the reduction (the sums per item, the finite check), the server step, and the
  rest of the round (its Python).
- **roofline**: the round's arithmetic at the machine's float64 GEMM rate on every thread
  (the best of the timings taken in turn with the fits). The arithmetic is counted from the
  population, as the expectation over a uniformly sampled cohort: per visited support rating a
  dot product and a gradient (4K flops), per query rating its loss before the update (2K), per
  visited query rating a dot product, the row's gradient and its step (6K), per sent row its
  delta, its share of the sums and of the server step (5K), and per step the update of the
  user's factors (3K). Memory does not bound the round: what it reads (the item matrix and the
  ratings, ``working_set_bytes``) fits in this machine's caches.

    python scripts/round_benchmark.py --json eval/results/round.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

from fedcf import FedReconMF
from fedcf._kernels.clients import query_sizes
from fedcf._kernels.layout import SPLIT_RANDOM
from fedcf.datasets import load_movielens
from fedcf.provenance import report_result, run_meta

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the main job's settings beside it
from movielens_benchmark import PAPER, estimator  # noqa: E402

K, CLIENTS = 50, 100


def fit_seconds(inter, rounds: int) -> tuple[float, FedReconMF]:
    model = estimator(FedReconMF, {**PAPER, "n_factors": K, "n_rounds": rounds,
                                   "clients_per_round": CLIENTS, "random_state": 0})
    t0 = time.perf_counter()
    model.fit(inter)
    return time.perf_counter() - t0, model


def round_flops(inter) -> float:
    """Expected flops of one round (module docstring), from the users' sizes."""
    n = np.diff(inter.indptr).astype(np.float64)
    batch, steps = PAPER["batch_size"], PAPER["recon_steps"]
    n_q = query_sizes(np.diff(inter.indptr), SPLIT_RANDOM, 0.5).astype(np.float64)  # the kernel's split
    n_s = n - n_q
    v_r, v_u = np.minimum(n_s, steps * batch), np.minimum(n_q, PAPER["update_steps"] * batch)
    n_steps = np.ceil(v_r / batch) + np.ceil(v_u / batch)
    flops = K * (4 * v_r + 2 * n_q + 6 * v_u + 5 * n_q + 3 * n_steps)
    return float(CLIENTS * flops.mean())


def gemm_rate(n: int = 1024, calls: int = 3) -> float:
    """float64 GEMM flops per second on every thread (the best of ``calls`` timings)."""
    A = np.random.default_rng(0).random((n, n))
    best = np.inf
    for _ in range(calls):
        t0 = time.perf_counter()
        A @ A
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def phases(model) -> dict:
    h = model.history_
    out = {p: statistics.median(r[p + "_seconds"] for r in h) for p in ("work", "reduce", "server")}
    out["round"] = statistics.median(r["seconds"] for r in h)
    out["python"] = out["round"] - out["work"] - out["reduce"] - out["server"]
    return out


def measure(inter, r1: int, r2: int, repeats: int) -> dict:
    fit_seconds(inter, 5)  # warm-up: loads the kernels
    short, long, rates, model = [], [], [], None
    for _ in range(repeats):
        short.append(fit_seconds(inter, r1)[0])
        seconds, model = fit_seconds(inter, r2)
        long.append(seconds)
        rates.append(gemm_rate())
    flops, peak = round_flops(inter), max(rates)
    marginal, bound = (min(long) - min(short)) / (r2 - r1), flops / peak
    return {"dataset": "ml-100k", "clients": CLIENTS, "K": K, "threads": numba.get_num_threads(),
            "rounds": [r1, r2], "fit_seconds": {str(r1): short, str(r2): long},
            "marginal_seconds": marginal, "phases_median": phases(model),
            "round_flops": flops, "gemm_flops_per_second": peak,
            "working_set_bytes": int(inter.items.nbytes + inter.values.nbytes +
                                     inter.indptr.nbytes + inter.n_items * (K + 1) * 4),
            "roofline_seconds": bound, "ratio_to_roofline": marginal / bound,
            "target_seconds": 0.6e-3}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, nargs=2, default=[100, 600], metavar=("R1", "R2"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if not 0 < args.rounds[0] < args.rounds[1]:
        ap.error("--rounds R1 R2 needs 0 < R1 < R2")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    out = measure(load_movielens("100k"), *args.rounds, args.repeats)
    out["meta"] = run_meta("round_benchmark.py", argv)
    ph = out["phases_median"]
    print(f"marginal round {out['marginal_seconds'] * 1e3:.3f} ms (target 0.6 ms); roofline "
          f"{out['roofline_seconds'] * 1e3:.3f} ms ({out['round_flops'] / 1e6:.1f} MFLOP at "
          f"{out['gemm_flops_per_second'] / 1e9:.0f} GFLOP/s), ratio "
          f"{out['ratio_to_roofline']:.1f}; phases (ms): " +
          ", ".join(f"{k} {v * 1e3:.3f}" for k, v in ph.items()))
    return report_result(out, args.json)


if __name__ == "__main__":
    main()
