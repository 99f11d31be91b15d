"""FedNCF (federated NeuMF) and centralized NCF: mini-batch SGD on the binary cross-entropy of
the NeuMF logit, in place.

The logit of item row r for a user (p_g, p_m) is h·[p_g ⊙ q_g[r], a_L] + h_b, where a_0 =
[p_m, q_m[r]] and a_{l+1} = relu(a_l W_l + b_l). The dense parameters travel packed in one flat
vector ``theta`` (see ``dense_layout``). ``neumf_local`` is one device's pass given everything
random, a pure function of its arrays; ``neumf_device`` draws those from the device's stream and
runs it; ``neumf_clients`` is FedNCF's client work of a round and ``neumf_fold_in`` serves new
users on their devices; ``neumf_epochs`` is centralized NCF's epoch. The NumPy twins are in
``fedcf._reference.neumf`` (on ``sampled_nets.NeuMFNet``, whose gradients the tests check
against finite differences) and ``NCF._numpy_epoch``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .rng import client_key, stream_key
from .sampled import (
    SC_BATCH,
    SC_EPOCHS,
    SC_ITEM_LR,
    SC_LAM,
    SC_LR,
    SC_NEG,
    SC_SHARE,
    _sigmoid,
    batch_span,
    draw_device,
    gather_batch,
)
from .sgd import write_rows
from .util import QUEUE_WORKERS, client_queue, store, take

USER, ITEMS, DENSE = 1, 2, 4  # stage bits


@njit(cache=True)
def dense_layout(d, widths):
    """Offsets in ``theta`` of W_l (in_l × out_l, row-major), b_l, h and h_b, and each layer's
    input width: (off_W, off_b, ins, off_h, off_hb, size)."""
    L = widths.shape[0]
    off_W, off_b, ins = np.empty(L, np.int64), np.empty(L, np.int64), np.empty(L, np.int64)
    off, width = 0, 2 * d
    for j in range(L):
        ins[j] = width
        off_W[j] = off
        off += width * widths[j]
        off_b[j] = off
        off += widths[j]
        width = widths[j]
    return off_W, off_b, ins, off, off + d + width, off + d + width + 1


@njit(cache=True)
def _batch_grads(PG, PM, urows, QG, QM, rows, Ws, bs, h, hb, ys, grads):
    """Mean loss of one batch (user rows ``urows`` of PG, PM; item rows ``rows`` of QG, QM;
    labels ``ys``) and its gradient into grads = (g_PG, g_PM, g_QG, g_QM, [g_W], [g_b], g_h,
    g_hb): the dense ones overwritten, the table ones zeroed and filled on the rows the batch
    touches only."""
    d, L, B = PG.shape[1], len(Ws), rows.shape[0]
    A = [np.empty((B, 2 * d))]
    for j in range(B):
        A[0][j, :d] = PM[urows[j]]
        A[0][j, d:] = QM[rows[j]]
    for layer in range(L):
        A.append(np.maximum(np.dot(A[layer], Ws[layer]) + bs[layer], 0.0))
    last = A[L].shape[1]
    X = np.empty((B, d + last))
    for j in range(B):
        X[j, :d] = PG[urows[j]] * QG[rows[j]]
        X[j, d:] = A[L][j]
    s = np.dot(X, h) + hb[0]
    loss = 0.0
    ds = np.empty(B)
    for j in range(B):
        loss += max(s[j], 0.0) + np.log1p(np.exp(-abs(s[j]))) - ys[j] * s[j]
        ds[j] = (_sigmoid(s[j]) - ys[j]) / B
    grads[6][:] = np.dot(X.T, ds)
    grads[7][0] = ds.sum()
    da = np.outer(ds, h[d:])
    for layer in range(L - 1, -1, -1):
        dz = da * (A[layer + 1] > 0.0)
        grads[4][layer][:, :] = np.dot(A[layer].T, dz)
        grads[5][layer][:] = dz.sum(axis=0)
        da = np.dot(dz, Ws[layer].T)
    g_pg, g_pm, g_qg, g_qm = grads[0], grads[1], grads[2], grads[3]
    for j in range(B):
        g_pg[urows[j]] = 0.0
        g_pm[urows[j]] = 0.0
        g_qg[rows[j]] = 0.0
        g_qm[rows[j]] = 0.0
    for j in range(B):
        u, r = urows[j], rows[j]
        for f in range(d):
            dgmf = ds[j] * h[f]
            g_pg[u, f] += dgmf * QG[r, f]
            g_qg[r, f] += dgmf * PG[u, f]
            g_pm[u, f] += da[j, f]
            g_qm[r, f] += da[j, d + f]
    return loss / B


@njit(cache=True)
def _dense_views(theta, d, widths):
    """The layers' weights, biases, h and h_b as views of ``theta`` (a step on theta moves
    them), and zeroed gradients of the same shapes."""
    off_W, off_b, ins, off_h, off_hb, _ = dense_layout(d, widths)
    L = widths.shape[0]
    Ws = [theta[off_W[j]:off_W[j] + ins[j] * widths[j]].reshape((ins[j], widths[j]))
          for j in range(L)]
    bs = [theta[off_b[j]:off_b[j] + widths[j]] for j in range(L)]
    gW = [np.zeros((ins[j], widths[j])) for j in range(L)]
    gb = [np.zeros(widths[j]) for j in range(L)]
    return Ws, bs, theta[off_h:off_hb], theta[off_hb:off_hb + 1], gW, gb


@njit(cache=True)
def _dense_step(Ws, bs, h, hb, grads, lr, lam):
    for j in range(len(Ws)):
        _step(Ws[j], grads[4][j], lr, lam)
        _step(bs[j], grads[5][j], lr, lam)
    _step(h, grads[6], lr, lam)
    _step(hb, grads[7], lr, lam)


@njit(cache=True)
def _step(x, g, rate, lam):
    for i in range(x.size):
        x.flat[i] -= rate * (g.flat[i] + lam * x.flat[i])


@njit(cache=True)
def neumf_local(pg, pm, qg, qm, theta, widths, idx, y, order, batch, stages, lr, item_lr, lam):
    """Local epochs over a device's examples, updating its embeddings pg, pm (d,), the local item
    rows qg, qm (m, d) and the dense vector ``theta`` in place; idx, y, order, batch as in
    ``sampled.dot_local``; stages: per batch, the stage bits (USER, ITEMS, DENSE) applied in
    turn, each from a gradient at the current parameters. Weight decay ``lam`` reaches every
    parameter a stage updates (every local row, as a dense optimizer's does). Returns the mean
    over batches of the last stage's loss."""
    d, epochs, n = pg.shape[0], order.shape[0], order.shape[1]
    PG, PM = pg.reshape((1, d)), pm.reshape((1, d))  # views: the device's one user row
    Ws, bs, h, hb, gW, gb = _dense_views(theta, d, widths)
    grads = (np.zeros((1, d)), np.zeros((1, d)), np.zeros(qg.shape), np.zeros(qm.shape), gW,
             gb, np.zeros(h.shape[0]), np.zeros(1))
    nb = max(1, -(-n // batch))
    rows = np.empty(n // nb + 1, np.int64)
    urows = np.zeros(n // nb + 1, np.int64)
    ys = np.empty(rows.shape[0])
    total, count = 0.0, 0
    for t in range(epochs):
        start = 0
        for k in range(nb):
            size = batch_span(n, nb, k)
            gather_batch(order, t, start, size, idx, y, rows, ys)
            loss = 0.0
            for st in stages:
                grads[2][:, :] = 0.0  # every local row steps (weight decay), touched or not
                grads[3][:, :] = 0.0
                loss = _batch_grads(PG, PM, urows[:size], qg, qm, rows[:size], Ws, bs, h, hb,
                                    ys[:size], grads)
                if st & USER:
                    _step(PG, grads[0], lr, lam)
                    _step(PM, grads[1], lr, lam)
                if st & ITEMS:
                    _step(qg, grads[2], item_lr, lam)
                    _step(qm, grads[3], item_lr, lam)
                if st & DENSE:
                    _dense_step(Ws, bs, h, hb, grads, lr, lam)
            total += loss
            count += 1
            start += size
    return total / count


@njit(cache=True)
def _step_rows(X, G, touched, rate, lam):
    for r in touched:
        for f in range(X.shape[1]):
            X[r, f] -= rate * (G[r, f] + lam * X[r, f])


@njit(cache=True)
def neumf_epochs(PG, PM, QG, QM, theta, widths, users, items, y, order, batch, lr, emb_lr,
                 lam):
    """Centralized NeuMF: mini-batch SGD over examples (users[e], items[e], y[e]) of every user,
    epoch t visiting them in order[t] cut as ``np.array_split`` cuts it; from each batch's
    gradient the dense layers step at rate ``lr`` and the embedding rows the batch touches (only
    those) at ``emb_lr``, weight decay ``lam`` on what steps. Returns the mean batch loss of the
    last epoch."""
    d, epochs, n = PG.shape[1], order.shape[0], order.shape[1]
    Ws, bs, h, hb, gW, gb = _dense_views(theta, d, widths)
    grads = (np.zeros(PG.shape), np.zeros(PM.shape), np.zeros(QG.shape), np.zeros(QM.shape),
             gW, gb, np.zeros(h.shape[0]), np.zeros(1))
    nb = max(1, -(-n // batch))
    rows = np.empty(n // nb + 1, np.int64)
    urows = np.empty(n // nb + 1, np.int64)
    ys = np.empty(rows.shape[0])
    last = 0.0
    for t in range(epochs):
        start, total = 0, 0.0
        for k in range(nb):
            size = batch_span(n, nb, k)
            for j in range(size):
                ex = order[t, start + j]
                urows[j], rows[j], ys[j] = users[ex], items[ex], y[ex]
            total += _batch_grads(PG, PM, urows[:size], QG, QM, rows[:size], Ws, bs, h, hb,
                                  ys[:size], grads)
            tu, ti = np.unique(urows[:size]), np.unique(rows[:size])
            _step_rows(PG, grads[0], tu, emb_lr, lam)
            _step_rows(PM, grads[1], tu, emb_lr, lam)
            _step_rows(QG, grads[2], ti, emb_lr, lam)
            _step_rows(QM, grads[3], ti, emb_lr, lam)
            _dense_step(Ws, bs, h, hb, grads, lr, lam)
            start += size
        last = total / nb
    return last


# ---------------------------------------------------------------------- FedNCF on the round
# The global matrix Q (n_items + R, 2d) holds item row i = [q_g | q_m] and, in its last R rows,
# the dense vector theta row after row (zero padded); a device's kept user row is [p_g | p_m].


@njit(cache=True)
def _unpack(Q, n_items, size):
    """theta: the first ``size`` numbers of Q's rows n_items.. read row after row."""
    theta = np.empty(size)
    W = Q.shape[1]
    for t in range(size):
        theta[t] = Q[n_items + t // W, t % W]
    return theta


@njit(cache=True)
def neumf_device(pos, excluded, Q, n_items, p, cfg, widths, stages, epochs, state):
    """One FedNCF device from the global matrix Q and its user row p (2d,), float64, updated in
    place: ``sampled.draw_device`` draws the negatives (items < n_items) and orders, then
    ``neumf_local`` runs the epochs. Returns (mean batch loss, m, uniq (m used), the trained
    local rows (m + R, 2d): the m item rows, then the dense rows as laid out in Q)."""
    d, W, R = p.shape[0] // 2, Q.shape[1], Q.shape[0] - n_items
    uniq, m, loc, order, y = draw_device(pos, excluded, n_items, int(cfg[SC_NEG]), epochs, state)
    qg, qm = np.empty((max(m, 1), d)), np.empty((max(m, 1), d))
    for r in range(m):
        qg[r] = Q[uniq[r], :d]
        qm[r] = Q[uniq[r], d:]
    theta = _unpack(Q, n_items, dense_layout(d, widths)[5])
    pg, pm = p[:d].copy(), p[d:].copy()
    loss = 0.0
    if pos.shape[0] > 0 and epochs > 0:
        loss = neumf_local(pg, pm, qg, qm, theta, widths, loc, y, order, int(cfg[SC_BATCH]),
                           stages, cfg[SC_LR], cfg[SC_ITEM_LR], cfg[SC_LAM])
    p[:d] = pg
    p[d:] = pm
    rows = np.empty((m + R, W))
    for r in range(m):
        rows[r, :d] = qg[r]
        rows[r, d:] = qm[r]
    for j in range(R):  # the padding after theta is never trained: its delta stays zero
        rows[m + j] = Q[n_items + j]
    for t in range(theta.shape[0]):
        rows[m + t // W, t % W] = theta[t]
    return loss, m, uniq, rows


@njit(cache=True, parallel=True)
def neumf_clients(data, clients, glob, local, excl, cfg, widths, n_items, ids, out):
    """FedNCF's ClientUpdate of one round, laid out as ``sampled.sampled_clients``: each device
    trains from the global matrix and its kept user row (local = (P, c); P[clients[k]] is
    overwritten when it stays finite) and writes the deltas of the item rows it touched, then of
    the R dense rows, into its slots; with cfg[SC_SHARE] = 0 nothing (every slot −1). Bias deltas
    are zero (NeuMF has no item bias). Each device's randomness is its own (seed, round, id)."""
    indptr, items, Q, P = data[0], data[1], glob[0], local[0]
    eptr, eitems = excl[0], excl[1]
    offsets, d_items, d_Q, d_b, losses = out[0], out[1], out[2], out[3], out[4]
    W, epochs, share = Q.shape[1], int(cfg[SC_EPOCHS]), cfg[SC_SHARE] > 0.0
    queue = client_queue(indptr, clients)
    stages = np.array([USER | ITEMS | DENSE], np.int64)
    for _ in prange(QUEUE_WORKERS):
        k = take(queue)
        while k >= 0:
            u = clients[k]
            p = P[u].astype(np.float64)
            loss, m, uniq, rows = neumf_device(items[indptr[u]:indptr[u + 1]],
                                               eitems[eptr[u]:eptr[u + 1]], Q, n_items, p, cfg,
                                               widths, stages, epochs, np.array([client_key(ids, u)]))
            store(losses, np.int64(k), loss)
            R = Q.shape[0] - n_items
            touched = np.empty(m + R, np.int64)
            touched[:m] = uniq[:m]
            for j in range(R):
                touched[m + j] = n_items + j
            length = offsets[k + 1] - offsets[k]
            write_rows(touched, m + R if share else 0, rows, Q, offsets[k], length, d_items, d_Q)
            for t in range(length):
                d_b[offsets[k] + t] = 0.0
            if np.isfinite(p).all():  # a diverged device keeps its old row
                for a in range(W):
                    P[u, a] = p[a]
            k = take(queue)


@njit(cache=True, parallel=True)
def neumf_fold_in(indptr, items, excl, Q, n_items, widths, cfg, epochs, seed, keys, P):
    """Users unseen in training, each on their own device: the user row P[r] (from zero) trained
    for ``epochs`` local epochs with everything global frozen. Row r's stream is keyed by
    keys[r] alone, so a user's result does not depend on who shares the call."""
    eptr, eitems = excl[0], excl[1]
    user_only = np.array([USER], np.int64)
    for r in prange(indptr.shape[0] - 1):
        p = np.zeros(Q.shape[1])
        neumf_device(items[indptr[r]:indptr[r + 1]], eitems[eptr[r]:eptr[r + 1]], Q, n_items, p,
                     cfg, widths, user_only, epochs, np.array([stream_key(seed, 1, keys[r])]))
        P[r] = p
