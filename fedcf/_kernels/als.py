"""Exact ridge solves: user reconstruction (fold-in) and the two half-steps of centralized ALS.

The model is r̂ = μ + b_i + c_u + p_u·q_i. With the "fixed" side frozen (items when solving users,
users when solving items), each row's parameters x = [p; c] minimise

    Σ_j (r_j − offset − fixed_bias[j] − x·z_j)² + (lam · n + lam0) · ‖x‖²,     z_j = [fixed[j]; 1]

over the row's n entries j — the per-rating (ALS-WR) weighting of the regularization, so that the
solve is the exact minimiser of the same per-example loss the SGD paths use, plus a constant floor
``lam0`` that keeps rows with fewer entries than factors well posed. Without a bias the last
coordinate is dropped. The Gram matrix is accumulated in the factors' dtype (float32 models: 16-wide
SIMD, ~1e-7 relative error against float64), the (K+1)×(K+1) Cholesky solve runs in float64; both
are the register-tiled kernels of ``dense``. A row with fewer entries than unknowns (and a positive
regularization) solves the equivalent n × n system instead (see ``solve_ridge_row``): same
solution, less work.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dense import GRAM_ROWS, cholesky_solve_panels, design_width, gram_rows, solve_square
from .layout import CFG_FIT_BIAS, CFG_LAM, CFG_LAM0, CFG_OFFSET, IA_ALPHA, IA_LAM
from .util import QUEUE_WORKERS, chunk_span, take, task_queue

ROWS_PER_CHUNK = 32


# Leaf arithmetic may be reassociated (SIMD); "nnan"/"ninf" stay off so NaN checks hold.
_FAST = {"reassoc", "contract", "arcp"}


@njit(cache=True, fastmath=_FAST)
def cholesky_factor(A, d):
    """Overwrite A[:d, :d]'s lower triangle (A SPD) with its Cholesky factor L (A = L Lᵀ).
    Returns False when A is not positive definite."""
    for j in range(d):
        s = A[j, j]
        for k in range(j):
            s -= A[j, k] * A[j, k]
        if not s > 0.0:
            return False
        ljj = np.sqrt(s)
        A[j, j] = ljj
        inv = 1.0 / ljj
        for i in range(j + 1, d):
            t = A[i, j]
            for k in range(j):
                t -= A[i, k] * A[j, k]
            A[i, j] = t * inv
    return True


@njit(cache=True, fastmath=_FAST)
def cholesky_substitute(L, x, d):
    """Solve L Lᵀ x = rhs in place (``x`` holds rhs on entry) with L from ``cholesky_factor``."""
    for i in range(d):  # forward: L y = rhs
        t = x[i]
        for k in range(i):
            t -= L[i, k] * x[k]
        x[i] = t / L[i, i]
    for i in range(d - 1, -1, -1):  # backward: Lᵀ x = y, by columns of Lᵀ (contiguous rows of L)
        t = x[i] / L[i, i]
        x[i] = t
        li = L[i]
        for k in range(i):
            x[k] -= li[k] * t


@njit(cache=True, fastmath=_FAST)
def cholesky_solve_inplace(A, x, d):
    """Solve A x = rhs for SPD A[:d, :d]; ``x`` holds rhs on entry, the solution on exit.

    A's lower triangle is overwritten by its Cholesky factor. Returns False when A is not
    positive definite (x is then left untouched).
    """
    if not cholesky_factor(A, d):
        return False
    cholesky_substitute(A, x, d)
    return True


@njit(cache=True)
def gather_design(idx, vals, fixed, fixed_bias, cfg, Zt, y):
    """The row's design z_j = [fixed[j]; 1 if d > K] as the columns of ``Zt`` (d, n), and its
    targets y_j = r_j − offset − fixed_bias[j]."""
    K, d = fixed.shape[1], Zt.shape[0]
    for t in range(idx.shape[0]):
        j = idx[t]
        for a in range(K):
            Zt[a, t] = fixed[j, a]
        if d > K:
            Zt[K, t] = 1.0
        y[t] = vals[t] - cfg[CFG_OFFSET] - fixed_bias[j]


@njit(cache=True)
def gather_rows(idx, vals, fixed, fixed_bias, cfg, d, Z):
    """The row's design by rows, as ``gram_rows`` takes it: Z[t] = [fixed[j]; 1 if d > K; y_j;
    zeros to Z's width] with y_j = r_j − offset − fixed_bias[j]."""
    K = fixed.shape[1]
    for t in range(idx.shape[0]):
        j = idx[t]
        zt = Z[t]
        for a in range(K):
            zt[a] = fixed[j, a]
        zt[K] = 1.0  # overwritten by y when d = K
        zt[d] = vals[t] - cfg[CFG_OFFSET] - fixed_bias[j]
        for a in range(d + 1, zt.shape[0]):
            zt[a] = 0.0


