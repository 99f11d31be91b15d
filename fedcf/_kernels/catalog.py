"""Client work when the global model holds only a catalog of items (FedReconCatalogMF).

An item e of the population is scored with the item vector and bias

    q_e = Σ_k coef_k · G[row_k] + V[bucket_e],      b_e = Σ_k coef_k · gb[row_k] + d[bucket_e]

where the terms (row_k, coef_k) come from the item map ``imap = (rptr, rows, coef, bucket)``: a
catalog item has the single term (its own row, 1); an out-of-catalog item has its feature rows of
the federated linear adapter (the one constant feature is the shared UNK row) or no term at
all (today's fallback). ``bucket_e`` ≥ 0 names one of B hashed *local* rows (V, d): they belong to
the user, are reconstructed on the device with (p, c) from the support set — ALS: alternating
exact solves; SGD: joint steps — and never reach an output. The global rows G (catalog rows,
adapter rows, and optionally the learned default (p₀, c₀) of the local parameters) are frozen
during reconstruction; k_u mini-batch steps then move the global rows the query set touches.

The learned default is the prior mean of the ridge solve (and the start of SGD reconstruction);
its client delta is one step of −lr · Λ A⁻¹ ∇ₓ(query loss) (A the regularized normal matrix of
the last user solve, Λ its ridge diagonal). That is the exact ∂(query loss)/∂(p₀, c₀) only for a
ridge reconstruction without local rows (tested against finite differences). With local rows
(alternating sweeps) it differentiates the last user solve alone: the local rows are held at
their values, although they too depend on (p₀, c₀) through the sweeps, so the delta is an
approximation. For SGD reconstruction it is the first-order term ∇ₓ (x treated as x₀ plus a
constant).

Outputs are laid out as in clients.py. ``cc`` is ``layout.catalog_cfg``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .als import cholesky_solve_inplace
from .clients import client_sets
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
    OC_DEFAULT,
    OC_SWEEPS,
    RECON_ALS,
)
from .sgd import init_local
from .util import minibatch_schedule, unique_rows


@njit(cache=True)
def base_vectors(items, G, gb, imap):
    """(Zb (n, K), bb (n,)) float64: the global part of each entry's item vector and bias."""
    rptr, rows, coef = imap[0], imap[1], imap[2]
    n, K = items.shape[0], G.shape[1]
    Zb, bb = np.zeros((n, K)), np.zeros(n)
    for t in range(n):
        j = items[t]
        for k in range(rptr[j], rptr[j + 1]):
            r, w = rows[k], coef[k]
            for a in range(K):
                Zb[t, a] += w * G[r, a]
            bb[t] += w * gb[r]
    return Zb, bb


@njit(cache=True)
def patch_vectors(items, imap, uniq, m, Gl, gbl, G, gb, Zb, bb):
    """Replace, in (Zb, bb) from ``base_vectors``, the contribution of the m rows uniq[:m] by
    their finetuned values (Gl, gbl)."""
    rptr, rows, coef = imap[0], imap[1], imap[2]
    for t in range(items.shape[0]):
        j = items[t]
        for k in range(rptr[j], rptr[j + 1]):
            s = np.searchsorted(uniq[:m], rows[k])
            if s < m and uniq[s] == rows[k]:
                w = coef[k]
                for a in range(G.shape[1]):
                    Zb[t, a] += w * (Gl[s, a] - G[rows[k], a])
                bb[t] += w * (gbl[s] - gb[rows[k]])


@njit(cache=True)
def local_table(items, bucket):
    """Sorted distinct buckets of the support entries (lb (m,)) and each entry's slot (−1: the
    item has no local row)."""
    n = items.shape[0]
    keys = np.empty(n, np.int64)
    live = 0
    for t in range(n):
        keys[t] = bucket[items[t]]
        live += keys[t] >= 0
    lb = np.empty(live, np.int64)
    k = 0
    for t in range(n):
        if keys[t] >= 0:
            lb[k] = keys[t]
            k += 1
    lb = np.unique(lb)
    return lb, slots_of(items, bucket, lb)


@njit(cache=True)
def slots_of(items, bucket, lb):
    """Slot in lb of each entry's bucket, −1 when it has none or the support never touched it."""
    slot = np.full(items.shape[0], -1, np.int64)
    for t in range(items.shape[0]):
        bk = bucket[items[t]]
        if bk >= 0 and lb.shape[0] > 0:
            s = np.searchsorted(lb, bk)
            if s < lb.shape[0] and lb[s] == bk:
                slot[t] = s
    return slot


