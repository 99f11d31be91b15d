"""Plain NumPy/Python twins of every kernel: slow, obvious, and the oracle the tests compare against.

Each function takes the same arguments as its kernel (see ``fedcf._kernels``) and returns what the
kernel writes, without mutating its inputs.
"""

from __future__ import annotations

import numpy as np

from ._kernels.layout import (
    CC_ALS_LAM,
    CC_ALS_LAM0,
    CC_INIT,
    CC_INIT_SCALE,
    CC_RECON,
    CFG_FIT_BIAS,
    CFG_LAM,
    CFG_LAM0,
    CFG_OFFSET,
    HP_BATCH,
    HP_EPOCHS,
    HP_FIT_BIAS,
    HP_JOINT,
    HP_LAM,
    HP_LR,
    HP_OFFSET,
    HP_STEPS,
    IC_ALPHA,
    IC_LAM,
    IC_NEG,
    IC_NEG_WEIGHT,
    IC_SPLIT,
    IC_SUPPORT_FRAC,
    INIT_UNIFORM,
    OC_DEFAULT,
    OC_SWEEPS,
    RECON_ALS,
    RI_INIT,
    RI_SCALE,
    SE_FIT_BIAS,
    SE_LAM,
    SE_LR,
    SE_OFFSET,
    SPLIT_NONE,
    SPLIT_RANDOM,
)

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


# ---------------------------------------------------------------------- random streams
def mix64(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int, a: int, b: int) -> int:
    k = mix64(seed + _GOLDEN)
    k = mix64(k + a + _GOLDEN)
    return mix64(k + b + _GOLDEN)


class Stream:
    """Python twin of a kernel random stream."""

    def __init__(self, seed: int):
        self.state = int(seed) & _MASK

    def next_u64(self) -> int:
        self.state = (self.state + _GOLDEN) & _MASK
        return mix64(self.state)

    def next_float(self) -> float:
        return float(self.next_u64() >> 11) * (1.0 / 9007199254740992.0)

    def next_below(self, n: int) -> int:
        return int(self.next_float() * n)

    def shuffle(self, arr: np.ndarray) -> None:
        for i in range(len(arr) - 1, 0, -1):
            j = self.next_below(i + 1)
            arr[i], arr[j] = arr[j], arr[i]


def as_stream(seed_or_stream) -> Stream:
    """A Stream from a seed, or the given Stream itself (to share one stream across phases)."""
    return seed_or_stream if isinstance(seed_or_stream, Stream) else Stream(seed_or_stream)


# ---------------------------------------------------------------------- prediction
def predict_pairs(users, items, user_params, item_params, mu):
    P, c = user_params
    Q, b = item_params
    users = np.asarray(users)
    items = np.asarray(items)
    ku, ki = users >= 0, items >= 0
    out = np.full(len(users), float(mu))
    out[ku] += c[users[ku]]
    out[ki] += b[items[ki]]
    both = ku & ki
    out[both] += np.sum(P[users[both]].astype(np.float64) * Q[items[both]], axis=1)
    return out


# ---------------------------------------------------------------------- ridge solves
def gram_panel(Z, n, a, c0, rows, width):
    """Twin of ``dense.gram_panel``: rows a … a + rows − 1 and columns c0 … c0 + width − 1 of
    Z[:n]ᵀ Z[:n], in float64."""
    Z64 = np.asarray(Z[:n], np.float64)
    return Z64[:, a:a + rows].T @ Z64[:, c0:c0 + width]


def gram_rows(Z, n, d):
    """Twin of ``dense.gram_rows``: the Gram of Z[:n]'s first d columns and their products with
    column d (the targets)."""
    Z64 = np.asarray(Z[:n], np.float64)
    return Z64[:, :d].T @ Z64[:, :d], Z64[:, :d].T @ Z64[:, d]


