"""One device's local pass of FedNCF (federated NeuMF): mini-batch SGD on the binary
cross-entropy of the NeuMF logit, in place.

The logit of item row r for a user (p_g, p_m) is h·[p_g ⊙ q_g[r], a_L] + h_b, where a_0 =
[p_m, q_m[r]] and a_{l+1} = relu(a_l W_l + b_l). The dense parameters travel packed in one flat
vector ``theta`` (see ``dense_layout``). The caller draws everything random, so the kernel is a
pure function of its arrays. Its NumPy twin is ``FedNCF._numpy_pass`` with
``sampled_nets.NeuMFNet``, whose gradients the tests check against finite differences.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .sampled import _sigmoid, batch_span, gather_batch

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
