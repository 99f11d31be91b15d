"""Client work of one round for implicit feedback (Hu, Koren & Volinsky confidence weighting).

A client reconstructs p (and its bias β, if the model has user biases) exactly by weighted ALS
against the global Q, item biases b and the broadcast side (Gram, offset projection), then takes
k_u mini-batch steps on item rows (and their biases) with p frozen. Output slots as in
``clients.py``. Tuple members are read by index (see util.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .als import ridge_scratch, solve_implicit_row
from .clients import query_sizes, split_client
from .dense import solve_square
from .layout import (
    HP_BATCH,
    HP_EPOCHS,
    HP_LAM,
    HP_LR,
    HP_STEPS,
    IC_ALPHA,
    IC_ITEM_BIAS,
    IC_LAM,
    IC_NEG,
    IC_NEG_WEIGHT,
    IC_SPLIT,
    IC_SUPPORT_FRAC,
)
from .rng import client_key, next_below
from .sgd import write_rows
from .util import (
    QUEUE_WORKERS,
    client_queue,
    gather_entries,
    minibatch_schedule,
    processed_examples,
    store,
    take,
    unique_rows,
    write_outer,
)


@njit(cache=True)
def implicit_slots(counts, cfg, hp):
    """Output slots per client: its query positives plus every sampled negative."""
    out = query_sizes(counts, int(cfg[IC_SPLIT]), cfg[IC_SUPPORT_FRAC])
    for k in range(counts.shape[0]):
        seen = processed_examples(out[k], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                  int(hp[HP_EPOCHS]))
        out[k] += int(cfg[IC_NEG]) * seen
    return out


@njit(cache=True)
def implicit_client_start(data, u, Q, side, cfg, state):
    """Split client u's data and reconstruct p from its support set by the weighted-ALS solve
    (``side`` as in ``solve_implicit_row``: the user bias β is solved when its Gram has K + 1
    rows, the item biases enter as its offset).

    Returns (q_items, q_vals, x): the query set and x = [p; β] (float64, K + 1; β = 0 without a
    user bias). Consumes the stream only for a random split.
    """
    indptr, items, values = data[0], data[1], data[2]
    s0 = indptr[u]
    n = indptr[u + 1] - s0
    K = Q.shape[1]
    perm, n_s, q_start = split_client(n, int(cfg[IC_SPLIT]), cfg[IC_SUPPORT_FRAC], state)
    s_items, s_vals = gather_entries(items, values, s0, perm[:n_s])
    d = side[0].shape[0]
    A = solve_square(d)
    x = np.zeros(K + 1)
    buf = ridge_scratch(Q, n_s)
    solve_implicit_row(s_items, s_vals, Q, side, cfg[IC_ALPHA], cfg[IC_LAM], A, x, buf)
    if d == K:
        x[K] = 0.0
    q_items, q_vals = gather_entries(items, values, s0, perm[q_start:n])
    return q_items, q_vals, x


@njit(cache=True)
def score(x, Ql, bl, r):
    """β + b_r + p·q_r for x = [p; β] and local rows (Ql, bl)."""
    K = Ql.shape[1]
    dot = x[K] + bl[r]
    for a in range(K):
        dot += x[a] * Ql[r, a]
    return dot


@njit(cache=True)
def confidence_loss(q_items, q_vals, Q, b, alpha, x):
    """Σ_pos (1 + α r)(1 − β − b_i − p·q_i)² / n over the query positives (0 when empty)."""
    n_q = q_items.shape[0]
    tot = 0.0
    for t in range(n_q):
        e = 1.0 - score(x, Q, b, q_items[t])
        tot += (1.0 + alpha * q_vals[t]) * e * e
    return tot / n_q if n_q > 0 else 0.0


@njit(cache=True)
def local_rows(Q, b, uniq, m):
    """Private float64 copies of rows uniq[:m] of Q and of their biases b, and zeroed gradients
    of the same shapes: (Ql, G, bl, Gb)."""
    K = Q.shape[1]
    Ql = np.empty((max(m, 1), K))
    bl = np.zeros(max(m, 1))
    for r in range(m):
        bl[r] = b[uniq[r]]
        for a in range(K):
            Ql[r, a] = Q[uniq[r], a]
    return Ql, np.zeros((max(m, 1), K)), bl, np.zeros(max(m, 1))


@njit(cache=True)
def row_grad(r, g, l2, B, x, Ql, G, bl, Gb):
    """G[r] += g·p + 2·l2·q_r / B and Gb[r] += g + 2·l2·b_r / B: the gradient of one visit's loss
    whose derivative in the score is g (the bias's share is dropped by the caller when the model
    has no item bias)."""
    K = Ql.shape[1]
    for a in range(K):
        G[r, a] += g * x[a] + 2.0 * l2 * Ql[r, a] / B
    Gb[r] += g + 2.0 * l2 * bl[r] / B


@njit(cache=True)
def positive_grad(r, strength, alpha, l2, B, x, Ql, G, bl, Gb):
    """∂/∂(q_r, b_r) of (1/B)(1 + α·strength)(1 − β − b_r − p·q_r)² + L2, for one positive."""
    c = 1.0 + alpha * strength
    row_grad(r, -2.0 * c * (1.0 - score(x, Ql, bl, r)) / B, l2, B, x, Ql, G, bl, Gb)


@njit(cache=True)
def write_biases(uniq, m, bl, b, base, length, d_b):
    """Bias deltas bl[t] − b[uniq[t]] into slots [base, base + length) (zeros past m)."""
    for t in range(length):
        d_b[base + t] = bl[t] - b[uniq[t]] if t < m else 0.0


@njit(cache=True, parallel=True)
def fedrecon_implicit_clients(data, clients, glob, cfg, hp, ids, n_items, out):
    """FedRecon ClientUpdate for implicit feedback (weighted-ALS reconstruction, sampled negatives).

    data : (indptr, items, strengths) user-grouped CSR;  glob : (Q (n_items, K), side (the
    ``solve_implicit_row`` side the server broadcasts: Gram of [Q, 1 if user biases], the item
    biases as offset or none, their projection), b (n_items,) item biases);  cfg :
    ``layout.implicit_cfg``;  hp : ``layout.sgd_hp`` of the update (lr, L2, batch, k_u, epochs);
    out : (offsets from ``implicit_slots``, d_items, d_Q, losses, d_b).

    With s = β + b_i + p·q_i (β, b only where the model has them), the client's local loss on a
    batch of B query positives and the B·m items drawn uniformly from the catalog (weak
    negatives) is
        (1/B) Σ_pos (1 + alpha·r)(1 − s_i)² + ν (1/(B·m)) Σ_neg s_j² + L2,
    an unbiased mini-batch estimate of mean-over-positives + ν·mean-over-catalog. p and β are
    reconstructed exactly (``solve_implicit_row``) from the support set and frozen; the rows and,
    with item biases, their biases move. Clients are taken largest first from a shared queue, as
    in ``fedrecon_clients``.
    """
    Q, side, b = glob[0], glob[1], glob[2]
    offsets, d_items, d_Q, losses, d_b = out[0], out[1], out[2], out[3], out[4]
    alpha, fit_b = cfg[IC_ALPHA], cfg[IC_ITEM_BIAS] > 0.0
    m_neg, nu = int(cfg[IC_NEG]), cfg[IC_NEG_WEIGHT]
    lr, l2 = hp[HP_LR], hp[HP_LAM]
    queue = client_queue(data[0], clients)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            u = clients[k]
            state = np.array([client_key(ids, u)])
            q_items, q_vals, x = implicit_client_start(data, u, Q, side, cfg, state)
            n_q = q_items.shape[0]
            # the visit order of the query positives, then the negatives drawn for each visit
            visit, ends, steps = minibatch_schedule(n_q, int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                                    int(hp[HP_EPOCHS]), state)
            n_neg = m_neg * (ends[steps - 1] if steps > 0 else 0)
            all_items = np.empty(n_q + n_neg, np.int64)
            for t in range(n_q):
                all_items[t] = q_items[t]
            for t in range(n_neg):
                all_items[n_q + t] = next_below(state, n_items)
            uniq = np.empty(max(n_q + n_neg, 1), np.int64)
            loc = np.empty(max(n_q + n_neg, 1), np.int64)
            mrows = unique_rows(all_items, uniq, loc)
            Ql, G, bl, Gb = local_rows(Q, b, uniq, mrows)
            store(losses, np.int64(k), confidence_loss(q_items, q_vals, Q, b, alpha, x))
            # k_u steps: step s covers visits [ends[s-1], ends[s]) and their negatives
            v = 0
            for s in range(steps):
                end = ends[s]
                B = end - v
                for t in range(v, end):
                    positive_grad(loc[visit[t]], q_vals[visit[t]], alpha, l2, B, x, Ql, G, bl, Gb)
                    for h in range(m_neg):
                        rn = loc[n_q + t * m_neg + h]
                        row_grad(rn, 2.0 * nu * score(x, Ql, bl, rn) / (B * m_neg), 0.0, B, x,
                                 Ql, G, bl, Gb)
                for t in range(v, end):
                    for h in range(1 + m_neg):
                        r = loc[visit[t]] if h == 0 else loc[n_q + t * m_neg + h - 1]
                        for a in range(Ql.shape[1]):
                            Ql[r, a] -= lr * G[r, a]
                            G[r, a] = 0.0
                        if fit_b:
                            bl[r] -= lr * Gb[r]
                        Gb[r] = 0.0
                v = end
            length = offsets[k + 1] - offsets[k]
            write_rows(uniq, mrows, Ql, Q, offsets[k], length, d_items, d_Q)
            write_biases(uniq, mrows, bl, b, offsets[k], length, d_b)
            k = take(queue)


@njit(cache=True, parallel=True)
def fedrecon_implicit_full_clients(data, clients, glob, cfg, hp, ids, n_items, out):
    """Like ``fedrecon_implicit_clients`` but with the exact full-catalog negative term.

    Local loss per step: (1/B) Σ_pos c (1 − p·q_i)² + ν · (1/n_items) Σ_all j (p·q_j)² + L2.
    With p frozen, S steps of the negative term map every row q_j ↦ (I − η p pᵀ)^S q_j,
    η = lr·2ν/n_items, i.e. q_j − (γ/‖p‖²)(p·q_j) p with γ = 1 − (1 − η‖p‖²)^S. So a client
    uploads (a) for its positive rows the exact delta minus that rank-1 part, and (b) the K×K
    matrix W = (γ/‖p‖²) p pᵀ; the server adds −Q · Σ_u w_u W_u / Σ w to the mean delta, which
    equals averaging the dense n_items × K deltas exactly. (W reveals p up to sign: deploy it
    under secure aggregation.)

    out : (offsets (query sizes), d_items, d_Q, losses, W (m, K, K) float64).
    Clients are taken largest first from a shared queue, as in ``fedrecon_clients``.
    """
    Q, side, b = glob[0], glob[1], glob[2]  # the model has no biases here (b is zeros)
    offsets, d_items, d_Q, losses, Wm = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    alpha, nu = cfg[IC_ALPHA], cfg[IC_NEG_WEIGHT]
    lr, l2 = hp[HP_LR], hp[HP_LAM]
    eta = lr * 2.0 * nu / n_items
    queue = client_queue(data[0], clients)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            u = clients[k]
            state = np.array([client_key(ids, u)])
            q_items, q_vals, x = implicit_client_start(data, u, Q, side, cfg, state)
            p = x[:K]
            n_q = q_items.shape[0]
            uniq = np.empty(max(n_q, 1), np.int64)
            loc = np.empty(max(n_q, 1), np.int64)
            m = unique_rows(q_items, uniq, loc)
            Ql, G, bl, Gb = local_rows(Q, b, uniq, m)
            store(losses, np.int64(k), confidence_loss(q_items, q_vals, Q, b, alpha, x))
            visit, ends, steps = minibatch_schedule(n_q, int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                                    int(hp[HP_EPOCHS]), state)
            start = 0
            for s in range(steps):
                end = ends[s]
                B = end - start
                for t in range(start, end):
                    positive_grad(loc[visit[t]], q_vals[visit[t]], alpha, l2, B, x, Ql, G, bl, Gb)
                for r in range(m):  # every positive row also feels the negative term
                    dot = 0.0
                    for a in range(K):
                        dot += p[a] * Ql[r, a]
                    for a in range(K):
                        Ql[r, a] -= lr * G[r, a] + eta * dot * p[a]
                        G[r, a] = 0.0
                start = end
            pp = 0.0
            for a in range(K):
                pp += p[a] * p[a]
            gamma = 1.0 - (1.0 - eta * pp) ** steps if pp > 0 else 0.0
            scale = gamma / pp if pp > 0 else 0.0
            write_outer(Wm, k, p, scale)
            base = offsets[k]
            write_rows(uniq, m, Ql, Q, base, offsets[k + 1] - base, d_items, d_Q)
            for r in range(m):  # exact delta minus the rank-1 part the server applies, rounded once
                dot = 0.0
                for a in range(K):
                    dot += p[a] * Q[uniq[r], a]
                for a in range(K):
                    d_Q[base + r, a] = (Ql[r, a] - Q[uniq[r], a]) + scale * dot * p[a]
            k = take(queue)
