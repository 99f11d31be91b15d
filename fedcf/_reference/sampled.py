"""NumPy twin of ``fedcf._kernels.sampled`` (slow, obvious: the tests' oracle)."""

from __future__ import annotations

import numpy as np
from scipy.special import expit

USER, ITEMS = 1, 2


def dot_local(u, c, e, b, idx, y, order, batch, stages, lr, item_lr, lam):
    epochs, n = order.shape
    losses = []
    for t in range(epochs):
        for part in np.array_split(order[t], max(1, -(-n // batch))):
            rows, ys = idx[t * n + part], y[part]
            for st in stages:
                s = e[rows] @ u + c[0] + b[rows, 0]
                loss = float(np.mean(np.logaddexp(0.0, s) - ys * s))
                ds = (expit(s) - ys) / len(part)
                old = u.copy()
                if st & USER:
                    u -= lr * (ds @ e[rows] + lam * old)
                    c -= lr * (ds.sum() + lam * c)
                if st & ITEMS:
                    e -= item_lr * lam * e
                    b -= item_lr * lam * b
                    np.subtract.at(e, rows, item_lr * ds[:, None] * old[None, :])
                    np.subtract.at(b[:, 0], rows, item_lr * ds)
            losses.append(loss)
    return float(np.mean(losses))