@njit(cache=True)
def item_vector(t, Zb, bb, slot, V, dv, z):
    """z = the entry's item vector; returns its item bias."""
    s = slot[t]
    for a in range(Zb.shape[1]):
        z[a] = Zb[t, a] + (V[s, a] if s >= 0 else 0.0)
    return bb[t] + (dv[s] if s >= 0 else 0.0)


@njit(cache=True)
def solve_user(vals, Zb, bb, slot, V, dv, mu, x0, ridge, fb, A, x):
    """x = [p; c] minimising Σ (r − μ − b_e − c − p·q_e)² + (λn + λ₀)‖x − x0‖² (exact, as the
    ridge solves of als.py with prior mean x0). A (d × d) is left holding the regularized normal
    matrix (before factorization); returns False when it is not positive definite."""
    K, n = Zb.shape[1], vals.shape[0]
    d = K + 1 if fb else K
    z = np.empty(d)
    L = np.zeros((d, d))
    rhs = np.zeros(d)
    for t in range(n):
        be = item_vector(t, Zb, bb, slot, V, dv, z[:K])
        if fb:
            z[K] = 1.0
        y = vals[t] - mu - be
        for a in range(d):
            y -= z[a] * x0[a]
        for a in range(d):
            rhs[a] += z[a] * y
            for c in range(d):
                L[a, c] += z[a] * z[c]
    for a in range(d):
        L[a, a] += ridge[0] * n + ridge[1]
    A[:d, :d] = L
    ok = cholesky_solve_inplace(L, rhs, d)
    for a in range(d):
        x[a] = x0[a] + rhs[a] if ok else np.nan
    return ok


@njit(cache=True)
def fit_local_rows(vals, Zb, bb, slot, mu, x, ridge, fb, V, dv):
    """Each local row (v, d) given the user: the ridge optimum is parallel to z = [p; 1],
    v = z · Σ res / (n_s‖z‖² + λ n_s + λ₀), res = r − μ − b − c − p·Zb (global part only)."""
    K = Zb.shape[1]
    m = V.shape[0]
    zz = 1.0 if fb else 0.0
    for a in range(K):
        zz += x[a] * x[a]
    c = x[K] if fb else 0.0
    tot, cnt = np.zeros(m), np.zeros(m)
    for t in range(vals.shape[0]):
        s = slot[t]
        if s >= 0:
            res = vals[t] - mu - bb[t] - c
            for a in range(K):
                res -= x[a] * Zb[t, a]
            tot[s] += res
            cnt[s] += 1.0
    for s in range(m):
        k = tot[s] / (cnt[s] * zz + ridge[0] * cnt[s] + ridge[1])
        for a in range(K):
            V[s, a] = x[a] * k
        dv[s] = k if fb else 0.0


@njit(cache=True)
def sgd_local(vals, Zb, bb, slot, mu, hp, x, V, dv, state):
    """k_r joint mini-batch steps on [p; c] and the local rows (global part frozen)."""
    K, m = Zb.shape[1], V.shape[0]
    lr, lam, fb = hp[HP_LR], hp[HP_LAM], hp[HP_FIT_BIAS] != 0.0
    visit, ends, steps = minibatch_schedule(vals.shape[0], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                            int(hp[HP_EPOCHS]), state)
    z = np.empty(K)
    gx, gV, gd = np.zeros(K + 1), np.zeros((m, K)), np.zeros(m)
    start = 0
    for st in range(steps):
        end = ends[st]
        gx[:] = 0.0
        gV[:] = 0.0
        gd[:] = 0.0
        for i in range(start, end):
            t = visit[i]
            e = vals[t] - mu - item_vector(t, Zb, bb, slot, V, dv, z) - (x[K] if fb else 0.0)
            for a in range(K):
                e -= x[a] * z[a]
            s = slot[t]
            for a in range(K):
                gx[a] -= 2.0 * e * z[a]
                if s >= 0:
                    gV[s, a] -= 2.0 * e * x[a]
            gx[K] -= 2.0 * e
            if s >= 0:
                gd[s] -= 2.0 * e
        inv = 1.0 / (end - start)
        for s in range(m):
            for a in range(K):
                V[s, a] -= lr * (gV[s, a] * inv + 2.0 * lam * V[s, a])
            if fb:
                dv[s] -= lr * (gd[s] * inv + 2.0 * lam * dv[s])
        for a in range(K):
            x[a] -= lr * (gx[a] * inv + 2.0 * lam * x[a])
        if fb:
            x[K] -= lr * (gx[K] * inv + 2.0 * lam * x[K])
        start = end


