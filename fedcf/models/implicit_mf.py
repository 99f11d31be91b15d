"""Centralized implicit-feedback matrix factorization (weighted ALS, Hu, Koren & Volinsky 2008)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from .._kernels.als import implicit_side, implicit_solve_rows
from .._kernels.layout import implicit_als_cfg
from .._validation import Biases, Bool, Dtype, Int, RandomState, Real, bias_flags, moved_biases
from ..datasets import Interactions
from .base import MFEstimatorBase, RankingScoreMixin, atomic_fit, check_memory
from .prediction import warn_non_finite


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


class ImplicitMF(RankingScoreMixin, MFEstimatorBase):
    """Weighted ALS for implicit feedback (clicks, shares, plays), score = p_u·q_i (+ b_i + c_u).

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
    biases : bool or {"item", "user"}, default False
        True learns an item bias b_i and a user bias c_u; "item" or "user" only the one. With
        b_i, preference p_ui is fitted by b_i + p_u·q_i, so item popularity need not be carried
        by the factors; it is solved exactly with the item rows (a constant 1 is appended to the
        user side in the item half-step, b is an offset in the user half-step), regularized by
        the same λ. c_u is learned in the same way: it does not change a user's ranking, but it
        does change scores compared across users (click AUC over pooled impressions).
    dtype, random_state, verbose

    Attributes
    ----------
    user_factors_, item_factors_, item_biases_, user_biases_ (zeros when not learned; the global
    mean is 0, so ``recommend`` and ``predict`` return b_i + c_u + p·q scores), interactions_,
    history_.

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
        "biases": Biases(), "random_state": RandomState(), "verbose": Bool(),
    }

    def __init__(self, n_factors=50, *, regularization=0.01, alpha=1.0, n_epochs=15,
                 init_scale=0.01, biases=False, dtype="float32",
                 random_state=None, verbose=False):
        self.n_factors = n_factors
        self.regularization = regularization
        self.alpha = alpha
        self.n_epochs = n_epochs
        self.init_scale = init_scale
        self.biases = biases
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    @classmethod
    def _saved_params(cls, params: dict) -> dict:
        return moved_biases(params)  # saved as item_bias / user_bias before

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
        c, b = np.zeros(inter.n_users, dtype), np.zeros(inter.n_items, dtype)
        i_indptr, i_users, i_vals = inter.to_item_csr()
        cfg = implicit_als_cfg(self.alpha, self.regularization)
        ib, ub = bias_flags(self.biases)
        history = []
        for epoch in tqdm(range(self.n_epochs), desc="ImplicitMF", disable=not self.verbose,
                          leave=False):
            t0 = time.perf_counter()
            implicit_solve_rows(inter.indptr, inter.items, inter.values, Q,
                                implicit_side(Q, ub, b if ib else None), cfg, P, c)
            implicit_solve_rows(i_indptr, i_users, i_vals, P,
                                implicit_side(P, ib, c if ub else None), cfg, Q, b)
            if not all(np.isfinite(x).all() for x in (P, Q, b, c)):
                raise FloatingPointError(f"non-finite factors at epoch {epoch}; raise "
                                         f"regularization={self.regularization}")
            history.append({"epoch": epoch, "seconds": time.perf_counter() - t0})
        self._set_fitted(inter, P=P, c=c, Q=Q, b=b, mu=0.0, rating_scale=None, history=history)
        return self

    def _reconstruct_csr(self, indptr, items, values, keys):
        """Fold-in: the exact weighted-ALS solve of each row against the frozen items."""
        return implicit_fold_in(self.item_factors_, indptr, items, values, self.alpha,
                                self.regularization,
                                item_biases=self.item_biases_ if bias_flags(self.biases)[0]
                                else None, user_bias=bias_flags(self.biases)[1])


def implicit_fold_in(Q, indptr, items, values, alpha, lam, *, item_biases=None,
                     user_bias=False):
    """(P, user biases) of every CSR row by the exact weighted-ALS solve against frozen Q (and
    frozen item biases, if given); the user biases are zeros unless ``user_bias``."""
    P = np.zeros((len(indptr) - 1, Q.shape[1]), Q.dtype)
    c = np.zeros(len(P), Q.dtype)
    implicit_solve_rows(indptr, items, values, Q, implicit_side(Q, user_bias, item_biases),
                        implicit_als_cfg(alpha, lam), P, c)
    warn_non_finite(P, c, Q)
    return P, c
