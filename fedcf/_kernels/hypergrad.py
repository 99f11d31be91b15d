"""Directional derivatives of the clients' query loss (federated hypergradients, forward mode).

Each sampled client starts exactly as in ``fedrecon_clients`` (same stream, split and
reconstruction), computes its query loss ℓ at the broadcast global model (Q, b), and for each of
H tangent directions (T_Q, T_b) of the global model the derivative of ℓ along it — *including*
how its reconstructed local parameters move with (Q, b):

- exact ridge reconstruction: x = (p, c) solves M x = Zᵀy with Z = [q_j, 1], y = r − μ − b_j,
  M = ZᵀZ + (λn + λ₀)I, so by implicit differentiation M dx = dZᵀ(y − Zx) − Zᵀ(dZ x + T_b);
- k_r SGD steps: forward mode through every step (the tangent of p and c is carried along the
  same mini-batches in the same order).

Only the H derivatives and ℓ leave the client (H + 1 numbers), besides the tangent rows of its
own items it receives. Nothing depends on the thread count: each client writes its own slots.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .als import cholesky_factor, cholesky_substitute
from .clients import client_sets, query_loss
from .layout import (
    CC_ALS_LAM,
    CC_ALS_LAM0,
    CC_INIT,
    CC_INIT_SCALE,
    CC_RECON,
    HP_BATCH,
    HP_EPOCHS,
    HP_FIT_BIAS,
    HP_LAM,
    HP_LR,
    HP_OFFSET,
    HP_STEPS,
    RECON_ALS,
)
from .sgd import init_local
from .util import minibatch_schedule


@njit(cache=True)
def ridge_tangent(items, vals, Q, b, TQ, Tb, lam, mu, fit_bias, x, dx):
    """Ridge solution x = (p, c) of one support set and its tangents dx[h] along (TQ[h], Tb[h])."""
    K = Q.shape[1]
    H = TQ.shape[0]
    d = K + 1 if fit_bias else K
    n = items.shape[0]
    M = np.zeros((d, d))
    rhs = np.zeros(d)
    z = np.zeros(d)
    for t in range(n):
        j = items[t]
        for a in range(K):
            z[a] = Q[j, a]
        if fit_bias:
            z[K] = 1.0
        y = vals[t] - mu - b[j]
        for a in range(d):
            rhs[a] += z[a] * y
            for c in range(d):
                M[a, c] += z[a] * z[c]
    for a in range(d):
        M[a, a] += lam[0] * n + lam[1]
    if n == 0:
        x[:] = 0.0
        dx[:, :] = 0.0
        return
    if not cholesky_factor(M, d):  # not SPD (only with lam = lam0 = 0): NaN, the client is dropped
        x[:] = np.nan
        dx[:, :] = np.nan
        return
    sol = rhs
    cholesky_substitute(M, sol, d)
    R = np.zeros((d, H))
    for t in range(n):
        j = items[t]
        for a in range(K):
            z[a] = Q[j, a]
        resid = vals[t] - mu - b[j]
        for a in range(d):
            resid -= z[a] * sol[a]
        for h in range(H):
            dzx = Tb[h, j]  # dZ x + T_b (the bias column of Z does not move)
            for a in range(K):
                dzx += TQ[h, j, a] * sol[a]
            for a in range(K):
                R[a, h] += TQ[h, j, a] * resid - z[a] * dzx
            if fit_bias:
                R[K, h] -= dzx
    col = np.empty(d)
    x[:] = 0.0
    x[:d] = sol
    dx[:, :] = 0.0
    for h in range(H):
        col[:] = R[:, h]
        cholesky_substitute(M, col, d)
        dx[h, :d] = col


@njit(cache=True)
def sgd_tangent(items, vals, Q, b, TQ, Tb, hp, state, x, dx):
    """k_r mini-batch steps from x (as ``sgd_reconstruct_user``) carrying the tangents dx[h]."""
    K = Q.shape[1]
    H = TQ.shape[0]
    lr, lam = hp[HP_LR], hp[HP_LAM]
    mu, fit_bias = hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0
    visit, ends, steps = minibatch_schedule(items.shape[0], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                            int(hp[HP_EPOCHS]), state)
    g = np.zeros(K + 1)
    dg = np.zeros((H, K + 1))
    de = np.zeros(H)
    start = 0
    for s in range(steps):
        end = ends[s]
        g[:] = 0.0
        dg[:, :] = 0.0
        for t in range(start, end):
            j = items[visit[t]]
            pred = mu + b[j] + x[K]
            for a in range(K):
                pred += x[a] * Q[j, a]
            e = vals[visit[t]] - pred
            for h in range(H):
                v = Tb[h, j] + dx[h, K]
                for a in range(K):
                    v += dx[h, a] * Q[j, a] + x[a] * TQ[h, j, a]
                de[h] = -v
            for a in range(K):
                g[a] -= 2.0 * e * Q[j, a]
                for h in range(H):
                    dg[h, a] -= 2.0 * (de[h] * Q[j, a] + e * TQ[h, j, a])
            g[K] -= 2.0 * e
            for h in range(H):
                dg[h, K] -= 2.0 * de[h]
        m = end - start
        last = K + 1 if fit_bias else K
        for a in range(last):
            for h in range(H):
                dx[h, a] -= lr * (dg[h, a] / m + 2.0 * lam * dx[h, a])
            x[a] -= lr * (g[a] / m + 2.0 * lam * x[a])
        start = end


@njit(cache=True)
def query_tangent(items, vals, Q, b, TQ, Tb, mu, x, dx, out):
    """out[h] = dℓ along tangent h of the query MSE ℓ = mean (r − μ − b_j − c − p·q_j)²."""
    K = Q.shape[1]
    H = TQ.shape[0]
    n = items.shape[0]
    for h in range(H):
        out[h] = 0.0
    if n == 0:
        return
    for t in range(n):
        j = items[t]
        pred = mu + b[j] + x[K]
        for a in range(K):
            pred += x[a] * Q[j, a]
        e = vals[t] - pred
        for h in range(H):
            dpred = Tb[h, j] + dx[h, K]
            for a in range(K):
                dpred += TQ[h, j, a] * x[a] + Q[j, a] * dx[h, a]
            out[h] -= 2.0 * e * dpred / n


@njit(cache=True, parallel=True)
def fedrecon_tangent_clients(data, clients, glob, tangents, cfg, recon_hp, mu, ids, losses, jvp):
    """For every sampled client: its query loss before the update (``losses[k]``, as
    ``fedrecon_clients`` computes it) and its derivative along each tangent (``jvp[k, h]``).

    tangents : (TQ float64 (H, n_items, K), Tb float64 (H, n_items)); other arguments as in
    ``fedrecon_clients`` (mu: the rating offset of the model, 0 without biases).
    """
    Q, b = glob[0], glob[1]
    TQ, Tb = tangents[0], tangents[1]
    K, H = Q.shape[1], TQ.shape[0]
    fit_bias = recon_hp[HP_FIT_BIAS] != 0.0
    for k in prange(clients.shape[0]):
        state, s_items, s_vals, q_items, q_vals = client_sets(data, clients[k], cfg, ids)
        x = np.zeros(K + 1)
        dx = np.zeros((H, K + 1))
        if int(cfg[CC_RECON]) == RECON_ALS:
            lam = np.array([cfg[CC_ALS_LAM], cfg[CC_ALS_LAM0]])
            ridge_tangent(s_items, s_vals, Q, b, TQ, Tb, lam, recon_hp[HP_OFFSET], fit_bias, x,
                          dx)
        else:
            cb = np.zeros(1)
            init_local(x[:K], cb, int(cfg[CC_INIT]), cfg[CC_INIT_SCALE], state)
            sgd_tangent(s_items, s_vals, Q, b, TQ, Tb, recon_hp, state, x, dx)
        losses[k] = query_loss(q_items, q_vals, Q, b, mu, x[:K], x[K])
        query_tangent(q_items, q_vals, Q, b, TQ, Tb, mu, x, dx, jvp[k])


@njit(cache=True, parallel=True)
def stateful_tangent_clients(data, clients, glob, local, tangents, mu, losses, jvp):
    """FedAvg / FURL clients: the loss of their stored row (p, c) on all their data at the
    broadcast (Q, b), and its derivative along each tangent (the stored rows do not move with the
    server's hyperparameters within the round)."""
    indptr, items, values = data[0], data[1], data[2]
    Q, b = glob[0], glob[1]
    P, c = local[0], local[1]
    TQ, Tb = tangents[0], tangents[1]
    K, H = Q.shape[1], TQ.shape[0]
    for k in prange(clients.shape[0]):
        u = clients[k]
        s0, e0 = indptr[u], indptr[u + 1]
        x = np.zeros(K + 1)
        for a in range(K):
            x[a] = P[u, a]
        x[K] = c[u]
        dx = np.zeros((H, K + 1))
        losses[k] = query_loss(items[s0:e0], values[s0:e0], Q, b, mu, x[:K], x[K])
        query_tangent(items[s0:e0], values[s0:e0], Q, b, TQ, Tb, mu, x, dx, jvp[k])
