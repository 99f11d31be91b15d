"""NumPy twin of ``fedcf._kernels.sampled`` (slow, obvious: the tests' oracle)."""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from .rng import as_stream

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


def draw_device(pos, excluded, n_items, neg, epochs, stream):
    """Twin of the kernel's ``draw_device``: (uniq, loc, order, y)."""
    n, excluded = len(pos), set(int(x) for x in excluded)
    draws = []
    for _ in range(epochs):
        negs = []
        while len(negs) < n * neg:
            r = stream.next_below(n_items)
            if r not in excluded:
                negs.append(r)
        draws.append(np.r_[np.asarray(pos, np.int64), np.asarray(negs, np.int64)])
    order = np.array([np.arange(n * (1 + neg)) for _ in range(epochs)], np.int64).reshape(
        epochs, n * (1 + neg))
    for t in range(epochs):
        stream.shuffle(order[t])
    all_items = np.concatenate(draws) if draws else np.zeros(0, np.int64)
    uniq, loc = np.unique(all_items, return_inverse=True)
    return uniq, loc, order, np.r_[np.ones(n), np.zeros(n * neg)]


def device_pass(pos, excluded, Q, b, u, c, cfg, stages, epochs, seed):
    """Twin of the kernel's ``device_pass``: (loss, uniq, e, b_local) with u, c updated in
    place; ``seed`` is the stream's state (or a Stream)."""
    uniq, loc, order, y = draw_device(pos, excluded, Q.shape[0], int(cfg[0]), epochs,
                                      as_stream(seed))
    e = np.asarray(Q, np.float64)[uniq].copy()
    bl = np.asarray(b, np.float64)[uniq][:, None].copy()
    if len(pos) == 0 or epochs == 0:
        return 0.0, uniq, e, bl
    loss = dot_local(u, c, e, bl, loc, y, order, int(cfg[2]), stages, cfg[3], cfg[4], cfg[5])
    return loss, uniq, e, bl


def sampled_client(pos, excluded, Q, b, u, c, cfg, stages, seed):
    """One device of ``sampled_clients``: (loss, touched items, their row and bias deltas, the
    new user part); nothing uploaded when cfg[6] (share) is 0."""
    u, c = np.array(u, np.float64), np.array([c], np.float64)
    loss, uniq, e, bl = device_pass(pos, excluded, Q, b, u, c, cfg, stages, int(cfg[1]), seed)
    if cfg[6] <= 0:
        uniq = uniq[:0]
        e, bl = e[:0], bl[:0]
    return loss, uniq, e - Q[uniq], bl[:, 0] - b[uniq], u, c[0]


def fold_in_row(pos, excluded, Q, b, cfg, epochs, seed):
    """Twin of one row of ``sampled_fold_in``: the user part trained from zero, items frozen."""
    u, c = np.zeros(Q.shape[1]), np.zeros(1)
    device_pass(pos, excluded, Q, b, u, c, cfg, np.array([USER]), epochs, seed)
    return u, c[0]


def personal_scores_row(pos, excluded, Q, b, p, c, cfg, stages, seed):
    """Twin of one row of ``personal_scores``."""
    u, cb = np.array(p, np.float64), np.array([c], np.float64)
    _, uniq, e, bl = device_pass(pos, excluded, Q, b, u, cb, cfg, stages, int(cfg[1]), seed)
    s = np.asarray(Q, np.float64) @ u + cb[0] + b
    s[uniq] = e @ u + cb[0] + bl[:, 0]
    return s
