"""Dense kernels of a row's ridge solve: the Gram matrix A = ZᵀZ as a register-tiled
micro-kernel, and a Cholesky factorization by panels that runs its updates on it.

A ridge solve's Gram (n · d² of its n · d² + d³/3 flops) is a small GEMM with a long inner
dimension (the row's n ratings) and d = K + 1 outputs a side. Written as dot products along the
rating axis, every one of the d²/2 entries ends in a horizontal reduction of a SIMD register and
a scalar tail; at K = 50 and ~100 ratings per row those cost as much as the multiply-adds.

Here the design is laid out by rows, each padded with zeros to ``W``, a multiple of the SIMD width
(the values of Z's dtype in 64 bytes: 16 float32, 8 float64), and the Gram is built from rank-one
updates like a GEMM micro-kernel: ``gram_panel`` keeps a panel of ``GRAM_ROWS`` rows × up to
``GRAM_BLOCKS`` SIMD vectors of A in registers while it runs over the ratings (one vector load per
block and one broadcast per row feed GRAM_ROWS × blocks fused multiply-adds), and writes the
panel once. No reductions, no tails. Numba cannot keep vector accumulators in registers across a
loop from Python source (the stores to A may alias Z's loads), so the panel is an ``intrinsic``
that emits the LLVM vector loop directly; on CPUs narrower than 64 bytes LLVM splits each vector
into two or four.

Each entry is summed over the ratings in order, in Z's dtype: deterministic, and independent of
the thread count. ``_reference.gram_panel`` is the NumPy twin.

The (d × d, float64) Cholesky is short work at d = K + 1 = 51: written as dot products or row
updates in Python, its loops are tails and horizontal sums. ``cholesky_solve_panels`` factors A = RᵀR
(R upper, in rows padded like the design) GRAM_ROWS rows at a time: the rows above a panel update
it through ``gram_panel`` (the bulk of the d³/3 flops), the panel's own rows update each other
with whole-vector row operations (``row_update``), and the right-hand side rides along in column
d, so the forward substitution comes free. Whole-vector operations also touch the entries left of
each row's diagonal within its first vector: those are scratch, zeroed at the start (so that
nothing left by an earlier row, a NaN or a value decaying to subnormal, is carried along) and
never read into a result. ``_reference.ridge_solve_row`` is the twin of the solve.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

GRAM_ROWS = 6  # rows of A per panel: 6 × 4 accumulators + 4 loads + 1 broadcast ≤ 32 registers
GRAM_BLOCKS = 4  # SIMD vectors per panel row
VECTOR_BYTES = 64


@njit(cache=True)
def design_width(d, itemsize):
    """W: the padded width of a design row [z (d values), y, zeros] of ``itemsize``-byte floats —
    room for y in column d and for the last panel's rows (A's rows are read from Z's columns),
    rounded up to whole 64-byte vectors."""
    step = VECTOR_BYTES // itemsize
    need = max(d + 1, (d + GRAM_ROWS - 1) // GRAM_ROWS * GRAM_ROWS)
    return (need + step - 1) // step * step


def _float_arrays(name, *arrays):
    """The vector type's element for C-contiguous 2-d float arrays of one dtype, else TypeError."""
    ok = all(isinstance(x, types.Array) and x.ndim == 2 and x.layout == "C" for x in arrays)
    if not (ok and len({x.dtype for x in arrays}) == 1
            and arrays[0].dtype in (types.float32, types.float64)):
        raise TypeError(f"{name} needs C-contiguous 2-d float arrays of one dtype")
    return arrays[0].dtype