def ridge_solve_row(idx, vals, fixed, fixed_bias, lam, lam0, offset, fit_bias):
    """argmin_x Σ (r − offset − fixed_bias − x·z)² + (lam·n + lam0)‖x‖², by np.linalg.solve."""
    K = fixed.shape[1]
    Z = fixed[idx].astype(np.float64)
    if fit_bias:
        Z = np.hstack([Z, np.ones((len(idx), 1))])
    y = np.asarray(vals, np.float64) - offset - fixed_bias[idx]
    d = Z.shape[1]
    reg = lam * len(idx) + lam0
    if len(idx) == 0 and reg == 0:
        x = np.zeros(d)
    else:
        x = np.linalg.solve(Z.T @ Z + reg * np.eye(d), Z.T @ y)
    return x[:K], (x[K] if fit_bias else 0.0)


def ridge_solve_rows(indptr, idx, vals, fixed, fixed_bias, cfg):
    lam, lam0, offset = cfg[CFG_LAM], cfg[CFG_LAM0], cfg[CFG_OFFSET]
    fit_bias = cfg[CFG_FIT_BIAS] != 0
    n = len(indptr) - 1
    out = np.zeros((n, fixed.shape[1]))
    out_bias = np.zeros(n)
    for r in range(n):
        s, e = indptr[r], indptr[r + 1]
        out[r], out_bias[r] = ridge_solve_row(idx[s:e], vals[s:e], fixed, fixed_bias, lam, lam0,
                                              offset, fit_bias)
    return out, out_bias


def ridge_cg_rows(indptr, idx, vals, fixed, fixed_bias, cfg, steps, out, out_bias):
    """Twin of ``als.ridge_cg_rows``: textbook conjugate gradient on each row's dense normal
    equations, warm-started from (out, out_bias); returns new arrays."""
    lam, lam0, offset = cfg[CFG_LAM], cfg[CFG_LAM0], cfg[CFG_OFFSET]
    fit_bias = cfg[CFG_FIT_BIAS] != 0
    P, c = np.array(out, np.float64), np.array(out_bias, np.float64)
    for r in range(len(indptr) - 1):
        s, e = indptr[r], indptr[r + 1]
        Z = fixed[idx[s:e]].astype(np.float64)
        if fit_bias:
            Z = np.hstack([Z, np.ones((e - s, 1))])
        x = np.r_[P[r], c[r]] if fit_bias else P[r].copy()
        if e == s:
            x[:] = 0.0
        else:
            A = Z.T @ Z + (lam * (e - s) + lam0) * np.eye(Z.shape[1])
            res = Z.T @ (vals[s:e] - offset - fixed_bias[idx[s:e]]) - A @ x
            p, rs = res.copy(), float(res @ res)
            for _ in range(steps):
                if rs == 0.0 or not float(p @ A @ p) > 0.0:
                    break
                alpha = rs / float(p @ A @ p)
                x, res = x + alpha * p, res - alpha * (A @ p)
                rs, rs_old = float(res @ res), rs
                p = res + (rs / rs_old) * p
        P[r] = x[:P.shape[1]]
        c[r] = x[-1] if fit_bias else 0.0
    return P, c


def ridge_objective(idx, vals, fixed, fixed_bias, p, c, lam, lam0, offset):
    """The local objective ``ridge_solve_row`` minimises, at (p, c)."""
    e = np.asarray(vals) - offset - fixed_bias[idx] - c - fixed[idx].astype(np.float64) @ p
    return float(e @ e + (lam * len(idx) + lam0) * (p @ p + c * c))


# ---------------------------------------------------------------------- gradient steps
def _hp(hp):
    return (float(hp[HP_LR]), float(hp[HP_LAM]), int(hp[HP_BATCH]), int(hp[HP_STEPS]),
            int(hp[HP_EPOCHS]), float(hp[HP_OFFSET]), hp[HP_FIT_BIAS] != 0, hp[HP_JOINT] != 0)


def _batches(n, bs, max_steps, epochs, stream):
    """Yield index arrays of each mini-batch, in the kernels' order."""
    steps = 0
    for _ in range(epochs):
        if steps >= max_steps or n == 0:
            return
        order = np.arange(n)
        stream.shuffle(order)
        for start in range(0, n, bs):
            if steps >= max_steps:
                return
            yield order[start:start + bs]
            steps += 1


