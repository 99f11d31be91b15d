"""NumPy twins of ``fedcf._kernels.hypergrad`` (federated hypergradients):
slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    INIT_UNIFORM,
)
from .rng import Stream, stream_key
from .sgd import _batches, _hp, init_local


def fedrecon_tangent_client(items, vals, Q, b, TQ, Tb, *, seed, round_idx, client, split,
                            support_fraction, recon, recon_hp, init_scale, ridge, mu):
    """Twin of one client of ``fedrecon_tangent_clients``: (query loss, dℓ along each of the H
    tangents (TQ[h], Tb[h])), reconstruction differentiated by implicit differentiation (ridge)
    or forward mode through the SGD steps, written with whole-array NumPy."""
    n, K, H = len(items), Q.shape[1], TQ.shape[0]
    _, _, _, _, _, _, fit_bias, _ = _hp(recon_hp)
    stream = Stream(stream_key(seed, round_idx, int(client)))
    perm = np.arange(n)
    if split == "random":
        stream.shuffle(perm)
    n_s = n if split == "none" else min(max(int(np.ceil(n * support_fraction - 1e-9)),
                                            1 if n else 0), n)
    sup, qry = (perm, perm) if split == "none" else (perm[:n_s], perm[n_s:])
    Q64 = Q.astype(np.float64)
    if recon == "als":
        x, dx = _ridge_tangent(items[sup], vals[sup], Q64, b, TQ, Tb, ridge, mu, fit_bias)
    else:
        x0 = np.append(init_local(K, np.array([INIT_UNIFORM, init_scale]), stream), 0.0)
        x, dx = _sgd_tangent(items[sup], vals[sup], Q64, b, TQ, Tb, recon_hp, stream, x0)
    j, r = items[qry], vals[qry]
    if len(j) == 0:
        return 0.0, np.zeros(H)
    e = r - (mu + b[j] + x[K] + Q64[j] @ x[:K])
    dpred = Tb[:, j] + dx[:, K:] + TQ[:, j] @ x[:K] + dx[:, :K] @ Q64[j].T   # (H, n_q)
    return float(np.mean(e * e)), -2.0 * (dpred @ e) / len(j)


def _ridge_tangent(j, r, Q64, b, TQ, Tb, ridge, mu, fit_bias):
    K, H = Q64.shape[1], TQ.shape[0]
    Z = np.hstack([Q64[j], np.ones((len(j), 1))]) if fit_bias else Q64[j]
    y = r - mu - b[j]
    M = Z.T @ Z + (ridge[0] * len(j) + ridge[1]) * np.eye(Z.shape[1])
    sol = np.linalg.solve(M, Z.T @ y)
    x = np.append(sol[:K], sol[K] if fit_bias else 0.0)
    dx = np.zeros((H, K + 1))
    for h in range(H):
        dZ = np.hstack([TQ[h, j], np.zeros((len(j), 1))]) if fit_bias else TQ[h, j]
        dsol = np.linalg.solve(M, dZ.T @ (y - Z @ sol) - Z.T @ (dZ @ sol + Tb[h, j]))
        dx[h, :K] = dsol[:K]
        dx[h, K] = dsol[K] if fit_bias else 0.0
    return x, dx


def _sgd_tangent(j_all, r_all, Q64, b, TQ, Tb, hp, stream, x):
    lr, lam, bs, steps, epochs, mu, fit_bias, _ = _hp(hp)
    K, H = Q64.shape[1], TQ.shape[0]
    x, dx = x.copy(), np.zeros((H, K + 1))
    for batch in _batches(len(j_all), bs, steps, epochs, stream):
        j, r = j_all[batch], r_all[batch]
        e = r - (mu + b[j] + x[K] + Q64[j] @ x[:K])
        de = -(Tb[:, j] + dx[:, K:] + dx[:, :K] @ Q64[j].T + TQ[:, j] @ x[:K])   # (H, m)
        g = np.append(-2.0 * e @ Q64[j], -2.0 * e.sum()) / len(batch) + 2 * lam * x
        dg = np.concatenate([-2.0 * (de @ Q64[j] + np.einsum("m,hma->ha", e, TQ[:, j])),
                             -2.0 * de.sum(axis=1, keepdims=True)], axis=1) / len(batch) \
            + 2 * lam * dx
        last = K + 1 if fit_bias else K
        x[:last] -= lr * g[:last]
        dx[:, :last] -= lr * dg[:, :last]
    return x, dx
