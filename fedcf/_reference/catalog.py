"""NumPy twins of ``fedcf._kernels.catalog`` (out-of-catalog items: catalog rows, local rows, adapter):
slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    CC_ALS_LAM,
    CC_ALS_LAM0,
    CC_INIT,
    CC_INIT_SCALE,
    CC_RECON,
    HP_BATCH,
    HP_EPOCHS,
    HP_LR,
    HP_STEPS,
    OC_DEFAULT,
    OC_SWEEPS,
    RECON_ALS,
)
from .sgd import _batches, _hp, init_local


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