def sgd_reconstruct_user(items, vals, Q, b, hp, p, c, seed):
    lr, lam, bs, steps, epochs, mu, fit_bias, _ = _hp(hp)
    p = np.array(p, np.float64)
    c = float(c)
    Q64 = Q.astype(np.float64)
    for batch in _batches(len(items), bs, steps, epochs, as_stream(seed)):
        j = items[batch]
        e = vals[batch] - (mu + b[j] + c + Q64[j] @ p)
        gp = (-2.0 * e) @ Q64[j] / len(batch) + 2.0 * lam * p
        gc = np.mean(-2.0 * e) + 2.0 * lam * c
        p = p - lr * gp
        if fit_bias:
            c = c - lr * gc
    return p, c


def init_local(K, init_cfg, stream):
    """Twin of the kernels' ``init_local``: zeros, or uniform ±scale drawn from the stream."""
    if int(init_cfg[RI_INIT]) == INIT_UNIFORM:
        return np.array([(2 * stream.next_float() - 1) * init_cfg[RI_SCALE] for _ in range(K)])
    return np.zeros(K)


def sgd_reconstruct_rows(indptr, idx, vals, glob, hp, init, keys):
    """Returns (P, c): each row starts from ``init_local`` on its own stream keys[r]."""
    Q, b = glob
    n = len(indptr) - 1
    P, c = np.zeros((n, Q.shape[1])), np.zeros(n)
    for r in range(n):
        s, e = indptr[r], indptr[r + 1]
        stream = Stream(int(keys[r]))
        p0 = init_local(Q.shape[1], init, stream)
        P[r], cb = sgd_reconstruct_user(idx[s:e], vals[s:e], Q, b, hp, p0, 0.0, stream)
        c[r] = cb if hp[HP_FIT_BIAS] != 0 else 0.0
    return P, c


def item_steps_user(items, vals, Q, b, hp, p, c, seed):
    """Returns (uniq, delta_Q, delta_b, p, c) — p, c changed only with joint training."""
    lr, lam, bs, steps, epochs, mu, fit_bias, joint = _hp(hp)
    uniq, loc = np.unique(items, return_inverse=True)
    Ql = Q[uniq].astype(np.float64)
    bl = b[uniq].astype(np.float64)
    p = np.array(p, np.float64)
    c = float(c)
    for batch in _batches(len(items), bs, steps, epochs, as_stream(seed)):
        r = loc[batch]
        e = vals[batch] - (mu + bl[r] + c + Ql[r] @ p)
        G = np.zeros_like(Ql)
        gb = np.zeros_like(bl)
        np.add.at(G, r, -2.0 * e[:, None] * p[None, :] + 2.0 * lam * Ql[r])
        np.add.at(gb, r, -2.0 * e + 2.0 * lam * bl[r])
        gp = (-2.0 * e) @ Ql[r] / len(batch) + 2.0 * lam * p
        gc = np.mean(-2.0 * e) + 2.0 * lam * c
        Ql -= lr * G / len(batch)
        if fit_bias:
            bl -= lr * gb / len(batch)
        if joint:
            p = p - lr * gp
            if fit_bias:
                c = c - lr * gc
    return uniq, Ql - Q[uniq], bl - b[uniq], p, c


def item_steps_rows(indptr, idx, vals, glob, local, hp, seeds):
    Q, b = glob
    P, c = local
    nnz = indptr[-1]
    d_items = np.full(nnz, -1, np.int64)
    d_Q = np.zeros((nnz, Q.shape[1]))
    d_b = np.zeros(nnz)
    for r in range(len(indptr) - 1):
        s, e = indptr[r], indptr[r + 1]
        uniq, dq, db, _, _ = item_steps_user(idx[s:e], vals[s:e], Q, b, hp, P[r], c[r],
                                             int(seeds[r]))
        m = len(uniq)
        d_items[s:s + m] = uniq
        d_Q[s:s + m] = dq
        d_b[s:s + m] = db
    return d_items, d_Q, d_b


