"""One device's local pass of the dot-product sampled-negative baselines (FedMF, PFedRec):
mini-batch SGD on the binary cross-entropy of score = u·e_i + c + b_i, in place.

The caller draws everything random (the negatives and each epoch's order), so the kernel is a
pure function of its arrays; ``fedcf._reference.sampled.dot_local`` is its NumPy twin.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
            size = n // nb + (1 if k < n % nb else 0)
            for j in range(size):
                ex = order[t, start + j]
                rows[j] = idx[t * n + ex]
                ys[j] = y[ex]
            loss = 0.0
            for st in stages:
                loss = _batch(u, c, e, b, rows[:size], ys[:size], st, lr, item_lr, lam, ds)
            total += loss
            count += 1
            start += size
    return total / count
