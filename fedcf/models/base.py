"""The base of every matrix-factorization estimator: parameters, fitted state and the hooks a
subclass fills; prediction and reconstruction come from ``prediction.py``, save/load from
``persistence.py``, ``score`` from the mixins below."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_is_fitted

from .._kernels.als import ridge_solve_rows
from .._kernels.layout import ridge_cfg
from .._ranking import ranking_metrics
from .._validation import check_params, id_kind_mismatch, named_kwargs, raw_ids
from ..datasets import DataValidationError, Interactions
from ..datasets._files import fits_in_ram
from .persistence import (  # noqa: F401
    _META,
    FORMAT_VERSION,
    Persistence,
    _ids_to_array,
)
from .prediction import (  # noqa: F401
    LocalParams,
    Prediction,
    _as_pairs,
    _as_ratings,
    content_key,
    user_keys,
    warn_non_finite,
)


def atomic_fit(fit):
    """Decorator: a ``fit`` that raises leaves the estimator exactly as it was before the call
    (its previously fitted attributes restored, no half-replaced state)."""

    @functools.wraps(fit)
    def wrapper(self, *args, **kwargs):
        before = {k: v for k, v in vars(self).items() if k.endswith("_")}
        try:
            return fit(self, *args, **kwargs)
        except BaseException:
            for k in [k for k in vars(self) if k.endswith("_")]:
                delattr(self, k)
            for k, v in before.items():
                setattr(self, k, v)
            raise

    return wrapper


def _plain(x):
    return x.item() if isinstance(x, np.generic) else x


def _warn_kind(unknown: np.ndarray, model_ids: np.ndarray, what: str) -> None:
    bad = id_kind_mismatch(unknown[:1000], model_ids) if len(unknown) and len(model_ids) else None
    if bad is not None:
        kind = "text" if isinstance(bad, str) else "numbers"
        bad = _plain(bad)  # 7, not np.int64(7)
        warnings.warn(f"{what} id {bad!r} is {type(bad).__name__} but the model's {what} ids "
                      f"are {'numbers' if kind == 'text' else 'text'} (e.g. "
                      f"{_plain(np.asarray(model_ids)[0])!r}): it can never match and scores as an "
                      f"unknown {what}; pass ids of the model's type", UserWarning, stacklevel=4)


def check_callback(callback) -> None:
    """A fit callback must be callable."""
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function (model, round) -> dict or None, got "
                        f"{type(callback).__name__}")


def check_memory(nbytes: float, what: str, advice: str = "lower n_factors (or the sizes "
                 "that scale it)") -> None:
    """Refuse up front, with the figure, a fit whose arrays would not fit in this machine's RAM."""
    fits, gib = fits_in_ram(nbytes)
    if not fits:
        raise MemoryError(f"{what} needs about {nbytes / 2**30:.1f} GiB, more than this machine's "
                          f"{gib:.1f} GiB of RAM allows; {advice}")


