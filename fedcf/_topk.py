"""Top-k selection, the one implementation (recommend, ranking metrics, CTR slates)."""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores of each row (1-D: of the array), best first; equal scores
    inside the top k keep index order. O(n) selection then an O(k log k) sort per row."""
    s = np.asarray(scores)
    rows = np.atleast_2d(s)
    k = min(int(k), rows.shape[1])
    if k <= 0:
        out = np.zeros((rows.shape[0], 0), np.int64)
        return out[0] if s.ndim == 1 else out
    part = np.argpartition(-rows, k - 1, axis=1)[:, :k]
    order = np.lexsort((part, -np.take_along_axis(rows, part, axis=1)), axis=1)
    top = np.take_along_axis(part, order, axis=1)
    return top[0] if s.ndim == 1 else top
