"""NumPy twins of ``fedcf._kernels.dense`` (the Gram panel): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np


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
