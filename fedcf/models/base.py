"""Shared machinery of every matrix-factorization estimator: prediction, reconstruction of a user
from ratings, recommendation, and versioned save/load (.npz + JSON, no pickle)."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_is_fitted

from .._io import atomic_savez, load_npz
from .._kernels.als import ridge_solve_rows
from .._kernels.layout import ridge_cfg
from .._kernels.predict import predict_pairs
from .._ranking import ranking_metrics
from .._topk import top_k
from .._validation import check_params
from ..datasets import DataValidationError, Interactions
from ..datasets._files import fits_in_ram

FORMAT_VERSION = 2
_META = "metadata"


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


def check_callback(callback) -> None:
    """A fit callback must be callable."""
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function (model, round) -> dict or None, got "
                        f"{type(callback).__name__}")


def user_keys(raw_ids) -> np.ndarray:
    """A uint64 key per raw user id: the seed of that user's random stream at inference, so a
    user's SGD reconstruction depends on who they are, not on their row in a call."""
    return pd.util.hash_array(np.asarray(raw_ids, dtype=object)).astype(np.uint64)


def content_key(items: np.ndarray, ratings: np.ndarray) -> np.uint64:
    """A uint64 key for an anonymous user from their history (same history, same stream)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(items, np.int64).tobytes())
    h.update(np.ascontiguousarray(ratings, np.float64).tobytes())
    return np.frombuffer(h.digest(), np.uint64)[0]


def check_memory(nbytes: float, what: str) -> None:
    """Refuse up front, with the figure, a fit whose arrays would not fit in this machine's RAM."""
    fits, gib = fits_in_ram(nbytes)
    if not fits:
        raise MemoryError(f"{what} needs about {nbytes / 2**30:.1f} GiB, more than this machine's "
                          f"{gib:.1f} GiB of RAM allows; lower n_factors (or the sizes "
                          "that scale it)")


@dataclass(frozen=True)
class LocalParams:
    """A user's local model: what reconstruction produces and what never leaves the device."""

    factors: np.ndarray  # (K,)
    bias: float