def _vector_type(context, dtype):
    sty = context.get_value_type(dtype)
    return ir.VectorType(sty, VECTOR_BYTES // context.get_abi_sizeof(sty))


def _vector_at(builder, vty, data, width, row, col):
    """Pointer to the vector at (row, col) of a C-contiguous array ``width`` values wide."""
    ptr = builder.gep(data, [builder.add(builder.mul(row, width), col)])
    return builder.bitcast(ptr, vty.as_pointer())


def _splat(builder, value, vty):
    """A vector of vty with every lane = value."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), value,
                                 ir.Constant(ir.IntType(32), 0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count)
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), mask)


def _fma(builder, a, b, c):
    """a·b + c, fused where the CPU has FMA (``contract``), a multiply and an add elsewhere."""
    prod = builder.fmul(a, b)
    prod.flags.append("contract")
    out = builder.fadd(prod, c)
    out.flags.append("contract")
    return out


def _panel_loop(builder, vty, z_ptr, o_ptr, dims, nblk):
    """The panel with exactly ``nblk`` vectors per row: accumulate over the ratings, store."""
    n, a, c0, z_w, o_w = dims
    i64 = ir.IntType(64)
    cols = [builder.add(c0, ir.Constant(i64, b * vty.count)) for b in range(nblk)]
    acc = [[cgutils.alloca_once_value(builder, ir.Constant(vty, None)) for _ in range(nblk)]
           for _ in range(GRAM_ROWS)]  # allocas: promoted to registers by LLVM
    with cgutils.for_range(builder, n) as loop:
        zs = [builder.load(_vector_at(builder, vty, z_ptr, z_w, loop.index, c), align=4)
              for c in cols]
        for r in range(GRAM_ROWS):
            col = builder.add(a, ir.Constant(i64, r))
            w = builder.load(builder.gep(z_ptr, [builder.add(builder.mul(loop.index, z_w), col)]))
            wv = _splat(builder, w, vty)
            for b in range(nblk):
                builder.store(_fma(builder, wv, zs[b], builder.load(acc[r][b])), acc[r][b])
    for r in range(GRAM_ROWS):
        row = builder.add(a, ir.Constant(i64, r))
        for b in range(nblk):
            builder.store(builder.load(acc[r][b]),
                          _vector_at(builder, vty, o_ptr, o_w, row, cols[b]), align=4)


@intrinsic
def gram_panel(typingctx, Z, n, a, c0, nblk, out):
    """out[a + r, c0 : c0 + nblk·L] = Σ_{t<n} Z[t, a + r] · Z[t, c0 : c0 + nblk·L] for
    r < GRAM_ROWS, where L = values of Z's dtype per 64-byte vector and 1 ≤ nblk ≤ GRAM_BLOCKS
    (other nblk: nothing is written). Z (≥ n rows) and out are C-contiguous arrays of one float
    dtype; the caller keeps every index in bounds."""
    dtype = _float_arrays("gram_panel", Z, out)
    sig = types.none(Z, types.int64, types.int64, types.int64, types.int64, out)

    def codegen(context, builder, signature, args):
        z_arr = context.make_array(signature.args[0])(context, builder, args[0])
        o_arr = context.make_array(signature.args[5])(context, builder, args[5])
        vty = _vector_type(context, dtype)
        n_, a_, c0_, nblk_ = (context.cast(builder, v, t, types.int64)
                              for v, t in zip(args[1:5], signature.args[1:5]))
        dims = (n_, a_, c0_, builder.extract_value(z_arr.shape, 1),
                builder.extract_value(o_arr.shape, 1))
        for k in range(1, GRAM_BLOCKS + 1):
            with builder.if_then(builder.icmp_signed("==", nblk_, ir.Constant(ir.IntType(64), k))):
                _panel_loop(builder, vty, z_arr.data, o_arr.data, dims, k)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def row_update(typingctx, dst, drow, src, srow, a, c, v0, nvec):
    """dst[drow, v·L : (v + 1)·L] = a · dst[…] − c · src[srow, …] for the 64-byte vectors
    v0 ≤ v < v0 + nvec (L values each): whole vectors, no tail. dst and src are C-contiguous 2-d
    arrays of one float dtype; the caller keeps every index in bounds."""
    dtype = _float_arrays("row_update", dst, src)
    i64 = types.int64
    sig = types.none(dst, i64, src, i64, types.float64, types.float64, i64, i64)

    def codegen(context, builder, signature, args):
        d_arr = context.make_array(signature.args[0])(context, builder, args[0])
        s_arr = context.make_array(signature.args[2])(context, builder, args[2])
        vty = _vector_type(context, dtype)
        drow_, srow_, v0_, nvec_ = (context.cast(builder, args[k], signature.args[k], i64)
                                    for k in (1, 3, 6, 7))
        av, cv = (_splat(builder, context.cast(builder, args[k], signature.args[k], dtype), vty)
                  for k in (4, 5))
        d_w, s_w = (builder.extract_value(x.shape, 1) for x in (d_arr, s_arr))
        with cgutils.for_range(builder, nvec_) as loop:
            col = builder.mul(builder.add(v0_, loop.index), ir.Constant(ir.IntType(64), vty.count))
            dp = _vector_at(builder, vty, d_arr.data, d_w, drow_, col)
            sp = _vector_at(builder, vty, s_arr.data, s_w, srow_, col)
            ax = builder.fmul(av, builder.load(dp, align=4))
            out = builder.fsub(ax, builder.fmul(cv, builder.load(sp, align=4)))
            builder.store(out, dp, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def gram_panels(Z, n, a, out):
    """Rows a … a + GRAM_ROWS − 1 of Z[:n]ᵀ Z[:n] into ``out``, from the vector holding column a
    to Z's last column (what lies left of the diagonal is computed too, and left unused)."""
    W = Z.shape[1]
    step = VECTOR_BYTES // Z.itemsize  # values per SIMD vector
    c = a // step * step
    while c < W:
        nblk = min(GRAM_BLOCKS, (W - c) // step)
        gram_panel(Z, np.int64(n), np.int64(a), np.int64(c), np.int64(nblk), out)
        c += nblk * step


@njit(cache=True)
def gram_rows(Z, n, d, acc, U):
    """U[a, c] = Σ_{t<n} Z[t, a] Z[t, c] for a < d, a ≤ c ≤ d (float64): the upper triangle of
    the Gram of Z's first d columns and, in column d, their products with the targets. ``Z`` is
    a design of rows [z, y, zeros] (``design_width`` columns); ``acc`` is scratch in Z's dtype of
    at least (rows of the last panel) × W. U's other entries are left as they were."""
    for a in range(0, d, GRAM_ROWS):
        gram_panels(Z, n, a, acc)
    for a in range(d):
        for c in range(a, d + 1):
            U[a, c] = acc[a, c]


@njit(cache=True)
def solve_square(d):
    """float64 work for ``cholesky_solve_panels`` on d unknowns: (2, rows, W) zeros, the matrix
    U (rows [A | b], padded like a float64 design) and the panel products S."""
    rows = (d + GRAM_ROWS - 1) // GRAM_ROWS * GRAM_ROWS
    return np.zeros((2, rows, design_width(d, 8)))


@njit(cache=True, fastmath={"reassoc", "contract", "arcp"})
def cholesky_solve_panels(U, S, d, x):
    """Solve A x = b for SPD A, given A's upper triangle in U[:d, :d] and b in U[:d, d] (U, S from
    ``solve_square``); x[:d] gets the solution. U becomes [R | R⁻ᵀb] with A = RᵀR (R upper); S
    is scratch. Returns False, x untouched, when A is not positive definite."""
    step = VECTOR_BYTES // U.itemsize
    n_vec = U.shape[1] // step
    for r in range(d):  # the scratch left of the diagonal that whole-vector steps touch
        for c in range(r // step * step, r):
            U[r, c] = 0.0
    for j in range(0, d, GRAM_ROWS):
        if j > 0:
            gram_panels(U, j, j, S)  # the rows above, against this panel's rows
        for r in range(j, min(j + GRAM_ROWS, d)):
            v0 = np.int64(r // step)  # whole vectors from the one holding the diagonal
            if j > 0:
                row_update(U, np.int64(r), S, np.int64(r), 1.0, 1.0, v0, n_vec - v0)
            for q in range(j, r):  # the panel's rows above r
                row_update(U, np.int64(r), U, np.int64(q), 1.0, U[q, r], v0, n_vec - v0)
            s = U[r, r]
            if not s > 0.0:
                return False
            root = np.sqrt(s)
            row_update(U, np.int64(r), U, np.int64(r), 1.0 / root, 0.0, v0, n_vec - v0)
            U[r, r] = root
    for i in range(d - 1, -1, -1):  # R x = R⁻ᵀb
        t = U[i, d]
        for k in range(i + 1, d):
            t -= U[i, k] * x[k]
        x[i] = t / U[i, i]
    return True
