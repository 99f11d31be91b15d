"""NumPy twins of ``fedcf._kernels.als`` (ridge and implicit ALS solves): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import (
    CFG_FIT_BIAS,
    CFG_LAM,
    CFG_LAM0,
    CFG_OFFSET,
)


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


def implicit_solve_rows(indptr, idx, vals, fixed, alpha, lam, *, ones=False, offset=None):
    """Dense Hu-Koren-Volinsky solve per row: the full n_items-sized weighted least squares of
    p_j − offset_j on [fixed_j, 1 if ``ones``]. Returns (n_rows, K + ones): factors, then bias."""
    Y = fixed.astype(np.float64)
    if ones:
        Y = np.hstack([Y, np.ones((len(Y), 1))])
    n_items, d = Y.shape
    off = np.zeros(n_items) if offset is None else np.asarray(offset, np.float64)
    out = np.zeros((len(indptr) - 1, d))
    for r in range(len(indptr) - 1):
        s, e = indptr[r], indptr[r + 1]
        c = np.ones(n_items)
        p = np.zeros(n_items)
        np.add.at(c, idx[s:e], alpha * np.asarray(vals[s:e], np.float64))
        p[idx[s:e]] = 1.0
        A = (Y * c[:, None]).T @ Y + lam * np.eye(d)
        out[r] = np.linalg.solve(A, (Y * c[:, None]).T @ (p - off))
    return out