def _ids_to_array(ids: np.ndarray, what: str) -> np.ndarray:
    """Raw ids in a form np.load can read back without pickle."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iufU":
        return ids
    if all(isinstance(x, str) for x in ids):
        return ids.astype(str)
    if all(isinstance(x, (int, np.integer)) for x in ids):
        return ids.astype(np.int64)
    bad = next(x for x in ids if not isinstance(x, (str, int, np.integer)))
    raise TypeError(
        f"cannot save {what} id {bad!r} of type {type(bad).__name__}: only str and int ids (one kind "
        "per model) can be saved without pickle"
    )


def _as_pairs(X, user_col: str, item_col: str):
    """Raw (users, items) from a DataFrame or an (n, 2) array-like."""
    if isinstance(X, pd.DataFrame):
        missing = [c for c in (user_col, item_col) if c not in X.columns]
        if missing:
            raise DataValidationError(
                f"column {missing[0]!r} not found in the DataFrame; its columns are {list(X.columns)}"
            )
        return X[user_col].to_numpy(), X[item_col].to_numpy()
    if isinstance(X, Interactions):
        return X.user_ids[X.user_index()], X.item_ids[X.items]
    arr = np.asarray(X, dtype=object) if not isinstance(X, np.ndarray) else X
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(
            f"expected a DataFrame with {user_col!r}/{item_col!r} columns or an (n, 2) array of "
            f"(user, item) pairs, got shape {getattr(arr, 'shape', None)}"
        )
    return arr[:, 0], arr[:, 1]


class MFEstimatorBase(BaseEstimator):
    """Base of every fedcf estimator (not used directly).

    Subclasses declare ``_parameter_constraints`` ({name: rule}, see ``fedcf._validation``) and
    set in ``fit``: ``item_ids_``, ``user_ids_``, ``item_factors_``, ``item_biases_``,
    ``global_mean_``, ``rating_scale_``, ``history_`` (and ``user_factors_`` / ``user_biases_``
    when they keep user rows); they may override ``_reconstruct_csr``.
    """

    _parameter_constraints: dict = {}
    _fitted_attr = "item_factors_"
    # name of the ridge regularization used for reconstruction; subclasses may override
    _recon_lam_attr = "regularization"

    def _check_params(self) -> dict:
        """Every declared parameter rule (named errors); returns the cleaned values."""
        return check_params(self)

    def check_params(self):
        """Check every parameter now, as ``fit`` does first; a bad value raises an error that
        names it. Returns self (e.g. to check a configuration before reading any data)."""
        self._check_params()
        return self

    # ------------------------------------------------------------------ subclass hooks
    def _user_params(self, users: np.ndarray):
        """Local parameters of dense users seen in fit.

        Models that keep user rows (centralized, FedAvg/FURL, or loaded with them) return those;
        FedRecon keeps none, so its seen users are reconstructed from their fit data, the same
        way a device would.
        """
        if getattr(self, "user_factors_", None) is not None:
            return self.user_factors_[users], self.user_biases_[users]
        dt = self.item_factors_.dtype
        if len(users) == 0:
            return np.zeros((0, self.item_factors_.shape[1]), dt), np.zeros(0, dt)
        inter = getattr(self, "interactions_", None)
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
        return P, c

    def _recon_lam(self) -> float:
        return float(getattr(self, self._recon_lam_attr))

    def _recon_lam0(self) -> float:
        return 1e-3 * self._recon_lam() + 1e-6

    # ------------------------------------------------------------------ helpers
    def _check_fitted(self):
        check_is_fitted(self, self._fitted_attr)

    def _item_index(self, raw_items) -> np.ndarray:
        """Model item ids (int32, the one index dtype the kernels are compiled for); −1 unknown."""
        idx = pd.Index(self.item_ids_).get_indexer(pd.Index(np.asarray(raw_items)))
        return idx.astype(np.int32)

    def _user_index(self, raw_users) -> np.ndarray:
        return pd.Index(self.user_ids_).get_indexer(pd.Index(np.asarray(raw_users)))

    def _model_items_of(self, inter: Interactions) -> np.ndarray:
        """Model item id of each of ``inter``'s entries (−1 for items the model never saw)."""
        if inter.item_ids is self.item_ids_ or (
            len(inter.item_ids) == len(self.item_ids_)
            and np.array_equal(inter.item_ids, self.item_ids_)
        ):
            return inter.items
        return self._item_index(inter.item_ids)[inter.items]

    def _clip(self, pred: np.ndarray, clip: bool) -> np.ndarray:
        if clip and getattr(self, "rating_scale_", None) is not None:
            np.clip(pred, *self.rating_scale_, out=pred)
        return pred

    # ------------------------------------------------------------------ public API
    def reconstruct_users(self, inter: Interactions):
        """Reconstruct every user of ``inter`` from their own entries, against frozen items.

        Items unknown to the model are ignored. Returns (factors (n_users, K), biases (n_users,)),
        rows in ``inter``'s dense user order. A user's result depends only on their own entries
        and raw id, never on the other users in the call. Nothing is stored on the estimator.
        """
        self._check_fitted()
        if not isinstance(inter, Interactions):
            raise TypeError(f"reconstruct_users takes an Interactions, got {type(inter).__name__}")
        model_items = self._model_items_of(inter)
        keep = model_items >= 0
        if not keep.all():
            inter = inter.take(keep)
            model_items = model_items[keep]
        return self._reconstruct_csr(inter.indptr, model_items.astype(np.int32), inter.values,
                                     user_keys(inter.user_ids))

    def reconstruct(self, items, ratings=None) -> LocalParams:
        """A new user's local parameters from their ratings (raw item ids), by reconstruction.

        Unknown items are ignored (they carry no information about known items). ``ratings``
        defaults to 1.0 each (implicit feedback). The result is returned, never stored.
        """
        self._check_fitted()
        items = np.atleast_1d(np.asarray(items))
        ratings = np.ones(len(items)) if ratings is None else _as_ratings(ratings)
        if items.ndim != 1 or len(items) != len(ratings):
            raise DataValidationError(
                f"mismatched lengths: items has {len(items)} entries but ratings has {len(ratings)}"
            )
        idx = self._item_index(items) if len(items) else np.zeros(0, np.int32)
        keep = idx >= 0
        indptr = np.array([0, int(keep.sum())], dtype=np.int64)
        key = np.array([content_key(idx[keep], ratings[keep])], np.uint64)
        P, c = self._reconstruct_csr(indptr, idx[keep], ratings[keep], key)
        return LocalParams(P[0].copy(), float(c[0]))

    def predict(self, X, *, clip: bool = True, user_col: str = "user", item_col: str = "item"):
        """Predicted ratings for (user, item) pairs of raw ids.

        ``X`` is a DataFrame with user/item columns, an (n, 2) array of pairs, or Interactions.
        Fallbacks, never an IndexError: an item unseen in fit scores μ + c_u (no item term); a user
        unseen in fit scores μ + b_i (reconstruct them with ``reconstruct`` to do better); both
        unseen, μ. With ``clip`` predictions are clipped to ``rating_scale_``.
        """
        self._check_fitted()
        raw_u, raw_i = _as_pairs(X, user_col, item_col)
        users = self._user_index(raw_u).astype(np.int64)
        items = self._item_index(raw_i)
        known = np.unique(users[users >= 0])
        P_known, c_known = self._user_params(known)
        # compact user table: row k holds user known[k]
        compact = np.full(len(users), -1, np.int64)
        if len(known):
            compact[users >= 0] = np.searchsorted(known, users[users >= 0])
        out = np.empty(len(users))
        predict_pairs(compact, items, (P_known, c_known),
                      (self.item_factors_, self.item_biases_), float(self.global_mean_), out)
        return self._clip(out, clip)

    def recon_predict(self, support: Interactions, query: Interactions, *, clip: bool = True):
        """Reconstruct each user of ``support`` and predict the entries of ``query`` (same users,
        same order; e.g. the parts of ``support_query_split``) — ReconEval's step."""
        P, c = self.reconstruct_users(support)
        return self.predict_entries(query, P, c, clip=clip)

    def predict_local(self, local: LocalParams, items, *, clip: bool = True) -> np.ndarray:
        """Predicted ratings of a reconstructed user (``reconstruct``'s result) on raw items
        (unknown items: μ + c_u)."""
        self._check_fitted()
        P, c = self._check_local(local)
        idx = self._item_index(np.atleast_1d(np.asarray(items)))
        out = np.empty(len(idx))
        predict_pairs(np.zeros(len(idx), np.int64), idx, (P, c),
                      (self.item_factors_, self.item_biases_), float(self.global_mean_), out)
        return self._clip(out, clip)

    def predict_entries(self, inter: Interactions, factors, biases, *, clip: bool = True):
        """Predictions for every entry of ``inter`` with user rows (factors (n_users, K),
        biases (n_users,)) in ``inter``'s dense user order — e.g. users reconstructed by
        ``reconstruct_users`` on a support set, scored on the query set. Items unknown to the
        model get the documented fallback (no item term)."""
        self._check_fitted()
        K = self.item_factors_.shape[1]
        P = np.asarray(factors)
        c = np.asarray(biases)
        if P.shape != (inter.n_users, K) or c.shape != (inter.n_users,):
            raise ValueError(f"factors must have shape ({inter.n_users}, {K}) and biases "
                             f"({inter.n_users},) for these interactions; got {P.shape} and "
                             f"{c.shape}")
        out = np.empty(inter.nnz)
        predict_pairs(inter.user_index(), self._model_items_of(inter).astype(np.int32),
                      (P.astype(self.item_factors_.dtype), c.astype(self.item_factors_.dtype)),
                      (self.item_factors_, self.item_biases_), float(self.global_mean_), out)
        return self._clip(out, clip)

    def _check_local(self, local):
        if not isinstance(local, LocalParams):
            raise TypeError(f"expected LocalParams (from reconstruct), got {type(local).__name__}")
        K = self.item_factors_.shape[1]
        f = np.asarray(local.factors, dtype=np.float64)
        if f.shape != (K,) or not np.isfinite(f).all():
            raise ValueError(f"LocalParams.factors must be {K} finite numbers for this model "
                             f"(n_factors={K}), got shape {f.shape}")
        if not np.isfinite(local.bias):
            raise ValueError(f"LocalParams.bias must be a finite number, got {local.bias!r}")
        dt = self.item_factors_.dtype
        return f[None, :].astype(dt), np.array([local.bias], dtype=dt)

    def score_all_items(self, factors: np.ndarray, biases: np.ndarray) -> np.ndarray:
        """(n_users, n_items) scores for the given user factors and biases (BLAS matmul)."""
        scores = np.asarray(factors, np.float64) @ self.item_factors_.T.astype(np.float64)
        scores += self.item_biases_[None, :] + np.asarray(biases, np.float64)[:, None]
        scores += self.global_mean_
        return scores

    def recommend(self, items=None, ratings=None, *, user=None, n: int = 10,
                  filter_seen: bool = True) -> pd.DataFrame:
        """Top-``n`` items for a user, as a DataFrame (item, score) best first.

        Either pass a new user's history (``items``, ``ratings``) — the user is reconstructed on the
        fly and nothing is stored — or ``user=`` a raw id seen in fit. With ``filter_seen`` the
        user's own items are left out.
        """
        u = self._check_recommend(items, user, n)
        if user is not None:
            P, c = self._user_params(np.array([u]))
            local = LocalParams(P[0], float(c[0]))
            seen = self._seen_items(u) if filter_seen else None
        else:
            local = self.reconstruct(items, ratings)
            idx = self._item_index(np.atleast_1d(np.asarray(items)))
            seen = idx[idx >= 0]
        scores = self.score_all_items(local.factors[None, :], np.array([local.bias]))[0]
        if filter_seen and len(seen):
            scores[seen] = -np.inf
        top = top_k(scores, min(int(n), int(np.isfinite(scores).sum())))
        return pd.DataFrame({"item": self.item_ids_[top], "score": scores[top]})

    def _check_recommend(self, items, user, n) -> int:
        """Check ``recommend``'s arguments; returns the dense id of ``user`` (−1 without one)."""
        self._check_fitted()
        if (user is None) == (items is None):
            raise ValueError("pass either items (with optional ratings) for a new user, or user=")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if user is None:
            return -1
        u = self._user_index([user])[0]
        if u < 0:
            raise KeyError(f"user {user!r} was not seen in fit; pass their items= to reconstruct")
        return u

    def _seen_items(self, u: int) -> np.ndarray:
        inter = getattr(self, "interactions_", None)
        if inter is not None:
            return inter.items[inter.indptr[u]:inter.indptr[u + 1]]
        seen = getattr(self, "seen_indptr_", None)
        if seen is None:
            raise ValueError("this model was saved without its users' histories, so it cannot "
                             "filter their seen items; pass filter_seen=False, or items= to "
                             "recommend for a history you hold")
        return self.seen_items_[seen[u]:seen[u + 1]]

    # ------------------------------------------------------------------ persistence
    _saved_arrays: tuple[str, ...] = ("item_factors_", "item_biases_")

    def save(self, path) -> Path:
        """Write one versioned ``.npz`` (arrays + JSON metadata, no pickle), atomically: a reader
        sees the old file or the new one, never a part. ``.npz`` is appended to a path that does
        not end in it. Models that keep user rows also keep each user's seen items (for
        ``recommend(user=..., filter_seen=True)``); FedRecon models keep no user data at all."""
        self._check_fitted()
        path = Path(path)
        if path.is_dir() or str(path).endswith(os.sep):
            raise IsADirectoryError(f"cannot save the model to {str(path)!r}: it is a folder; pass "
                                    "a file name such as folder/model.npz")
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        params = self.get_params(deep=False)
        meta = {
            "format_version": FORMAT_VERSION,
            "class": type(self).__name__,
            "params": {k: (str(v) if isinstance(v, (np.dtype, type, os.PathLike)) else
                           v.tolist() if isinstance(v, np.ndarray) else v)
                       for k, v in params.items()},
            "global_mean": float(self.global_mean_),
            "rating_scale": None if self.rating_scale_ is None else list(self.rating_scale_),
            "history": getattr(self, "history_", []),
        }
        arrays = {a: getattr(self, a) for a in self._saved_arrays if getattr(self, a, None) is not None}
        arrays["user_ids"] = _ids_to_array(self.user_ids_, "user")
        arrays["item_ids"] = _ids_to_array(self.item_ids_, "item")
        if "user_factors_" in arrays:
            inter = getattr(self, "interactions_", None)
            if inter is not None:
                arrays["seen_indptr"], arrays["seen_items"] = inter.indptr, inter.items
            elif getattr(self, "seen_indptr_", None) is not None:
                arrays["seen_indptr"], arrays["seen_items"] = self.seen_indptr_, self.seen_items_
        return atomic_savez(path, arrays, meta, meta_key=_META)

    @classmethod
    def load(cls, path):
        """Load a model written by ``save`` (refuses another class, a newer format, or a file
        that is not a complete fedcf model, naming the path)."""
        arrays, meta = load_npz(path, meta_key=_META, what="model")
        where = f"model file {str(path)!r}"
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(f"{where}: format_version {meta['format_version']} is newer than this "
                             f"fedcf understands ({FORMAT_VERSION}); upgrade fedcf")
        if meta.get("class") != cls.__name__:
            raise ValueError(f"{where} holds a {meta.get('class')}, not a {cls.__name__}; load it "
                             f"with fedcf.{meta.get('class')}.load")
        model = cls(**meta["params"])
        missing = [a for a in ("item_factors_", "item_biases_", "user_ids", "item_ids")
                   if a not in arrays]
        if missing:
            raise ValueError(f"{where} lacks array {missing[0]!r}: damaged or not a fedcf model")
        for name in cls._saved_arrays:
            if name in arrays:
                setattr(model, name, arrays[name])
        model.user_ids_ = arrays["user_ids"]
        model.item_ids_ = arrays["item_ids"]
        if "seen_indptr" in arrays:
            model.seen_indptr_, model.seen_items_ = arrays["seen_indptr"], arrays["seen_items"]
        model.global_mean_ = meta["global_mean"]
        model.rating_scale_ = None if meta["rating_scale"] is None else tuple(meta["rating_scale"])
        model.history_ = meta["history"]
        model._check_loaded(where)
        return model

    def _check_loaded(self, where: str):
        Q, b = self.item_factors_, self.item_biases_
        n_items = len(self.item_ids_)
        ok = Q.ndim == 2 and Q.shape[0] == n_items and b.shape == (n_items,)
        P = getattr(self, "user_factors_", None)
        if P is not None:
            ok = ok and P.shape == (len(self.user_ids_), Q.shape[1]) and \
                self.user_biases_.shape == (len(self.user_ids_),)
        if not ok or Q.shape[1] != self.n_factors or Q.dtype.kind != "f":
            raise ValueError(f"{where}: array shapes do not match (item factors {Q.shape}, "
                             f"{n_items} item ids, n_factors={self.n_factors}): damaged or edited")