class MFEstimatorBase(Prediction, Persistence, BaseEstimator):
    """Base of every fedcf estimator (not used directly).

    Subclasses declare ``_parameter_constraints`` ({name: rule}, see ``fedcf._validation``) and
    set in ``fit``: ``item_ids_``, ``user_ids_``, ``item_factors_``, ``item_biases_``,
    ``global_mean_``, ``rating_scale_``, ``history_`` (and ``user_factors_`` / ``user_biases_``
    when they keep user rows); they may override ``_reconstruct_csr``.
    """

    _parameter_constraints: dict = {}
    _fitted_attr = "item_factors_"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:  # an unknown keyword says where the setting lives
            cls.__init__ = named_kwargs(cls.__init__)

    def _check_params(self) -> dict:
        """Every declared parameter rule (named errors); returns the cleaned values."""
        return check_params(self)

    def check_params(self):
        """Check every parameter now, as ``fit`` does first; a bad value raises an error that
        names it. Returns self (e.g. to check a configuration before reading any data)."""
        self._check_params()
        return self

    def set_params(self, **params):
        """As scikit-learn's; a nested name (``server_optimizer__learning_rate``) under a phase
        given by name (``server_optimizer="adam"``) first builds that phase's object, so grids
        over nested parameters work from the defaults."""
        for name in {k.partition("__")[0] for k in params if "__" in k}:
            value = params.get(name, self.__dict__.get(name))
            if isinstance(value, str) and name in self._parameter_constraints:
                params[name] = self._parameter_constraints[name](name, value)
                if isinstance(params[name], str):  # "auto": an object only at fit
                    raise ValueError(f"{name}={value!r} is chosen at fit from the data, so it "
                                     f"has no {name}__ parameters to set; give {name} an object "
                                     f"first (e.g. {name}=... in the same set_params call)")
        return super().set_params(**params)

    # ------------------------------------------------------------------ subclass hooks
    def _row_width(self) -> int:
        """Columns of item_factors_ and of a user row (FedNCF: both branches' embeddings)."""
        return self.n_factors

    def _user_params(self, users: np.ndarray):
        """Local parameters of dense users seen in fit.

        Models that keep user rows (centralized, FedAvg/FURL, or loaded with them) return those;
        FedRecon keeps none, so its seen users are reconstructed from their fit data, the same
        way a device would.
        """
        if self._fitted("user_factors_") is not None:
            return self.user_factors_[users], self.user_biases_[users]
        dt = self.item_factors_.dtype
        if len(users) == 0:
            return np.zeros((0, self.item_factors_.shape[1]), dt), np.zeros(0, dt)
        inter = self._fitted("interactions_")
        if inter is None:
            raise ValueError("this model was loaded from disk and holds no user data; "
                             "reconstruct users with reconstruct(items, ratings) or "
                             "reconstruct_users(interactions)")
        sub = inter.subset_users(users)
        return self._reconstruct_csr(sub.indptr, sub.items, sub.values, user_keys(sub.user_ids))

    def _set_fitted(self, inter, *, P, c, Q, b, mu, rating_scale, history):
        """Set the fitted attributes shared by the centralized estimators."""
        self.user_factors_, self.user_biases_ = P, c
        self.item_factors_, self.item_biases_ = Q, b
        self.global_mean_ = mu
        self.rating_scale_ = rating_scale
        self.user_ids_, self.item_ids_ = inter.user_ids, inter.item_ids
        self.interactions_ = inter
        self.history_ = history

    def _reconstruct_csr(self, indptr, items, values, keys):
        """Local params of every row of a CSR over *model* item ids: exact ridge solve.
        ``keys`` (uint64 per row) seed rows' random streams where reconstruction is random."""
        K = self.item_factors_.shape[1]
        n = len(indptr) - 1
        P = np.zeros((n, K), dtype=self.item_factors_.dtype)
        c = np.zeros(n, dtype=self.item_factors_.dtype)
        cfg = ridge_cfg(self._recon_lam(), self._recon_lam0(), self.global_mean_,
                        bool(self.biases))
        ridge_solve_rows(indptr, items, values, self.item_factors_, self.item_biases_, cfg, P, c)
        warn_non_finite(P, c, self.item_factors_)
        return P, c

    def _recon_lam(self) -> float:
        """The ridge λ per rating of a reconstruction (the centralized models' own)."""
        return float(self.regularization)

    def _recon_lam0(self) -> float:
        return 1e-3 * self._recon_lam() + 1e-6

    # ------------------------------------------------------------------ helpers
    def _check_fitted(self):
        check_is_fitted(self, self._fitted_attr)

    def _item_index(self, raw_items) -> np.ndarray:
        """Model item ids (int32, the one index dtype the kernels are compiled for); −1 unknown.
        Ids of another kind than the model's (text for numbers, or the reverse) can never
        match: a warning names one."""
        raw = raw_ids(raw_items, "items")
        idx = pd.Index(self.item_ids_).get_indexer(pd.Index(raw))
        _warn_kind(raw[idx < 0], self.item_ids_, "item")
        return idx.astype(np.int32)

    def _user_index(self, raw_users) -> np.ndarray:
        raw = raw_ids(raw_users, "users")
        idx = pd.Index(self.user_ids_).get_indexer(pd.Index(raw))
        _warn_kind(raw[idx < 0], self.user_ids_, "user")
        return idx

    def _model_items_of(self, inter: Interactions) -> np.ndarray:
        """Model item id of each of ``inter``'s entries (−1 for items the model never saw)."""
        if inter.item_ids is self.item_ids_ or (
            len(inter.item_ids) == len(self.item_ids_)
            and np.array_equal(inter.item_ids, self.item_ids_)
        ):
            return inter.items
        return self._item_index(inter.item_ids)[inter.items]

    def _clip(self, pred: np.ndarray, clip: bool) -> np.ndarray:
        if clip and self._fitted("rating_scale_") is not None:
            np.clip(pred, *self.rating_scale_, out=pred)
        return pred


