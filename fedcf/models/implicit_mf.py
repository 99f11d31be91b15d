"""Centralized implicit-feedback matrix factorization (weighted ALS, Hu, Koren & Volinsky 2008)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from .._kernels.als import implicit_solve_rows
from .._kernels.layout import implicit_als_cfg
from .._validation import Bool, Dtype, Int, RandomState, Real
from ..datasets import Interactions
from .base import MFEstimatorBase, RankingScoreMixin, atomic_fit, check_memory


def coerce_implicit(X, y=None, **data_kwargs) -> Interactions:
    """Implicit interactions from any supported input: (user, item) pairs or a DataFrame without
    a ``rating`` column mean strength 1 per pair, y (or the rating column) gives strengths;
    strengths must be >= 0 (the first negative one is named)."""
    if (isinstance(X, pd.DataFrame) and "rating" not in X.columns) or \
            isinstance(X, (np.ndarray, list, tuple)):
        data_kwargs.setdefault("rating_col", None)
    inter = Interactions.coerce(X, y, **data_kwargs)
    if np.any(inter.values < 0):
        row = int(np.flatnonzero(inter.values < 0)[0])
        raise ValueError(f"implicit feedback strengths must be >= 0; entry {row} has "
                         f"{inter.values[row]}")
    return inter


def item_gram(Q: np.ndarray) -> np.ndarray:
    """YᵀY in float64 — what a server would broadcast with the item matrix (K² numbers)."""
    Q64 = Q.astype(np.float64, copy=False)
    return Q64.T @ Q64


class ImplicitMF(RankingScoreMixin, MFEstimatorBase):
    """Weighted ALS for implicit feedback (clicks, shares, plays), score = p_u·q_i.

    Every unobserved (user, item) is a weak negative (preference 0, confidence 1); an observed one
    has preference 1 and confidence 1 + ``alpha``·r, where r is the interaction strength (1 for a
    single click). The ``implicit`` library's ALS with ``alpha = 1 + alpha_here`` solves the same
    problem on binary data (it uses confidence α·r).

    Parameters
    ----------
    n_factors : int
    regularization : float
        λ‖x‖² per row (not scaled by the row's count, as in ``implicit``).
    alpha : float
        Confidence slope.
    n_epochs : int
        ALS sweeps (users then items).
    init_scale : float
        Std of the normal initialization.
    dtype, random_state, verbose

    Attributes
    ----------
    user_factors_, item_factors_ (zero biases and global mean, so ``recommend`` and ``predict``
    return p·q scores), interactions_, history_.

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = ImplicitMF(n_factors=4, n_epochs=3, random_state=0).fit(ratings)
    >>> model.user_factors_.shape
    (60, 4)
    """

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_")
    _parameter_constraints = {
        "n_factors": Int(1), "regularization": Real(0.0, low_open=True), "alpha": Real(0.0),
        "n_epochs": Int(0, 10**7), "init_scale": Real(0.0, low_open=True), "dtype": Dtype(),
        "random_state": RandomState(), "verbose": Bool(),
    }

    def __init__(self, n_factors=50, *, regularization=0.01, alpha=1.0, n_epochs=15,
                 init_scale=0.01, dtype="float32", random_state=None, verbose=False):
        self.n_factors = n_factors
        self.regularization = regularization
        self.alpha = alpha
        self.n_epochs = n_epochs
        self.init_scale = init_scale
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    biases = False  # the model has no bias terms (read by the shared machinery)

    @atomic_fit
    def fit(self, X, y=None, **data_kwargs):
        """Fit on Interactions, a DataFrame (user, item[, rating as strength]) or a sparse matrix.
        A fit that raises leaves the estimator as it was."""
        dtype = self._check_params()["dtype"]
        inter = coerce_implicit(X, y, **data_kwargs)
        check_memory((inter.n_users + inter.n_items) * self.n_factors * 16
                     + 2 * (self.n_factors + 1) ** 2 * 8 * 32, f"ImplicitMF with n_factors="
                     f"{self.n_factors}")
        rng = check_random_state(self.random_state)
        K = self.n_factors
        P = (rng.standard_normal((inter.n_users, K)) * self.init_scale).astype(dtype)
        Q = (rng.standard_normal((inter.n_items, K)) * self.init_scale).astype(dtype)
        i_indptr, i_users, i_vals = inter.to_item_csr()
        cfg = implicit_als_cfg(self.alpha, self.regularization)
        history = []
        for epoch in tqdm(range(self.n_epochs), desc="ImplicitMF", disable=not self.verbose,
                          leave=False):
            t0 = time.perf_counter()
            implicit_solve_rows(inter.indptr, inter.items, inter.values, Q, item_gram(Q), cfg, P)
            implicit_solve_rows(i_indptr, i_users, i_vals, P, item_gram(P), cfg, Q)
            if not (np.isfinite(P).all() and np.isfinite(Q).all()):
                raise FloatingPointError(f"non-finite factors at epoch {epoch}; raise "
                                         f"regularization={self.regularization}")
            history.append({"epoch": epoch, "seconds": time.perf_counter() - t0})
        self._set_fitted(inter, P=P, c=np.zeros(inter.n_users, dtype), Q=Q,
                         b=np.zeros(inter.n_items, dtype), mu=0.0, rating_scale=None,
                         history=history)
        return self

    def _reconstruct_csr(self, indptr, items, values, keys):
        """Fold-in: the exact weighted-ALS solve of each row against the frozen items."""
        return implicit_fold_in(self.item_factors_, indptr, items, values, self.alpha,
                                self.regularization)


def implicit_fold_in(Q, indptr, items, values, alpha, lam):
    """(P, zero biases) of every CSR row by the exact weighted-ALS solve against frozen Q."""
    P = np.zeros((len(indptr) - 1, Q.shape[1]), Q.dtype)
    implicit_solve_rows(indptr, items, values, Q, item_gram(Q), implicit_als_cfg(alpha, lam), P)
    return P, np.zeros(len(P), P.dtype)
