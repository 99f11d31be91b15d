"""Client work of one round for explicit ratings, in one call: ``prange`` over the sampled clients,
each writing its own slots of preallocated outputs. Each client's randomness comes from its own
stream (seed, round, client id), so nothing depends on the thread count.

Output slots: client k writes its sparse delta of (Q, b) to rows [offsets[k], offsets[k+1]) of
``d_items`` / ``d_Q`` / ``d_b`` (distinct items first, then item −1 padding) and its query loss
before the update to ``losses[k]``. Its weight, the query size, is known to the host before the
call (it lays out the slots), so the kernel does not write it. Local parameters never reach an
output of ``fedrecon_clients``. Tuple members are read by index (see util.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .als import ridge_scratch, solve_ridge_row
from .dense import solve_square
from .layout import (
    CC_ALS_LAM,
    CC_ALS_LAM0,
    CC_INIT,
    CC_INIT_SCALE,
    CC_RECON,
    CC_SPLIT,
    CC_SUPPORT_FRAC,
    HP_FIT_BIAS,
    HP_OFFSET,
    RECON_ALS,
    SPLIT_NONE,
    SPLIT_RANDOM,
)
from .rng import client_key, shuffle_inplace
from .sgd import init_local, item_steps_user, item_work, sgd_reconstruct_user, write_delta
from .util import QUEUE_WORKERS, client_queue, gather_entries, take


@njit(cache=True)
def n_support(n, split, frac):
    """Support size of a client with n examples (the query gets the rest; NO SPLIT reuses all)."""
    if split == SPLIT_NONE:
        return n
    s = int(np.ceil(n * frac - 1e-9))
    return min(max(s, 1 if n > 0 else 0), n)


@njit(cache=True)
def query_sizes(counts, split, frac):
    """Query size of each client (its weight n_i in the aggregate)."""
    out = np.empty(counts.shape[0], np.int64)
    for k in range(counts.shape[0]):
        n = counts[k]
        out[k] = n if split == SPLIT_NONE else n - n_support(n, split, frac)
    return out


@njit(cache=True)
def split_client(n, split, frac, state):
    """Order a client's n examples support first. Returns (perm, n_s, q_start): the support is
    perm[:n_s], the query perm[q_start:n] (NO SPLIT: both are all of perm). A random split
    consumes the client's stream; the others keep the stored (time) order."""
    perm = np.empty(max(n, 1), np.int64)
    for t in range(n):
        perm[t] = t
    if split == SPLIT_RANDOM:
        shuffle_inplace(perm[:n], state)
    n_s = n_support(n, split, frac)
    return perm, n_s, 0 if split == SPLIT_NONE else n_s


@njit(cache=True)
def client_sets(data, u, cfg, ids):
    """Client u's random stream (seed, round, u) and its (support, query) items and values,
    split as ``split_client`` says: (state, s_items, s_vals, q_items, q_vals)."""
    indptr, items, values = data[0], data[1], data[2]
    s0 = indptr[u]
    n = indptr[u + 1] - s0
    state = np.array([client_key(ids, u)])
    perm, n_s, q_start = split_client(n, int(cfg[CC_SPLIT]), cfg[CC_SUPPORT_FRAC], state)
    s_items, s_vals = gather_entries(items, values, s0, perm[:n_s])
    q_items, q_vals = gather_entries(items, values, s0, perm[q_start:n])
    return state, s_items, s_vals, q_items, q_vals


