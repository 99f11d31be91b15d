"""Gradient kernels: k-step mini-batch reconstruction, item-side client steps, centralized SGD epoch.

Federated paths use the per-example loss of the paper's Keras model (mean squared error), plus an
optional L2 term:

    ℓ(u, i) = (r − μ − b_i − c_u − p_u·q_i)² + lam · (‖p_u‖² + c_u² + ‖q_i‖² + b_i²)

and a mini-batch step moves each parameter by −lr × (mean over the batch of ∂ℓ). Batches walk a
fresh shuffle of the client's examples each epoch (the shuffle comes from the client's own random
stream, see ``rng.py``); a run stops after ``max_steps`` batches or ``epochs`` passes, whichever is
first — the TensorFlow Federated recipe "one epoch, at most 50 steps".

Settings arrive packed as ``layout.sgd_hp`` (named indices HP_*).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .layout import (
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
from .rng import next_float
from .util import minibatch_schedule, prefetch_row, store, unique_rows

PREFETCH_AHEAD = 8  # ratings between a row's prefetch in ``sgd_epoch`` and its use


@njit(cache=True)
def sgd_reconstruct_user(items, vals, Q, b, hp, p, cb, state):
    """k_r mini-batch gradient steps on one user's (p, c) with (Q, b) frozen.

    items, vals : the user's support set;  p : float64 (K,) initial factors, updated in place;
    cb : float64 (1,) initial bias, updated in place;  state : uint64 (1,) random stream;
    hp : ``layout.sgd_hp``. Returns the number of steps taken.
    """
    K = Q.shape[1]
    lr, lam = hp[HP_LR], hp[HP_LAM]
    mu, fit_bias = hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0
    visit, ends, steps = minibatch_schedule(items.shape[0], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                            int(hp[HP_EPOCHS]), state)
    gp = np.zeros(K)
    start = 0
    for s in range(steps):
        end = ends[s]
        for a in range(K):
            gp[a] = 0.0
        gc = 0.0
        for t in range(start, end):
            j = items[visit[t]]
            pred = mu + b[j] + cb[0]
            for a in range(K):
                pred += p[a] * Q[j, a]
            e = vals[visit[t]] - pred
            for a in range(K):
                gp[a] -= 2.0 * e * Q[j, a]
            gc -= 2.0 * e
        m = end - start
        for a in range(K):
            p[a] -= lr * (gp[a] / m + 2.0 * lam * p[a])
        if fit_bias:
            cb[0] -= lr * (gc / m + 2.0 * lam * cb[0])
        start = end
    return steps


@njit(cache=True)
def init_local(p, cb, init, scale, state):
    """Starting point of SGD reconstruction: zeros, or uniform in ±scale from the user's stream."""
    for a in range(p.shape[0]):
        p[a] = (2.0 * next_float(state) - 1.0) * scale if init == INIT_UNIFORM else 0.0
    cb[0] = 0.0


@njit(cache=True)
def item_steps_user(items, vals, Q, b, hp, p, cb, state, work):
    """k_u mini-batch steps on the rows of (Q, b) that one user's query set touches.

    The user (p, cb) is frozen unless hp[HP_JOINT] (the joint-training ablation), in which case it
    is updated from the same batches. ``work`` is scratch from ``item_work(n, K)``; on return its
    members ``uniq[:m]`` hold the user's m distinct items and ``Ql[:m]``, ``bl[:m]`` (float64)
    their updated rows, so the delta is ``Ql[:m] − Q[uniq[:m]]`` (see ``write_delta``).
    Returns m.
    """
    uniq, loc, Ql, bl, G, gb = work
    K = Q.shape[1]
    lr, lam = hp[HP_LR], hp[HP_LAM]
    mu, fit_bias, joint = hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0, hp[HP_JOINT] != 0.0
    m = unique_rows(items, uniq, loc)
    for r in range(m):
        for a in range(K):
            Ql[r, a] = Q[uniq[r], a]
            G[r, a] = 0.0
        bl[r] = b[uniq[r]]
        gb[r] = 0.0
    visit, ends, steps = minibatch_schedule(items.shape[0], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                            int(hp[HP_EPOCHS]), state)
    gp = np.zeros(K)
    start = 0
    for s in range(steps):
        end = ends[s]
        gc = 0.0
        for a in range(K):
            gp[a] = 0.0
        for t in range(start, end):
            r = loc[visit[t]]
            pred = mu + bl[r] + cb[0]
            for a in range(K):
                pred += p[a] * Ql[r, a]
            e = vals[visit[t]] - pred
            for a in range(K):
                G[r, a] += -2.0 * e * p[a] + 2.0 * lam * Ql[r, a]
                gp[a] -= 2.0 * e * Ql[r, a]
            if fit_bias:
                gb[r] += -2.0 * e + 2.0 * lam * bl[r]
            gc -= 2.0 * e
        inv = lr / (end - start)
        for t in range(start, end):  # apply each touched row once, then clear its gradient
            r = loc[visit[t]]  # a repeated row meets a cleared gradient: no-op
            for a in range(K):
                Ql[r, a] -= inv * G[r, a]
                G[r, a] = 0.0
            bl[r] -= inv * gb[r]
            gb[r] = 0.0
        if joint:
            m_b = end - start
            for a in range(K):
                p[a] -= lr * (gp[a] / m_b + 2.0 * lam * p[a])
            if fit_bias:
                cb[0] -= lr * (gc / m_b + 2.0 * lam * cb[0])
        start = end
    return m