class RatingScoreMixin(RegressorMixin):
    """``score`` of the rating estimators: R², as for every scikit-learn regressor."""

    def score(self, X, y=None, sample_weight=None) -> float:
        """R² of ``predict(X)`` against the true ratings (higher is better; 1 is perfect).

        X, y as in ``fit``: (user, item) pairs with ratings y, or a DataFrame with a ``rating``
        column, or Interactions. Users unseen in fit get ``predict``'s fallback (μ + b_i); to score
        held-out users by reconstruction use ``fedcf.model_selection.recon_scorer``, and for RMSE
        pass ``scoring="neg_root_mean_squared_error"`` to scikit-learn's tools.
        """
        if y is not None:
            y_true = _as_ratings(y)
        elif isinstance(X, Interactions):
            y_true = X.values
        elif isinstance(X, pd.DataFrame) and "rating" in X.columns:
            y_true = _as_ratings(X["rating"])
        else:
            raise DataValidationError("score needs the true ratings: pass them as y, or X as a "
                                      "DataFrame with a 'rating' column")
        pred = self.predict(X)
        if len(pred) != len(y_true):
            raise DataValidationError(f"X has {len(pred)} pairs but y has {len(y_true)} ratings")
        return float(r2_score(y_true, pred, sample_weight=sample_weight))


class RankingScoreMixin:
    """``score`` of the implicit-feedback estimators: NDCG@k of held-out pairs."""

    def score(self, X, y=None, *, k: int = 10) -> float:
        """NDCG@``k`` of the held-out (user, item) pairs X (higher is better): each user of X
        seen in fit ranks every item except those of their fit data; the pairs of X are the
        relevant ones. Users unseen in fit and items unknown to the model are skipped (score
        held-out users with ``fedcf.model_selection.recon_scorer``); y is ignored."""
        self._check_fitted()
        raw_u, raw_i = _as_pairs(X, "user", "item")
        u, i = self._user_index(raw_u), self._item_index(raw_i)
        keep = (u >= 0) & (i >= 0)
        if not keep.any():
            raise DataValidationError("score found no pair of X with a user seen in fit and a "
                                      "known item; for held-out users use "
                                      "fedcf.model_selection.recon_scorer")
        n_u, n_i = len(self.user_ids_), len(self.item_ids_)
        relevant = Interactions.from_arrays(u[keep], i[keep], duplicates="last",
                                            user_catalog=np.arange(n_u), item_catalog=np.arange(n_i))
        seen = self._seen_interactions()

        return ranking_metrics(self._dense_user_scores, seen, relevant, k,
                               with_auc=False)["ndcg"]

    def _dense_user_scores(self, users) -> np.ndarray:
        """Scores of every item for dense users seen in fit (a model whose users score with
        more than a row of factors overrides it)."""
        return self.score_all_items(*self._user_params(users))

    def _held_out_scores(self, support: Interactions):
        """score_fn(batch) of every item for the users of ``support`` from their own data, as
        their devices would score (reconstructed here; a model whose devices train more than
        a user row overrides it)."""
        P, c = self.reconstruct_users(support)
        return lambda b: self.score_all_items(P[b], c[b])

    def _seen_interactions(self) -> Interactions:
        inter = self._fitted("interactions_")
        if inter is not None:
            return inter
        if self._fitted("seen_indptr_") is None:
            raise ValueError("this model was loaded from disk and holds no user data, so it "
                             "cannot rank for users seen in fit; score held-out users with "
                             "fedcf.model_selection.recon_scorer")
        indptr, items = self.seen_indptr_, self.seen_items_
        return Interactions(indptr=indptr, items=items, values=np.ones(len(items)),
                            timestamps=None, user_ids=np.arange(len(indptr) - 1),
                            item_ids=np.arange(len(self.item_ids_)))