def sgd_epoch(users, items, vals, user_params, item_params, cfg):
    P, c = (np.array(a, np.float64) for a in user_params)
    Q, b = (np.array(a, np.float64) for a in item_params)
    lr, lam, mu, fit_bias = cfg[SE_LR], cfg[SE_LAM], cfg[SE_OFFSET], cfg[SE_FIT_BIAS] != 0
    sse = 0.0
    for t in range(len(users)):
        u, i = users[t], items[t]
        e = vals[t] - (mu + c[u] + b[i] + P[u] @ Q[i])
        sse += e * e
        if fit_bias:
            c[u] += lr * (e - lam * c[u])
            b[i] += lr * (e - lam * b[i])
        pu = P[u].copy()
        P[u] += lr * (e * Q[i] - lam * pu)
        Q[i] += lr * (e * pu - lam * Q[i])
    return (P, c), (Q, b), sse


# ---------------------------------------------------------------------- one federated round
def fedrecon_round(data, clients, Q, b, *, seed, round_idx, split, support_fraction, recon,
                   recon_hp, update_hp, init_scale, ridge=(0.1, 1e-6)):
    """One round of Algorithm 1 as a plain per-client NumPy loop (server SGD, lr 1 applied by the
    caller): returns (items, mean ΔQ rows, mean Δb, weights). Consumes each client's stream in the
    kernel's order, so it reproduces ``fedrecon_clients`` + ``aggregate`` exactly.

    split : "random" | "time" | "none";  recon : "sgd" | "als"
    """
    indptr, items_all, values_all = data
    K = Q.shape[1]
    mu, fit_bias = float(update_hp[HP_OFFSET]), update_hp[HP_FIT_BIAS] != 0
    total = np.zeros((Q.shape[0], K))
    total_b = np.zeros(Q.shape[0])
    touched = np.zeros(Q.shape[0], bool)
    weights = []
    for u in clients:
        s0, e0 = indptr[u], indptr[u + 1]
        items, vals = items_all[s0:e0], values_all[s0:e0]
        n = e0 - s0
        stream = Stream(stream_key(seed, round_idx, int(u)))
        perm = np.arange(n)
        if split == "random":
            stream.shuffle(perm)
        if split == "none":
            sup = qry = perm
        else:
            n_s = min(max(int(np.ceil(n * support_fraction - 1e-9)), 1 if n else 0), n)
            sup, qry = perm[:n_s], perm[n_s:]
        if recon == "als":
            p, c = ridge_solve_row(items[sup], vals[sup], Q, b, ridge[0], ridge[1], mu, fit_bias)
        else:
            p0 = init_local(K, np.array([INIT_UNIFORM, init_scale]), stream)
            p, c = sgd_reconstruct_user(items[sup], vals[sup], Q, b, recon_hp, p0, 0.0, stream)
        uniq, dq, db, _, _ = item_steps_user(items[qry], vals[qry], Q, b, update_hp, p, c, stream)
        w = len(qry)
        weights.append(w)
        total[uniq] += w * dq
        total_b[uniq] += w * db
        touched[uniq] |= w > 0
    n_total = max(sum(weights), 1)
    rows = np.flatnonzero(touched)
    return rows, total[rows] / n_total, total_b[rows] / n_total, np.array(weights, float)


# ---------------------------------------------------------------------- implicit feedback
def implicit_solve_rows(indptr, idx, vals, fixed, alpha, lam):
    """Dense Hu-Koren-Volinsky solve per row: the full n_items-sized weighted least squares."""
    Y = fixed.astype(np.float64)
    n_items, K = Y.shape
    out = np.zeros((len(indptr) - 1, K))
    for r in range(len(indptr) - 1):
        s, e = indptr[r], indptr[r + 1]
        c = np.ones(n_items)
        p = np.zeros(n_items)
        np.add.at(c, idx[s:e], alpha * np.asarray(vals[s:e], np.float64))
        p[idx[s:e]] = 1.0
        A = (Y * c[:, None]).T @ Y + lam * np.eye(K)
        out[r] = np.linalg.solve(A, (Y * c[:, None]).T @ p)
    return out


