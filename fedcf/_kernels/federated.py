"""One round of client work in one call: ``prange`` over the sampled clients, each writing its own
slots of preallocated outputs. Randomness comes from each client's stream (seed, round, client id).

Output slots: client k writes its sparse delta of (Q, b) to rows [offsets[k], offsets[k+1]) of
``d_items`` / ``d_Q`` / ``d_b`` (distinct items first, then item −1 padding) and its query loss
before the update to ``losses[k]``. Its weight, the query size, is known to the host before the
call (it lays out the slots), so the kernel does not write it. Local parameters never reach an
output of ``fedrecon_clients``.

Numba note: tuple members are taken by index, and a kernel writes only what it must. With numba
0.68.1, stores inside a ``prange`` body into arrays unpacked from a tuple argument were lost, and
a plain store of an integer-derived weight was dropped by the parfor pass even with indexed
access (tests/test_kernels.py and tests/test_federated.py pin the behaviour that matters).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .als import solve_implicit_row, solve_ridge_row
from .rng import next_below, next_float, shuffle_inplace, stream_key
from .sgd import (
    HP_FIT_BIAS,
    HP_OFFSET,
    item_steps_user,
    item_work,
    sgd_reconstruct_user,
    unique_rows,
    write_delta,
)

# client_cfg layout (float64)
CC_SPLIT, CC_SUPPORT_FRAC, CC_RECON, CC_INIT, CC_INIT_SCALE, CC_ALS_LAM, CC_ALS_LAM0 = range(7)
SPLIT_NONE, SPLIT_RANDOM, SPLIT_TIME = 0, 1, 2
RECON_ALS, RECON_SGD = 0, 1
INIT_ZEROS, INIT_UNIFORM = 0, 1
# ids layout (uint64): [seed, round]


def client_cfg(split, support_fraction, recon, init, init_scale, als_lam, als_lam0):
    return np.array([split, support_fraction, recon, init, init_scale, als_lam, als_lam0],
                    dtype=np.float64)


@njit(cache=True)
def store(arr, k, value):
    """arr[k] = value. Inside a prange body, numba 0.68.1's parfor pass dropped some plain stores
    of values computed in the loop (module docstring); a store inside a called function is kept.
    """
    arr[k] = value


@njit(cache=True)
def n_support(n, split, frac):
    """Support size of a client with n examples (the query gets the rest; NO SPLIT reuses all)."""
    if split == SPLIT_NONE:
        return n
    s = int(np.ceil(n * frac - 1e-9))
    return min(max(s, 1 if n > 0 else 0), n)


@njit(cache=True)
def query_sizes(counts, split, frac):
    out = np.empty(counts.shape[0], np.int64)
    for k in range(counts.shape[0]):
        n = counts[k]
        out[k] = n if split == SPLIT_NONE else n - n_support(n, split, frac)
    return out


@njit(cache=True)
def split_client(n, cfg, state, perm):
    """perm[:n] = example order: support first (n_s), then query. Returns n_s.

    NO SPLIT returns n and the query is the whole of perm[:n] too.
    """
    split = int(cfg[CC_SPLIT])
    for t in range(n):
        perm[t] = t
    if split == SPLIT_RANDOM:
        shuffle_inplace(perm[:n], state)
    return n_support(n, split, cfg[CC_SUPPORT_FRAC])


@njit(cache=True)
def reconstruct_local(s_items, s_vals, Q, b, cfg, recon_hp, state, p, cb, scratch):
    """Local (p, cb) from the support set with (Q, b) frozen: exact ridge or k_r SGD steps."""
    K = Q.shape[1]
    fit_bias = recon_hp[HP_FIT_BIAS] != 0.0
    if int(cfg[CC_RECON]) == RECON_ALS:
        A, rhs, ridge = scratch[0], scratch[1], scratch[3]
        ridge[0] = cfg[CC_ALS_LAM]
        ridge[1] = cfg[CC_ALS_LAM0]
        ridge[2] = recon_hp[HP_OFFSET]
        ridge[3] = 1.0 if fit_bias else 0.0
        buf = np.empty((K + 2) * max(s_items.shape[0], 1), Q.dtype)
        solve_ridge_row(s_items, s_vals, Q, b, ridge, A, rhs, buf)
        for a in range(K):
            p[a] = rhs[a]
        cb[0] = rhs[K] if fit_bias else 0.0
    else:
        scale = cfg[CC_INIT_SCALE]
        uniform = int(cfg[CC_INIT]) == INIT_UNIFORM
        for a in range(K):
            p[a] = (2.0 * next_float(state) - 1.0) * scale if uniform else 0.0
        cb[0] = 0.0
        order = scratch[4]
        sgd_reconstruct_user(s_items, s_vals, Q, b, recon_hp, p, cb, state, order)


@njit(cache=True)
def _query_loss(items, vals, Q, b, mu, p, c):
    n = items.shape[0]
    if n == 0:
        return 0.0
    K = Q.shape[1]
    s = 0.0
    for t in range(n):
        j = items[t]
        pred = mu + b[j] + c
        for a in range(K):
            pred += p[a] * Q[j, a]
        e = vals[t] - pred
        s += e * e
    return s / n


@njit(cache=True, parallel=True)
def fedrecon_clients(data, clients, glob, cfg, recon_hp, update_hp, ids, out):
    """Federated Reconstruction ClientUpdate for every sampled client (Algorithm 1).

    data : (indptr int64, items int, values float64) user-grouped CSR of the training population
    clients : int64 (m,) dense ids of the sampled clients
    glob : (Q (n_items, K), b (n_items,)) global parameters g(t), read only
    cfg : float64 ``client_cfg`` (split, support fraction, reconstruction method, init, ridge λ)
    recon_hp, update_hp : float64 ``sgd_hp`` for reconstruction (k_r) and the update (k_u)
    ids : uint64 (2,) = [seed, round] — each client's stream is stream_key(seed, round, client)
    out : (offsets int64 (m+1,), d_items int64, d_Q float, d_b float, losses float64 (m,));
          offsets must equal the cumsum of query_sizes(counts of the clients)
    """
    # tuple members by index (see the module docstring)
    indptr, items, values = data[0], data[1], data[2]
    Q, b = glob[0], glob[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    mu = update_hp[HP_OFFSET]
    for k in prange(clients.shape[0]):
        u = clients[k]
        s0, e0 = indptr[u], indptr[u + 1]
        n = e0 - s0
        state = np.array([stream_key(ids[0], ids[1], u)])
        perm = np.empty(max(n, 1), np.int64)
        n_s = split_client(n, cfg, state, perm)
        q_start = 0 if int(cfg[CC_SPLIT]) == SPLIT_NONE else n_s
        n_q = n - q_start
        s_items = np.empty(n_s, items.dtype)
        s_vals = np.empty(n_s)
        for t in range(n_s):
            s_items[t] = items[s0 + perm[t]]
            s_vals[t] = values[s0 + perm[t]]
        q_items = np.empty(n_q, items.dtype)
        q_vals = np.empty(n_q)
        for t in range(n_q):
            q_items[t] = items[s0 + perm[q_start + t]]
            q_vals[t] = values[s0 + perm[q_start + t]]
        p = np.zeros(K)
        cb = np.zeros(1)
        scratch = (np.empty((K + 1, K + 1)), np.empty(K + 1), np.empty(K + 1), np.empty(4),
                   np.empty(max(n_s, 1), np.int64))
        reconstruct_local(s_items, s_vals, Q, b, cfg, recon_hp, state, p, cb, scratch)
        losses[k] = _query_loss(q_items, q_vals, Q, b, mu, p, cb[0])
        work = item_work(n_q, K)
        m = item_steps_user(q_items, q_vals, Q, b, update_hp, p, cb, state, work)
        write_delta(work, m, Q, b, offsets[k], offsets[k + 1] - offsets[k], (d_items, d_Q, d_b))


@njit(cache=True, parallel=True)
def stateful_clients(data, clients, glob, local, update_hp, ids, out):
    """FedAvg / FedPer / FURL ClientUpdate: joint steps on the user's row and the item rows.

    local : (P (n_users, K), c (n_users,)) persistent user parameters; row ``clients[k]`` is read
    and overwritten with the client's trained value (clients are distinct, so no two threads share
    a row). update_hp should have joint = 1. Items as in ``fedrecon_clients``; no split.
    """
    indptr, items, values = data[0], data[1], data[2]
    Q, b = glob[0], glob[1]
    P, c = local[0], local[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    mu = update_hp[HP_OFFSET]
    for k in prange(clients.shape[0]):
        u = clients[k]
        s0, e0 = indptr[u], indptr[u + 1]
        n = e0 - s0
        state = np.array([stream_key(ids[0], ids[1], u)])
        p = np.empty(K)
        for a in range(K):
            p[a] = P[u, a]
        cb = np.array([float(c[u])])
        losses[k] = _query_loss(items[s0:e0], values[s0:e0], Q, b, mu, p, cb[0])
        work = item_work(n, K)
        m = item_steps_user(items[s0:e0], values[s0:e0], Q, b, update_hp, p, cb, state, work)
        write_delta(work, m, Q, b, offsets[k], offsets[k + 1] - offsets[k], (d_items, d_Q, d_b))
        finite = np.isfinite(cb[0])
        for a in range(K):
            finite = finite and np.isfinite(p[a])
        if finite:  # a diverged client keeps its old row; the server drops its item delta too
            for a in range(K):
                P[u, a] = p[a]
            c[u] = cb[0]


@njit(cache=True)
def _sum_run(order, lo, hi, d_Q, d_b, scale, out_Q, out_b, m):
    K = d_Q.shape[1]
    for a in range(K):
        out_Q[m, a] = 0.0
    out_b[m] = 0.0
    for t in range(lo, hi):
        e = order[t]
        w = scale[e]
        for a in range(K):
            out_Q[m, a] += w * d_Q[e, a]
        out_b[m] += w * d_b[e]


@njit(cache=True, parallel=True)
def sum_sorted_runs(order, d_items, d_Q, d_b, scale, out_Q, out_b, out_items):
    """Deterministic sparse reduction: Σ scale[e] · delta[e] per item, over entries ``order``
    sorted by item (stable, so ties keep client order). Entries with scale 0 are skipped.

    out_Q (≥ m, K) float64, out_b, out_items (≥ m) receive the m distinct items. Returns m.
    Each item's sum is one thread's sequential loop in that fixed order, so the result does not
    depend on the thread count.
    """
    n = order.shape[0]
    keep = np.empty(n, np.int64)
    nk = 0
    for t in range(n):
        if scale[order[t]] != 0.0:
            keep[nk] = order[t]
            nk += 1
    starts = np.empty(nk + 1, np.int64)
    m = 0
    last = -1
    for t in range(nk):
        j = d_items[keep[t]]
        if j != last:
            starts[m] = t
            out_items[m] = j
            m += 1
            last = j
    starts[m] = nk
    for r in prange(m):
        _sum_run(keep, starts[r], starts[r + 1], d_Q, d_b, scale, out_Q, out_b, r)
    return m


# ---------------------------------------------------------------------- implicit feedback
# implicit client cfg layout (float64)
IC_SPLIT, IC_SUPPORT_FRAC, IC_ALPHA, IC_LAM, IC_NEG, IC_NEG_WEIGHT = range(6)


@njit(cache=True)
def processed_examples(n, bs, max_steps, epochs):
    """How many examples k_u mini-batch steps visit (batches of bs, ≤ max_steps, ≤ epochs)."""
    if n == 0 or max_steps <= 0:
        return 0
    per_epoch = (n + bs - 1) // bs
    full_epochs = min(epochs, max_steps // per_epoch)
    seen = full_epochs * n
    left_steps = max_steps - full_epochs * per_epoch
    if full_epochs < epochs and left_steps > 0:
        seen += min(n, left_steps * bs)
    return seen


@njit(cache=True)
def implicit_slots(counts, cfg, hp):
    """Output slots per client: its query positives plus every sampled negative."""
    out = np.empty(counts.shape[0], np.int64)
    split, frac = int(cfg[IC_SPLIT]), cfg[IC_SUPPORT_FRAC]
    for k in range(counts.shape[0]):
        n = counts[k]
        n_q = n if split == SPLIT_NONE else n - n_support(n, split, frac)
        seen = processed_examples(n_q, int(hp[2]), int(hp[3]), int(hp[4]))
        out[k] = n_q + int(cfg[IC_NEG]) * seen
    return out


@njit(cache=True)
def implicit_client_start(data, u, Q, gram, cfg, state):
    """Split client u's data and reconstruct p from its support set by the weighted-ALS solve.

    Returns (perm, q_start, n_q, p): the client's example order (support first), where its
    query starts, the query size, and p (float64, K). Consumes the stream only for a random split.
    """
    indptr, items, values = data[0], data[1], data[2]
    s0, e0 = indptr[u], indptr[u + 1]
    n = e0 - s0
    K = Q.shape[1]
    perm = np.empty(max(n, 1), np.int64)
    split = int(cfg[IC_SPLIT])
    for t in range(n):
        perm[t] = t
    if split == SPLIT_RANDOM:
        shuffle_inplace(perm[:n], state)
    n_s = n_support(n, split, cfg[IC_SUPPORT_FRAC])
    q_start = 0 if split == SPLIT_NONE else n_s
    s_items = np.empty(n_s, items.dtype)
    s_vals = np.empty(n_s)
    for t in range(n_s):
        s_items[t] = items[s0 + perm[t]]
        s_vals[t] = values[s0 + perm[t]]
    A = np.empty((K, K))
    p = np.empty(K)
    buf = np.empty((K + 1) * max(n_s, 1), Q.dtype)
    solve_implicit_row(s_items, s_vals, Q, gram, cfg[IC_ALPHA], cfg[IC_LAM], A, p, buf)
    return perm, q_start, n - q_start, p


@njit(cache=True, parallel=True)
def fedrecon_implicit_clients(data, clients, glob, cfg, hp, ids, n_items, out):
    """FedRecon ClientUpdate for implicit feedback (weighted-ALS reconstruction, sampled negatives).

    data : (indptr, items, strengths) user-grouped CSR;  glob : (Q (n_items, K), gram = QᵀQ (K, K)
    float64, broadcast by the server);  cfg : float64 [split, support fraction, alpha, recon λ,
    negatives per positive m, negative weight ν];  hp : ``sgd_hp`` of the update (lr, L2, batch,
    k_u, epochs);  out : (offsets from ``implicit_slots``, d_items, d_Q, losses).

    The client's local loss on a batch of B query positives and the B·m items drawn uniformly
    from the catalog (weak negatives) is
        (1/B) Σ_pos (1 + alpha·r)(1 − p·q_i)² + ν (1/(B·m)) Σ_neg (p·q_j)² + L2,
    an unbiased mini-batch estimate of mean-over-positives + ν·mean-over-catalog. p is
    reconstructed exactly (``solve_implicit_row``) from the support set and frozen.
    """
    indptr, items, values = data[0], data[1], data[2]
    Q, gram = glob[0], glob[1]
    offsets, d_items, d_Q, losses = out[0], out[1], out[2], out[3]
    K = Q.shape[1]
    alpha = cfg[IC_ALPHA]
    m_neg, nu = int(cfg[IC_NEG]), cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs = hp[0], hp[1], int(hp[2]), int(hp[3]), int(hp[4])
    for k in prange(clients.shape[0]):
        u = clients[k]
        s0 = indptr[u]
        state = np.array([stream_key(ids[0], ids[1], u)])
        perm, q_start, n_q, p = implicit_client_start(data, u, Q, gram, cfg, state)
        # the visit order of the query positives, then the negatives drawn for each visit
        seen = processed_examples(n_q, bs, max_steps, epochs)
        visit = np.empty(max(seen, 1), np.int64)
        batch_end = np.empty(max(seen, 1), np.int64)
        pos_order = np.empty(max(n_q, 1), np.int64)
        v = 0
        steps = 0
        for _ in range(epochs):
            if steps >= max_steps or n_q == 0:
                break
            for t in range(n_q):
                pos_order[t] = q_start + t
            shuffle_inplace(pos_order[:n_q], state)
            for start in range(0, n_q, bs):
                if steps >= max_steps:
                    break
                for t in range(start, min(n_q, start + bs)):
                    visit[v] = pos_order[t]
                    v += 1
                batch_end[steps] = v
                steps += 1
        n_neg = m_neg * seen
        all_items = np.empty(n_q + n_neg, np.int64)
        for t in range(n_q):
            all_items[t] = items[s0 + perm[q_start + t]]
        for t in range(n_neg):
            all_items[n_q + t] = next_below(state, n_items)
        uniq = np.empty(max(n_q + n_neg, 1), np.int64)
        loc = np.empty(max(n_q + n_neg, 1), np.int64)
        mrows = unique_rows(all_items, uniq, loc)
        Ql = np.empty((max(mrows, 1), K))
        G = np.zeros((max(mrows, 1), K))
        for r in range(mrows):
            for a in range(K):
                Ql[r, a] = Q[uniq[r], a]
        # query loss before the update (positives only, confidence-weighted)
        tot = 0.0
        for t in range(n_q):
            j = all_items[t]
            dot = 0.0
            for a in range(K):
                dot += p[a] * Q[j, a]
            c = 1.0 + alpha * values[s0 + perm[q_start + t]]
            tot += c * (1.0 - dot) * (1.0 - dot)
        store(losses, k, tot / n_q if n_q > 0 else 0.0)  # see ``store``
        # k_u steps: step b covers visits [batch_end[b-1], batch_end[b]) and their negatives
        v = 0
        for b_ in range(steps):
            end = batch_end[b_]
            B = end - v
            for t in range(v, end):
                r = loc[visit[t] - q_start]
                c = 1.0 + alpha * values[s0 + perm[visit[t]]]
                dot = 0.0
                for a in range(K):
                    dot += p[a] * Ql[r, a]
                g = -2.0 * c * (1.0 - dot) / B
                for a in range(K):
                    G[r, a] += g * p[a] + 2.0 * l2 * Ql[r, a] / B
                for h in range(m_neg):
                    rn = loc[n_q + t * m_neg + h]
                    dn = 0.0
                    for a in range(K):
                        dn += p[a] * Ql[rn, a]
                    gn = 2.0 * nu * dn / (B * m_neg)
                    for a in range(K):
                        G[rn, a] += gn * p[a]
            for t in range(v, end):
                rows_touched = 1 + m_neg
                for h in range(rows_touched):
                    r = loc[visit[t] - q_start] if h == 0 else loc[n_q + t * m_neg + h - 1]
                    for a in range(K):
                        Ql[r, a] -= lr * G[r, a]
                        G[r, a] = 0.0
            v = end
        base = offsets[k]
        for t in range(offsets[k + 1] - base):
            if t < mrows:
                j = uniq[t]
                d_items[base + t] = j
                for a in range(K):
                    d_Q[base + t, a] = Ql[t, a] - Q[j, a]
            else:
                d_items[base + t] = -1
                for a in range(K):
                    d_Q[base + t, a] = 0.0


@njit(cache=True)
def write_outer(W, k, p, scale):
    """W[k] = scale · p pᵀ (through a call, see ``store``)."""
    K = p.shape[0]
    for a in range(K):
        for c in range(K):
            W[k, a, c] = scale * p[a] * p[c]


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
    """
    indptr, items, values = data[0], data[1], data[2]
    Q, gram = glob[0], glob[1]
    offsets, d_items, d_Q, losses, Wm = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    alpha, nu = cfg[IC_ALPHA], cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs = hp[0], hp[1], int(hp[2]), int(hp[3]), int(hp[4])
    eta = lr * 2.0 * nu / n_items
    for k in prange(clients.shape[0]):
        u = clients[k]
        s0 = indptr[u]
        state = np.array([stream_key(ids[0], ids[1], u)])
        perm, q_start, n_q, p = implicit_client_start(data, u, Q, gram, cfg, state)
        q_items = np.empty(max(n_q, 1), np.int64)
        for t in range(n_q):
            q_items[t] = items[s0 + perm[q_start + t]]
        uniq = np.empty(max(n_q, 1), np.int64)
        loc = np.empty(max(n_q, 1), np.int64)
        m = unique_rows(q_items[:n_q], uniq, loc)
        Ql = np.empty((max(m, 1), K))
        G = np.zeros((max(m, 1), K))
        for r in range(m):
            for a in range(K):
                Ql[r, a] = Q[uniq[r], a]
        tot = 0.0
        for t in range(n_q):
            dot = 0.0
            for a in range(K):
                dot += p[a] * Ql[loc[t], a]
            c = 1.0 + alpha * values[s0 + perm[q_start + t]]
            tot += c * (1.0 - dot) * (1.0 - dot)
        store(losses, k, tot / n_q if n_q > 0 else 0.0)
        order = np.empty(max(n_q, 1), np.int64)
        steps = 0
        for _ in range(epochs):
            if steps >= max_steps or n_q == 0:
                break
            for t in range(n_q):
                order[t] = t
            shuffle_inplace(order[:n_q], state)
            for start in range(0, n_q, bs):
                if steps >= max_steps:
                    break
                end = min(n_q, start + bs)
                B = end - start
                for t in range(start, end):
                    r = loc[order[t]]
                    c = 1.0 + alpha * values[s0 + perm[q_start + order[t]]]
                    dot = 0.0
                    for a in range(K):
                        dot += p[a] * Ql[r, a]
                    g = -2.0 * c * (1.0 - dot) / B
                    for a in range(K):
                        G[r, a] += g * p[a] + 2.0 * l2 * Ql[r, a] / B
                for r in range(m):  # every positive row also feels the negative term
                    dot = 0.0
                    for a in range(K):
                        dot += p[a] * Ql[r, a]
                    for a in range(K):
                        Ql[r, a] -= lr * G[r, a] + eta * dot * p[a]
                        G[r, a] = 0.0
                steps += 1
        pp = 0.0
        for a in range(K):
            pp += p[a] * p[a]
        gamma = 1.0 - (1.0 - eta * pp) ** steps if pp > 0 else 0.0
        scale = gamma / pp if pp > 0 else 0.0
        write_outer(Wm, k, p, scale)
        base = offsets[k]
        for t in range(offsets[k + 1] - base):
            if t < m:
                j = uniq[t]
                d_items[base + t] = j
                dot = 0.0
                for a in range(K):
                    dot += p[a] * Q[j, a]
                for a in range(K):  # exact delta minus the rank-1 part the server applies
                    d_Q[base + t, a] = (Ql[t, a] - Q[j, a]) + scale * dot * p[a]
            else:
                d_items[base + t] = -1
                for a in range(K):
                    d_Q[base + t, a] = 0.0
