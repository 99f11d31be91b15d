"""Gradient kernels: k-step mini-batch reconstruction, item-side client steps, centralized SGD epoch.

Federated paths use the per-example loss of the paper's Keras model (mean squared error), plus an
optional L2 term:

    ℓ(u, i) = (r − μ − b_i − c_u − p_u·q_i)² + lam · (‖p_u‖² + c_u² + ‖q_i‖² + b_i²)

and a mini-batch step moves each parameter by −lr × (mean over the batch of ∂ℓ). Batches walk a
fresh shuffle of the client's examples each epoch (the shuffle comes from the client's own random
stream, see ``rng.py``); a run stops after ``max_steps`` batches or ``epochs`` passes, whichever is
first — the TensorFlow Federated recipe "one epoch, at most 50 steps".

hp (float64 array) layout, shared by the federated kernels:
    [lr, lam, batch_size, max_steps, epochs, offset μ, fit_bias, joint]
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .rng import shuffle_inplace

HP_LR, HP_LAM, HP_BATCH, HP_STEPS, HP_EPOCHS, HP_OFFSET, HP_FIT_BIAS, HP_JOINT = range(8)


def sgd_hp(lr, lam, batch_size, max_steps, epochs, offset, fit_bias, joint=False) -> np.ndarray:
    return np.array([lr, lam, batch_size, max_steps, epochs, offset, float(fit_bias), float(joint)],
                    dtype=np.float64)


@njit(cache=True)
def sgd_reconstruct_user(items, vals, Q, b, hp, p, cb, state, order):
    """k_r mini-batch gradient steps on one user's (p, c) with (Q, b) frozen.

    items, vals : the user's support set;  p : float64 (K,) initial factors, updated in place;
    cb : float64 (1,) initial bias, updated in place;  state : uint64 (1,) random stream;
    order : int64 scratch of at least len(items). Returns the number of steps taken.
    """
    n = items.shape[0]
    K = Q.shape[1]
    lr, lam = hp[HP_LR], hp[HP_LAM]
    bs, max_steps, epochs = int(hp[HP_BATCH]), int(hp[HP_STEPS]), int(hp[HP_EPOCHS])
    mu, fit_bias = hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0
    if n == 0 or max_steps <= 0:
        return 0
    gp = np.zeros(K)
    steps = 0
    for _ in range(epochs):
        if steps >= max_steps:
            break
        for t in range(n):
            order[t] = t
        shuffle_inplace(order[:n], state)
        for start in range(0, n, bs):
            if steps >= max_steps:
                break
            end = min(n, start + bs)
            for a in range(K):
                gp[a] = 0.0
            gc = 0.0
            for t in range(start, end):
                j = items[order[t]]
                pred = mu + b[j] + cb[0]
                for a in range(K):
                    pred += p[a] * Q[j, a]
                e = vals[order[t]] - pred
                for a in range(K):
                    gp[a] -= 2.0 * e * Q[j, a]
                gc -= 2.0 * e
            m = end - start
            for a in range(K):
                p[a] -= lr * (gp[a] / m + 2.0 * lam * p[a])
            if fit_bias:
                cb[0] -= lr * (gc / m + 2.0 * lam * cb[0])
            steps += 1
    return steps


@njit(cache=True)
def unique_rows(items, uniq, loc):
    """Dedupe one user's items: uniq[:m] sorted unique ids, loc[t] = row of items[t]. Returns m."""
    n = items.shape[0]
    if n == 0:
        return 0
    srt = np.argsort(items, kind="mergesort")
    m = 0
    for t in range(n):
        j = items[srt[t]]
        if m == 0 or uniq[m - 1] != j:
            uniq[m] = j
            m += 1
        loc[srt[t]] = m - 1
    return m