def _implicit_start(items, vals, Q, cfg, seed):
    """Shared start of the implicit clients: split, then the exact weighted-ALS reconstruction.
    Returns (stream, query positions, p)."""
    split, frac = int(cfg[IC_SPLIT]), cfg[IC_SUPPORT_FRAC]
    alpha, lam_r = cfg[IC_ALPHA], cfg[IC_LAM]
    stream = Stream(seed)
    n = len(items)
    perm = np.arange(n)
    if split == SPLIT_RANDOM:
        stream.shuffle(perm)
    if split == SPLIT_NONE:
        n_s, q_start = n, 0
    else:
        n_s = min(max(int(np.ceil(n * frac - 1e-9)), 1 if n else 0), n)
        q_start = n_s
    sup = perm[:n_s]
    p = implicit_solve_rows(np.array([0, n_s]), items[sup], vals[sup], Q, alpha, lam_r)[0]
    return stream, perm[q_start:], p


def fedrecon_implicit_client(items, vals, Q, cfg, hp, seed, n_items):
    """Twin of one client of ``fedrecon_implicit_clients``: returns (uniq items, ΔQ rows, loss)."""
    alpha, m_neg, nu = cfg[IC_ALPHA], int(cfg[IC_NEG]), cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs, *_ = _hp(hp)
    stream, qry, p = _implicit_start(items, vals, Q, cfg, seed)
    batches = []
    for b in _batches(len(qry), bs, max_steps, epochs, stream):
        batches.append(b)
    visits = np.concatenate(batches) if batches else np.zeros(0, int)
    negs = np.array([stream.next_below(n_items) for _ in range(m_neg * len(visits))], dtype=int)
    q_items = items[qry]
    uniq = np.unique(np.concatenate([q_items, negs]))
    Ql = Q[uniq].astype(np.float64)
    row = {j: r for r, j in enumerate(uniq)}
    c_all = 1.0 + alpha * vals[qry]
    loss = float(np.mean(c_all * (1 - Q[q_items].astype(np.float64) @ p) ** 2)) if len(qry) else 0.0
    t0 = 0
    for b in batches:
        B = len(b)
        G = np.zeros_like(Ql)
        for t, qi in enumerate(b):
            r = row[q_items[qi]]
            G[r] += -2.0 * c_all[qi] * (1 - p @ Ql[r]) / B * p + 2.0 * l2 * Ql[r] / B
            for h in range(m_neg):
                rn = row[negs[(t0 + t) * m_neg + h]]
                G[rn] += 2.0 * nu * (p @ Ql[rn]) / (B * m_neg) * p
        Ql -= lr * G
        t0 += B
    return uniq, Ql - Q[uniq], loss


def fedrecon_implicit_full_client(items, vals, Q, cfg, hp, seed, n_items):
    """Dense twin of one client of ``fedrecon_implicit_full_clients``: every catalog row is
    updated explicitly at every step. Returns the dense ΔQ (n_items, K) and the loss."""
    alpha, nu = cfg[IC_ALPHA], cfg[IC_NEG_WEIGHT]
    lr, l2, bs, max_steps, epochs, *_ = _hp(hp)
    stream, qry, p = _implicit_start(items, vals, Q, cfg, seed)
    Qd = Q.astype(np.float64).copy()
    q_items = items[qry]
    c_all = 1.0 + alpha * vals[qry]
    loss = float(np.mean(c_all * (1 - Qd[q_items] @ p) ** 2)) if len(qry) else 0.0
    eta = lr * 2.0 * nu / n_items
    for b in _batches(len(qry), bs, max_steps, epochs, stream):
        G = np.zeros_like(Qd)
        for t in b:
            j = q_items[t]
            G[j] += -2.0 * c_all[t] * (1 - p @ Qd[j]) / len(b) * p + 2.0 * l2 * Qd[j] / len(b)
        Qd = Qd - lr * G - eta * np.outer(Qd @ p, p)
    return Qd - Q, loss


# ---------------------------------------------------------------------- robust aggregation
def robust_rows(items, d_Q, d_b, cover, beta, median):
    """Twin of ``robust_sorted_runs``: per item (sorted), over entries with cover > 0, the
    coordinate-wise median or β-trimmed mean of [d_Q | d_b], times the item's Σ cover."""
    keep = cover > 0
    out_items = np.unique(items[keep])
    X = np.hstack([d_Q, d_b[:, None]]).astype(np.float64)
    rows = []
    for j in out_items:
        sel = keep & (items == j)
        v = np.sort(X[sel], axis=0)
        n = len(v)
        if median:
            stat = np.median(v, axis=0)
        else:
            t = int(np.floor(beta * n))
            stat = v[t:n - t].mean(axis=0)
        rows.append(cover[sel].sum() * stat)
    R = np.array(rows).reshape(len(out_items), X.shape[1])
    return out_items, R[:, :-1], R[:, -1]


