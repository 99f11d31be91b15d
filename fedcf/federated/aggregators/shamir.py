"""Shamir secret sharing of the protocol's 16-byte seeds, vectorised with NumPy.

A secret is cut into ``CHUNKS`` values of at most 30 bits, each shared by its own random
polynomial of degree t − 1 over the prime field GF(p), p = 2³¹ − 1: holder k (x = k, 1-based)
gets the polynomials' values at x. Any t shares give the secret back by Lagrange interpolation at
0; t − 1 shares are independent of it (every candidate secret fits exactly one polynomial
through them). The polynomials' coefficients come from the OS's secure randomness
(``os.urandom``), drawn exactly uniform on the field by rejection.

Why not a library's: pycryptodome's ``Shamir`` shares over GF(2¹²⁸) with one Python-level field
multiplication per coefficient and holder — most of a 100-client secure round's time. Here one
split is t NumPy steps over every holder and chunk at once (Horner's rule), and one combine is a
dot product with Lagrange weights, computed in one batch for every secret the server
rebuilds in a round (``combine_many``).
"""

from __future__ import annotations

import os

import numpy as np

P = 2**31 - 1  # a Mersenne prime: products of two field elements fit in int64
BITS = 30  # bits of a secret per chunk (below p, so every chunk is a field element)
SECRET_BYTES = 16
CHUNKS = -(-8 * SECRET_BYTES // BITS)  # 5 chunks of ≤ 30 bits carry 128 bits
SHARE_BYTES = 4 * CHUNKS  # a share of one secret: CHUNKS field elements, uint32 little-endian
MAX_HOLDERS = 2**16 - 1  # holder indices travel as 2 bytes


def field_elements(shape) -> np.ndarray:
    """Independent uniform elements of GF(p) from the OS's secure randomness (31 random bits,
    the one value equal to p drawn again)."""
    n = int(np.prod(shape))
    out = np.empty(0, np.int64)
    while len(out) < n:
        draw = np.frombuffer(os.urandom(4 * (n - len(out))), "<u4").astype(np.int64) & P
        out = np.concatenate([out, draw[draw < P]])
    return out.reshape(shape)


def _to_chunks(secret: bytes) -> np.ndarray:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret is {SECRET_BYTES} bytes, got "
                         f"{len(secret) if isinstance(secret, (bytes, bytearray)) else secret!r}")
    v = int.from_bytes(secret, "little")
    return np.array([(v >> (BITS * k)) & ((1 << BITS) - 1) for k in range(CHUNKS)], np.int64)


def _from_chunks(chunks: np.ndarray) -> bytes:
    if np.any(chunks >= 1 << BITS) or int(chunks[-1]) >> (8 * SECRET_BYTES - BITS * (CHUNKS - 1)):
        raise ValueError("the shares do not interpolate to a secret (a corrupted or foreign "
                         "share among them)")
    v = sum(int(c) << (BITS * k) for k, c in enumerate(chunks))
    return v.to_bytes(SECRET_BYTES, "little")


def split(secrets, t: int, n: int) -> list[list[bytes]]:
    """Shares of each of ``secrets`` (16 bytes each) for holders 1..n, any t of which rebuild
    it: ``out[k][j]`` is holder k + 1's share of secret j (``SHARE_BYTES`` bytes)."""
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (t, n)):
        raise TypeError(f"t and n must be whole numbers, got t={t!r}, n={n!r}")
    if not 1 <= t <= n <= MAX_HOLDERS:
        raise ValueError(f"need 1 <= t <= n <= {MAX_HOLDERS}, got t={t}, n={n}")
    const = np.concatenate([_to_chunks(s) for s in secrets])
    coef = field_elements((t - 1, len(const)))
    x = np.arange(1, n + 1, dtype=np.int64)[:, None]
    acc = np.zeros((n, len(const)), np.int64)
    for c in coef[::-1]:  # Horner: acc ← acc·x + c, highest degree first
        acc = (acc * x + c) % P
    acc = (acc * x + const) % P
    words = acc.astype("<u4").reshape(n, len(secrets), CHUNKS)
    return [[w.tobytes() for w in row] for row in words]


class ShareError(ValueError):
    """Shares that cannot give a secret; ``group`` is the position of the offending group in
    ``combine_many``'s argument."""

    def __init__(self, message: str, group: int = 0):
        super().__init__(message)
        self.group = group


def _field_inverse(a: np.ndarray) -> np.ndarray:
    """a^(p − 2) mod p elementwise (Fermat's inverse of non-zero field elements), by square and
    multiply on whole arrays."""
    out, base, e = np.ones_like(a), a % P, P - 2
    while e:
        if e & 1:
            out = out * base % P
        base, e = base * base % P, e >> 1
    return out


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """Weights λ[g, j] with f(0) = Σ_j λ[g, j] f(xs[g, j]) for every polynomial of degree
    below xs.shape[1], one row per holder set (distinct non-zero x in each row): λ_j =
    Π_{m≠j} x_m / (x_m − x_j), each product a loop over m of whole-array steps."""
    xs = np.asarray(xs, np.int64) % P
    num, den = np.ones_like(xs), np.ones_like(xs)
    for m in range(xs.shape[1]):
        other = np.arange(xs.shape[1]) != m
        num = np.where(other, num * xs[:, m:m + 1] % P, num)
        den = np.where(other, den * ((xs[:, m:m + 1] - xs) % P) % P, den)
    return num * _field_inverse(den) % P


def _parse(shares, group: int) -> tuple:
    xs = tuple(int(i) for i, _ in shares)
    if len(set(xs)) != len(xs) or not all(1 <= x <= MAX_HOLDERS for x in xs) or not xs:
        raise ShareError(f"share indices must be distinct, in 1..{MAX_HOLDERS}, got {list(xs)}",
                         group)
    if any(len(s) != SHARE_BYTES for _, s in shares):
        raise ShareError(f"a share is {SHARE_BYTES} bytes", group)
    y = np.frombuffer(b"".join(bytes(s) for _, s in shares), "<u4").astype(np.int64)
    if np.any(y >= P):
        raise ShareError("a share holds a value outside the field (a corrupted share)", group)
    return xs, y.reshape(len(xs), CHUNKS)


def combine_many(groups) -> list[bytes]:
    """The secret of each group of shares ``[(index, share bytes), ...]`` (each as many as its
    threshold; more are fine, fewer give a wrong secret or an error): groups of one size are
    interpolated together, the Lagrange weights of each distinct holder set computed once, all
    in one batch. A ShareError names the first
    bad group."""
    parsed = [_parse(g, k) for k, g in enumerate(groups)]
    out: list = [None] * len(parsed)
    for size in sorted({len(xs) for xs, _ in parsed}):
        which = [k for k, (xs, _) in enumerate(parsed) if len(xs) == size]
        sets, where = np.unique(np.array([parsed[k][0] for k in which]), axis=0,
                                return_inverse=True)  # every pair: one set of holders
        lam = lagrange_at_zero(sets)[where.ravel()]
        y = np.stack([parsed[k][1] for k in which])  # (groups, size, CHUNKS)
        chunks = ((lam[:, :, None] * y) % P).sum(axis=1) % P
        for k, c in zip(which, chunks):
            try:
                out[k] = _from_chunks(c)
            except ValueError as e:
                raise ShareError(str(e), k) from None
    return out


def combine(shares) -> bytes:
    """The secret from shares ``[(index, share bytes), ...]`` (as many as its threshold; more
    are fine, fewer give a wrong secret or an error)."""
    return combine_many([shares])[0]
