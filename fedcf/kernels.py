"""The low-level door to fedcf's compute kernels, for benchmarks and extensions: the Numba-jitted
kernels a benchmark times, their packed settings, and ``reference`` — the plain NumPy twin of every
kernel (slow, obvious; the oracle the tests compare against).

Nothing here is needed to fit or use a model. The kernels take arrays in the layouts of
``fedcf._kernels.layout`` and write their results into output arrays; their signatures follow the
kernels and may change between minor versions.

Examples
--------
>>> import numpy as np
>>> from fedcf.kernels import reference, ridge_cfg, ridge_solve_rows
>>> indptr, items, values = np.array([0, 2]), np.array([0, 1]), np.array([4.0, 2.0])
>>> Q, b = np.eye(2), np.zeros(2)
>>> P, c = np.empty((1, 2)), np.empty(1)
>>> cfg = ridge_cfg(0.1, 1e-6, 3.0, True)
>>> ridge_solve_rows(indptr, items, values, Q, b, cfg, P, c)
>>> P2, c2 = reference.ridge_solve_rows(indptr, items, values, Q, b, cfg)
>>> bool(np.allclose(P, P2) and np.allclose(c, c2))
True
"""

from __future__ import annotations

from . import _reference as reference
from ._kernels.als import ridge_cg_rows, ridge_solve_rows
from ._kernels.layout import ridge_cfg, sgd_hp
from ._kernels.sgd import gather_ratings, sgd_epoch

__all__ = ["reference", "ridge_solve_rows", "ridge_cg_rows", "ridge_cfg", "sgd_hp",
           "gather_ratings", "sgd_epoch"]
