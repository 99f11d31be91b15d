"""NumPy twins of ``fedcf._kernels.predict`` (prediction): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np


def predict_pairs(users, items, user_params, item_params, mu):
    P, c = user_params
    Q, b = item_params
    users = np.asarray(users)
    items = np.asarray(items)
    ku, ki = users >= 0, items >= 0
    out = np.full(len(users), float(mu))
    out[ku] += c[users[ku]]
    out[ki] += b[items[ki]]
    both = ku & ki
    out[both] += np.sum(P[users[both]].astype(np.float64) * Q[items[both]], axis=1)
    return out