@njit(cache=True)
def reconstruct(vals, Zb, bb, slot, m, x0, cfg, cc, hp, state, A):
    """Local parameters from the support set: (x = [p; c] (K+1,), V (m, K), dv (m,)). ALS
    alternates the user solve and the local-row solve ``cc[OC_SWEEPS]`` times (once without local
    rows); SGD starts from x0 (the learned default) or ``init_local``."""
    K = Zb.shape[1]
    fb = hp[HP_FIT_BIAS] != 0.0
    x, V, dv = np.zeros(K + 1), np.zeros((m, K)), np.zeros(m)
    mu = hp[HP_OFFSET]
    if int(cfg[CC_RECON]) == RECON_ALS:
        ridge = np.array([cfg[CC_ALS_LAM], cfg[CC_ALS_LAM0]])
        for _ in range(max(int(cc[OC_SWEEPS]), 1) if m > 0 else 1):
            solve_user(vals, Zb, bb, slot, V, dv, mu, x0, ridge, fb, A, x)
            if m > 0:
                fit_local_rows(vals, Zb, bb, slot, mu, x, ridge, fb, V, dv)
        return x, V, dv
    if int(cc[OC_DEFAULT]) >= 0:
        x[:] = x0
    else:
        cb = np.zeros(1)
        init_local(x[:K], cb, int(cfg[CC_INIT]), cfg[CC_INIT_SCALE], state)
    sgd_local(vals, Zb, bb, slot, mu, hp, x, V, dv, state)
    if not fb:
        x[K] = 0.0
    return x, V, dv


@njit(cache=True)
def loss_and_grad(vals, Zb, bb, slot, V, dv, mu, x, fb, g):
    """Mean squared error of the local model on a set; g = its gradient in x = [p; c]."""
    K, n = Zb.shape[1], vals.shape[0]
    z = np.empty(K)
    g[:] = 0.0
    s = 0.0
    for t in range(n):
        e = vals[t] - mu - item_vector(t, Zb, bb, slot, V, dv, z) - (x[K] if fb else 0.0)
        for a in range(K):
            e -= x[a] * z[a]
        s += e * e
        for a in range(K):
            g[a] -= 2.0 * e * z[a] / n
        if fb:
            g[K] -= 2.0 * e / n
    return s / n if n > 0 else 0.0


@njit(cache=True)
def entry_terms(items, imap):
    """The query entries' global terms: (tptr (n+1,), trow, tcoef)."""
    rptr, rows, coef = imap[0], imap[1], imap[2]
    n = items.shape[0]
    tptr = np.zeros(n + 1, np.int64)
    for t in range(n):
        tptr[t + 1] = tptr[t] + rptr[items[t] + 1] - rptr[items[t]]
    trow, tcoef = np.empty(tptr[n], np.int64), np.empty(tptr[n])
    for t in range(n):
        k0 = rptr[items[t]]
        for k in range(tptr[t], tptr[t + 1]):
            trow[k] = rows[k0 + k - tptr[t]]
            tcoef[k] = coef[k0 + k - tptr[t]]
    return tptr, trow, tcoef