# ---------------------------------------------------------------------- federated hypergradients
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


def tree_sum(items, node_lo, node_level, s_Q, s_b, depth, a, b):
    """Twin of ``tree_sum_runs``: per item, a dict of tree nodes {(lo, level): row}, combined
    level by level (left + right; a lone child moves up) while the parent lies in [a, b)."""
    X = np.hstack([s_Q, s_b[:, None]]).astype(np.float64)
    out = []
    for j in np.unique(items):
        nodes = {(int(lo), int(lv)): X[e] for e, (lo, lv) in
                 enumerate(zip(node_lo, node_level)) if items[e] == j}
        for L in range(1, depth + 1):
            for p in sorted({lo >> L for lo, lv in nodes if lv < L}):
                if (p << L) < a or ((p + 1) << L) > b:
                    continue
                kids = [(lo, lv) for lo, lv in sorted(nodes) if lv < L and lo >> L == p]
                row = nodes.pop(kids[0])
                if len(kids) == 2:
                    row = row + nodes.pop(kids[1])
                nodes[(p << L, L)] = row
        out += [(j, lo, lv, row) for (lo, lv), row in sorted(nodes.items())]
    R = np.array([r for *_, r in out]).reshape(len(out), X.shape[1])
    return (np.array([o[0] for o in out]), np.array([o[1] for o in out]),
            np.array([o[2] for o in out]), R[:, :-1], R[:, -1])


def grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth):
    """Twin of ``grouped_tree_sum``: per (item, group), Σ scale·delta in entry order from 0;
    then ``tree_sum`` of those group sums over the whole tree. Returns (items, s_Q, s_b)."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    groups, scale = group[owner], scale[owner]
    used = [e for e in range(len(items)) if items[e] >= 0 and scale[e] != 0.0]
    keys = sorted({(int(items[e]), int(groups[e])) for e in used})
    row = {k: i for i, k in enumerate(keys)}
    S = np.zeros((len(keys), d_Q.shape[1] + 1))
    for e in used:
        S[row[(int(items[e]), int(groups[e]))]] += scale[e] * np.append(
            d_Q[e].astype(np.float64), d_b[e])
    it = np.array([k[0] for k in keys], np.int64)
    lo = np.array([k[1] for k in keys], np.int64)
    j, _, _, s_Q, s_b = tree_sum(it, lo, np.zeros_like(lo), S[:, :-1], S[:, -1], depth, 0,
                                 2 ** depth)
    return j, s_Q, s_b


def group_counters(clients, group, offsets, items, num, w, bad, empty, losses, weights,
                   values_per_row, rank_values, n_groups):
    """Twin of ``group_counters``: each counter column by ``np.bincount`` over the clients'
    groups (it adds in input order), the worst client by a lexsort per group."""
    owner = np.repeat(np.arange(len(clients)), np.diff(offsets))
    sent = np.bincount(owner[(items >= 0) & (num[owner] != 0)], minlength=len(clients))
    used, finite = w > 0, np.isfinite(losses)
    loss_w = np.where(used & finite, weights, 0.0)
    cols = [np.where(used, w, 0.0), np.ones(len(clients)), used * 1.0, bad * 1.0,
            (bad & ~finite) * 1.0, empty * 1.0, sent * values_per_row + used * rank_values,
            loss_w * np.where(loss_w > 0, losses, 0.0), loss_w]
    present = np.unique(group)
    at = np.searchsorted(present, group)
    stats = np.stack([np.bincount(at, weights=c, minlength=len(present)) for c in cols], 1)
    key = np.where(finite, losses, np.inf)
    worst_c, worst_l = np.full(len(present), -1, np.int64), np.full(len(present), -np.inf)
    for s in range(len(present)):
        k = np.flatnonzero((at == s) & (weights > 0))
        if len(k):
            best = k[np.lexsort((clients[k], -key[k]))[0]]
            worst_c[s], worst_l[s] = clients[best], key[best]
    return present, stats.reshape(len(present), len(cols)), worst_c, worst_l


# ---------------------------------------------------------------------- catalog, local rows
def catalog_base(items, G, gb, imap):
    """Dense twin of the item map: each entry's global item vector and bias."""
    rptr, rows, coef, _ = imap
    Zb, bb = np.zeros((len(items), G.shape[1])), np.zeros(len(items))
    for t, j in enumerate(items):
        r, w = rows[rptr[j]:rptr[j + 1]], coef[rptr[j]:rptr[j + 1]]
        Zb[t] = w @ G[r].astype(np.float64)
        bb[t] = w @ gb[r].astype(np.float64)
    return Zb, bb