@njit(cache=True)
def reconstruct_local(s_items, s_vals, Q, b, cfg, recon_hp, state, p, cb):
    """Local (p, cb) from the support set with (Q, b) frozen: exact ridge or k_r SGD steps."""
    K = Q.shape[1]
    fit_bias = recon_hp[HP_FIT_BIAS] != 0.0
    if int(cfg[CC_RECON]) == RECON_ALS:
        A, rhs = solve_square(K + 1), np.empty(K + 1)
        ridge = np.array([cfg[CC_ALS_LAM], cfg[CC_ALS_LAM0], recon_hp[HP_OFFSET],
                          1.0 if fit_bias else 0.0])
        buf = ridge_scratch(Q, s_items.shape[0])
        solve_ridge_row(s_items, s_vals, Q, b, ridge, A, rhs, buf)
        for a in range(K):
            p[a] = rhs[a]
        cb[0] = rhs[K] if fit_bias else 0.0
    else:
        init_local(p, cb, int(cfg[CC_INIT]), cfg[CC_INIT_SCALE], state)
        sgd_reconstruct_user(s_items, s_vals, Q, b, recon_hp, p, cb, state)


@njit(cache=True)
def query_loss(items, vals, Q, b, mu, p, c):
    """Mean squared error of (p, c) on a query set (0 when it is empty)."""
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
    cfg : ``layout.client_cfg`` (split, support fraction, reconstruction method, init, ridge λ)
    recon_hp, update_hp : ``layout.sgd_hp`` for reconstruction (k_r) and the update (k_u)
    ids : uint64 [seed, round] or [seed, round, key per row] — each client's stream is
          stream_key(seed, round, client) (rng.client_key)
    out : (offsets int64 (m+1,), d_items int64, d_Q float, d_b float, losses float64 (m,));
          offsets must equal the cumsum of query_sizes(counts of the clients)
    The threads take clients, largest first, from a shared queue; only the timing depends on
    which thread runs which client.
    """
    Q, b = glob[0], glob[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    mu = update_hp[HP_OFFSET]
    queue = client_queue(data[0], clients)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            state, s_items, s_vals, q_items, q_vals = client_sets(data, clients[k], cfg, ids)
            p = np.zeros(K)
            cb = np.zeros(1)
            reconstruct_local(s_items, s_vals, Q, b, cfg, recon_hp, state, p, cb)
            losses[k] = query_loss(q_items, q_vals, Q, b, mu, p, cb[0])
            work = item_work(q_items.shape[0], K)
            m = item_steps_user(q_items, q_vals, Q, b, update_hp, p, cb, state, work)
            write_delta(work, m, Q, b, offsets[k], offsets[k + 1] - offsets[k],
                        (d_items, d_Q, d_b))
            k = take(queue)


@njit(cache=True, parallel=True)
def stateful_clients(data, clients, glob, local, update_hp, ids, out):
    """FedAvg / FedPer / FURL ClientUpdate: joint steps on the user's row and the item rows.

    local : (P (n_users, K), c (n_users,)) persistent user parameters; row ``clients[k]`` is read
    and overwritten with the client's trained value (clients are distinct, so no two threads share
    a row). update_hp should have joint = 1. Items as in ``fedrecon_clients``; no split.
    Clients are taken largest first from a shared queue, as in ``fedrecon_clients``.
    """
    indptr, items, values = data[0], data[1], data[2]
    Q, b = glob[0], glob[1]
    P, c = local[0], local[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    K = Q.shape[1]
    mu = update_hp[HP_OFFSET]
    queue = client_queue(data[0], clients)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            u = clients[k]
            s0, e0 = indptr[u], indptr[u + 1]
            state = np.array([client_key(ids, u)])
            p = np.empty(K)
            for a in range(K):
                p[a] = P[u, a]
            cb = np.zeros(1)
            cb[0] = c[u]
            losses[k] = query_loss(items[s0:e0], values[s0:e0], Q, b, mu, p, cb[0])
            work = item_work(e0 - s0, K)
            m = item_steps_user(items[s0:e0], values[s0:e0], Q, b, update_hp, p, cb, state, work)
            write_delta(work, m, Q, b, offsets[k], offsets[k + 1] - offsets[k], (d_items, d_Q, d_b))
            finite = np.isfinite(cb[0])
            for a in range(K):
                finite = finite and np.isfinite(p[a])
            if finite:  # a diverged client keeps its old row; the server drops its item delta too
                for a in range(K):
                    P[u, a] = p[a]
                c[u] = cb[0]
            k = take(queue)
