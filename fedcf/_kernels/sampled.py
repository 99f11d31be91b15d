"""The dot-product sampled-negative baselines (FedMF, PFedRec): mini-batch SGD on the binary
cross-entropy of score = u·e_i + c + b_i.

``dot_local`` is one device's pass given everything random (the negatives and each epoch's
order), a pure function of its arrays. ``device_pass`` draws those from the device's stream and
runs it; ``sampled_clients`` is a round's client work (``prange`` over the devices, outputs as
``clients.py``); ``sampled_fold_in`` and ``personal_scores`` serve users on their devices.
``fedcf._reference.sampled`` holds the NumPy twins.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .rng import client_key, next_below, shuffle_inplace, stream_key
from .sgd import write_rows
from .util import QUEUE_WORKERS, client_queue, store, take, unique_rows

USER, ITEMS = 1, 2  # stage bits


@njit(cache=True)
def _sigmoid(s):
    if s >= 0.0:
        return 1.0 / (1.0 + np.exp(-s))
    z = np.exp(s)
    return z / (1.0 + z)


@njit(cache=True)
def _batch(u, c, e, b, rows, y, stage, lr, item_lr, lam, ds):
    """One stage on one batch (``rows``: local item row of each example; ``y`` its label);
    returns the batch's mean loss before the step."""
    m, d = len(rows), len(u)
    loss = 0.0
    for j in range(m):
        r = rows[j]
        s = c[0] + b[r, 0]
        for f in range(d):
            s += u[f] * e[r, f]
        loss += max(s, 0.0) + np.log1p(np.exp(-abs(s))) - y[j] * s
        ds[j] = (_sigmoid(s) - y[j]) / m
    old = u.copy()
    if stage & USER:
        gc = 0.0
        for j in range(m):
            gc += ds[j]
        for f in range(d):
            g = 0.0
            for j in range(m):
                g += ds[j] * e[rows[j], f]
            u[f] -= lr * (g + lam * old[f])
        c[0] -= lr * (gc + lam * c[0])
    if stage & ITEMS:
        if lam > 0.0:  # weight decay reaches every local row, as a dense optimizer's does
            for r in range(len(e)):
                b[r, 0] -= item_lr * lam * b[r, 0]
                for f in range(d):
                    e[r, f] -= item_lr * lam * e[r, f]
        for j in range(m):
            r = rows[j]
            b[r, 0] -= item_lr * ds[j]
            for f in range(d):
                e[r, f] -= item_lr * ds[j] * old[f]
    return loss / m


@njit(cache=True)
def batch_span(n, nb, k):
    """Size of batch k when n examples are cut into nb near-equal batches, as
    ``np.array_split`` cuts them (the first n % nb batches one larger)."""
    return n // nb + (1 if k < n % nb else 0)


@njit(cache=True)
def gather_batch(order, t, start, size, idx, y, rows, ys):
    """rows[:size], ys[:size] = the local rows and labels of epoch t's examples
    order[t, start:start + size] (idx holds epoch t's rows at t·n + example)."""
    n = order.shape[1]
    for j in range(size):
        ex = order[t, start + j]
        rows[j] = idx[t * n + ex]
        ys[j] = y[ex]


