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

from .sampled import _sigmoid

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
def _batch_grads(pg, pm, qg, qm, Ws, bs, h, hb, rows, ys, grads):
    """Mean loss of one batch (local rows ``rows``, labels ``ys``) and its gradient into
    grads = (g_pg, g_pm, g_qg (per local row), g_qm, [g_W], [g_b], g_h, g_hb), overwritten."""
    d, L, B = pg.shape[0], len(Ws), rows.shape[0]
    A = [np.empty((B, 2 * d))]
    for j in range(B):
        A[0][j, :d] = pm
        A[0][j, d:] = qm[rows[j]]
    for layer in range(L):
        A.append(np.maximum(np.dot(A[layer], Ws[layer]) + bs[layer], 0.0))
    last = A[L].shape[1]
    X = np.empty((B, d + last))
    for j in range(B):
        X[j, :d] = pg * qg[rows[j]]
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
    g_pg[:] = 0.0
    g_pm[:] = 0.0
    g_qg[:, :] = 0.0
    g_qm[:, :] = 0.0
    for j in range(B):
        r = rows[j]
        for f in range(d):
            dgmf = ds[j] * h[f]
            g_pg[f] += dgmf * qg[r, f]
            g_qg[r, f] += dgmf * pg[f]
            g_pm[f] += da[j, f]
            g_qm[r, f] += da[j, d + f]
    return loss / B


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
    off_W, off_b, ins, off_h, off_hb, _ = dense_layout(d, widths)
    L = widths.shape[0]
    Ws = [theta[off_W[j]:off_W[j] + ins[j] * widths[j]].reshape((ins[j], widths[j]))
          for j in range(L)]  # views: a step on theta moves them
    bs = [theta[off_b[j]:off_b[j] + widths[j]] for j in range(L)]
    h, hb = theta[off_h:off_hb], theta[off_hb:off_hb + 1]
    gW = [np.zeros((ins[j], widths[j])) for j in range(L)]
    gb = [np.zeros(widths[j]) for j in range(L)]
    grads = (np.zeros(d), np.zeros(d), np.zeros(qg.shape), np.zeros(qm.shape), gW, gb,
             np.zeros(h.shape[0]), np.zeros(1))
    rows = np.empty(n // max(1, -(-n // batch)) + 1, np.int64)
    ys = np.empty(rows.shape[0])
    nb = max(1, -(-n // batch))
    total, count = 0.0, 0
    for t in range(epochs):
        start = 0
        for k in range(nb):
            size = n // nb + (1 if k < n % nb else 0)
            for j in range(size):
                ex = order[t, start + j]
                rows[j] = idx[t * n + ex]
                ys[j] = y[ex]
            loss = 0.0
            for st in stages:
                loss = _batch_grads(pg, pm, qg, qm, Ws, bs, h, hb, rows[:size], ys[:size],
                                    grads)
                if st & USER:
                    _step(pg, grads[0], lr, lam)
                    _step(pm, grads[1], lr, lam)
                if st & ITEMS:
                    _step(qg, grads[2], item_lr, lam)
                    _step(qm, grads[3], item_lr, lam)
                if st & DENSE:
                    for j in range(L):
                        _step(Ws[j], gW[j], lr, lam)
                        _step(bs[j], gb[j], lr, lam)
                    _step(h, grads[6], lr, lam)
                    _step(hb, grads[7], lr, lam)
            total += loss
            count += 1
            start += size
    return total / count