@njit(cache=True)
def item_steps_user(items, vals, Q, b, hp, p, cb, state, work):
    """k_u mini-batch steps on the rows of (Q, b) that one user's query set touches.

    The user (p, cb) is frozen unless hp[HP_JOINT] (the joint-training ablation), in which case it
    is updated from the same batches. Returns (m, Ql, bl, uniq): the user's m distinct items
    ``uniq[:m]`` and their updated rows ``Ql[:m]``, ``bl[:m]`` (float64); the delta is
    ``Ql[:m] − Q[uniq[:m]]``. ``work`` is a tuple of scratch arrays from ``item_work(n, K)``.
    """
    order, uniq, loc, Ql, bl, G, gb = work
    n = items.shape[0]
    K = Q.shape[1]
    lr, lam = hp[HP_LR], hp[HP_LAM]
    bs, max_steps, epochs = int(hp[HP_BATCH]), int(hp[HP_STEPS]), int(hp[HP_EPOCHS])
    mu, fit_bias, joint = hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0, hp[HP_JOINT] != 0.0
    m = unique_rows(items, uniq, loc)
    for r in range(m):
        for a in range(K):
            Ql[r, a] = Q[uniq[r], a]
            G[r, a] = 0.0
        bl[r] = b[uniq[r]]
        gb[r] = 0.0
    gp = np.zeros(K)
    steps = 0
    for _ in range(epochs):
        if steps >= max_steps or n == 0:
            break
        for t in range(n):
            order[t] = t
        shuffle_inplace(order[:n], state)
        for start in range(0, n, bs):
            if steps >= max_steps:
                break
            end = min(n, start + bs)
            gc = 0.0
            for a in range(K):
                gp[a] = 0.0
            for t in range(start, end):
                r = loc[order[t]]
                pred = mu + bl[r] + cb[0]
                for a in range(K):
                    pred += p[a] * Ql[r, a]
                e = vals[order[t]] - pred
                for a in range(K):
                    G[r, a] += -2.0 * e * p[a] + 2.0 * lam * Ql[r, a]
                    gp[a] -= 2.0 * e * Ql[r, a]
                if fit_bias:
                    gb[r] += -2.0 * e + 2.0 * lam * bl[r]
                gc -= 2.0 * e
            inv = lr / (end - start)
            for t in range(start, end):  # apply each touched row once, then clear its gradient
                r = loc[order[t]]  # a repeated row meets a cleared gradient: no-op
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
            steps += 1
    return m


@njit(cache=True)
def item_work(n, K):
    """Scratch for ``item_steps_user`` on up to n examples with K factors."""
    n = max(n, 1)
    return (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
            np.empty((n, K)), np.empty(n), np.zeros((n, K)), np.zeros(n))


@njit(cache=True)
def write_delta(work, m, Q, b, base, length, out):
    """Write the delta of ``item_steps_user``'s m rows into out slots [base, base + length).

    out : (d_items, d_Q, d_b); slots past m get item −1 and zero deltas.
    """
    d_items, d_Q, d_b = out
    uniq, Ql, bl = work[1], work[3], work[4]
    K = Q.shape[1]
    for t in range(length):
        if t < m:
            j = uniq[t]
            d_items[base + t] = j
            for a in range(K):
                d_Q[base + t, a] = Ql[t, a] - Q[j, a]
            d_b[base + t] = bl[t] - b[j]
        else:
            d_items[base + t] = -1
            for a in range(K):
                d_Q[base + t, a] = 0.0
            d_b[base + t] = 0.0


@njit(cache=True, parallel=True)
def sgd_reconstruct_rows(indptr, idx, vals, glob, hp, seeds, out, out_bias):
    """Batched ``sgd_reconstruct_user`` over a user-grouped CSR.

    glob : (Q, b) frozen item factors and biases;  seeds : uint64 (n_rows,) stream seed per row;
    out, out_bias : initial user factors / biases (n_rows, K) / (n_rows,), updated in place.
    Rows are independent and each has its own stream: results do not depend on thread count.
    """
    Q, b = glob[0], glob[1]  # by index: see fedrecon_clients
    n_rows = indptr.shape[0] - 1
    K = Q.shape[1]
    for r in prange(n_rows):
        s, e = indptr[r], indptr[r + 1]
        p = np.empty(K)
        for a in range(K):
            p[a] = out[r, a]
        cb = np.array([float(out_bias[r])])
        state = np.array([seeds[r]])
        order = np.empty(max(e - s, 1), np.int64)
        sgd_reconstruct_user(idx[s:e], vals[s:e], Q, b, hp, p, cb, state, order)
        for a in range(K):
            out[r, a] = p[a]
        out_bias[r] = cb[0] if hp[HP_FIT_BIAS] != 0.0 else out_bias[r]


@njit(cache=True, parallel=True)
def item_steps_rows(indptr, idx, vals, glob, local, hp, seeds, out):
    """Batched ``item_steps_user``: every row's sparse delta of (Q, b), users frozen.

    glob : (Q, b);  local : (P, c) user factors / biases, one row per CSR row (not modified unless
    joint, and then only through copies — local results never leave this function);
    out : (delta_items int64 (nnz,), delta_Q float (nnz, K), delta_b float (nnz,)), written in each
    row's slots [indptr[r], indptr[r+1]): the row's m distinct items first, then item −1 padding.
    """
    Q, b = glob[0], glob[1]  # by index: see fedrecon_clients
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
    axpy loops may be reassociated (SIMD); no NaN check depends on them.
    """
    P, c = user_params[0], user_params[1]
    Q, b = item_params[0], item_params[1]
    lr, lam, mu, fit_bias = cfg[0], cfg[1], cfg[2], cfg[3] != 0.0
    K = Q.shape[1]
    dec = 1.0 - lr * lam
    sse = 0.0
    for t in range(users.shape[0]):
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
        le = lr * e
        for a in range(K):
            p0 = pu[a]
            q0 = qi[a]
            pu[a] = dec * p0 + le * q0
            qi[a] = dec * q0 + le * p0
    return sse
