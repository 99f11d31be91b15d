"""Server-side row kernels: the non-finite guard over client deltas and sparse row updates.

Sequential on purpose (deterministic, and each call is a fraction of a millisecond).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def finite_clients(offsets, d_Q, d_b):
    """ok[k] = every value in client k's slots [offsets[k], offsets[k+1]) is finite."""
    m = offsets.shape[0] - 1
    K = d_Q.shape[1]
    ok = np.ones(m, np.bool_)
    for k in range(m):
        for e in range(offsets[k], offsets[k + 1]):
            if not np.isfinite(d_b[e]):
                ok[k] = False
                break
            bad = False
            for a in range(K):
                if not np.isfinite(d_Q[e, a]):
                    bad = True
                    break
            if bad:
                ok[k] = False
                break
    return ok


@njit(cache=True)
def sgd_rows(x, rows, delta, lr):
    """x[rows] += lr · delta (x: (n, K) or (n, 1) view); returns True if the rows stay finite."""
    K = x.shape[1]
    ok = True
    for t in range(rows.shape[0]):
        r = rows[t]
        for a in range(K):
            v = x[r, a] + lr * delta[t, a]
            x[r, a] = v
            ok = ok and np.isfinite(x[r, a])
    return ok


@njit(cache=True)
def adagrad_rows(x, acc, rows, delta, lr, eps):
    """Adagrad on the given rows with g = −delta: acc += g²; x −= lr g / (√acc + eps)."""
    K = x.shape[1]
    ok = True
    for t in range(rows.shape[0]):
        r = rows[t]
        for a in range(K):
            g = -delta[t, a]
            acc[r, a] += g * g
            v = x[r, a] - lr * g / (np.sqrt(acc[r, a]) + eps)
            x[r, a] = v
            ok = ok and np.isfinite(x[r, a])
    return ok
