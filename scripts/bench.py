#!/usr/bin/env python
"""Side-by-side performance benchmark: fedcf kernels against peers measured in the same run.

Sections (``--sections``, default all):
  foldin   batched reconstruction of every user (K=50) vs implicit's batched recalculate_user
  als      one explicit ALS epoch vs one iteration of implicit's ALS (Cholesky and CG)
  sgd      one biased-MF SGD epoch vs cornac's Cython MF, seeded (1 thread) and all cores
  fedrecon paper-scale FedRecon (500 rounds x 100 clients) with SGD and ALS reconstruction,
           1 vs 2 threads, and the same rounds as a plain per-client NumPy loop and (ALS) as
           a round written as vectorized NumPy
  scaling  round time as clients per round and the catalog grow; peak memory
  dp       the dense noise step of user-level DP as the catalog grows, vs the sparse mean
  memory   peak RSS of the main job and of a fit on 10^6 users (fresh processes)
  ceiling  measured GEMM GFLOP/s and memory bandwidth; each kernel's share of the GEMM peak

Every timed row reports min and median of >= 3 repeats (the thread-scaling rows: >= 5, the
one- and two-thread runs alternated; the fold-in and its GEMM ceiling, and the SGD epoch and
seeded cornac, timed in turn in short blocks) after a warm-up call (the warm-up of
fedcf kernels, i.e. Numba compilation or cache load, is reported as a row of its own). Ratios are
``speedup = peer_seconds / fedcf_seconds`` (both min). Peers run with BLAS limited to one thread
inside their own threading, as implicit recommends.

Examples
--------
python scripts/bench.py --json bench.json
python scripts/bench.py --quick --sections foldin,sgd
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
import warnings

import numba
import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from fedcf import CentralizedMF, FedReconMF
from fedcf.datasets import load_movielens, make_synthetic_ratings
from fedcf.eval import random_split
from fedcf.federated import Selector, SGDReconstruction
from fedcf.kernels import gather_ratings, ridge_cfg, ridge_cg_rows, ridge_solve_rows, sgd_epoch, sgd_hp
from fedcf.kernels import reference as ref
from fedcf.provenance import run_meta, write_json
from fedcf.registry import lookup

K = 50
ROWS: list[dict] = []
# implicit warns about OpenBLAS threads when a model is built; its timed calls run under
# threadpool_limits(1, "blas") below, as it recommends
warnings.filterwarnings("ignore", message="OpenBLAS is configured", category=RuntimeWarning)


def paired(fns, repeats, block=1):
    """[(warm-up seconds, min, median)] of each of ``fns``, timed in turn: a warm-up call of each,
    then ``repeats`` rounds in which each function is called ``block`` times in a row. On a
    machine whose speed drifts within minutes, the functions compared in one ratio are then
    sampled over the same minutes; with block > 1, the later calls of a block run after calls of
    the same function (not in the wake of another's load, e.g. an all-core GEMM)."""
    warm = []
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
    ts = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                ts[k].append(time.perf_counter() - t0)
    return [(w, min(t), statistics.median(t)) for w, t in zip(warm, ts)]


def timed(fn, repeats):
    """(warm-up seconds, min, median) of fn()."""
    return paired([fn], repeats)[0]


def gemm_peak(quick):
    """A float32 GEMM on every thread (the compute ceiling): (the call, its flops)."""
    n = 512 if quick else 2048
    A = np.random.default_rng(0).random((n, n), dtype=np.float32)
    return (lambda: A @ A), 2.0 * n ** 3


def add(name, fedcf=None, peer=None, peer_name=None, flops=None, **extra):
    row = {"name": name, "fedcf_seconds": None, "fedcf_median": None, "peer": peer_name,
           "peer_seconds": None, "peer_median": None, "speedup": None,
           "threads": numba.get_num_threads(), **extra}
    if fedcf is not None:
        row["fedcf_seconds"], row["fedcf_median"] = fedcf[1], fedcf[2]
    if peer is not None:
        row["peer_seconds"], row["peer_median"] = peer[1], peer[2]
    if fedcf is not None and peer is not None:
        row["speedup"] = peer[1] / fedcf[1]
    if flops is not None and fedcf is not None:
        row["gflops"] = flops / fedcf[1] / 1e9
    ROWS.append(row)
    sp_ = f"{row['speedup']:6.2f}x" if row["speedup"] else "      "
    fs = f"{row['fedcf_seconds'] * 1e3:10.2f} ms" if fedcf is not None else " " * 13
    ps = f"{row['peer_seconds'] * 1e3:10.2f} ms" if peer is not None else " " * 13
    note = extra.get("note", "")
    print(f"{name:<46} {fs} {ps} {sp_}  {peer_name or '':<22} {note}", flush=True)
    return row


def datasets(args):
    out = {}
    if args.quick:
        out["synthetic-small"] = make_synthetic_ratings(300, 200, 6000, random_state=0)
        return out
    out["ml-100k"] = load_movielens("100k")
    out["synthetic-1m"] = make_synthetic_ratings(6040, 3706, 1_000_209, random_state=0)
    return out


def implicit_model(**kw):
    try:
        from implicit.cpu.als import AlternatingLeastSquares
    except ImportError:
        return None
    return AlternatingLeastSquares(factors=K, random_state=0, **kw)


def random_model(inter):
    """Seeded float32 factors (std 0.1) and zero biases for timing a kernel on ``inter``."""
    rng = np.random.default_rng(0)
    P = rng.normal(0, 0.1, (inter.n_users, K)).astype(np.float32)
    Q = rng.normal(0, 0.1, (inter.n_items, K)).astype(np.float32)
    return rng, P, np.zeros(inter.n_users, np.float32), Q, np.zeros(inter.n_items, np.float32)


def ridge_flops(counts, d=K + 1):
    """Floating-point operations of the exact ridge solves of rows with these entry counts, in the
    form ``ridge_solve_rows`` takes: n·d² + d³/3 (Gram, Cholesky) for n ≥ d, and n²·d + n³/3 + 2n·d
    for the n × n (dual) system of a row with n < d entries."""
    n = np.asarray(counts, np.float64)
    return float(np.sum(np.where(n < d, n * n * d + n ** 3 / 3 + 2 * n * d, n * d * d + d ** 3 / 3)))


# ---------------------------------------------------------------------- sections
def section_foldin(data, args):
    for dname, inter in data.items():
        rng = np.random.default_rng(0)
        Q = rng.normal(0, 0.1, (inter.n_items, K)).astype(np.float32)
        b = np.zeros(inter.n_items, np.float32)
        P = np.zeros((inter.n_users, K), np.float32)
        c = np.zeros(inter.n_users, np.float32)
        cfg = ridge_cfg(0.1, 1e-6, 3.5, True)
        gemm, gemm_flops = gemm_peak(args.quick)
        f, g = paired([lambda: ridge_solve_rows(inter.indptr, inter.items, inter.values, Q, b,
                                                cfg, P, c), gemm], max(args.repeats, 5), block=3)
        flops = ridge_flops(inter.counts())
        peer = None
        m = implicit_model(iterations=1)
        if m is not None:
            csr = sp.csr_matrix(inter.to_csr().astype(np.float32))
            with threadpool_limits(1, "blas"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.fit(csr, show_progress=False)
                m.item_factors = Q.copy()
                ids = np.arange(inter.n_users)
                peer = timed(lambda: m.recalculate_user(ids, csr), args.repeats)
        us = f[1] / inter.n_users * 1e6
        add(f"fold-in all users [{dname}]", f, peer, "implicit recalculate_user (Cholesky)",
            flops, note=f"{us:.1f} us/user fedcf" + (
                f", {peer[1] / inter.n_users * 1e6:.1f} us/user peer" if peer else "")
            + f"; GEMM share against a GEMM timed in turn with it (blocks of 3 calls), "
            f"{gemm_flops / g[1] / 1e9:.1f} GFLOP/s",
            us_per_user=us, gemm_fraction=(flops / f[1]) / (gemm_flops / g[1]))


def section_als(data, args):
    for dname, inter in data.items():
        rng, P, c, Q, b = random_model(inter)
        i_indptr, i_users, i_vals = inter.to_item_csr()
        cfg = ridge_cfg(0.1, 1e-6, float(inter.values.mean()), True)

        def epoch():
            ridge_solve_rows(inter.indptr, inter.items, inter.values, Q, b, cfg, P, c)
            ridge_solve_rows(i_indptr, i_users, i_vals, P, c, cfg, Q, b)

        f = timed(epoch, args.repeats)

        def cg_epoch(steps=3):  # warm-started CG, as implicit's default solver
            ridge_cg_rows(inter.indptr, inter.items, inter.values, Q, b, cfg, steps, P, c)
            ridge_cg_rows(i_indptr, i_users, i_vals, P, c, cfg, steps, Q, b)

        f_cg = timed(cg_epoch, args.repeats)
        flops = ridge_flops(inter.counts()) + ridge_flops(np.diff(i_indptr))
        for use_cg in (False, True):
            peer = None
            csr = sp.csr_matrix(inter.to_csr().astype(np.float32))
            if implicit_model() is not None:
                def fit(iters, use_cg=use_cg):
                    m = implicit_model(iterations=iters, use_cg=use_cg)
                    m.fit(csr, show_progress=False)

                with threadpool_limits(1, "blas"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    one = timed(lambda: fit(1), args.repeats)
                    three = timed(lambda: fit(3), args.repeats)
                # per iteration: difference of a 3- and a 1-iteration fit (drops setup costs)
                per = tuple(max((t3 - t1) / 2, 1e-9) for t1, t3 in zip(one, three))
                peer = per
            add(f"ALS epoch [{dname}]", f, peer,
                f"implicit ALS iteration ({'CG' if use_cg else 'Cholesky'})", flops)
            if use_cg:
                add(f"ALS epoch, CG 3 steps [{dname}]", f_cg, peer, "implicit ALS iteration (CG)",
                    note="als_solver='cg', cg_steps=3" + cg_accuracy(inter, args))


def cg_accuracy(inter, args) -> str:
    """Test RMSE of CentralizedMF (15 epochs, 90/10 random split) by CG steps vs Cholesky."""
    if args.quick:
        return ""
    train, test = random_split(inter, (0.9, 0.1), random_state=0)

    def err(**kw):
        m = CentralizedMF(K, n_epochs=15, random_state=0, **kw).fit(train)
        return float(np.sqrt(np.mean((m.predict(test) - test.values) ** 2)))

    steps = ", ".join(f"{s} steps {err(als_solver='cg', cg_steps=s):.4f}" for s in (1, 2, 3, 5))
    return f"; test RMSE: Cholesky {err():.4f}, CG {steps}"


def section_sgd(data, args):
    try:
        from cornac.data import Dataset
        from cornac.models import MF
    except ImportError:
        Dataset = None
    for dname, inter in data.items():
        rng, P, c, Q, b = random_model(inter)
        users = inter.user_index()
        order = rng.permutation(inter.nnz)
        cfg = np.array([0.005, 0.02, float(inter.values.mean()), 1.0])
        # each epoch gathers a fresh shuffle into reused buffers, as CentralizedMF does: the
        # gather is timed, drawing the permutation is not (cornac walks one fixed order)
        bufs = (np.empty_like(users), np.empty_like(inter.items), np.empty_like(inter.values))

        def epoch():
            gather_ratings(order, users, inter.items, inter.values, *bufs)
            return sgd_epoch(*bufs, (P, c), (Q, b), cfg)

        peer = None
        if Dataset is None:
            f = timed(epoch, args.repeats)
        else:
            uir = list(zip(users.tolist(), inter.items.tolist(), inter.values.tolist()))
            ds = Dataset.from_uir(uir, seed=0)

            def fit(iters, **kw):
                return lambda: MF(k=K, max_iter=iters, learning_rate=0.005, lambda_reg=0.02,
                                  use_bias=True, early_stop=False, verbose=False, **kw).fit(ds)

            def epoch_time(one, eleven):  # an epoch: 11 iterations minus 1 (setup cancels out)
                return tuple(max((t11 - t1) / 10, 1e-9) for t1, t11 in zip(one, eleven))

            # cornac forces one thread when seeded (the target's peer, timed in turn with
            # fedcf's epoch); unseeded it runs Hogwild on every core
            f, one, eleven = paired([epoch, fit(1, seed=0), fit(11, seed=0)], args.repeats,
                                    block=2)
            peer = epoch_time(one, eleven)
            add(f"SGD epoch, biased MF [{dname}]", f, epoch_time(*paired([fit(1), fit(11)],
                                                                         args.repeats)),
                "cornac MF, all cores (Hogwild, not reproducible)", 6.0 * inter.nnz * K)
        add(f"SGD epoch, biased MF [{dname}]", f, peer, "cornac MF, seeded (1 thread)",
            6.0 * inter.nnz * K)


def fedrecon_fit(inter, recon, rounds, clients, threads):
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        m = FedReconMF(server_optimizer="sgd", early_stopping=None,
                       n_factors=K, n_rounds=rounds, clients_per_round=clients,
                       reconstruction=SGDReconstruction(learning_rate=0.5)
                       if recon == "sgd" else "als", random_state=0)
        t0 = time.perf_counter()
        m.fit(inter)
        return time.perf_counter() - t0, m
    finally:
        numba.set_num_threads(before)


def numpy_vectorized_round(data, clients, Q, b, mu, lam, lr, bs, max_steps, rng):
    """One FedRecon round as a NumPy user would write it: every client at once on arrays padded
    to the largest client, no per-client Python loop. Random half split, exact ridge
    reconstruction of (p, c) by one batched solve, then up to ``max_steps`` mini-batch steps of
    ``bs`` on each client's copies of its query rows; returns the weighted mean row delta. The
    same algorithm as the kernels (its own random draws, so not the same numbers)."""
    indptr, items, vals = data
    K = Q.shape[1]
    start, n = indptr[clients], indptr[clients + 1] - indptr[clients]
    m, L = len(clients), int(n.max())
    pos = np.arange(L)[None, :]
    key = np.where(pos < n[:, None], rng.random((m, L)), np.inf)  # random split and order
    idx = start[:, None] + np.minimum(np.argsort(key, axis=1), n[:, None] - 1)
    I, R = items[idx], vals[idx]
    ns = np.ceil(n * 0.5).astype(np.int64)
    sup, qry = pos < ns[:, None], (pos >= ns[:, None]) & (pos < n[:, None])
    Z = np.concatenate([Q[I], np.ones((m, L, 1))], axis=2) * sup[..., None]
    A = np.einsum("mlk,mlj->mkj", Z, Z) + (lam * ns + 1e-6)[:, None, None] * np.eye(K + 1)
    x = np.linalg.solve(A, np.einsum("mlk,ml->mk", Z, (R - mu - b[I]) * sup)[..., None])[..., 0]
    p, c = x[:, :K], x[:, K]
    Ql, bl = Q[I].astype(np.float64), b[I].astype(np.float64)
    nq, rows = n - ns, np.arange(m)[:, None]
    for s in range(max_steps):
        cols = ns[:, None] + s * bs + np.arange(bs)[None, :]
        live = cols < n[:, None]
        if not live.any():
            break
        cols = np.minimum(cols, L - 1)
        e = (R[rows, cols] - mu - bl[rows, cols] - c[:, None]
             - np.einsum("mbk,mk->mb", Ql[rows, cols], p)) * live
        step = 2 * lr / np.maximum(live.sum(1), 1)[:, None]
        Ql[rows, cols] += (step * e)[..., None] * p[:, None, :]
        bl[rows, cols] += step * e
    w = nq.astype(np.float64)[:, None]
    dQ, db = np.zeros_like(Q, dtype=np.float64), np.zeros(len(b))
    np.add.at(dQ, I[qry], ((Ql - Q[I]) * w[..., None])[qry])
    np.add.at(db, I[qry], ((bl - b[I]) * w)[qry])
    return dQ / w.sum(), db / w.sum()


def section_fedrecon(data, args):
    inter = data.get("synthetic-1m") or next(iter(data.values()))
    rounds = 20 if args.quick else 500
    clients = 20 if args.quick else 100
    max_threads = numba.config.NUMBA_NUM_THREADS
    for recon in ("sgd", "als"):
        counts = sorted({1, max_threads})
        by_threads = {threads: [] for threads in counts}
        fedrecon_fit(inter, recon, 3, clients, max_threads)  # warm-up (loads the kernels)
        for _ in range(max(args.repeats, 5)):  # alternated: a slow spell hits both counts
            for threads in counts:
                by_threads[threads].append(fedrecon_fit(inter, recon, rounds, clients, threads))
        times = {threads: (None, min(r[0] for r in runs), statistics.median(r[0] for r in runs))
                 for threads, runs in by_threads.items()}
        runs = by_threads[max_threads]
        updates = sum(h["clients_used"] for h in runs[0][1].history_)
        best = times[max_threads]
        add(f"FedRecon {rounds}x{clients} ({recon} recon) [{max_threads} threads]", best, None, None,
            note=f"{updates / best[1]:.0f} client updates/s",
            client_updates_per_second=updates / best[1])
        if max_threads > 1:
            add(f"FedRecon {rounds}x{clients} ({recon} recon): 2 threads vs 1", best, times[1],
                f"same run, {1} thread", note="speedup = parallel efficiency x threads")
        # the same rounds as a plain per-client NumPy loop (timed on a few rounds, scaled)
        model = runs[0][1]
        n_ref = 1 if args.quick else 2
        hp_r = sgd_hp(0.5, 0.0, 5, 50, 1, model.global_mean_, True)
        hp_u = sgd_hp(0.5, 0.0, 5, 50, 1, model.global_mean_, True)
        Q = model.item_factors_.astype(np.float64)
        b = model.item_biases_.astype(np.float64)
        eligible = np.flatnonzero(inter.counts() >= 1)
        t0 = time.perf_counter()
        for t in range(n_ref):
            cl = Selector(0, eligible, clients)(t).clients
            ref.fedrecon_round((inter.indptr, inter.items, inter.values), cl, Q, b, seed=0,
                               round_idx=t, split="random", support_fraction=0.5, recon=recon,
                               recon_hp=hp_r, update_hp=hp_u, init_scale=0.05)
        per_round_ref = (time.perf_counter() - t0) / n_ref
        scaled = per_round_ref * rounds
        add(f"FedRecon {rounds}x{clients} ({recon} recon) vs NumPy loop", best,
            (None, scaled, scaled), "plain per-client NumPy loop",
            note=f"NumPy: {n_ref} rounds timed, x{rounds // n_ref} scaled")
        if recon == "als":  # the exact solve batches in NumPy; SGD reconstruction would not
            n_vec = 2 if args.quick else 5
            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            for t in range(n_vec):
                numpy_vectorized_round((inter.indptr, inter.items, inter.values),
                                       Selector(0, eligible, clients)(t).clients, Q, b,
                                       model.global_mean_, 0.1, 0.5, 5, 50, rng)
            vec = (time.perf_counter() - t0) / n_vec * rounds
            add(f"FedRecon {rounds}x{clients} (als recon) vs vectorized NumPy", best,
                (None, vec, vec), "a round as vectorized NumPy (all clients at once)",
                note=f"NumPy: {n_vec} rounds timed, x{rounds // n_vec} scaled")


def section_scaling(data, args):
    n_users = 2000 if args.quick else 20_000
    base = make_synthetic_ratings(n_users, 3706 if not args.quick else 500, n_users * 30,
                                  random_state=1)
    cpr = [100, 1000] if args.quick else [100, 1000, 10_000]
    for m in cpr:
        model = FedReconMF(server_optimizer="sgd", early_stopping=None,
                           n_factors=K, n_rounds=5, clients_per_round=m, random_state=0)
        model.fit(base)
        secs = [h["seconds"] for h in model.history_[1:]]
        srv = [h["server_seconds"] for h in model.history_[1:]]
        add(f"round time, {m} clients/round [{n_users} users]",
            (None, min(secs), statistics.median(secs)), None, None,
            note=f"server {statistics.median(srv) * 1e3:.1f} ms; "
                 f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
            clients_per_round=m, server_seconds=statistics.median(srv))
    catalogs = [1000, 10_000] if args.quick else [1000, 10_000, 100_000, 1_000_000]
    for n_items in catalogs:
        pop = make_synthetic_ratings(2000, n_items, 2000 * 40, random_state=2)
        for opt, lr in (("sgd", 1.0), ("adam", 0.01)):
            model = FedReconMF(early_stopping=None,
                               n_factors=K, n_rounds=6, clients_per_round=100, random_state=0,
                               server_optimizer=lookup("server_optimizer", opt)(lr))
            model.fit(pop)
            hist = model.history_[1:]
            client = [h["seconds"] - h["server_seconds"] for h in hist]
            srv = [h["server_seconds"] for h in hist]
            add(f"round, 100 clients, {n_items:,} items, {opt} server",
                (None, min(client), statistics.median(client)), None, None,
                note=f"clients+aggregation (shown); server step {statistics.median(srv) * 1e3:.1f} ms; "
                     f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
                n_items=n_items, server_optimizer=opt, server_seconds=statistics.median(srv))


def section_dp(args):
    """The dense noise step of user-level DP (DPGaussianMean) as the catalog grows: noise on every
    row of Q and b each round, against the sparse mean of the same 100 clients' uploads."""
    from fedcf.federated import (
        ClientOutputs,
        DPGaussianMean,
        RoundHyperparams,
        RunContext,
        WeightedMean,
    )

    rng = np.random.default_rng(0)
    hp = RoundHyperparams(1.0, {}, 1.0)
    for n_items in ([1000, 10_000] if args.quick else [1000, 10_000, 100_000, 1_000_000]):
        per, m = 60, 100
        out = ClientOutputs(np.arange(0, per * m + 1, per), rng.integers(0, n_items, per * m),
                            rng.normal(0, 0.01, (per * m, K)).astype(np.float32),
                            np.zeros(per * m, np.float32), np.full(m, float(per)), np.zeros(m))
        dp = DPGaussianMean(1.0, 1.0).bind(RunContext(
            n_eligible=10 * m, clients_per_round=m, n_rounds=1, n_items=n_items, n_factors=K,
            seed=0, biases=True))
        add(f"DP aggregation, 100 clients, {n_items:,} items", timed(lambda: dp(out, hp, 0),
                                                                     args.repeats),
            timed(lambda: WeightedMean()(out, hp, 0), args.repeats), "sparse weighted mean",
            n_items=n_items, note="speedup < 1: the dense DP step costs 1/speedup times the sparse mean")


MILLION_USER_FIT = """
import sys, time
import numpy as np
from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
n_users, n_items, per_user = (int(a) for a in sys.argv[1:4])
inter = make_synthetic_ratings(n_users, n_items, n_users * per_user, random_state=0)
t0 = time.perf_counter()
FedReconMF(server_optimizer="sgd", early_stopping=None,
           n_factors=50, n_rounds=10, clients_per_round=100, random_state=0).fit(inter)
print(time.perf_counter() - t0, inter.indptr.nbytes + inter.items.nbytes + inter.values.nbytes
      + (inter.timestamps.nbytes if inter.timestamps is not None else 0))
"""


def peak_rss(cmd) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB, stdout) of a command run in a child process."""
    import subprocess
    import sys

    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "out = subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True); "
             "print(time.perf_counter() - t, "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); "
             "print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else '')")
    res = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                         check=True)
    first, last = res.stdout.strip().splitlines()[:2]
    secs, mib = (float(v) for v in first.split())
    return secs, mib, last


def section_memory(args):
    """Peak resident memory of the main job (README's first command) and of a fit on a
    population of 10⁶ users (10 rounds × 100 clients), each in a fresh process."""
    import sys
    import tempfile

    n_users = 10_000 if args.quick else 1_000_000
    secs, mib, out = peak_rss([sys.executable, "-c", MILLION_USER_FIT, str(n_users), "3706",
                               "10"])
    fit_s, data_bytes = (float(v) for v in out.split())
    dense = n_users * 3706 * 4 / 2**30
    add(f"peak memory, fit on {n_users:,} users", (None, secs, secs), None, None,
        note=f"peak RSS {mib:,.0f} MiB (ratings {data_bytes / 2**20:,.0f} MiB; a users x items "
             f"float32 array would be {dense:,.1f} GiB); fit {fit_s:.1f} s of the total",
        peak_rss_mib=mib)
    if args.quick:
        return
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "movielens_benchmark.py")
    with tempfile.TemporaryDirectory() as tmp:
        secs, mib, _ = peak_rss([sys.executable, script, "--json", os.path.join(tmp, "r.json"),
                                 "--no-progress"])
    add("peak memory, main job (movielens_benchmark.py)", (None, secs, secs), None, None,
        note=f"peak RSS {mib:,.0f} MiB", peak_rss_mib=mib)


MAIN_JOB_PATHS = "centralized,fedavg,fedrecon-sgd,fedrecon-als,hypergradient,fedrecon-variants"


def compile_run(cache, paths, jobs) -> float:
    """Wall seconds of ``python -m fedcf compile`` in a fresh process with this cache folder."""
    import subprocess
    import sys

    env = {**os.environ, "FEDCF_NUMBA_CACHE": cache}
    env.pop("NUMBA_CACHE_DIR", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedcf", "-q", "compile", "--paths", paths, "--jobs",
                    str(jobs)], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def section_coldstart(args):
    """What a fresh install pays before the kernels run: the main job's kernels compiled into an
    empty cache folder (one process, then two), the first row's share (the centralized path),
    and the same paths loaded from the filled cache (the peer: every later run)."""
    import tempfile

    paths = "centralized-sgd" if args.quick else MAIN_JOB_PATHS
    with tempfile.TemporaryDirectory() as tmp:
        one = compile_run(os.path.join(tmp, "one"), paths, 1)
        first = one if "," not in paths else \
            compile_run(os.path.join(tmp, "first"), paths.split(",")[0], 1)  # one path: the same run
        two = compile_run(os.path.join(tmp, "two"), paths, 2)
        warm = compile_run(os.path.join(tmp, "one"), paths, 1)
    add("kernels before the first row, empty cache", (None, first, first), None, None,
        note="the first row's path; includes interpreter start and imports")
    add("main job's kernels: cache load vs compile", (None, warm, warm), (None, one, one),
        "compile, empty cache", note=f"paths {paths}")
    add("main job's kernels compiled by 2 processes", (None, two, two), (None, one, one),
        "1 process")


def section_ceiling(args):
    fn, flops = gemm_peak(args.quick)
    n = round((flops / 2) ** (1 / 3))
    g = timed(fn, args.repeats)
    gemm = flops / g[1] / 1e9
    add(f"GEMM float32 {n}x{n} (BLAS, all threads)", g, None, None,
        note=f"{gemm:.1f} GFLOP/s", gflops=gemm)
    mb = 64 if args.quick else 512
    x = np.ones(mb * 2**20 // 8)
    y = np.empty_like(x)
    cpy = timed(lambda: np.copyto(y, x), args.repeats)
    bw = 2 * x.nbytes / cpy[1] / 1e9
    add(f"memory copy {mb} MiB", cpy, None, None, note=f"{bw:.1f} GB/s (read + write)",
        gbytes_per_second=bw)
    for r in ROWS:  # the fold-in rows keep the share against their own, paired GEMM timing
        if r.get("gflops") and not r["name"].startswith("GEMM") and "gemm_fraction" not in r:
            r["gemm_fraction"] = r["gflops"] / gemm
    print("\nshare of the measured GEMM peak (compute roofline; these kernels are compute bound):")
    for r in ROWS:
        if "gemm_fraction" in r:
            print(f"  {r['name']:<46} {r['gflops']:7.2f} GFLOP/s = {100 * r['gemm_fraction']:5.1f} %")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--sections",
                    default="foldin,als,sgd,fedrecon,scaling,dp,memory,ceiling,coldstart")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    ROWS.clear()
    sections = set(args.sections.split(","))
    unknown = sections - {"foldin", "als", "sgd", "fedrecon", "scaling", "dp", "memory",
                          "ceiling", "coldstart"}
    if unknown:
        raise SystemExit(f"unknown --sections {sorted(unknown)}")
    print(f"fedcf bench: {platform.machine()}, {os.cpu_count()} cpus, numba threads "
          f"{numba.get_num_threads()}, K={K}, repeats={args.repeats}")
    t0 = time.perf_counter()
    data = datasets(args)
    tiny = make_synthetic_ratings(50, 30, 600, random_state=0)
    warm = time.perf_counter()
    for recon in ("als", "sgd"):
        FedReconMF(server_optimizer="sgd", early_stopping=None,
                   n_factors=4, n_rounds=1, clients_per_round=5, reconstruction=recon,
                   random_state=0).fit(tiny)
    warm = time.perf_counter() - warm
    add("kernel compile / cache load (FedRecon paths)", (None, warm, warm), None, None,
        note="one-time per install when the Numba cache is cold")
    print(f"{'row':<46} {'fedcf':>13} {'peer':>13} {'speedup':>7}")
    # the thread-scaling rows first: in two full runs they came out markedly lower after the
    # peers' sections (implicit, cornac and their thread pools) than in a process of their own
    if "fedrecon" in sections:
        section_fedrecon(data, args)
    if "foldin" in sections:
        section_foldin(data, args)
    if "als" in sections:
        section_als(data, args)
    if "sgd" in sections:
        section_sgd(data, args)
    if "scaling" in sections:
        section_scaling(data, args)
    if "dp" in sections:
        section_dp(args)
    if "memory" in sections:
        section_memory(args)
    if "ceiling" in sections:
        section_ceiling(args)
    if "coldstart" in sections:
        section_coldstart(args)
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.json:
        meta = run_meta("bench.py", argv, packages=("implicit", "cornac"))
        write_json(args.json, [{**r, "meta": meta} for r in ROWS])
        print(f"wrote {args.json}")
    return ROWS


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "bench.py")
