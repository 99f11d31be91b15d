"""NumPy twin of ``fedcf._kernels.neumf`` (slow, obvious: the tests' oracle), built on
``sampled_nets.NeuMFNet``, whose gradients the tests check against finite differences."""

from __future__ import annotations

import numpy as np

from .rng import as_stream
from .sampled import draw_device

USER, ITEMS, DENSE = 1, 2, 4


def _scatter(idx: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    """Per-example gradients summed onto ``n`` rows."""
    out = np.zeros((n,) + g.shape[1:])
    np.add.at(out, idx, g)
    return out


def neumf_local(net, user, rows, dense, idx, y, order, batch, stages, lr, item_lr, lam):
    """Twin of the kernel's ``neumf_local`` on NeuMFNet's dicts (user: pg, pm; rows: qg, qm;
    dense: net.dense_keys), updated in place; the mean batch loss."""
    n, losses = len(y), []
    for epoch, perm in enumerate(order):
        for b in np.array_split(perm, max(1, -(-n // batch))):
            rows_b = idx[epoch * n + b]
            for st in stages:
                loss, gu, gr, gd = net.grads(user, {k: v[rows_b] for k, v in rows.items()},
                                             dense, y[b])
                if st & USER:
                    for k in gu:
                        user[k] -= lr * (gu[k] + lam * user[k])
                if st & ITEMS:
                    for k in gr:
                        rows[k] -= item_lr * (_scatter(rows_b, gr[k], len(rows[k]))
                                              + lam * rows[k])
                if st & DENSE:
                    for k in gd:
                        dense[k] -= lr * (gd[k] + lam * dense[k])
            losses.append(loss)
    return float(np.mean(losses))


def neumf_device(net, pos, excluded, Q, n_items, p, cfg, stages, epochs, seed):
    """Twin of the kernel's ``neumf_device``: (loss, uniq, trained rows (m + R, 2d)) with the
    user row p updated in place; ``seed`` is the stream's state (or a Stream)."""
    d, W = net.d, Q.shape[1]
    uniq, loc, order, y = draw_device(pos, excluded, n_items, int(cfg[0]), epochs,
                                      as_stream(seed))
    Q = np.asarray(Q, np.float64)
    theta = Q[n_items:].reshape(-1)[:net.dense_size]
    dense = {k: v.copy() for k, v in net.unpack(theta.copy()).items()}
    user = {"pg": p[:d].copy(), "pm": p[d:].copy()}
    rows = {"qg": Q[uniq, :d].copy(), "qm": Q[uniq, d:].copy()}
    loss = 0.0
    if len(pos) and epochs:
        loss = neumf_local(net, user, rows, dense, loc, y, order, int(cfg[2]), stages, cfg[3],
                           cfg[4], cfg[5])
    p[:d], p[d:] = user["pg"], user["pm"]
    flat = Q[n_items:].reshape(-1).copy()
    flat[:len(theta)] = net.pack(dense)
    return loss, uniq, np.vstack([np.hstack([rows["qg"], rows["qm"]]), flat.reshape(-1, W)])