@njit(cache=True)
def item_work(n, K):
    """Scratch for ``item_steps_user`` on up to n examples with K factors:
    (uniq, loc, Ql, bl, G, gb)."""
    n = max(n, 1)
    return (np.empty(n, np.int64), np.empty(n, np.int64), np.empty((n, K)), np.empty(n),
            np.zeros((n, K)), np.zeros(n))


@njit(cache=True)
def write_rows(uniq, m, Ql, Q, base, length, d_items, d_Q):
    """Row deltas Ql[t] − Q[uniq[t]] for t < m into slots [base, base + length) of (d_items, d_Q);
    slots past m get item −1 and zero rows. The one writer of sparse row deltas."""
    K = Q.shape[1]
    for t in range(length):
        if t < m:
            j = uniq[t]
            d_items[base + t] = j
            for a in range(K):
                d_Q[base + t, a] = Ql[t, a] - Q[j, a]
        else:
            d_items[base + t] = -1
            for a in range(K):
                d_Q[base + t, a] = 0.0


@njit(cache=True)
def write_delta(work, m, Q, b, base, length, out):
    """Write the delta of ``item_steps_user``'s m rows (factors and biases) into out slots
    [base, base + length); out : (d_items, d_Q, d_b)."""
    uniq, Ql, bl = work[0], work[2], work[3]
    write_rows(uniq, m, Ql, Q, base, length, out[0], out[1])
    d_b = out[2]
    for t in range(length):
        d_b[base + t] = bl[t] - b[uniq[t]] if t < m else 0.0


@njit(cache=True, parallel=True)
def sgd_reconstruct_rows(indptr, idx, vals, glob, hp, init, keys, out):
    """Batched SGD reconstruction: every CSR row's (p, c) from k_r steps against frozen (Q, b).

    glob : (Q, b);  hp : ``sgd_hp``;  init : ``layout.recon_init_cfg`` (zeros or uniform ±scale);
    keys : uint64 (n_rows,) — row r's random stream (its start and its batch order) is keys[r]
    alone, so a user's result does not depend on which other rows share the call or on threads;
    out : (P (n_rows, K), c (n_rows,)) float, overwritten.
    """
    Q, b = glob[0], glob[1]  # by index: see util.py
    P, c = out[0], out[1]
    n_rows = indptr.shape[0] - 1
    K = Q.shape[1]
    for r in prange(n_rows):
        s, e = indptr[r], indptr[r + 1]
        p = np.empty(K)
        cb = np.zeros(1)
        state = np.array([keys[r]])
        init_local(p, cb, int(init[RI_INIT]), init[RI_SCALE], state)
        sgd_reconstruct_user(idx[s:e], vals[s:e], Q, b, hp, p, cb, state)
        for a in range(K):
            P[r, a] = p[a]
        store(c, np.int64(r), cb[0] if hp[HP_FIT_BIAS] != 0.0 else 0.0)