def _as_ratings(ratings) -> np.ndarray:
    try:
        r = np.atleast_1d(np.asarray(ratings, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise DataValidationError(f"ratings must be numbers, got {ratings!r}") from exc
    if r.ndim != 1:
        raise DataValidationError(f"ratings must be one-dimensional, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        row = int(np.flatnonzero(~np.isfinite(r))[0])
        raise DataValidationError(f"ratings has a non-finite value {float(r[row])} at row {row}")
    return r


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

        def scores(batch):
            return self.score_all_items(*self._user_params(batch))

        return ranking_metrics(scores, seen, relevant, k, with_auc=False)["ndcg"]

    def _seen_interactions(self) -> Interactions:
        inter = getattr(self, "interactions_", None)
        if inter is not None:
            return inter
        if getattr(self, "seen_indptr_", None) is None:
            raise ValueError("this model was loaded from disk and holds no user data, so it "
                             "cannot rank for users seen in fit; score held-out users with "
                             "fedcf.model_selection.recon_scorer")
        indptr, items = self.seen_indptr_, self.seen_items_
        return Interactions(indptr=indptr, items=items, values=np.ones(len(items)),
                            timestamps=None, user_ids=np.arange(len(indptr) - 1),
                            item_ids=np.arange(len(self.item_ids_)))

