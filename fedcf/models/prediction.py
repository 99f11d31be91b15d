"""What every estimator answers once fitted: reconstruction of a user from ratings, predictions,
scores over the catalog and recommendations (``Prediction``, mixed into ``MFEstimatorBase``)."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._kernels.predict import predict_pairs
from .._kernels.rng import stream_keys
from .._topk import top_k
from .._validation import raw_ids
from ..datasets import DataValidationError, Interactions


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


_EVAL_STREAM = np.uint64(2**40 + 17)  # distinguishes inference streams from training rounds


def inference_keys(seed: int, keys: np.ndarray) -> np.ndarray:
    """Stream seed of each user at inference: a mix of the model's seed and the user's key."""
    return stream_keys(np.uint64(seed), _EVAL_STREAM, np.ascontiguousarray(keys, np.uint64))


@dataclass(frozen=True)
class LocalParams:
    """A user's local model: what reconstruction produces and what never leaves the device.

    Parameters
    ----------
    factors : ndarray (K,)
    bias : float

    Examples
    --------
    >>> from fedcf import CentralizedMF
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> model = CentralizedMF(n_factors=3, n_epochs=2, random_state=0).fit(
    ...     make_synthetic_ratings(40, 12, 300, random_state=0))
    >>> local = model.reconstruct(items=[0, 3], ratings=[5.0, 2.0])
    >>> local.factors.shape, type(local.bias)
    ((3,), <class 'float'>)
    """

    factors: np.ndarray  # (K,)
    bias: float


_WITHHELD = ("this model was saved without its training user ids (a DP release, a FedRecon "
             "model by default, or save(user_ids=False))")


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


def check_reconstructed(factors, bias, ratings, scale, item_factors) -> None:
    """A reconstruction that came out non-finite is refused with its measured cause, never
    returned as NaN: ratings so large that the arithmetic overflows, or else a model whose item
    factors blew up in fit (its divergence warnings said so)."""
    if np.isfinite(factors).all() and np.isfinite(bias).all():
        return
    top = float(np.abs(ratings).max(initial=0.0))
    span = 1.0 if scale is None else max(abs(scale[0]), abs(scale[1]), 1.0)
    if top > 1e3 * span:
        where = "" if scale is None else f", far outside the model's rating scale {tuple(scale)}"
        raise DataValidationError(f"reconstruction from these ratings is not finite: the "
                                  f"largest |rating| is {top:.3g}{where}; give ratings on the "
                                  "scale the model was fitted on")
    q = _largest(item_factors)
    if q > 1e3:
        raise FloatingPointError(f"reconstruction is not finite with ratings up to {top:.3g}: "
                                 + _diverged(q))
    raise FloatingPointError(f"reconstruction is not finite with ratings up to {top:.3g} and item "
                             f"factors up to {q:.3g}: the reconstruction's own steps diverged; "
                             "lower reconstruction__learning_rate or use reconstruction='als'")


def _largest(item_factors) -> float:
    return float(np.nanmax(np.abs(item_factors.astype(np.float64)), initial=0.0))


def _diverged(q: float) -> str:
    return (f"the model's item factors reach {q:.3g}, so its fit diverged (it warned of "
            "non-finite uploads); refit with a smaller client step (client_update__learning_rate)")


def warn_non_finite(P, c, item_factors) -> None:
    """Warn (RuntimeWarning) when an exact solve left users non-finite: the model's item
    factors are large enough for its arithmetic to overflow (a fit that diverged)."""
    bad = ~(np.isfinite(P).all(axis=1) & np.isfinite(c))
    if bad.any():
        warnings.warn(f"reconstruction is not finite for {int(bad.sum())} of {len(bad)} users: "
                      + _diverged(_largest(item_factors)), RuntimeWarning, stacklevel=4)


class Prediction:
    """reconstruct / predict / recommend of a fitted estimator (needs the base's fitted state and
    helpers: ``_check_fitted``, ``_item_index``, ``_user_params``, ``_reconstruct_csr``, ...)."""

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
        items = raw_ids(items, "items")
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
        check_reconstructed(P[0], c[0], ratings, self._fitted("rating_scale_"),
                            self.item_factors_)
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
        self._warn_withheld(len(raw_u))
        users = self._user_index(raw_u).astype(np.int64)
        items = self._item_index(raw_i)
        known = np.unique(users[users >= 0])
        P_known, c_known = self._user_params(known)
        # compact user table: row k holds user known[k]
        compact = np.full(len(users), -1, np.int64)
        if len(known):
            compact[users >= 0] = np.searchsorted(known, users[users >= 0])
        out = np.empty(len(users))
        self._pair_scores(compact, items, P_known, c_known, out)
        return self._clip(out, clip)

    def _pair_scores(self, users, items, P, c, out) -> None:
        """out[k] = the score of user row users[k] of (P, c) for model item items[k]; −1 in either
        takes the documented fallback (no user term, no item term). A model that scores with
        more than a dot product overrides it."""
        predict_pairs(users, items, (P, c), (self.item_factors_, self.item_biases_),
                      float(self.global_mean_), out)

    def _warn_withheld(self, n_pairs: int) -> None:
        if self._fitted("user_ids_withheld_") and n_pairs:
            warnings.warn(_WITHHELD + "; every user scores as a new user (no personal term). "
                          "Reconstruct users from their ratings (reconstruct_users, "
                          "recon_predict) for personal scores", UserWarning, stacklevel=3)

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
        idx = self._item_index(items)
        out = np.empty(len(idx))
        self._pair_scores(np.zeros(len(idx), np.int64), idx, P, c, out)
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
        self._pair_scores(inter.user_index(), self._model_items_of(inter).astype(np.int32),
                          P.astype(self.item_factors_.dtype), c.astype(self.item_factors_.dtype),
                          out)
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
            idx = self._item_index(items)
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
        if u < 0 and self._fitted("user_ids_withheld_"):
            raise KeyError(f"user {user!r}: " + _WITHHELD + "; pass the user's items= (and "
                           "ratings=) to reconstruct them")
        if u < 0:
            raise KeyError(f"user {user!r} was not seen in fit; pass their items= to reconstruct")
        return u

    def _seen_items(self, u: int) -> np.ndarray:
        inter = self._fitted("interactions_")
        if inter is not None:
            return inter.items[inter.indptr[u]:inter.indptr[u + 1]]
        seen = self._fitted("seen_indptr_")
        if seen is None:
            raise ValueError("this model was saved without its users' histories, so it cannot "
                             "filter their seen items; pass filter_seen=False, or items= to "
                             "recommend for a history you hold")
        return self.seen_items_[seen[u]:seen[u + 1]]