def catalog_reconstruct(items, vals, G, gb, imap, cfg, cc, hp, stream):
    """Twin of catalog.reconstruct: (x = [p; c], lb, V, dv, A) with A the last normal matrix."""
    K = G.shape[1]
    _, lam, _, _, _, mu, fb, _ = _hp(hp)
    d = K + 1 if fb else K
    Zb, bb = catalog_base(items, G, gb, imap)
    bk = imap[3][items]
    lb = np.unique(bk[bk >= 0])
    slot = np.where(bk >= 0, np.searchsorted(lb, bk), -1)
    V, dv = np.zeros((len(lb), K)), np.zeros(len(lb))
    x0 = np.zeros(K + 1)
    if int(cc[OC_DEFAULT]) >= 0:
        x0 = np.append(G[int(cc[OC_DEFAULT])].astype(np.float64), gb[int(cc[OC_DEFAULT])])
    A = np.zeros((d, d))
    if int(cfg[CC_RECON]) == RECON_ALS:
        reg = cfg[CC_ALS_LAM] * len(items) + cfg[CC_ALS_LAM0]
        x = np.zeros(K + 1)
        for _ in range(max(int(cc[OC_SWEEPS]), 1) if len(lb) else 1):
            Vz, dz = _local_part(slot, V, dv)
            Z = np.hstack([Zb + Vz, np.ones((len(items), 1))])[:, :d]
            y = vals - mu - bb - dz - Z @ x0[:d]
            A = Z.T @ Z + reg * np.eye(d)
            x[:d] = x0[:d] + np.linalg.solve(A, Z.T @ y)
            z = np.append(x[:K], 1.0)[:d]
            res = vals - mu - bb - (x[K] if fb else 0.0) - Zb @ x[:K]
            for s in range(len(lb)):
                n_s = np.sum(slot == s)
                k = res[slot == s].sum() / (n_s * (z @ z) + cfg[CC_ALS_LAM] * n_s + cfg[CC_ALS_LAM0])
                V[s], dv[s] = x[:K] * k, (k if fb else 0.0)
        return x, lb, V, dv, A
    x = x0.copy() if int(cc[OC_DEFAULT]) >= 0 else np.append(
        init_local(K, np.array([cfg[CC_INIT], cfg[CC_INIT_SCALE]]), stream), 0.0)
    lr = float(hp[HP_LR])
    for batch in _batches(len(items), int(hp[HP_BATCH]), int(hp[HP_STEPS]), int(hp[HP_EPOCHS]),
                          stream):
        s = slot[batch]
        Vz, dz = _local_part(s, V, dv)
        Z = Zb[batch] + Vz
        e = vals[batch] - mu - bb[batch] - dz - x[K] * fb - Z @ x[:K]
        gV, gd = np.zeros_like(V), np.zeros_like(dv)
        np.add.at(gV, s[s >= 0], -2.0 * e[s >= 0, None] * x[None, :K])
        np.add.at(gd, s[s >= 0], -2.0 * e[s >= 0])
        gp, gc = (-2.0 * e) @ Z / len(batch), np.mean(-2.0 * e)
        V -= lr * (gV / len(batch) + 2 * lam * V)
        if fb:
            dv -= lr * (gd / len(batch) + 2 * lam * dv)
        x[:K] -= lr * (gp + 2 * lam * x[:K])
        if fb:
            x[K] -= lr * (gc + 2 * lam * x[K])
    if not fb:
        x[K] = 0.0
    return x, lb, V, dv, A


