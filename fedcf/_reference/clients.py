"""NumPy twins of ``fedcf._kernels.clients`` (one federated round): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    HP_FIT_BIAS,
    HP_OFFSET,
    INIT_UNIFORM,
)
from .als import ridge_solve_row
from .rng import Stream, stream_key
from .sgd import init_local, item_steps_user, sgd_reconstruct_user


def fedrecon_round(data, clients, Q, b, *, seed, round_idx, split, support_fraction, recon,
                   recon_hp, update_hp, init_scale, ridge=(0.1, 1e-6)):
    """One round of Algorithm 1 as a plain per-client NumPy loop (server SGD, lr 1 applied by the
    caller): returns (items, mean ΔQ rows, mean Δb, weights). Consumes each client's stream in the
    kernel's order, so it reproduces ``fedrecon_clients`` + ``aggregate`` exactly.

    split : "random" | "time" | "none";  recon : "sgd" | "als"
    """
    indptr, items_all, values_all = data
    K = Q.shape[1]
    mu, fit_bias = float(update_hp[HP_OFFSET]), update_hp[HP_FIT_BIAS] != 0
    total = np.zeros((Q.shape[0], K))
    total_b = np.zeros(Q.shape[0])
    touched = np.zeros(Q.shape[0], bool)
    weights = []
    for u in clients:
        s0, e0 = indptr[u], indptr[u + 1]
        items, vals = items_all[s0:e0], values_all[s0:e0]
        n = e0 - s0
        stream = Stream(stream_key(seed, round_idx, int(u)))
        perm = np.arange(n)
        if split == "random":
            stream.shuffle(perm)
        if split == "none":
            sup = qry = perm
        else:
            n_s = min(max(int(np.ceil(n * support_fraction - 1e-9)), 1 if n else 0), n)
            sup, qry = perm[:n_s], perm[n_s:]
        if recon == "als":
            p, c = ridge_solve_row(items[sup], vals[sup], Q, b, ridge[0], ridge[1], mu, fit_bias)
        else:
            p0 = init_local(K, np.array([INIT_UNIFORM, init_scale]), stream)
            p, c = sgd_reconstruct_user(items[sup], vals[sup], Q, b, recon_hp, p0, 0.0, stream)
        uniq, dq, db, _, _ = item_steps_user(items[qry], vals[qry], Q, b, update_hp, p, c, stream)
        w = len(qry)
        weights.append(w)
        total[uniq] += w * dq
        total_b[uniq] += w * db
        touched[uniq] |= w > 0
    n_total = max(sum(weights), 1)
    rows = np.flatnonzero(touched)
    return rows, total[rows] / n_total, total_b[rows] / n_total, np.array(weights, float)