@njit(cache=True)
def ridge_scratch(fixed, n_max):
    """Scratch for ``solve_ridge_row`` on rows of up to n_max entries, in ``fixed``'s dtype: a design
    of up to max(n_max, d) + 1 rows and a Gram panel of up to d + GRAM_ROWS − 1 rows."""
    d = fixed.shape[1] + 1
    W = design_width(d, fixed.itemsize)
    return np.empty((max(n_max, d) + 1 + d + GRAM_ROWS) * W, fixed.dtype)


@njit(cache=True)
def solve_ridge_row(idx, vals, fixed, fixed_bias, cfg, A, rhs, buf):
    """Solve one row; returns d (= K + fit_bias) with the solution in rhs[:d]. Empty rows give 0.

    A is ``dense.solve_square(K + 1)``, rhs float64 (K + 1,); ``buf`` is ``ridge_scratch`` for at
    least n entries. A row with fewer entries than unknowns (n < d) and reg > 0 takes the dual
    form (ZᵀZ + reg I)⁻¹ Zᵀy = Zᵀ (ZZᵀ + reg I)⁻¹ y: the same solution from an n × n system (Gram
    n²d instead of nd², Cholesky n³/3 instead of d³/3), from the design gathered transposed. Both
    forms then share one Gram and one Cholesky call (one inlined copy each: compile time).
    """
    K = fixed.shape[1]
    d = K + 1 if cfg[CFG_FIT_BIAS] != 0.0 else K
    n = idx.shape[0]
    reg = cfg[CFG_LAM] * n + cfg[CFG_LAM0]
    if n == 0:
        for a in range(d):
            rhs[a] = 0.0
        return d
    dual = n < d and reg > 0.0
    inner, dim = (d, n) if dual else (n, d)  # the Gram's inner length and its size
    W = design_width(dim, fixed.itemsize)
    design = buf[:(inner + 1) * W].reshape((inner + 1, W))  # + 1: the dual's targets
    if dual:
        gather_design(idx, vals, fixed, fixed_bias, cfg, design[:d], design[d])
        for a in range(d):
            for t in range(n, W):
                design[a, t] = 0.0
    else:
        gather_rows(idx, vals, fixed, fixed_bias, cfg, d, design)
    rows = (dim + GRAM_ROWS - 1) // GRAM_ROWS * GRAM_ROWS
    U = A[0]
    gram_rows(design, inner, dim, buf[(inner + 1) * W:(inner + 1 + rows) * W].reshape((rows, W)),
              U)
    for a in range(dim):
        U[a, a] += reg
        if dual:  # the Gram's column n is the transposed design's zero padding
            U[a, n] = design[d, a]
    if not cholesky_solve_panels(U, A[1], dim, rhs):
        for a in range(d):
            rhs[a] = np.nan
    elif dual:  # x = Zᵀα, accumulated in row n of U (free, as n < d)
        x = U[n]
        for a in range(d):
            s = 0.0
            for t in range(n):
                s += design[a, t] * rhs[t]
            x[a] = s
        for a in range(d):
            rhs[a] = x[a]
    return d


