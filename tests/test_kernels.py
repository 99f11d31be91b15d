"""Every kernel against its NumPy twin, plus invariants (objective, thread independence)."""

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcf import _reference as ref
from fedcf._kernels import als, dense, layout, predict, sgd, util
from fedcf._kernels import rng as krng


def random_csr(rng, n_rows, n_cols, max_per_row=8, dupes=False, empty_share=0.2):
    rows = []
    for _ in range(n_rows):
        n = 0 if rng.random() < empty_share else int(rng.integers(1, max_per_row + 1))
        if dupes:
            rows.append(rng.integers(0, n_cols, n))
        else:
            rows.append(rng.choice(n_cols, size=min(n, n_cols), replace=False))
    indptr = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
    idx = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, np.int32)
    vals = rng.integers(1, 6, len(idx)).astype(np.float64)
    return indptr, idx, vals


def make_problem(seed, n_rows=25, n_cols=15, K=4, dtype=np.float32, dupes=False):
    rng = np.random.default_rng(seed)
    indptr, idx, vals = random_csr(rng, n_rows, n_cols, dupes=dupes)
    Q = rng.normal(0, 0.4, (n_cols, K)).astype(dtype)
    b = rng.normal(0, 0.2, n_cols).astype(dtype)
    return rng, indptr, idx, vals, Q, b


def seeds_for(n, seed=3, rnd=1):
    return np.array([ref.stream_key(seed, rnd, u) for u in range(n)], dtype=np.uint64)


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- random streams
def test_stream_matches_python_twin():
    for seed, a, b in [(0, 0, 0), (7, 3, 11), (2**63 + 5, 499, 10**6)]:
        assert int(krng.stream_key(np.uint64(seed), a, b)) == ref.stream_key(seed, a, b)
    arr = np.arange(50, dtype=np.int64)
    krng.shuffle_inplace(arr, np.array([np.uint64(12345)]))
    twin = np.arange(50)
    ref.Stream(12345).shuffle(twin)
    assert arr.tolist() == twin.tolist()
    assert sorted(arr.tolist()) == list(range(50))


# ---------------------------------------------------------------- ridge
@numba.njit
def call_gram_panel(Z, n, a, c0, nblk, out):
    dense.gram_panel(Z, n, a, c0, nblk, out)  # an intrinsic: callable from jitted code only


