"""Cross-validation for recommenders, in scikit-learn's form.

Splitters read the user column of X themselves, so they work as ``cv=`` in ``cross_val_score`` and
``GridSearchCV`` without ``groups``:

- ``UserKFold`` / ``UserShuffleSplit`` hold out whole users (for ReconEval: held-out users are
  reconstructed from part of their rows and scored on the rest, by ``recon_scorer``);
- ``PerUserSplit`` holds out part of each user's own rows, at random or the latest by time (for
  StandardEval: the model scores users it was fitted on, with scikit-learn's own scorers).

``recon_scorer`` is the ReconEval scorer: RMSE, MAE, rounded accuracy, or precision / recall /
NDCG / hit rate @k for implicit models; deterministic for a seed.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
from sklearn.model_selection import BaseCrossValidator
from sklearn.utils import check_random_state

from ._ranking import ranking_metrics
from .datasets import DataValidationError, Interactions
from .eval.metrics import mae, rmse, rounded_accuracy
from .eval.splits import support_query_split
from .models.base import RankingScoreMixin

__all__ = ["PerUserSplit", "UserKFold", "UserShuffleSplit", "recon_scorer"]


def _column(X, name: str, position: int) -> np.ndarray:
    """Column ``name`` of a DataFrame X, or column ``position`` of an (n, 2) array of pairs."""
    if isinstance(X, pd.DataFrame):
        if name not in X.columns:
            raise DataValidationError(f"column {name!r} not found in X; its columns are "
                                      f"{list(X.columns)} (set user_col=/time_col= on the "
                                      "splitter)")
        return X[name].to_numpy()
    arr = X if isinstance(X, np.ndarray) else np.asarray(X, dtype=object)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise DataValidationError(f"X must be a DataFrame or an (n, 2) array of (user, item) "
                                  f"pairs, got shape {arr.shape}")
    return arr[:, position]


def _user_codes(X, user_col: str) -> np.ndarray:
    users = _column(X, user_col, 0)
    if len(users) == 0:
        raise DataValidationError("X is empty: nothing to split")
    if pd.isna(users).any():
        raise DataValidationError(f"{user_col!r} has a missing id at row "
                                  f"{int(np.flatnonzero(pd.isna(users))[0])}")
    return pd.factorize(users)[0]


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_fraction(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


class _UserSplitter(BaseCrossValidator):
    def __init__(self, n_splits, *, random_state=None, user_col="user"):
        self.n_splits = n_splits
        self.random_state = random_state
        self.user_col = user_col

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return _check_int(self.n_splits, "n_splits", 1)

    def _iter_test_indices(self, X=None, y=None, groups=None):
        codes = _user_codes(X, self.user_col)
        for fold_users in self._test_users(codes.max() + 1):
            yield np.flatnonzero(np.isin(codes, fold_users))


class UserKFold(_UserSplitter):
    """K folds of whole users: each user's rows are all in one test fold (ReconEval).

    Parameters
    ----------
    n_splits : int >= 2
    shuffle : bool
        Assign users to folds at random (by ``random_state``) rather than in first-seen order.
    random_state : int, RandomState or None
    user_col : str
        The user column of a DataFrame X (an array X has users in column 0).

    Examples
    --------
    >>> import pandas as pd
    >>> from fedcf.model_selection import UserKFold
    >>> X = pd.DataFrame({"user": [1, 1, 2, 3, 3, 4], "item": [1, 2, 1, 1, 2, 2]})
    >>> folds = [set(X.user.iloc[test]) for _, test in UserKFold(2, random_state=0).split(X)]
    >>> [len(f) for f in folds], folds[0] & folds[1]
    ([2, 2], set())
    """

    def __init__(self, n_splits=5, *, shuffle=True, random_state=None, user_col="user"):
        super().__init__(n_splits, random_state=random_state, user_col=user_col)
        self.shuffle = shuffle

    def _test_users(self, n_users):
        k = _check_int(self.n_splits, "n_splits", 2)
        if k > n_users:
            raise ValueError(f"n_splits={k} is more than the {n_users} users in X")
        users = np.arange(n_users)
        if self.shuffle:
            users = check_random_state(self.random_state).permutation(n_users)
        yield from np.array_split(users, k)


class UserShuffleSplit(_UserSplitter):
    """Random held-out users, ``n_splits`` independent draws of ``test_size`` of the users.

    Parameters
    ----------
    n_splits : int >= 1
    test_size : float in (0, 1)
        Fraction of users held out (at least one, and at least one left to train on).
    random_state : int, RandomState or None
    user_col : str

    Examples
    --------
    >>> import pandas as pd
    >>> from fedcf.model_selection import UserShuffleSplit
    >>> X = pd.DataFrame({"user": [1, 1, 2, 3, 3, 4], "item": [1, 2, 1, 1, 2, 2]})
    >>> train, test = next(UserShuffleSplit(1, test_size=0.25, random_state=0).split(X))
    >>> len(set(X.user.iloc[test]))
    1
    """

    def __init__(self, n_splits=5, *, test_size=0.2, random_state=None, user_col="user"):
        super().__init__(n_splits, random_state=random_state, user_col=user_col)
        self.test_size = test_size

    def _test_users(self, n_users):
        k = self.get_n_splits()
        frac = _check_fraction(self.test_size, "test_size")
        if n_users < 2:
            raise ValueError("UserShuffleSplit needs at least 2 users in X")
        n_test = min(max(int(round(frac * n_users)), 1), n_users - 1)
        rng = check_random_state(self.random_state)
        for _ in range(k):
            yield rng.permutation(n_users)[:n_test]


class PerUserSplit(BaseCrossValidator):
    """Hold out ``test_size`` of each user's own rows (StandardEval: the users stay seen in fit).

    Each user keeps at least one training row; a user's test count is ``test_size`` × their
    rows, rounded. ``order="random"`` draws the rows at random, ``n_splits`` independent times;
    ``order="time"`` holds out each user's latest rows by ``time_col`` (one split).

    Parameters
    ----------
    n_splits : int, default 1
    test_size : float in (0, 1), default 0.2
    order : {"random", "time"}, default "random"
    random_state : int, RandomState or None
    user_col, time_col : str
        Columns of X holding the user id and the timestamp.

    Examples
    --------
    >>> import pandas as pd
    >>> from fedcf.model_selection import PerUserSplit
    >>> X = pd.DataFrame({"user": [1, 1, 1, 2, 2], "item": [1, 2, 3, 1, 3],
    ...                   "timestamp": [1, 2, 3, 1, 2]})
    >>> train, test = next(PerUserSplit(order="time", test_size=0.4).split(X))
    >>> sorted(test.tolist())
    [2, 4]
    """

    def __init__(self, n_splits=1, *, test_size=0.2, order="random", random_state=None,
                 user_col="user", time_col="timestamp"):
        self.n_splits = n_splits
        self.test_size = test_size
        self.order = order
        self.random_state = random_state
        self.user_col = user_col
        self.time_col = time_col

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        k = _check_int(self.n_splits, "n_splits", 1)
        if self.order not in ("random", "time"):
            raise ValueError(f"order must be 'random' or 'time', got {self.order!r}")
        if self.order == "time" and k != 1:
            raise ValueError(f"order='time' has one outcome; use n_splits=1, got {k}")
        return k

    def _iter_test_indices(self, X=None, y=None, groups=None):
        k = self.get_n_splits()
        frac = _check_fraction(self.test_size, "test_size")
        codes = _user_codes(X, self.user_col)
        counts = np.bincount(codes)
        n_test = np.minimum(np.floor(frac * counts + 0.5), counts - 1).astype(np.int64)
        if self.order == "time":
            times = _column(X, self.time_col, 2) if isinstance(X, pd.DataFrame) else None
            if times is None:
                raise DataValidationError("order='time' needs X as a DataFrame with a "
                                          f"{self.time_col!r} column")
            keys = [np.asarray(pd.to_numeric(pd.Series(times)), np.float64)]
        rng = check_random_state(self.random_state)
        for _ in range(k):
            key = -keys[0] if self.order == "time" else rng.random(len(codes))
            order = np.lexsort((key, codes))  # per user: latest (or random) first
            rank = np.empty(len(codes), np.int64)
            starts = np.r_[0, np.cumsum(counts)[:-1]]
            rank[order] = np.arange(len(codes)) - np.repeat(starts, counts)
            yield np.flatnonzero(rank < n_test[codes])


_RATING = {"rmse": (rmse, -1.0), "mae": (mae, -1.0), "accuracy": (None, 1.0)}
_RANKING = ("precision", "recall", "ndcg", "hit_rate", "map")


class ReconScorer:
    """A scikit-learn scorer for ReconEval; build it with ``recon_scorer``."""

    def __init__(self, metric, k, support_fraction, split, random_state, user_col, item_col):
        self.metric, self.k = metric, k
        self.support_fraction, self.split = support_fraction, split
        self.random_state = random_state
        self.user_col, self.item_col = user_col, item_col

    def __repr__(self) -> str:
        at = f"@{self.k}" if self.metric in _RANKING else ""
        return (f"recon_scorer({self.metric + at!r}, support_fraction={self.support_fraction}, "
                f"split={self.split!r}, random_state={self.random_state})")

    def __call__(self, estimator, X, y=None) -> float:
        ranking = self.metric in _RANKING
        if not ranking and isinstance(estimator, RankingScoreMixin):
            raise ValueError(f"recon_scorer({self.metric!r}) scores predicted ratings, but "
                             f"{type(estimator).__name__} is an implicit-feedback model whose "
                             "scores are not ratings; use a ranking metric such as "
                             "'recall@10' or 'ndcg@10'")
        users = _column(X, self.user_col, 0)
        items = _column(X, self.item_col, 1)
        ratings = np.ones(len(users)) if y is None and ranking else y
        if ratings is None:
            if isinstance(X, pd.DataFrame) and "rating" in X.columns:
                ratings = X["rating"]
            else:
                raise DataValidationError(f"recon_scorer({self.metric!r}) needs the held-out "
                                          "ratings as y (or a 'rating' column in X)")
        times = X["timestamp"] if isinstance(X, pd.DataFrame) and "timestamp" in X.columns \
            else None
        known = estimator._item_index(items) >= 0
        if ranking:  # items the model does not know can be neither used nor recommended
            users, items, ratings = users[known], items[known], np.asarray(ratings)[known]
            times = None if times is None else np.asarray(times)[known]
        inter = Interactions.from_arrays(
            users, items, ratings, times, duplicates="last",
            item_catalog=estimator.item_ids_ if ranking else None)
        support, query = support_query_split(inter, self.split, self.support_fraction,
                                             self.random_state)
        if ranking:
            res = ranking_metrics(estimator._held_out_scores(support), support, query, self.k,
                                  with_auc=False)
            return float(res[self.metric])
        P, c = estimator.reconstruct_users(support)
        pred = estimator.predict_entries(query, P, c)
        if len(pred) == 0:
            raise ValueError(_no_query_advice(inter.counts(), self.support_fraction))
        if self.metric == "accuracy":
            return rounded_accuracy(query.values, pred, estimator.rating_scale_)
        fn, sign = _RATING[self.metric]
        return sign * fn(query.values, pred)


def _no_query_advice(counts: np.ndarray, support_fraction: float) -> str:
    """Why no held-out user has a query part, and what to change."""
    single = int((counts < 2).sum())
    if single == len(counts):
        return (f"no held-out user has a query part: all {single} have a single rating, and a "
                "user needs at least 2 (one to reconstruct from, one to score); evaluate users "
                "with more ratings")
    return (f"no held-out user has a query part: at support_fraction={support_fraction} every "
            f"user's ratings all go to the support part ({single} of {len(counts)} users have a "
            "single rating); lower support_fraction")


def recon_scorer(metric: str = "rmse", *, support_fraction: float = 0.5, split: str = "random",
                 random_state=0, user_col: str = "user", item_col: str = "item") -> ReconScorer:
    """The ReconEval scorer: each held-out user of the test fold is reconstructed from a support
    part of their rows (``split`` "random" or "time", ``support_fraction`` of them) against the
    frozen fitted model, and scored on the rest.

    ``metric``: "rmse", "mae" (returned negated: scikit-learn maximizes scores), "accuracy"
    (ratings rounded to the scale), or for implicit models "precision@k", "recall@k", "ndcg@k",
    "hit_rate@k", "map@k" (query items ranked among every item except the support items).
    Use it as ``scoring=`` in ``cross_val_score`` / ``GridSearchCV`` with ``UserKFold`` or
    ``UserShuffleSplit``. The same ``random_state`` gives the same support/query split.
    """
    name, _, k = str(metric).partition("@")
    if name in _RATING and not k:
        k_int = 10
    elif name in _RANKING:
        if k and not k.isdigit() or (k and int(k) < 1):
            raise ValueError(f"metric {metric!r}: the cut-off after '@' must be a positive integer")
        k_int = int(k) if k else 10
    else:
        raise ValueError(f"metric must be one of {sorted(_RATING)} or "
                         f"{[m + '@k' for m in _RANKING]}, got {metric!r}")
    if split not in ("random", "time"):
        raise ValueError(f"split must be 'random' or 'time', got {split!r}")
    if isinstance(support_fraction, bool) or not isinstance(support_fraction, numbers.Real) \
            or not 0 < support_fraction < 1:
        raise ValueError(f"support_fraction must be in (0, 1), got {support_fraction!r}")
    return ReconScorer(name, k_int, float(support_fraction), split, random_state, user_col,
                       item_col)