@njit(cache=True)
def global_steps(items, vals, imap, G, gb, slot, V, dv, x, hp, state, row_lo=0):
    """k_u mini-batch steps on the global rows the entries' terms touch (rows below ``row_lo``
    stay frozen), local parameters frozen. Returns (uniq, m, Gl, gbl): the m touched rows and
    their updated values (float64)."""
    K = G.shape[1]
    lr, lam, mu, fb = hp[HP_LR], hp[HP_LAM], hp[HP_OFFSET], hp[HP_FIT_BIAS] != 0.0
    tptr, trow, tcoef = entry_terms(items, imap)
    nt = trow.shape[0]
    uniq, loc = np.empty(max(nt, 1), np.int64), np.empty(max(nt, 1), np.int64)
    m = unique_rows(trow, uniq, loc)
    Gl, gbl = np.empty((max(m, 1), K)), np.empty(max(m, 1))
    for r in range(m):
        Gl[r] = G[uniq[r]]
        gbl[r] = gb[uniq[r]]
    Gg, gbg = np.zeros((max(m, 1), K)), np.zeros(max(m, 1))
    visit, ends, steps = minibatch_schedule(items.shape[0], int(hp[HP_BATCH]), int(hp[HP_STEPS]),
                                            int(hp[HP_EPOCHS]), state)
    z = np.empty(K)
    start = 0
    for st in range(steps):
        end = ends[st]
        for i in range(start, end):
            t, s = visit[i], slot[visit[i]]
            e = vals[t] - mu - (x[K] if fb else 0.0) - (dv[s] if s >= 0 else 0.0)
            for a in range(K):
                z[a] = V[s, a] if s >= 0 else 0.0
            for k in range(tptr[t], tptr[t + 1]):
                e -= tcoef[k] * gbl[loc[k]]
                for a in range(K):
                    z[a] += tcoef[k] * Gl[loc[k], a]
            for a in range(K):
                e -= x[a] * z[a]
            for k in range(tptr[t], tptr[t + 1]):
                r, w = loc[k], tcoef[k]
                if trow[k] < row_lo:
                    continue
                for a in range(K):
                    Gg[r, a] += -2.0 * e * w * x[a] + 2.0 * lam * Gl[r, a]
                if fb:
                    gbg[r] += -2.0 * e * w + 2.0 * lam * gbl[r]
        inv = lr / (end - start)
        for i in range(start, end):  # apply each touched row once, then clear its gradient
            t = visit[i]
            for k in range(tptr[t], tptr[t + 1]):
                r = loc[k]
                for a in range(K):
                    Gl[r, a] -= inv * Gg[r, a]
                    Gg[r, a] = 0.0
                gbl[r] -= inv * gbg[r]
                gbg[r] = 0.0
        start = end
    return uniq, m, Gl, gbl


@njit(cache=True)
def default_step(A, gx, ridge_diag, fb, als, lr, K):
    """The client's delta of the learned default: −lr · Λ A⁻¹ ∇ₓ for the ridge solve (exact
    without local rows; local rows held fixed otherwise), −lr · ∇ₓ (first order) for SGD
    reconstruction — see the module docstring."""
    d = K + 1 if fb else K
    g = gx[:d].copy()
    if als:
        L = A[:d, :d].copy()
        if not cholesky_solve_inplace(L, g, d):
            g[:] = np.nan
        g *= ridge_diag
    out = np.zeros(K + 1)
    for a in range(d):
        out[a] = -lr * g[a]
    return out


@njit(cache=True)
def write_client(uniq, m, Gl, gbl, G, gb, drow, dstep, base, length, out):
    """Slots [base, base + length): the m row deltas, then the default's (drow ≥ 0), then −1."""
    d_items, d_Q, d_b = out[1], out[2], out[3]
    K = G.shape[1]
    for t in range(length):
        if t < m:
            d_items[base + t] = uniq[t]
            for a in range(K):
                d_Q[base + t, a] = Gl[t, a] - G[uniq[t], a]
            d_b[base + t] = gbl[t] - gb[uniq[t]]
        elif t == m and drow >= 0:
            d_items[base + t] = drow
            for a in range(K):
                d_Q[base + t, a] = dstep[a]
            d_b[base + t] = dstep[K]
        else:
            d_items[base + t] = -1
            for a in range(K):
                d_Q[base + t, a] = 0.0
            d_b[base + t] = 0.0


@njit(cache=True)
def default_x(G, gb, cc, K):
    """x0 = [p₀; c₀]: the learned default's row, or zeros."""
    x0 = np.zeros(K + 1)
    row = int(cc[OC_DEFAULT])
    if row >= 0:
        for a in range(K):
            x0[a] = G[row, a]
        x0[K] = gb[row]
    return x0


@njit(cache=True)
def catalog_client(s_items, s_vals, q_items, q_vals, G, gb, imap, cfg, cc, recon_hp,
                   update_hp, state, base, length, out):
    """One client's ClientUpdate; returns its query loss before the update."""
    K = G.shape[1]
    fb = update_hp[HP_FIT_BIAS] != 0.0
    mu = update_hp[HP_OFFSET]
    x0 = default_x(G, gb, cc, K)
    Zs, bs = base_vectors(s_items, G, gb, imap)
    lb, s_slot = local_table(s_items, imap[3])
    A = np.zeros((K + 1, K + 1))
    x, V, dv = reconstruct(s_vals, Zs, bs, s_slot, lb.shape[0], x0, cfg, cc, recon_hp, state, A)
    Zq, bq = base_vectors(q_items, G, gb, imap)
    q_slot = slots_of(q_items, imap[3], lb)
    gx = np.zeros(K + 1)
    loss = loss_and_grad(q_vals, Zq, bq, q_slot, V, dv, mu, x, fb, gx)
    als = int(cfg[CC_RECON]) == RECON_ALS
    ridge_diag = cfg[CC_ALS_LAM] * s_items.shape[0] + cfg[CC_ALS_LAM0]
    dstep = default_step(A, gx, ridge_diag, fb, als, update_hp[HP_LR], K)
    uniq, m, Gl, gbl = global_steps(q_items, q_vals, imap, G, gb, q_slot, V, dv, x, update_hp,
                                    state)
    write_client(uniq, m, Gl, gbl, G, gb, int(cc[OC_DEFAULT]), dstep, base, length, out)
    return loss