@njit(cache=True, parallel=True)
def ridge_solve_rows(indptr, idx, vals, fixed, fixed_bias, cfg, out, out_bias):
    """Ridge-solve every row of a CSR against frozen ``fixed`` factors.

    Parameters
    ----------
    indptr : int64 (n_rows + 1,);  idx : int (nnz,) columns into ``fixed``;  vals : float (nnz,)
    fixed : float (n_fixed, K) frozen factors;  fixed_bias : float (n_fixed,) frozen biases
    cfg : ``layout.ridge_cfg`` = [lam, lam0, offset, fit_bias]
    out : float (n_rows, K) — overwritten with the solved factors
    out_bias : float (n_rows,) — overwritten with the solved biases (zeros when fit_bias is 0)

    A row whose system is not positive definite (only possible with lam = lam0 = 0) gets NaN.
    Rows are independent, so results do not depend on the thread count.
    """
    n_rows = indptr.shape[0] - 1
    K = fixed.shape[1]
    n_chunks = (n_rows + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
    queue = task_queue(n_chunks)  # chunks go to whichever thread is free
    for _ in prange(QUEUE_WORKERS):
        ch = take(queue)
        while ch >= 0:
            A = solve_square(K + 1)
            rhs = np.empty(K + 1)
            lo, hi, n_max = chunk_span(indptr, np.int64(ch), ROWS_PER_CHUNK, n_rows)
            buf = ridge_scratch(fixed, n_max)
            for r in range(lo, hi):
                s, e = indptr[r], indptr[r + 1]
                d = solve_ridge_row(idx[s:e], vals[s:e], fixed, fixed_bias, cfg, A, rhs, buf)
                for a in range(K):
                    out[r, a] = rhs[a]
                out_bias[r] = rhs[K] if d > K else 0.0
            ch = take(queue)


@njit(cache=True)
def solve_implicit_row(idx, vals, fixed, side, alpha, lam, A, rhs, buf):
    """Confidence-weighted ridge solve (Hu, Koren & Volinsky 2008) for one row, with biases.

    The fixed side's rows are y'_j = [y_j; 1 if d > K] (the 1 carries this row's own bias) and
    ``off[j]`` is the fixed side's bias (or none). The row's x (d values) minimises
        Σ_all j c_j (p_j − off_j − x·y'_j)² + lam ‖x‖²
    with p_j = 1, c_j = 1 + alpha·r_j on the row's entries and p_j = 0, c_j = 1 elsewhere, via
        (Y'ᵀY' + Σ_entries (c_j − 1) y'_j y'_jᵀ + lam I) x
            = Σ_entries (c_j − (c_j − 1) off_j) y'_j − Y'ᵀoff,
    so a row costs O(n·d² + d³), not O(n_items·d²). ``side`` = (gram = Y'ᵀY' (d×d float64),
    off (n_fixed,) float64 or empty for no offset, oproj = Y'ᵀoff (d,) float64), shared by all
    rows. The solution lands in rhs[:d]; A is ``dense.solve_square(d)``, rhs float64 (≥ d,);
    buf is ``ridge_scratch`` for n entries.
    """
    gram, off, oproj = side[0], side[1], side[2]
    K = fixed.shape[1]
    d = gram.shape[0]
    n = idx.shape[0]
    U = A[0]
    if n > 0:
        W = design_width(d, fixed.itemsize)
        Z = buf[:n * W].reshape((n, W))
        for t in range(n):  # rows [y'_j · sqrt(c_j − 1); 0 …] (column d, the target, unused)
            w = np.sqrt(max(alpha * vals[t], 0.0))
            j = idx[t]
            for a in range(K):
                Z[t, a] = fixed[j, a] * w
            for a in range(K, W):
                Z[t, a] = w if a < d else 0.0
        rows = (d + GRAM_ROWS - 1) // GRAM_ROWS * GRAM_ROWS
        gram_rows(Z, n, d, buf[n * W:(n + rows) * W].reshape((rows, W)), U)
    else:
        for a in range(d):
            for c in range(a, d):
                U[a, c] = 0.0
    for a in range(d):
        acc = 0.0
        for t in range(n):
            c = 1.0 + alpha * vals[t]
            coef = c - (c - 1.0) * off[idx[t]] if off.shape[0] > 0 else c
            acc += coef * (fixed[idx[t], a] if a < K else 1.0)
        U[a, d] = acc - oproj[a]
        for c in range(a, d):
            U[a, c] += gram[a, c]
        U[a, a] += lam
    if not cholesky_solve_panels(U, A[1], d, rhs):
        for a in range(d):
            rhs[a] = np.nan


@njit(cache=True, parallel=True)
def implicit_solve_rows(indptr, idx, vals, fixed, side, cfg, out, out_bias):
    """``solve_implicit_row`` for every row of a CSR; cfg = float64 [alpha, lam]; out (n_rows, K)
    and, when the side's Gram has K + 1 rows, out_bias (n_rows,) are overwritten. One
    implicit-ALS half-step (users given items, or items given users)."""
    n_rows = indptr.shape[0] - 1
    K = fixed.shape[1]
    d = side[0].shape[0]
    alpha, lam = cfg[IA_ALPHA], cfg[IA_LAM]
    n_chunks = (n_rows + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
    queue = task_queue(n_chunks)  # chunks go to whichever thread is free
    for _ in prange(QUEUE_WORKERS):
        ch = take(queue)
        while ch >= 0:
            A = solve_square(d)
            rhs = np.empty(d)
            lo, hi, n_max = chunk_span(indptr, np.int64(ch), ROWS_PER_CHUNK, n_rows)
            buf = ridge_scratch(fixed, n_max)
            for r in range(lo, hi):
                s, e = indptr[r], indptr[r + 1]
                solve_implicit_row(idx[s:e], vals[s:e], fixed, side, alpha, lam, A, rhs, buf)
                for a in range(K):
                    out[r, a] = rhs[a]
                if d > K:
                    out_bias[r] = rhs[K]
            ch = take(queue)


# ---------------------------------------------------------------------- conjugate gradient
@njit(cache=True, fastmath=_FAST)
def normal_matvec(Zt, n, d, reg, p, out, zp):
    """out = (Z Zᵀ + reg·I) p for a gathered design Zt (d × n, columns z_j); zp: (n,) scratch.
    Costs 4·n·d flops, without forming the d×d Gram matrix."""
    for t in range(n):
        zp[t] = 0.0
    for a in range(d):  # row by row: contiguous in t, so it vectorizes
        pa = p[a]
        for t in range(n):
            zp[t] += Zt[a, t] * pa
    for a in range(d):
        s = 0.0
        for t in range(n):
            s += Zt[a, t] * zp[t]
        out[a] = reg * p[a] + s


@njit(cache=True)
def cg_ridge_row(idx, vals, fixed, fixed_bias, cfg, steps, x, work, buf):
    """Improve the warm start x (d,) by ``steps`` conjugate-gradient steps on the row's normal
    equations (the system ``solve_ridge_row`` solves exactly); x is overwritten. Stops early when
    the residual vanishes. work: float64 scratch ≥ 3·d + n; buf in fixed's dtype ≥ (d + 1)·n."""
    K = fixed.shape[1]
    d = K + 1 if cfg[CFG_FIT_BIAS] != 0.0 else K
    n = idx.shape[0]
    reg = cfg[CFG_LAM] * n + cfg[CFG_LAM0]
    if n == 0:
        for a in range(d):
            x[a] = 0.0
        return
    Zt = buf[:d * n].reshape((d, n))
    y = buf[d * n:(d + 1) * n]
    gather_design(idx, vals, fixed, fixed_bias, cfg, Zt, y)
    r, p, Ap, zp = work[:d], work[d:2 * d], work[2 * d:3 * d], work[3 * d:3 * d + n]
    normal_matvec(Zt, n, d, reg, x, Ap, zp)
    rs = 0.0
    for a in range(d):  # r = Z y − A x
        s = 0.0
        for t in range(n):
            s += Zt[a, t] * y[t]
        r[a] = s - Ap[a]
        p[a] = r[a]
        rs += r[a] * r[a]
    for _ in range(steps):
        if rs == 0.0:
            break
        normal_matvec(Zt, n, d, reg, p, Ap, zp)
        pAp = 0.0
        for a in range(d):
            pAp += p[a] * Ap[a]
        if not pAp > 0.0:
            break
        alpha = rs / pAp
        rs_new = 0.0
        for a in range(d):
            x[a] += alpha * p[a]
            r[a] -= alpha * Ap[a]
            rs_new += r[a] * r[a]
        for a in range(d):
            p[a] = r[a] + (rs_new / rs) * p[a]
        rs = rs_new


@njit(cache=True, parallel=True)
def ridge_cg_rows(indptr, idx, vals, fixed, fixed_bias, cfg, steps, out, out_bias):
    """``ridge_solve_rows`` by ``steps`` conjugate-gradient steps per row, warm-started from the
    current ``out`` / ``out_bias`` (as implicit's CG solver does): O(steps·n·K) per row instead
    of O(n·K² + K³), approximate. Rows are independent (results do not depend on threads)."""
    n_rows = indptr.shape[0] - 1
    K = fixed.shape[1]
    fit_bias = cfg[CFG_FIT_BIAS] != 0.0
    n_chunks = (n_rows + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
    queue = task_queue(n_chunks)  # chunks go to whichever thread is free
    for _ in prange(QUEUE_WORKERS):
        ch = take(queue)
        while ch >= 0:
            lo, hi, n_max = chunk_span(indptr, np.int64(ch), ROWS_PER_CHUNK, n_rows)
            buf = np.empty((K + 2) * n_max, fixed.dtype)
            work = np.empty(3 * (K + 1) + n_max)
            x = np.empty(K + 1)
            for r in range(lo, hi):
                for a in range(K):
                    x[a] = out[r, a]
                x[K] = out_bias[r] if fit_bias else 0.0
                s, e = indptr[r], indptr[r + 1]
                cg_ridge_row(idx[s:e], vals[s:e], fixed, fixed_bias, cfg, steps, x, work, buf)
                for a in range(K):
                    out[r, a] = x[a]
                out_bias[r] = x[K] if fit_bias else 0.0
            ch = take(queue)


def item_gram(Q: np.ndarray) -> np.ndarray:
    """YᵀY in float64 — what a server would broadcast with the item matrix (K² numbers)."""
    Q64 = Q.astype(np.float64, copy=False)
    return Q64.T @ Q64


def implicit_side(fixed: np.ndarray, ones: bool = False, offset=None) -> tuple:
    """The shared part of one implicit half-step (``als.solve_implicit_row``'s ``side``):
    (Y'ᵀY', off, Y'ᵀoff) with Y' = [fixed, 1 if ``ones``] (the 1 carries the solved rows' own
    bias) and ``offset`` the fixed rows' biases (None: no offset). All float64; (K+1)² + K + 1
    numbers, what a server broadcasts besides the item matrix."""
    Y = fixed.astype(np.float64, copy=False)
    gram = item_gram(Y)
    col = Y.sum(axis=0)
    if ones:
        gram = np.block([[gram, col[:, None]], [col[None, :], np.array([[float(len(Y))]])]])
    if offset is None:
        return gram, np.zeros(0), np.zeros(len(gram))
    off = np.ascontiguousarray(offset, dtype=np.float64)
    proj = Y.T @ off
    return gram, off, (np.append(proj, off.sum()) if ones else proj)