@njit(cache=True, parallel=True)
def item_steps_rows(indptr, idx, vals, glob, local, hp, seeds, out):
    """Batched ``item_steps_user``: every row's sparse delta of (Q, b), users frozen.

    glob : (Q, b);  local : (P, c) user factors / biases, one row per CSR row (read only: with
    joint steps the user row is updated in a private copy that never leaves this function);
    out : (delta_items int64 (nnz,), delta_Q float (nnz, K), delta_b float (nnz,)), written in each
    row's slots [indptr[r], indptr[r+1]): the row's m distinct items first, then item −1 padding.
    """
    Q, b = glob[0], glob[1]  # by index: see util.py
    P, c = local[0], local[1]
    n_rows = indptr.shape[0] - 1
    K = Q.shape[1]
    for r in prange(n_rows):
        s, e = indptr[r], indptr[r + 1]
        p = np.empty(K)
        for a in range(K):
            p[a] = P[r, a]
        cb = np.array([float(c[r])])
        state = np.array([seeds[r]])
        work = item_work(e - s, K)
        m = item_steps_user(idx[s:e], vals[s:e], Q, b, hp, p, cb, state, work)
        write_delta(work, m, Q, b, s, e - s, out)


@njit(cache=True, fastmath={"reassoc", "contract", "arcp"})
def sgd_epoch(users, items, vals, user_params, item_params, cfg):
    """One epoch of classic per-rating SGD for biased MF (Funk / Koren), in the order given.

    users, items, vals : the ratings already in this epoch's (shuffled) order — gathering them
    contiguously first keeps the pass streaming through memory instead of jumping per rating;
    user_params : (P, c);  item_params : (Q, b), updated in place;
    cfg : float64 [lr, lam, offset μ, fit_bias]. Update for e = r − r̂:
    c += lr (e − lam c);  b += lr (e − lam b);  p += lr (e q − lam p);  q += lr (e p − lam q)
    (p and q updated from their values before the step). Returns the sum of e² seen.
    Sequential by design: the result depends only on the order. The dot product and the two
    axpy loops may be reassociated (SIMD); no NaN check depends on them. The two axpy
    coefficients are rounded to the factors' dtype, so a float32 model's row update stays in
    float32 (8-wide SIMD, no conversions); e and the biases are float64. The factor rows of the
    rating PREFETCH_AHEAD steps ahead are prefetched (the rows are random accesses; a hint,
    with no effect on any value).
    """
    P, c = user_params[0], user_params[1]
    Q, b = item_params[0], item_params[1]
    lr, lam, mu, fit_bias = cfg[SE_LR], cfg[SE_LAM], cfg[SE_OFFSET], cfg[SE_FIT_BIAS] != 0.0
    K = Q.shape[1]
    coef = np.empty(2, P.dtype)  # [decay, lr·e] in the factors' dtype
    coef[0] = 1.0 - lr * lam
    dec = coef[0]
    sse = 0.0
    n = users.shape[0]
    for t in range(n):
        if t + PREFETCH_AHEAD < n:  # the rows a few ratings ahead: their loads overlap this step
            prefetch_row(P, np.int64(users[t + PREFETCH_AHEAD]))
            prefetch_row(Q, np.int64(items[t + PREFETCH_AHEAD]))
        u = users[t]
        i = items[t]
        pu = P[u]
        qi = Q[i]
        dot = pu[0] - pu[0]
        for a in range(K):
            dot += pu[a] * qi[a]
        e = vals[t] - (mu + c[u] + b[i] + dot)
        sse += e * e
        if fit_bias:
            c[u] += lr * (e - lam * c[u])
            b[i] += lr * (e - lam * b[i])
        coef[1] = lr * e
        le = coef[1]
        for a in range(K):
            p0 = pu[a]
            q0 = qi[a]
            pu[a] = dec * p0 + le * q0
            qi[a] = dec * q0 + le * p0
    return sse


@njit(cache=True, parallel=True)
def gather_ratings(order, users, items, vals, out_users, out_items, out_vals):
    """out_*[t] = *[order[t]]: one epoch's shuffle of the ratings, gathered contiguously for
    ``sgd_epoch`` into buffers the caller reuses across epochs (no fresh pages per epoch).
    Each output entry is written once, so the result does not depend on the thread count."""
    for t in prange(order.shape[0]):
        o = order[t]
        out_users[t] = users[o]
        out_items[t] = items[o]
        out_vals[t] = vals[o]