@njit(cache=True, parallel=True)
def catalog_clients(data, clients, glob, imap, cfg, cc, recon_hp, update_hp, ids, out):
    """Federated Reconstruction ClientUpdate with a catalog, local rows, adapter and default.

    data : (indptr int64, items int (population item ids, rows of imap), values float64)
    glob : (G (R, K), gb (R,)) global rows; imap : (rptr, rows, coef, bucket), see the module
    cfg : ``layout.client_cfg``; cc : ``layout.catalog_cfg``; ids : uint64 [seed, round]
    out : (offsets (m+1,), d_items, d_Q, d_b, losses (m,)) as in clients.py; a client's slots
    must hold (query terms) + 1 when a default is learned.
    """
    G, gb = glob[0], glob[1]
    offsets, losses = out[0], out[4]
    for k in prange(clients.shape[0]):
        state, s_items, s_vals, q_items, q_vals = client_sets(data, clients[k], cfg, ids)
        losses[k] = catalog_client(s_items, s_vals, q_items, q_vals, G, gb, imap, cfg, cc,
                                   recon_hp, update_hp, state, offsets[k],
                                   offsets[k + 1] - offsets[k], out)


@njit(cache=True)
def reconstruct_one(items, vals, G, gb, imap, cfg, cc, hp, state):
    """A user's local model from their ratings: (x = [p; c], lb (m,) buckets, V (m, K), dv);
    ``state`` (uint64 (1,)) is the user's stream, consumed by SGD reconstruction."""
    K = G.shape[1]
    Zs, bs = base_vectors(items, G, gb, imap)
    lb, slot = local_table(items, imap[3])
    A = np.zeros((K + 1, K + 1))
    x, V, dv = reconstruct(vals, Zs, bs, slot, lb.shape[0], default_x(G, gb, cc, K), cfg, cc,
                           hp, state, A)
    return x, lb, V, dv


@njit(cache=True, parallel=True)
def catalog_recon_predict(support, query, glob, imap, cfg, cc, hp, ft_hp, keys, out):
    """ReconEval in one call: user r reconstructs from support row r (its stream keys[r]) and
    predicts query row r. With ft_hp = [row_lo, *layout.sgd_hp] and row_lo ≥ 0, the user then
    finetunes the global rows ≥ row_lo its support set touches (its local parameters frozen)
    before scoring — FedRecon + finetune (0: all rows; the first adapter row: only those).
    out : (pred (query nnz,), P (n, K), c (n,)) float64, overwritten."""
    G, gb = glob[0], glob[1]
    pred, P, c = out[0], out[1], out[2]
    K = G.shape[1]
    fb = hp[HP_FIT_BIAS] != 0.0
    for r in prange(support[0].shape[0] - 1):
        s, e = support[0][r], support[0][r + 1]
        state = np.array([keys[r]])
        s_items, s_vals = support[1][s:e], support[2][s:e]
        x, lb, V, dv = reconstruct_one(s_items, s_vals, G, gb, imap, cfg, cc, hp, state)
        for a in range(K):
            P[r, a] = x[a]
        c[r] = x[K] if fb else 0.0
        qs, qe = query[0][r], query[0][r + 1]
        q_items = query[1][qs:qe]
        Zq, bq = base_vectors(q_items, G, gb, imap)
        if ft_hp[0] >= 0:
            s_slot = slots_of(s_items, imap[3], lb)
            uniq, m, Gl, gbl = global_steps(s_items, s_vals, imap, G, gb, s_slot, V, dv, x,
                                            ft_hp[1:], state, int(ft_hp[0]))
            patch_vectors(q_items, imap, uniq, m, Gl, gbl, G, gb, Zq, bq)
        slot = slots_of(q_items, imap[3], lb)
        z = np.empty(K)
        for t in range(qe - qs):
            v = hp[HP_OFFSET] + item_vector(t, Zq, bq, slot, V, dv, z) + c[r]
            for a in range(K):
                v += x[a] * z[a]
            pred[qs + t] = v