@njit(cache=True)
def dot_local(u, c, e, b, idx, y, order, batch, stages, lr, item_lr, lam):
    """Local epochs over a device's examples, updating u (d,), c (1,), the local item rows
    e (m, d) and b (m, 1) in place.

    idx (epochs·n,): local row of example k in epoch t at t·n + k; y (n,): labels; order
    (epochs, n): each epoch's permutation, cut into ceil(n / batch) near-equal batches as
    ``np.array_split`` cuts it; stages: per batch, the stage bits applied in turn (USER, ITEMS).
    Returns the mean over batches of the last stage's loss.
    """
    epochs, n = order.shape
    nb = max(1, -(-n // batch))
    ds = np.empty(n // nb + 1)
    rows = np.empty(n // nb + 1, np.int64)
    ys = np.empty(n // nb + 1)
    total, count = 0.0, 0
    for t in range(epochs):
        start = 0
        for k in range(nb):
            size = batch_span(n, nb, k)
            gather_batch(order, t, start, size, idx, y, rows, ys)
            loss = 0.0
            for st in stages:
                loss = _batch(u, c, e, b, rows[:size], ys[:size], st, lr, item_lr, lam, ds)
            total += loss
            count += 1
            start += size
    return total / count


# ---------------------------------------------------------------------- a round's devices
# cfg of the round kernels: negatives per positive, local epochs, batch size, user and dense step,
# item step, weight decay, whether the device uploads its item delta (0: federation off)
SC_NEG, SC_EPOCHS, SC_BATCH, SC_LR, SC_ITEM_LR, SC_LAM, SC_SHARE = range(7)


@njit(cache=True)
def in_sorted(row, x):
    """Whether x is in the sorted 1-d array ``row`` (binary search)."""
    lo, hi = 0, row.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if row[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo < row.shape[0] and row[lo] == x


@njit(cache=True)
def draw_negative(excluded, n_items, state):
    """An item drawn uniformly from those not in the sorted ``excluded`` (rejection; the caller
    guarantees one exists)."""
    while True:
        r = next_below(state, n_items)
        if not in_sorted(excluded, r):
            return r


@njit(cache=True)
def draw_device(pos, excluded, n_items, neg, epochs, state):
    """Everything random of one device's local epochs, drawn from ``state`` in this order: for
    each epoch ``neg`` negatives per positive outside ``excluded`` (sorted), then each epoch's
    random order of its positives and negatives.

    Returns (uniq, m, loc, order, y): the m distinct items touched (uniq[:m], sorted), the local
    row of example k of epoch t at loc[t·nx + k], the orders (epochs, nx) and the labels (nx,).
    """
    n = pos.shape[0]
    nx = n * (1 + neg)
    all_items = np.empty(max(epochs * nx, 1), np.int64)
    for t in range(epochs):
        for j in range(n):
            all_items[t * nx + j] = pos[j]
        for j in range(n * neg):
            all_items[t * nx + n + j] = draw_negative(excluded, n_items, state)
    order = np.empty((epochs, nx), np.int64)
    for t in range(epochs):
        for j in range(nx):
            order[t, j] = j
        shuffle_inplace(order[t], state)
    uniq = np.empty(max(epochs * nx, 1), np.int64)
    loc = np.empty(max(epochs * nx, 1), np.int64)
    m = unique_rows(all_items[:epochs * nx], uniq, loc)
    y = np.zeros(nx)
    y[:n] = 1.0
    return uniq, m, loc, order, y


@njit(cache=True)
def device_pass(pos, excluded, Q, b, u, c, cfg, stages, epochs, state):
    """One device's local training from the global rows (Q, b) and its user part (u (K,),
    c (1,), float64, updated in place): ``draw_device`` draws the negatives and orders, then
    ``dot_local`` runs the epochs.

    Returns (mean batch loss, m, uniq (m used), the local rows e (m, K), their biases (m, 1)).
    """
    K = Q.shape[1]
    uniq, m, loc, order, y = draw_device(pos, excluded, Q.shape[0], int(cfg[SC_NEG]), epochs,
                                         state)
    e = np.empty((max(m, 1), K))
    bl = np.zeros((max(m, 1), 1))
    for r in range(m):
        bl[r, 0] = b[uniq[r]]
        for a in range(K):
            e[r, a] = Q[uniq[r], a]
    if pos.shape[0] == 0 or epochs == 0:
        return 0.0, m, uniq, e, bl
    loss = dot_local(u, c, e, bl, loc, y, order, int(cfg[SC_BATCH]), stages, cfg[SC_LR],
                     cfg[SC_ITEM_LR], cfg[SC_LAM])
    return loss, m, uniq, e, bl


@njit(cache=True)
def _write_bias_deltas(uniq, m, bl, b, base, length, d_b):
    for t in range(length):
        d_b[base + t] = bl[t, 0] - b[uniq[t]] if t < m else 0.0


@njit(cache=True, parallel=True)
def sampled_clients(data, clients, glob, local, excl, cfg, stages, ids, out):
    """FedMF / PFedRec ClientUpdate of one round: each device trains from the global rows and its
    own kept user part (local = (P, c), row ``clients[k]`` overwritten with the trained value
    when it stays finite) and writes the delta of the item rows it touched (positives and
    negatives) into its slots, as ``clients.fedrecon_clients`` does; with cfg[SC_SHARE] = 0 it
    uploads nothing (every slot item −1). excl = (indptr, items): the sorted items each user
    never draws as a negative (its own included). out = (offsets, d_items, d_Q, d_b, losses).
    Each device's randomness is its own stream (seed, round, client id)."""
    indptr, items = data[0], data[1]
    Q, b, P, c = glob[0], glob[1], local[0], local[1]
    eptr, eitems = excl[0], excl[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    K, epochs, share = Q.shape[1], int(cfg[SC_EPOCHS]), cfg[SC_SHARE] > 0.0
    queue = client_queue(indptr, clients)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            u = clients[k]
            state = np.array([client_key(ids, u)])
            uv = np.empty(K)
            for a in range(K):
                uv[a] = P[u, a]
            cb = np.zeros(1)
            cb[0] = c[u]
            loss, m, uniq, e, bl = device_pass(items[indptr[u]:indptr[u + 1]],
                                               eitems[eptr[u]:eptr[u + 1]], Q, b, uv, cb, cfg,
                                               stages, epochs, state)
            store(losses, np.int64(k), loss)
            length = offsets[k + 1] - offsets[k]
            mm = m if share else 0
            write_rows(uniq, mm, e, Q, offsets[k], length, d_items, d_Q)
            _write_bias_deltas(uniq, mm, bl, b, offsets[k], length, d_b)
            finite = np.isfinite(cb[0])
            for a in range(K):
                finite = finite and np.isfinite(uv[a])
            if finite:  # a diverged device keeps its old row; the server drops its delta too
                for a in range(K):
                    P[u, a] = uv[a]
                c[u] = cb[0]
            k = take(queue)


@njit(cache=True, parallel=True)
def sampled_fold_in(indptr, items, excl, Q, b, cfg, epochs, seed, keys, P, c):
    """Users unseen in training, each on their own device: the user part (P[r], c[r], from
    zero) trained for ``epochs`` local epochs with every global row frozen (a logistic
    regression on the device's positives and fresh negatives). Row r's stream is keyed by
    keys[r] alone, so a user's result does not depend on who shares the call."""
    eptr, eitems = excl[0], excl[1]
    user_only = np.array([USER], np.int64)
    for r in prange(indptr.shape[0] - 1):
        state = np.array([stream_key(seed, 1, keys[r])])
        u = np.zeros(Q.shape[1])
        cb = np.zeros(1)
        device_pass(items[indptr[r]:indptr[r + 1]], eitems[eptr[r]:eptr[r + 1]], Q, b, u, cb,
                    cfg, user_only, epochs, state)
        P[r] = u
        c[r] = cb[0]


@njit(cache=True, parallel=True)
def personal_scores(indptr, items, excl, Q, b, P, c, cfg, stages, seed, keys, out):
    """PFedRec's scores of every item for each row's user: the device finetunes the global rows
    (and a copy of its score function P[r], c[r]) for one local pass, as in a round, and scores
    with its personal rows; nothing is uploaded. Row r's stream is keyed by keys[r] alone."""
    eptr, eitems = excl[0], excl[1]
    K = Q.shape[1]
    for r in prange(indptr.shape[0] - 1):
        state = np.array([stream_key(seed, 2, keys[r])])
        u = P[r].astype(np.float64)
        cb = np.array([np.float64(c[r])])
        _, m, uniq, e, bl = device_pass(items[indptr[r]:indptr[r + 1]],
                                        eitems[eptr[r]:eptr[r + 1]], Q, b, u, cb, cfg, stages,
                                        int(cfg[SC_EPOCHS]), state)
        for i in range(Q.shape[0]):
            s = cb[0] + b[i]
            for a in range(K):
                s += u[a] * Q[i, a]
            out[r, i] = s
        for t in range(m):
            s = cb[0] + bl[t, 0]
            for a in range(K):
                s += u[a] * e[t, a]
            out[r, uniq[t]] = s