def _catalog_slots(lb, bk):
    """Slot in lb of each bucket (−1: none, or not reconstructed)."""
    pos = np.searchsorted(lb, bk)
    ok = (bk >= 0) & (pos < len(lb))
    ok[ok] = lb[pos[ok]] == bk[ok]
    return np.where(ok, pos, -1)


def _local_part(slot, V, dv):
    """Each entry's local row and bias (zeros without one)."""
    has = slot >= 0
    Vz = np.zeros((len(slot), V.shape[1]))
    Vz[has] = V[slot[has]]
    return Vz, np.where(has, dv[np.maximum(slot, 0)] if len(dv) else 0.0, 0.0)


def catalog_predict(items, x, lb, V, dv, G, gb, imap, mu):
    """Twin of the catalog scoring: μ + b_e + c + p·q_e with the user's local rows."""
    K = G.shape[1]
    Zb, bb = catalog_base(items, G, gb, imap)
    Vz, dz = _local_part(_catalog_slots(lb, imap[3][items]), V, dv)
    return mu + bb + dz + x[K] + (Zb + Vz) @ x[:K]


def catalog_client(s_items, s_vals, q_items, q_vals, G, gb, imap, cfg, cc, recon_hp, update_hp,
                   stream):
    """Twin of catalog.catalog_client: (query loss, rows, ΔG rows, Δgb rows), the learned
    default's delta last when there is one."""
    K = G.shape[1]
    lr, lam, bs, steps, epochs, mu, fb, _ = _hp(update_hp)
    x, lb, V, dv, A = catalog_reconstruct(s_items, s_vals, G, gb, imap, cfg, cc, recon_hp,
                                          stream)
    pred = catalog_predict(q_items, x, lb, V, dv, G, gb, imap, mu)
    e = q_vals - pred
    loss = float(np.mean(e ** 2)) if len(e) else 0.0
    Zq, _ = catalog_base(q_items, G, gb, imap)
    v_loc, d_loc = _local_part(_catalog_slots(lb, imap[3][q_items]), V, dv)
    gx = np.append((-2.0 * e) @ (Zq + v_loc) / max(len(e), 1),
                   np.sum(-2.0 * e) / max(len(e), 1) * fb)
    rptr, rows, coef, _ = imap
    terms = [(rows[rptr[j]:rptr[j + 1]], coef[rptr[j]:rptr[j + 1]]) for j in q_items]
    uniq = np.unique(np.concatenate([r for r, _ in terms] + [np.zeros(0, np.int64)]))
    Gl, gbl = G[uniq].astype(np.float64), gb[uniq].astype(np.float64)
    loc = [np.searchsorted(uniq, r) for r, _ in terms]
    for batch in _batches(len(q_items), bs, steps, epochs, stream):
        Gg, gbg = np.zeros_like(Gl), np.zeros_like(gbl)
        for t in batch:
            w = terms[t][1]
            z = v_loc[t] + w @ Gl[loc[t]]
            err = q_vals[t] - mu - x[K] * fb - d_loc[t] - w @ gbl[loc[t]] - z @ x[:K]
            np.add.at(Gg, loc[t], -2.0 * err * w[:, None] * x[None, :K] + 2 * lam * Gl[loc[t]])
            if fb:
                np.add.at(gbg, loc[t], -2.0 * err * w + 2 * lam * gbl[loc[t]])
        Gl -= lr * Gg / len(batch)
        gbl -= lr * gbg / len(batch)
    out_rows, dG, dgb = list(uniq), list(Gl - G[uniq]), list(gbl - gb[uniq])
    if int(cc[OC_DEFAULT]) >= 0:
        d = K + 1 if fb else K
        g = gx[:d]
        if int(cfg[CC_RECON]) == RECON_ALS:
            g = (cfg[CC_ALS_LAM] * len(s_items) + cfg[CC_ALS_LAM0]) * np.linalg.solve(A, g)
        g = np.append(g, 0.0)[:K + 1]
        out_rows.append(int(cc[OC_DEFAULT]))
        dG.append(-lr * g[:K])
        dgb.append(-lr * g[K])
    return loss, np.array(out_rows, np.int64), np.array(dG).reshape(-1, K), np.array(dgb)
