"""Centralized (server-side) biased matrix factorization: the paper's non-federated baseline."""

from __future__ import annotations

import time

import numpy as np
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from .._kernels.als import ridge_cg_rows, ridge_solve_rows
from .._kernels.layout import ridge_cfg, sgd_epoch_cfg
from .._kernels.predict import predict_pairs
from .._kernels.sgd import gather_ratings, sgd_epoch
from .._validation import Bool, Dtype, Int, Options, RandomState, RatingScale, Real
from ..datasets import Interactions
from .base import MFEstimatorBase, RatingScoreMixin, atomic_fit, check_memory


class CentralizedMF(RatingScoreMixin, MFEstimatorBase):
    """Biased matrix factorization trained on all data at once, r̂ = μ + b_i + c_u + p_u·q_i.

    Parameters
    ----------
    n_factors : int
        K, the embedding dimension.
    solver : {"als", "sgd"}
        "als": alternating exact ridge solves (per-rating regularization, ALS-WR);
        "sgd": classic per-rating SGD (Funk/Koren) in a fresh random order each epoch.
    als_solver : {"cholesky", "cg"}
        solver="als": each row's ridge system solved exactly (Cholesky), or approximately by
        ``cg_steps`` conjugate-gradient steps warm-started from the row's current value (as
        implicit's default solver; several times cheaper per epoch at K ≈ 50).
    cg_steps : int >= 1
        Conjugate-gradient steps per row and half-sweep (als_solver="cg").
    biases : bool
        Fit μ, item and user biases; False gives the plain p_u·q_i model of the paper.
    regularization : float
        L2 weight per rating (λ in Σ e² + λ(‖p_u‖² + ‖q_i‖² + c_u² + b_i²)).
    n_epochs : int
        ALS sweeps (users then items) or SGD epochs.
    learning_rate : float
        SGD step size (solver="sgd").
    init_scale : float
        Standard deviation of the normal initialization of the factors (> 0: with 0 every
        factor stays 0).
    rating_scale : (low, high) or None
        For clipping predictions; None takes the min and max of the training ratings.
    dtype : {"float32", "float64"}
    random_state : int, RandomState or None
    verbose : bool
        Show a progress bar over epochs.

    Attributes
    ----------
    user_factors_, user_biases_, item_factors_, item_biases_, global_mean_
    user_ids_, item_ids_ : raw ids of the rows
    interactions_ : the training Interactions (to filter seen items in ``recommend``)
    history_ : list of dicts, one per epoch (train RMSE, seconds)

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = CentralizedMF(n_factors=4, n_epochs=3, random_state=0).fit(ratings)
    >>> model.predict([[0, 1], [2, 3]]).shape
    (2,)
    """

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_")
    _parameter_constraints = {
        "n_factors": Int(1), "solver": Options("als", "sgd"),
        "als_solver": Options("cholesky", "cg"), "cg_steps": Int(1, 10**4), "biases": Bool(),
        "regularization": Real(0.0), "n_epochs": Int(0, 10**7),
        "learning_rate": Real(0.0, low_open=True), "init_scale": Real(0.0, low_open=True),
        "rating_scale": RatingScale(), "dtype": Dtype(), "random_state": RandomState(),
        "verbose": Bool(),
    }

    def __init__(self, n_factors=50, *, solver="als", als_solver="cholesky", cg_steps=3,
                 biases=True, regularization=0.05, n_epochs=15, learning_rate=0.01,
                 init_scale=0.1, rating_scale=None, dtype="float32", random_state=None,
                 verbose=False):
        self.n_factors = n_factors
        self.solver = solver
        self.als_solver = als_solver
        self.cg_steps = cg_steps
        self.biases = biases
        self.regularization = regularization
        self.n_epochs = n_epochs
        self.learning_rate = learning_rate
        self.init_scale = init_scale
        self.rating_scale = rating_scale
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    def _als_half(self, indptr, idx, vals, fixed, fixed_bias, cfg, out, out_bias):
        """One ALS half-sweep: every row of the CSR solved against the frozen side."""
        if self.als_solver == "cg":
            ridge_cg_rows(indptr, idx, vals, fixed, fixed_bias, cfg, self.cg_steps, out, out_bias)
        else:
            ridge_solve_rows(indptr, idx, vals, fixed, fixed_bias, cfg, out, out_bias)

    @atomic_fit
    def fit(self, X, y=None, **data_kwargs):
        """Fit on a DataFrame (user, item, rating[, timestamp]), Interactions or sparse matrix.

        ``data_kwargs`` go to ``Interactions.from_dataframe`` (column names, duplicates=...).
        A fit that raises leaves the estimator as it was.
        """
        dtype = self._check_params()["dtype"]
        inter = Interactions.coerce(X, y, **data_kwargs)
        K = self.n_factors
        itemsize = np.dtype(dtype).itemsize
        check_memory((inter.n_users + inter.n_items) * K * (itemsize + 8)
                     + 2 * (K + 2) ** 2 * 8 * 32 + inter.nnz * (K + 2) * itemsize,
                     f"CentralizedMF with n_factors={K}")
        rng = check_random_state(self.random_state)
        K = self.n_factors
        n_users, n_items = inter.n_users, inter.n_items
        scale = self._check_params()["rating_scale"]
        rating_scale = scale or (float(inter.values.min()), float(inter.values.max()))
        mu = float(inter.values.mean()) if self.biases else 0.0
        P = (rng.standard_normal((n_users, K)) * self.init_scale).astype(dtype)
        Q = (rng.standard_normal((n_items, K)) * self.init_scale).astype(dtype)
        c = np.zeros(n_users, dtype)
        b = np.zeros(n_items, dtype)
        users = inter.user_index()
        history = []
        lam = float(self.regularization)
        if self.solver == "als":
            i_indptr, i_users, i_vals = inter.to_item_csr()
            cfg = ridge_cfg(lam, 1e-6, mu, self.biases)
        else:  # each epoch's shuffle is gathered into these, reused
            shuffled = (np.empty_like(users), np.empty_like(inter.items),
                        np.empty_like(inter.values))
        epochs = tqdm(range(self.n_epochs), desc=f"CentralizedMF[{self.solver}]",
                      disable=not self.verbose, leave=False)
        for epoch in epochs:
            t0 = time.perf_counter()
            if self.solver == "als":
                # users given items: target r − μ − b_i; items given users: target r − μ − c_u
                self._als_half(inter.indptr, inter.items, inter.values, Q, b, cfg, P, c)
                self._als_half(i_indptr, i_users, i_vals, P, c, cfg, Q, b)
                pred = np.empty(inter.nnz)
                predict_pairs(users, inter.items, (P, c), (Q, b), mu, pred)
                sse = float(np.sum((inter.values - pred) ** 2))
            else:
                gather_ratings(rng.permutation(inter.nnz), users, inter.items, inter.values,
                               *shuffled)
                cfg = sgd_epoch_cfg(self.learning_rate, lam, mu, self.biases)
                sse = sgd_epoch(*shuffled, (P, c), (Q, b), cfg)
            if not np.isfinite(sse):
                big = float(np.abs(inter.values).max())
                hint = (f"the ratings (largest |r| = {big:.3g}) overflow {np.dtype(dtype).name} "
                        "arithmetic: rescale them" if big > 1e15 else
                        f"lower learning_rate={self.learning_rate}" if self.solver == "sgd" else
                        f"raise regularization={self.regularization}")
                raise FloatingPointError(
                    f"training diverged at epoch {epoch} (non-finite loss); {hint}")
            history.append({"epoch": epoch, "train_rmse": float(np.sqrt(sse / inter.nnz)),
                            "seconds": time.perf_counter() - t0})
        self._set_fitted(inter, P=P, c=c, Q=Q, b=b, mu=mu, rating_scale=rating_scale,
                         history=history)
        return self