def test_gram_panel_refuses_mixed_or_strided_arrays():
    Z = np.ones((4, 16), np.float32)
    for out in (np.ones((16, 16)), np.ones((16, 32), np.float32)[:, ::2], np.ones((16, 16), int)):
        with pytest.raises(TypeError, match="C-contiguous 2-d float"):
            call_gram_panel(Z, 4, 0, 0, 1, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_panel_matches_twin_and_writes_only_its_panel(dtype):
    """Every panel width (1 … GRAM_BLOCKS vectors, and out-of-range widths that write nothing),
    no ratings, one, and more than a vector's worth; entries outside the panel stay as they were."""
    rng = np.random.default_rng(5)
    lanes = dense.VECTOR_BYTES // np.dtype(dtype).itemsize
    R, W = dense.GRAM_ROWS, (dense.GRAM_BLOCKS + 1) * lanes
    for n in (0, 1, 5, 40):
        Z = rng.normal(size=(n + 1, W)).astype(dtype)
        for nblk in range(dense.GRAM_BLOCKS + 2):
            for a, c0 in ((0, 0), (3, lanes), (W - R, W - nblk * lanes)):
                out = np.full((W, W), 7.0, dtype)
                call_gram_panel(Z, n, a, max(c0, 0), nblk, out)
                mask = np.zeros_like(out, bool)
                if 1 <= nblk <= dense.GRAM_BLOCKS:
                    mask[a:a + R, c0:c0 + nblk * lanes] = True
                    want = ref.gram_panel(Z, n, a, c0, R, nblk * lanes)
                    np.testing.assert_allclose(out[mask].reshape(want.shape), want, **tol(dtype))
                assert np.all(out[~mask] == 7.0), (n, nblk, a, c0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_rows_match_twin_at_every_edge_size(dtype):
    """d on either side of the panel height and of one, two and several SIMD vectors."""
    rng = np.random.default_rng(6)
    for d in (1, 2, 5, 6, 7, 8, 15, 16, 17, 31, 47, 51, 64, 65, 100):
        W = dense.design_width(d, np.dtype(dtype).itemsize)
        rows = -(-d // dense.GRAM_ROWS) * dense.GRAM_ROWS
        assert W >= max(d + 1, rows) and W * np.dtype(dtype).itemsize % dense.VECTOR_BYTES == 0
        for n in (1, 2, 33):
            Z = np.zeros((n, W), dtype)
            Z[:, :d + 1] = rng.normal(size=(n, d + 1))
            U = np.full((d + 2, d + 2), 7.0)
            dense.gram_rows(Z, n, d, np.full((rows, W), np.nan, dtype), U)
            want_A, want_rhs = ref.gram_rows(Z, n, d)
            upper = np.triu(np.ones((d, d), bool))
            np.testing.assert_allclose(U[:d, :d][upper], want_A[upper], **tol(dtype))
            np.testing.assert_allclose(U[:d, d], want_rhs, **tol(dtype))
            written = np.zeros(U.shape, bool)
            written[:d, :d] = upper
            written[:d, d] = True
            assert np.all(U[~written] == 7.0)


@numba.njit
def call_row_update(dst, drow, src, srow, a, c, v0, nvec):
    dense.row_update(dst, drow, src, srow, a, c, v0, nvec)  # an intrinsic


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_update_is_whole_vectors_of_a_times_dst_minus_c_times_src(dtype):
    """Any run of vectors (none, one, all), a row updated from itself; nothing else changes."""
    rng = np.random.default_rng(8)
    L = dense.VECTOR_BYTES // np.dtype(dtype).itemsize
    src = rng.normal(size=(3, 4 * L)).astype(dtype)
    for v0, nvec in ((0, 0), (1, 1), (0, 4), (2, 2)):
        for same in (False, True):
            dst = rng.normal(size=(3, 4 * L)).astype(dtype)
            want = dst.copy()
            s_arr, srow = (dst, 1) if same else (src, 2)
            cols = slice(v0 * L, (v0 + nvec) * L)
            want[1, cols] = 0.5 * dst[1, cols] - 2.0 * s_arr[srow, cols]
            call_row_update(dst, 1, s_arr, srow, 0.5, 2.0, v0, nvec)
            np.testing.assert_allclose(dst, want, **tol(dtype))
    with pytest.raises(TypeError, match="C-contiguous 2-d float"):
        call_row_update(np.ones((2, 16)), 0, np.ones((2, 16), np.float32), 0, 1.0, 1.0, 0, 1)


@numba.njit
def factor_and_solve(A, b, d):
    work = dense.solve_square(d)
    work[:] = np.nan  # all but A's upper triangle and b: left over from anything before
    U, S = work[0], work[1]
    for a in range(d):
        for c in range(a, d):
            U[a, c] = A[a, c]
        U[a, d] = b[a]
    x = np.full(d, 7.0)
    ok = dense.cholesky_solve_panels(U, S, d, x)
    return ok, x


def test_cholesky_panels_solve_spd_systems_at_every_edge_size():
    """d below, at and across panel heights and float64 vectors; well and badly conditioned
    systems against NumPy's solve, with NaN in every scratch entry; not positive definite (and
    NaN) systems refused, x untouched."""
    rng = np.random.default_rng(7)
    for d in (1, 2, 5, 6, 7, 8, 9, 13, 16, 17, 51, 64, 70):
        for cond in (1.0, 1e6):
            Qm, _ = np.linalg.qr(rng.normal(size=(d, d)))
            A = (Qm * np.geomspace(1.0, 1.0 / cond, d)) @ Qm.T
            A = (A + A.T) / 2
            b = rng.normal(size=d)
            ok, x = factor_and_solve(A, b, d)
            assert ok
            np.testing.assert_allclose(A @ x, b, rtol=0, atol=1e-9 * cond)
        bad = -np.eye(d)
        ok, x = factor_and_solve(bad, np.ones(d), d)
        assert not ok and np.all(x == 7.0)
        nan = np.eye(d)
        nan[d - 1, d - 1] = np.nan
        ok, x = factor_and_solve(nan, np.ones(d), d)
        assert not ok and np.all(x == 7.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K", [15, 50, 70])
def test_ridge_rows_with_many_factors_match_twin(dtype, K):
    """Factor counts whose Gram spans several panels and column blocks (K = 70: five float32
    vectors a row, nine float64 ones), rows from fewer entries than K to many."""
    rng = np.random.default_rng(K)
    n_cols = 3 * K
    rows = [rng.choice(n_cols, n, replace=False) for n in (0, 3, K, K + 1, 2 * K + 7)]
    indptr = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
    idx = np.concatenate(rows).astype(np.int32)
    vals = rng.uniform(1, 5, len(idx))
    Q = rng.normal(0, 0.4, (n_cols, K)).astype(dtype)
    b = rng.normal(0, 0.2, n_cols).astype(dtype)
    for fit_bias in (True, False):
        cfg = layout.ridge_cfg(0.1, 0.01, 3.2, fit_bias)
        out, ob = np.full((len(rows), K), 9, dtype), np.full(len(rows), 9, dtype)
        als.ridge_solve_rows(indptr, idx, vals, Q, b, cfg, out, ob)
        want, want_b = ref.ridge_solve_rows(indptr, idx, vals, Q, b, cfg)
        np.testing.assert_allclose(out, want, **tol(dtype))
        np.testing.assert_allclose(ob, want_b, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fit_bias", [True, False])
def test_ridge_rows_match_twin(dtype, fit_bias):
    _, indptr, idx, vals, Q, b = make_problem(0, dtype=dtype, dupes=True)
    cfg = layout.ridge_cfg(0.1, 0.01, 3.2, fit_bias)
    out = np.full((len(indptr) - 1, Q.shape[1]), 9, dtype)
    ob = np.full(len(indptr) - 1, 9, dtype)
    als.ridge_solve_rows(indptr, idx, vals, Q, b, cfg, out, ob)
    want, want_b = ref.ridge_solve_rows(indptr, idx, vals, Q, b, cfg)
    np.testing.assert_allclose(out, want, **tol(dtype))
    np.testing.assert_allclose(ob, want_b, **tol(dtype))
    empty = np.diff(indptr) == 0
    assert np.all(out[empty] == 0) and np.all(ob[empty] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fit_bias", [True, False])
@pytest.mark.parametrize("K", [1, 4, 9])
def test_ridge_rows_either_side_of_the_dual_switch_match_twin(dtype, fit_bias, K):
    """Rows with n < d unknowns take the n × n (dual) system, the others the d × d one: both
    must give the twin's solution, at n = d - 1, d and d + 1 and with duplicated items."""
    rng = np.random.default_rng(K)
    d, n_cols = K + fit_bias, 3 * K + 5
    rows = [rng.choice(n_cols, n, replace=False) for n in (0, 1, d - 1, d, d + 1, 2 * d)]
    rows.append(np.array([2, 2, 2]))
    indptr = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
    idx = np.concatenate(rows).astype(np.int32)
    vals = rng.uniform(1, 5, len(idx))
    Q = rng.normal(0, 0.4, (n_cols, K)).astype(dtype)
    b = rng.normal(0, 0.2, n_cols).astype(dtype)
    for lam, lam0 in ((0.1, 0.0), (0.0, 0.3), (2.0, 1e-6)):
        cfg = layout.ridge_cfg(lam, lam0, 3.2, fit_bias)
        out, ob = np.full((len(rows), K), 9, dtype), np.full(len(rows), 9, dtype)
        als.ridge_solve_rows(indptr, idx, vals, Q, b, cfg, out, ob)
        want, want_b = ref.ridge_solve_rows(indptr, idx, vals, Q, b, cfg)
        np.testing.assert_allclose(out, want, **tol(dtype))
        np.testing.assert_allclose(ob, want_b, **tol(dtype))


def test_cholesky_factor_and_substitute_match_numpy():
    rng = np.random.default_rng(5)
    for d in (1, 2, 3, 7, 16, 51):
        Z = rng.normal(size=(d + 3, d))
        A = Z.T @ Z + 0.1 * np.eye(d)
        x = rng.normal(size=d)
        L, sol = np.full((d + 1, d + 1), 7.0), x.copy()
        L[:d, :d] = A
        assert als.cholesky_factor(L, d)
        np.testing.assert_allclose(np.tril(L[:d, :d]), np.linalg.cholesky(A), rtol=1e-10,
                                   atol=1e-12)
        als.cholesky_substitute(L, sol, d)
        np.testing.assert_allclose(sol, np.linalg.solve(A, x), rtol=1e-9, atol=1e-12)
        assert np.all(L[d] == 7.0) and np.all(L[:, d] == 7.0)
    assert not als.cholesky_factor(-np.eye(3), 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fit_bias", [True, False])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_ridge_cg_rows_match_twin(dtype, fit_bias, steps):
    rng, indptr, idx, vals, Q, b = make_problem(1, dtype=dtype, dupes=True)
    cfg = layout.ridge_cfg(0.1, 0.01, 3.2, fit_bias)
    start = (rng.standard_normal((len(indptr) - 1, Q.shape[1])) * 0.1).astype(dtype)
    start_b = (rng.standard_normal(len(indptr) - 1) * 0.1).astype(dtype)
    out, ob = start.copy(), start_b.copy()
    als.ridge_cg_rows(indptr, idx, vals, Q, b, cfg, steps, out, ob)
    want, want_b = ref.ridge_cg_rows(indptr, idx, vals, Q, b, cfg, steps, start, start_b)
    np.testing.assert_allclose(out, want, **tol(dtype))
    np.testing.assert_allclose(ob, want_b, **tol(dtype))
    empty = np.diff(indptr) == 0
    assert np.all(out[empty] == 0) and np.all(ob[empty] == 0)


def test_ridge_cg_converges_to_the_exact_solve():
    """With d steps (d = K + 1 unknowns) CG is exact up to rounding; 3 warm steps already
    lower each row's objective."""
    _, indptr, idx, vals, Q, b = make_problem(2, dtype=np.float64, dupes=True)
    cfg = layout.ridge_cfg(0.1, 0.01, 3.2, True)
    n, K = len(indptr) - 1, Q.shape[1]
    exact, exact_b = np.zeros((n, K)), np.zeros(n)
    als.ridge_solve_rows(indptr, idx, vals, Q, b, cfg, exact, exact_b)
    cg, cg_b = np.zeros((n, K)), np.zeros(n)
    als.ridge_cg_rows(indptr, idx, vals, Q, b, cfg, 2 * (K + 1), cg, cg_b)
    np.testing.assert_allclose(cg, exact, rtol=1e-8, atol=1e-8)
    few, few_b = np.zeros((n, K)), np.zeros(n)
    als.ridge_cg_rows(indptr, idx, vals, Q, b, cfg, 3, few, few_b)
    for r in range(n):
        s, e = indptr[r], indptr[r + 1]
        if e > s:
            def obj(p, c):
                return ref.ridge_objective(idx[s:e], vals[s:e], Q, b, p, c, 0.1, 0.01, 3.2)
            assert obj(exact[r], exact_b[r]) - 1e-9 <= obj(few[r], few_b[r]) <= obj(
                np.zeros(K), 0.0) + 1e-9


def test_ridge_one_rating_and_singular_systems():
    Q = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.zeros(2)
    indptr = np.array([0, 1], np.int64)
    out, ob = np.zeros((1, 2)), np.zeros(1)
    als.ridge_solve_rows(indptr, np.array([0], np.int32), np.array([4.0]), Q, b,
                         layout.ridge_cfg(0.5, 0.0, 0.0, False), out, ob)
    # minimise (4 - p0)^2 + 0.5 (p0^2 + p1^2) -> p0 = 4 / 1.5
    np.testing.assert_allclose(out[0], [4 / 1.5, 0.0])
    als.ridge_solve_rows(indptr, np.array([0], np.int32), np.array([4.0]), Q, b,
                         layout.ridge_cfg(0.0, 0.0, 0.0, False), out, ob)
    assert np.isnan(out[0]).all(), "a singular system must give NaN, not garbage"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.floats(0.001, 2.0), lam0=st.floats(0.0, 1.0))
def test_reconstruction_never_increases_local_objective(seed, lam, lam0):
    rng, indptr, idx, vals, Q, b = make_problem(seed, n_rows=6, K=3, dtype=np.float64, dupes=True)
    cfg = layout.ridge_cfg(lam, lam0, 3.0, True)
    out, ob = np.zeros((6, 3)), np.zeros(6)
    als.ridge_solve_rows(indptr, idx, vals, Q, b, cfg, out, ob)
    for r in range(6):
        s, e = indptr[r], indptr[r + 1]
        f_opt = ref.ridge_objective(idx[s:e], vals[s:e], Q, b, out[r], ob[r], lam, lam0, 3.0)
        for _ in range(5):  # any other point, including the zero init and nearby points
            p = rng.normal(0, 1, 3) * rng.choice([0.0, 0.01, 1.0])
            c = rng.normal() * rng.choice([0.0, 1.0])
            f = ref.ridge_objective(idx[s:e], vals[s:e], Q, b, p, c, lam, lam0, 3.0)
            assert f_opt <= f + 1e-9 * max(1.0, abs(f))


# ---------------------------------------------------------------- gradient steps
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.integers(1, 6), steps=st.integers(0, 7),
       epochs=st.integers(1, 3), lam=st.sampled_from([0.0, 0.05]), fit_bias=st.booleans())
def test_sgd_reconstruction_matches_twin(dtype, seed, bs, steps, epochs, lam, fit_bias):
    rng, indptr, idx, vals, Q, b = make_problem(seed, dtype=dtype, dupes=True)
    n = len(indptr) - 1
    hp = layout.sgd_hp(0.1, lam, bs, steps, epochs, 3.0, fit_bias)
    init = layout.recon_init_cfg("uniform" if seed % 2 else "zeros", 0.05)
    out, ob = np.full((n, Q.shape[1]), 9.0, dtype), np.full(n, 9.0, dtype)
    seeds = seeds_for(n, seed)
    sgd.sgd_reconstruct_rows(indptr, idx, vals, (Q, b), hp, init, seeds, (out, ob))
    want, want_b = ref.sgd_reconstruct_rows(indptr, idx, vals, (Q, b), hp, init, seeds)
    np.testing.assert_allclose(out, want, **tol(dtype))
    np.testing.assert_allclose(ob, want_b, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.integers(1, 6), steps=st.integers(0, 7),
       epochs=st.integers(1, 3), joint=st.booleans(), fit_bias=st.booleans())
def test_item_steps_match_twin(dtype, seed, bs, steps, epochs, joint, fit_bias):
    rng, indptr, idx, vals, Q, b = make_problem(seed, dtype=dtype, dupes=True)
    n, K = len(indptr) - 1, Q.shape[1]
    P = rng.normal(0, 0.3, (n, K)).astype(dtype)
    c = rng.normal(0, 0.1, n).astype(dtype)
    P0, c0, Q0, b0 = P.copy(), c.copy(), Q.copy(), b.copy()
    # step 0.2: at 0.5 joint single-example steps diverge (|Δ| ~ 1e50) and float32 kernels and
    # their twin then part by rounding chaos, which says nothing about the kernel
    hp = layout.sgd_hp(0.2, 0.01, bs, steps, epochs, 3.0, fit_bias, joint)
    seeds = seeds_for(n, seed)
    nnz = indptr[-1]
    out = (np.empty(nnz, np.int64), np.empty((nnz, K), dtype), np.empty(nnz, dtype))
    sgd.item_steps_rows(indptr, idx, vals, (Q, b), (P, c), hp, seeds, out)
    want = ref.item_steps_rows(indptr, idx, vals, (Q, b), (P, c), hp, seeds)
    assert out[0].tolist() == want[0].tolist()
    np.testing.assert_allclose(out[1], want[1], **tol(dtype))
    np.testing.assert_allclose(out[2], want[2], **tol(dtype))
    # inputs untouched: the kernel returns deltas, never edits the globals or the users
    for a, a0 in ((P, P0), (c, c0), (Q, Q0), (b, b0)):
        assert np.array_equal(a, a0)


def test_item_steps_with_duplicate_items_accumulate():
    # one user rates item 0 twice in one batch: both gradients land on the same row
    Q = np.array([[0.5], [0.0]])
    b = np.zeros(2)
    P, c = np.array([[1.0]]), np.zeros(1)
    indptr = np.array([0, 2], np.int64)
    idx = np.array([0, 0], np.int32)
    vals = np.array([1.5, 2.5])
    hp = layout.sgd_hp(0.1, 0.0, 2, 1, 1, 0.0, False)
    out = (np.empty(2, np.int64), np.empty((2, 1)), np.empty(2))
    sgd.item_steps_rows(indptr, idx, vals, (Q, b), (P, c), hp, seeds_for(1), out)
    # grad = mean(-2 e p) = -(1.0 + 2.0) ; step = 0.1 * 3.0 / 1
    assert out[0].tolist() == [0, -1]
    np.testing.assert_allclose(out[1][0, 0], 0.1 * (2 * 1.0 + 2 * 2.0) / 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_epoch_matches_twin(dtype):
    rng, indptr, idx, vals, Q, b = make_problem(5, dtype=dtype)
    n = len(indptr) - 1
    users = np.repeat(np.arange(n), np.diff(indptr))
    P = rng.normal(0, 0.1, (n, Q.shape[1])).astype(dtype)
    c = np.zeros(n, dtype)
    order = rng.permutation(len(idx))
    users, idx, vals = users[order], idx[order], vals[order]
    cfg = layout.sgd_epoch_cfg(0.02, 0.05, 3.0, True)
    (rP, rc), (rQ, rb), rsse = ref.sgd_epoch(users, idx, vals, (P, c), (Q, b), cfg)
    sse = sgd.sgd_epoch(users, idx, vals, (P, c), (Q, b), cfg)
    for a, w in ((P, rP), (c, rc), (Q, rQ), (b, rb)):
        np.testing.assert_allclose(a, w, **tol(dtype))
    np.testing.assert_allclose(sse, rsse, rtol=1e-5)


def test_gather_ratings_is_the_fancy_index():
    rng = np.random.default_rng(3)
    n = 1000
    users, items, vals = rng.integers(0, 50, n), rng.integers(0, 40, n).astype(np.int32), \
        rng.random(n)
    order = rng.permutation(n)
    out = (np.full(n, -1), np.full(n, -1, np.int32), np.full(n, np.nan))
    sgd.gather_ratings(order, users, items, vals, *out)
    for got, src in zip(out, (users, items, vals)):
        np.testing.assert_array_equal(got, src[order])


@numba.njit
def prefetch_every_row(arr):
    for r in range(arr.shape[0]):
        util.prefetch_row(arr, np.int64(r))  # an intrinsic: callable from jitted code only
    return arr.sum()


def test_prefetch_row_is_only_a_hint():
    """Every row of arrays narrower and wider than its lines, the last row included (the lines
    past the end are asked for too): nothing changes, nothing faults; other layouts refused."""
    for arr in (np.arange(12.0).reshape(6, 2), np.ones((3, 300), np.float32),
                np.arange(50, dtype=np.int64).reshape(1, 50)):
        before = arr.copy()
        assert prefetch_every_row(arr) == before.sum()
        np.testing.assert_array_equal(arr, before)
    with pytest.raises(TypeError, match="C-contiguous 2-d"):
        prefetch_every_row(np.ones((4, 4))[:, ::2])


def test_predict_pairs_with_unknowns():
    rng = np.random.default_rng(0)
    P, c = rng.normal(size=(4, 3)), rng.normal(size=4)
    Q, b = rng.normal(size=(5, 3)), rng.normal(size=5)
    u = np.array([0, 3, -1, 2, -1])
    i = np.array([4, -1, 2, 0, -1])
    out = np.empty(5)
    predict.predict_pairs(u, i, (P, c), (Q, b), 3.5, out)
    np.testing.assert_allclose(out, ref.predict_pairs(u, i, (P, c), (Q, b), 3.5))
    assert out[4] == 3.5 and out[1] == 3.5 + c[3] and out[2] == 3.5 + b[2]


# ---------------------------------------------------------------- threads
def test_results_identical_with_one_and_two_threads():
    _, indptr, idx, vals, Q, b = make_problem(11, n_rows=300, n_cols=40, K=6, dtype=np.float32)
    n, K, nnz = len(indptr) - 1, Q.shape[1], indptr[-1]
    rng = np.random.default_rng(0)
    P = rng.normal(0, 0.3, (n, K)).astype(np.float32)
    c = np.zeros(n, np.float32)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            o1, b1 = np.zeros((n, K), np.float32), np.zeros(n, np.float32)
            als.ridge_solve_rows(indptr, idx, vals, Q, b, layout.ridge_cfg(0.1, 0.0, 3.0, True), o1, b1)
            o3, b3 = P.copy(), c.copy()
            als.ridge_cg_rows(indptr, idx, vals, Q, b, layout.ridge_cfg(0.1, 0.0, 3.0, True), 3,
                              o3, b3)
            o2, b2 = P.copy(), c.copy()
            sgd.sgd_reconstruct_rows(indptr, idx, vals, (Q, b), layout.sgd_hp(0.1, 0, 3, 5, 1, 3, True),
                                     layout.recon_init_cfg("uniform", 0.05), seeds_for(n), (o2, b2))
            out = (np.empty(nnz, np.int64), np.empty((nnz, K), np.float32), np.empty(nnz, np.float32))
            sgd.item_steps_rows(indptr, idx, vals, (Q, b), (P, c),
                                layout.sgd_hp(0.5, 0, 3, 5, 1, 3, True), seeds_for(n), out)
            results.append((o1, b1, o2, b2, o3, b3, *out))
    finally:
        numba.set_num_threads(before)
    for a, b_ in zip(*results):
        assert np.array_equal(a, b_)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ones,with_offset", [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_implicit_solve_matches_dense_twin(dtype, ones, with_offset):
    from fedcf.models.implicit_mf import implicit_side

    _, indptr, idx, vals, Q, b = make_problem(21, n_rows=30, n_cols=25, K=5, dtype=dtype)
    off = 0.5 * b.astype(np.float64) + 0.2 if with_offset else None
    out = np.full((len(indptr) - 1, 5), 7, dtype)
    out_bias = np.full(len(indptr) - 1, 7, dtype)
    als.implicit_solve_rows(indptr, idx, vals, Q, implicit_side(Q, ones, off),
                            np.array([2.0, 0.3]), out, out_bias)
    want = ref.implicit_solve_rows(indptr, idx, vals, Q, 2.0, 0.3, ones=ones, offset=off)
    np.testing.assert_allclose(out, want[:, :5], **tol(dtype))
    if ones:
        np.testing.assert_allclose(out_bias, want[:, 5], **tol(dtype))
    else:
        assert np.all(out_bias == 7)  # not written without a bias column


def _tree_entries(rng, n_items, depth, a, b, pre_merged):
    """Random partial sums of items over tree nodes: leaves (level 0) and, with
    ``pre_merged``, some aligned subtrees in place of their leaves."""
    lo, level = [], []
    g = 0
    while g < 2 ** depth:
        lv = int(rng.integers(0, 3)) if pre_merged else 0
        while g % (1 << lv):
            lv -= 1
        lo.append(g)
        level.append(lv)
        g += 1 << lv
    items, nlo, nlv = [], [], []
    for j in range(n_items):
        for node in rng.permutation(len(lo))[:int(rng.integers(1, len(lo) + 1))]:
            items.append(j)
            nlo.append(lo[node])
            nlv.append(level[node])
    n = len(items)
    return (np.array(items, np.int64), np.array(nlo, np.int64), np.array(nlv, np.int64),
            rng.normal(size=(n, 3)), rng.normal(size=n))


@pytest.mark.parametrize("a,b,pre", [(0, 16, False), (0, 16, True), (3, 11, False),
                                     (4, 8, True)])
def test_tree_sum_runs_matches_its_twin_bit_for_bit(a, b, pre):
    from fedcf._kernels.server import tree_sum_runs

    rng = np.random.default_rng(a * 7 + b)
    items, nlo, nlv, s_Q, s_b = _tree_entries(rng, 12, 4, a, b, pre)
    order = np.lexsort((nlo, items))
    n = len(items)
    out = [np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
           np.empty((n, 3)), np.empty(n)]
    before = numba.get_num_threads()
    results = []
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            m = tree_sum_runs(order, items, nlo, nlv, s_Q, s_b, 4, a, b, *out)
            results.append([o[:m].copy() for o in out])
    finally:
        numba.set_num_threads(before)
    twin = ref.tree_sum(items, nlo, nlv, s_Q, s_b, 4, a, b)
    for got in results:
        for x, y in zip(got, twin):
            np.testing.assert_array_equal(x, y)
    if (a, b) == (0, 16):  # the whole tree: one total per item, the root node
        assert np.all(results[0][2] == 4) and np.all(results[0][1] == 0)
        np.testing.assert_allclose(results[0][3], [s_Q[items == j].sum(0) for j in range(12)])


def _cohort(rng, n_clients, n_entries, n_groups):
    """Client slots (offsets), entries with padding (item −1), groups, factors (some 0)."""
    cuts = np.sort(rng.integers(0, n_entries + 1, n_clients - 1))
    offsets = np.r_[0, cuts, n_entries].astype(np.int64)
    items = rng.integers(-1, 9, n_entries)
    group = rng.integers(0, n_groups, n_clients)
    scale = np.where(rng.random(n_clients) < 0.2, 0.0, rng.exponential(size=n_clients))
    return offsets, items, group, scale


@pytest.mark.parametrize("depth,n_entries", [(4, 400), (6, 60), (1, 30), (6, 0)])
def test_grouped_tree_sum_matches_its_twin_bit_for_bit(depth, n_entries):
    from fedcf._kernels.server import grouped_tree_sum

    rng = np.random.default_rng(depth * 100 + n_entries)
    offsets, items, group, scale = _cohort(rng, 25, n_entries, 2 ** depth)
    d_Q = rng.normal(size=(n_entries, 3)).astype(np.float32)
    d_b = rng.normal(size=n_entries).astype(np.float32)
    twin = ref.grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth)
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            out = [np.empty(n_entries, np.int64), np.empty((n_entries, 3)), np.empty(n_entries)]
            m = grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth, *out)
            for x, y in zip([o[:m] for o in out], twin):
                np.testing.assert_array_equal(x, y)
    finally:
        numba.set_num_threads(before)
    group[scale > 0] = 2 ** depth  # outside the tree
    out = [np.empty(n_entries, np.int64), np.empty((n_entries, 3)), np.empty(n_entries)]
    assert grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth, *out) == -1


@pytest.mark.parametrize("rank", [False, True])
def test_group_counters_match_their_twin_bit_for_bit(rank):
    from fedcf._kernels.server import group_counters

    rng = np.random.default_rng(int(rank))
    m = 300
    offsets, items, group, num = _cohort(rng, m, 2000, 64)
    clients = rng.choice(10_000, m, replace=False).astype(np.int64)
    w = np.where(rng.random(m) < 0.1, 0.0, rng.exponential(size=m))
    bad, empty = rng.random(m) < 0.1, rng.random(m) < 0.1
    losses = np.round(rng.exponential(size=m), 1)  # ties: the smaller id is the worst
    losses[rng.random(m) < 0.05] = np.nan
    weights = np.where(rng.random(m) < 0.1, 0.0, rng.integers(1, 50, m) * 1.0)
    args = (clients, group, offsets, items, num, w, bad, empty, losses, weights, 9.0,
            64.0 if rank else 0.0, 64)
    for x, y in zip(group_counters(*args), ref.group_counters(*args)):
        np.testing.assert_array_equal(x, y)


def test_threads_take_each_task_once_from_the_queue_largest_client_first():
    from numba import njit, prange

    from fedcf._kernels.util import QUEUE_WORKERS, claim, client_queue, take, task_queue

    @njit(parallel=True)
    def drain(queue, n):
        taken = np.zeros(n, np.int64)
        for _ in prange(QUEUE_WORKERS):
            k = take(queue)
            while k >= 0:
                taken[k] += 1
                k = take(queue)
        return taken

    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            assert np.all(drain(task_queue(5000), 5000) == 1)
            assert len(drain(task_queue(0), 0)) == 0
    finally:
        numba.set_num_threads(before)
    indptr = np.array([0, 5, 5, 9, 30, 34], np.int64)  # rows 5, 0, 4, 21, 4
    queue = client_queue(indptr, np.array([4, 1, 0, 3, 2], np.int64))
    assert [take(queue) for _ in range(6)] == [3, 2, 0, 4, 1, -1]  # 21, 5, the 4s, then 0
    with pytest.raises(Exception, match="int64"):
        njit(lambda a: claim(a))(np.zeros(1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_finite_guards_match_numpy(dtype):
    from fedcf._kernels.server import finite_clients, sgd_rows

    rng = np.random.default_rng(3)
    offsets = np.array([0, 0, 7, 20, 21, 40, 57], np.int64)  # client 0 sends nothing
    d_Q = rng.normal(size=(57, 9)).astype(dtype)
    d_b = rng.normal(size=57).astype(dtype)
    d_Q[8, 8], d_Q[20, 0], d_b[39] = np.nan, np.inf, -np.inf  # clients 2, 3, 4
    want = [bool(np.isfinite(d_Q[a:b]).all() and np.isfinite(d_b[a:b]).all())
            for a, b in zip(offsets, offsets[1:])]
    assert finite_clients(offsets, d_Q, d_b).tolist() == want == [True, True, False, False,
                                                                   False, True]
    x = rng.normal(size=(30, 9)).astype(dtype)
    rows = np.array([1, 4, 29], np.int64)
    delta = rng.normal(size=(3, 9))
    want = x.copy()
    want[rows] = (want[rows] + 0.5 * delta).astype(dtype)
    assert sgd_rows(x, rows, delta, 0.5) and np.array_equal(x, want)
    delta[2, 3] = np.finfo(dtype).max  # overflows the stored value
    assert not sgd_rows(x, rows, delta, 4.0)
    assert not sgd_rows(x, rows, np.full((3, 9), np.nan), 1.0)


def test_tree_sums_rejects_nodes_outside_the_tree():
    from fedcf.federated.round.partials import REDUCE_GROUPS, tree_sums

    items, lo, lv = np.array([5, 5]), np.array([0, REDUCE_GROUPS + 6]), np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="outside groups"):
        tree_sums(items, lo, lv, np.ones((2, 3)), np.ones(2))
    got = tree_sums(items, np.array([0, 1]), lv, np.ones((2, 3)), np.ones(2))
    np.testing.assert_array_equal(got[3], [[2.0, 2.0, 2.0]])


def test_summing_subtrees_first_gives_the_same_bits():
    from fedcf._kernels.server import tree_sum_runs

    rng = np.random.default_rng(9)
    items, nlo, nlv, s_Q, s_b = _tree_entries(rng, 20, 4, 0, 16, False)

    def tree(sel, a, b):
        order = np.flatnonzero(sel)[np.lexsort((nlo[sel], items[sel]))]
        n = len(order)
        out = [np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
               np.empty((n, 3)), np.empty(n)]
        m = tree_sum_runs(order, items, nlo, nlv, s_Q, s_b, 4, a, b, *out)
        return [o[:m] for o in out]

    whole = tree(np.ones(len(items), bool), 0, 16)
    for cuts in ([0, 5, 16], [0, 3, 9, 13, 16], [0, 8, 16]):  # shards = group ranges
        parts = [tree((nlo >= lo) & (nlo < hi), lo, hi) for lo, hi in zip(cuts, cuts[1:])]
        it, lo_, lv, q, bb = (np.concatenate(c) for c in zip(*parts))
        order = np.lexsort((lo_, it))
        n = len(it)
        out = [np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
               np.empty((n, 3)), np.empty(n)]
        m = tree_sum_runs(order, it, lo_, lv, q, bb, 4, 0, 16, *out)
        for x, y in zip([o[:m] for o in out], whole):
            np.testing.assert_array_equal(x, y)
