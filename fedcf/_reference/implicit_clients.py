"""NumPy twins of ``fedcf._kernels.implicit_clients`` (implicit-feedback clients):
slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    IC_ALPHA,
    IC_ITEM_BIAS,
    IC_LAM,
    IC_NEG,
    IC_NEG_WEIGHT,
    IC_SPLIT,
    IC_SUPPORT_FRAC,
    IC_USER_BIAS,
    SPLIT_NONE,
    SPLIT_RANDOM,
)
from .als import implicit_solve_rows
from .rng import Stream
from .sgd import _batches, _hp


def _implicit_start(items, vals, Q, cfg, seed, b=None):
    """Shared start of the implicit clients: split, then the exact weighted-ALS reconstruction
    (item biases ``b`` as offsets when the cfg says so; the user bias when it says so).
    Returns (stream, query positions, p, β)."""
    split, frac = int(cfg[IC_SPLIT]), cfg[IC_SUPPORT_FRAC]
    alpha, lam_r = cfg[IC_ALPHA], cfg[IC_LAM]
    stream = Stream(seed)
    n = len(items)
    perm = np.arange(n)
    if split == SPLIT_RANDOM:
        stream.shuffle(perm)
    if split == SPLIT_NONE:
        n_s, q_start = n, 0
    else:
        n_s = min(max(int(np.ceil(n * frac - 1e-9)), 1 if n else 0), n)
        q_start = n_s
    sup = perm[:n_s]
    ones = cfg[IC_USER_BIAS] > 0
    off = b if cfg[IC_ITEM_BIAS] > 0 else None
    x = implicit_solve_rows(np.array([0, n_s]), items[sup], vals[sup], Q, alpha, lam_r,
                            ones=ones, offset=off)[0]
    return stream, perm[q_start:], x[:Q.shape[1]], (x[-1] if ones else 0.0)


def fedrecon_implicit_client(items, vals, Q, cfg, hp, seed, n_items, b=None):
    """Twin of one client of ``fedrecon_implicit_clients``: returns (uniq items, ΔQ rows, loss,
    Δb rows). ``b``: the item biases (zeros if None)."""
    alpha, m_neg, nu = cfg[IC_ALPHA], int(cfg[IC_NEG]), cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs, *_ = _hp(hp)
    b = np.zeros(len(Q)) if b is None else np.asarray(b, np.float64)
    stream, qry, p, beta = _implicit_start(items, vals, Q, cfg, seed, b)
    batches = []
    for bat in _batches(len(qry), bs, max_steps, epochs, stream):
        batches.append(bat)
    visits = np.concatenate(batches) if batches else np.zeros(0, int)
    negs = np.array([stream.next_below(n_items) for _ in range(m_neg * len(visits))], dtype=int)
    q_items = items[qry]
    uniq = np.unique(np.concatenate([q_items, negs]))
    Ql, bl = Q[uniq].astype(np.float64), b[uniq].copy()
    row = {j: r for r, j in enumerate(uniq)}
    c_all = 1.0 + alpha * vals[qry]
    s_q = beta + b[q_items] + Q[q_items].astype(np.float64) @ p
    loss = float(np.mean(c_all * (1 - s_q) ** 2)) if len(qry) else 0.0
    fit_b = cfg[IC_ITEM_BIAS] > 0
    t0 = 0
    for bat in batches:
        B = len(bat)
        G, Gb = np.zeros_like(Ql), np.zeros_like(bl)
        for t, qi in enumerate(bat):
            r = row[q_items[qi]]
            g = -2.0 * c_all[qi] * (1 - beta - bl[r] - p @ Ql[r]) / B
            G[r] += g * p + 2.0 * l2 * Ql[r] / B
            Gb[r] += g + 2.0 * l2 * bl[r] / B
            for h in range(m_neg):
                rn = row[negs[(t0 + t) * m_neg + h]]
                gn = 2.0 * nu * (beta + bl[rn] + p @ Ql[rn]) / (B * m_neg)
                G[rn] += gn * p
                Gb[rn] += gn
        Ql -= lr * G
        if fit_b:
            bl -= lr * Gb
        t0 += B
    return uniq, Ql - Q[uniq], loss, bl - b[uniq]


def fedrecon_implicit_full_client(items, vals, Q, cfg, hp, seed, n_items):
    """Dense twin of one client of ``fedrecon_implicit_full_clients``: every catalog row is
    updated explicitly at every step. Returns the dense ΔQ (n_items, K) and the loss."""
    alpha, nu = cfg[IC_ALPHA], cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs, *_ = _hp(hp)
    stream, qry, p, _ = _implicit_start(items, vals, Q, cfg, seed)
    Qd = Q.astype(np.float64).copy()
    q_items = items[qry]
    c_all = 1.0 + alpha * vals[qry]
    loss = float(np.mean(c_all * (1 - Qd[q_items] @ p) ** 2)) if len(qry) else 0.0
    eta = lr * 2.0 * nu / n_items
    for b in _batches(len(qry), bs, max_steps, epochs, stream):
        G = np.zeros_like(Qd)
        for t in b:
            j = q_items[t]
            G[j] += -2.0 * c_all[t] * (1 - p @ Qd[j]) / len(b) * p + 2.0 * l2 * Qd[j] / len(b)
        Qd = Qd - lr * G - eta * np.outer(Qd @ p, p)
    return Qd - Q, loss
