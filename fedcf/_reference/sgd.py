"""NumPy twins of ``fedcf._kernels.sgd`` (gradient steps): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    HP_BATCH,
    HP_EPOCHS,
    HP_FIT_BIAS,
    HP_JOINT,
    HP_LAM,
    HP_LR,
    HP_OFFSET,
    HP_STEPS,
    INIT_UNIFORM,
    RI_INIT,
    RI_SCALE,
    SE_FIT_BIAS,
    SE_LAM,
    SE_LR,
    SE_OFFSET,
)
from .rng import Stream, as_stream


def _hp(hp):
    return (float(hp[HP_LR]), float(hp[HP_LAM]), int(hp[HP_BATCH]), int(hp[HP_STEPS]),
            int(hp[HP_EPOCHS]), float(hp[HP_OFFSET]), hp[HP_FIT_BIAS] != 0, hp[HP_JOINT] != 0)


def _batches(n, bs, max_steps, epochs, stream):
    """Yield index arrays of each mini-batch, in the kernels' order."""
    steps = 0
    for _ in range(epochs):
        if steps >= max_steps or n == 0:
            return
        order = np.arange(n)
        stream.shuffle(order)
        for start in range(0, n, bs):
            if steps >= max_steps:
                return
            yield order[start:start + bs]
            steps += 1


def sgd_reconstruct_user(items, vals, Q, b, hp, p, c, seed):
    lr, lam, bs, steps, epochs, mu, fit_bias, _ = _hp(hp)
    p = np.array(p, np.float64)
    c = float(c)
    Q64 = Q.astype(np.float64)
    for batch in _batches(len(items), bs, steps, epochs, as_stream(seed)):
        j = items[batch]
        e = vals[batch] - (mu + b[j] + c + Q64[j] @ p)
        gp = (-2.0 * e) @ Q64[j] / len(batch) + 2.0 * lam * p
        gc = np.mean(-2.0 * e) + 2.0 * lam * c
        p = p - lr * gp
        if fit_bias:
            c = c - lr * gc
    return p, c


def init_local(K, init_cfg, stream):
    """Twin of the kernels' ``init_local``: zeros, or uniform ±scale drawn from the stream."""
    if int(init_cfg[RI_INIT]) == INIT_UNIFORM:
        return np.array([(2 * stream.next_float() - 1) * init_cfg[RI_SCALE] for _ in range(K)])
    return np.zeros(K)


def sgd_reconstruct_rows(indptr, idx, vals, glob, hp, init, keys):
    """Returns (P, c): each row starts from ``init_local`` on its own stream keys[r]."""
    Q, b = glob
    n = len(indptr) - 1
    P, c = np.zeros((n, Q.shape[1])), np.zeros(n)
    for r in range(n):
        s, e = indptr[r], indptr[r + 1]
        stream = Stream(int(keys[r]))
        p0 = init_local(Q.shape[1], init, stream)
        P[r], cb = sgd_reconstruct_user(idx[s:e], vals[s:e], Q, b, hp, p0, 0.0, stream)
        c[r] = cb if hp[HP_FIT_BIAS] != 0 else 0.0
    return P, c


def item_steps_user(items, vals, Q, b, hp, p, c, seed):
    """Returns (uniq, delta_Q, delta_b, p, c) — p, c changed only with joint training."""
    lr, lam, bs, steps, epochs, mu, fit_bias, joint = _hp(hp)
    uniq, loc = np.unique(items, return_inverse=True)
    Ql = Q[uniq].astype(np.float64)
    bl = b[uniq].astype(np.float64)
    p = np.array(p, np.float64)
    c = float(c)
    for batch in _batches(len(items), bs, steps, epochs, as_stream(seed)):
        r = loc[batch]
        e = vals[batch] - (mu + bl[r] + c + Ql[r] @ p)
        G = np.zeros_like(Ql)
        gb = np.zeros_like(bl)
        np.add.at(G, r, -2.0 * e[:, None] * p[None, :] + 2.0 * lam * Ql[r])
        np.add.at(gb, r, -2.0 * e + 2.0 * lam * bl[r])
        gp = (-2.0 * e) @ Ql[r] / len(batch) + 2.0 * lam * p
        gc = np.mean(-2.0 * e) + 2.0 * lam * c
        Ql -= lr * G / len(batch)
        if fit_bias:
            bl -= lr * gb / len(batch)
        if joint:
            p = p - lr * gp
            if fit_bias:
                c = c - lr * gc
    return uniq, Ql - Q[uniq], bl - b[uniq], p, c


def item_steps_rows(indptr, idx, vals, glob, local, hp, seeds):
    Q, b = glob
    P, c = local
    nnz = indptr[-1]
    d_items = np.full(nnz, -1, np.int64)
    d_Q = np.zeros((nnz, Q.shape[1]))
    d_b = np.zeros(nnz)
    for r in range(len(indptr) - 1):
        s, e = indptr[r], indptr[r + 1]
        uniq, dq, db, _, _ = item_steps_user(idx[s:e], vals[s:e], Q, b, hp, P[r], c[r],
                                             int(seeds[r]))
        m = len(uniq)
        d_items[s:s + m] = uniq
        d_Q[s:s + m] = dq
        d_b[s:s + m] = db
    return d_items, d_Q, d_b


def sgd_epoch(users, items, vals, user_params, item_params, cfg):
    P, c = (np.array(a, np.float64) for a in user_params)
    Q, b = (np.array(a, np.float64) for a in item_params)
    lr, lam, mu, fit_bias = cfg[SE_LR], cfg[SE_LAM], cfg[SE_OFFSET], cfg[SE_FIT_BIAS] != 0
    sse = 0.0
    for t in range(len(users)):
        u, i = users[t], items[t]
        e = vals[t] - (mu + c[u] + b[i] + P[u] @ Q[i])
        sse += e * e
        if fit_bias:
            c[u] += lr * (e - lam * c[u])
            b[i] += lr * (e - lam * b[i])
        pu = P[u].copy()
        P[u] += lr * (e * Q[i] - lam * pu)
        Q[i] += lr * (e * pu - lam * Q[i])
    return (P, c), (Q, b), sse
