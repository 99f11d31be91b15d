"""`Interactions`: the one in-memory structure for ratings, grouped by user (one user = one client)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._validation import (
    DataValidationError,
    check_ids,
    check_numeric,
    check_same_length,
    check_scale,
    show,
)

_DEFAULT_TS = object()  # sentinel: "use a 'timestamp' column if there is one"


def _require_columns(df: pd.DataFrame, columns) -> None:
    """Name the first of ``columns`` (None entries skipped) that ``df`` lacks or has twice."""
    missing = [c for c in columns if c is not None and c not in df.columns]
    if missing:
        hint = ("; pass the ratings as y, or name the column with rating_col="
                if missing[0] == "rating" else "")
        raise DataValidationError(
            f"column {missing[0]!r} not found in the DataFrame; its columns are "
            f"{list(df.columns)}{hint}")
    twice = [c for c in columns if c is not None and int((df.columns == c).sum()) > 1]
    if twice:
        raise DataValidationError(
            f"column {twice[0]!r} appears {int((df.columns == twice[0]).sum())} times in the "
            f"DataFrame (columns {list(df.columns)}); keep one, or rename the others")


def _as_1d(y, name: str) -> np.ndarray:
    """y as a 1-D array (a Series, list or array; an (n, 1) column is refused, not guessed)."""
    arr = y.to_numpy() if isinstance(y, (pd.Series, pd.DataFrame)) else np.asarray(y)
    if arr.ndim != 1:
        raise DataValidationError(f"{name} must be one-dimensional (one rating per pair), got "
                                  f"shape {arr.shape}; pass y.ravel() for a column")
    return arr


def _factorize(raw: np.ndarray, catalog: np.ndarray | None, column: str):
    """Map raw ids to dense ids. With a catalog, ids must belong to it (names the first stranger)."""
    if catalog is not None:
        index = pd.Index(catalog)
        codes = index.get_indexer(raw)
        if np.any(codes < 0):
            row = int(np.flatnonzero(codes < 0)[0])
            raise DataValidationError(
                f"column {column!r} has id {show(raw[row])} at row {row} that is not in the given catalog"
            )
        return codes.astype(np.int64), np.asarray(catalog)
    try:
        codes, uniques = pd.factorize(raw, sort=True)
    except TypeError:  # ids of mixed, unorderable types: keep first-seen order
        codes, uniques = pd.factorize(raw, sort=False)
    uniques = np.asarray(uniques)
    return codes.astype(np.int64), uniques


def csr_take(indptr: np.ndarray, rows: np.ndarray, counts: np.ndarray | None = None) -> tuple:
    """(indptr, positions) of ``rows`` of a CSR taken in that order: the new row pointers and,
    for each entry of the new CSR, its position in the old one (``counts``: entries to take
    per row, default each row's own).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.datasets.interactions import csr_take
    >>> csr_take(np.array([0, 2, 3, 6]), np.array([2, 0]))
    (array([0, 3, 5]), array([3, 4, 5, 0, 1]))
    """
    rows = np.asarray(rows, np.int64)
    counts = indptr[rows + 1] - indptr[rows] if counts is None else counts
    new = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(counts, out=new[1:])
    return new, np.repeat(indptr[rows] - new[:-1], counts) + np.arange(int(new[-1]))


@dataclass(frozen=True, eq=False)
class Interactions:
    """User-grouped CSR of (item, value, timestamp) with raw-id maps.

    Attributes
    ----------
    indptr : int64 array (n_users + 1,)
        User ``u``'s entries are ``items[indptr[u]:indptr[u+1]]``.
    items : int32 array (nnz,)
        Dense item ids in ``[0, n_items)``. Within a user, entries are ordered by
        (timestamp, item) when timestamps exist, else by item, so a user's history reads
        oldest first and ties break the same way every time.
    values : float64 array (nnz,)
        Ratings (or implicit-feedback strengths).
    timestamps : float64 array (nnz,) or None
    user_ids, item_ids : arrays
        Raw ids; ``user_ids[u]`` is the raw id of dense user ``u``. Any hashable type.

    Examples
    --------
    >>> import pandas as pd
    >>> from fedcf.datasets import Interactions
    >>> df = pd.DataFrame({"user": ["a", "a", "b"], "item": [10, 20, 10],
    ...                    "rating": [4.0, 3.0, 5.0]})
    >>> inter = Interactions.coerce(df)
    >>> inter.n_users, inter.n_items, inter.counts().tolist()
    (2, 2, [2, 1])
    """

    indptr: np.ndarray
    items: np.ndarray
    values: np.ndarray
    timestamps: np.ndarray | None
    user_ids: np.ndarray
    item_ids: np.ndarray

    # as a population of a federated fit (fedcf.federated.round.contracts.Population): its ratings
    # are here, and its clients run wherever the estimator's executor says
    executor = None
    holds_ratings = True

    def __post_init__(self):
        """Check a hand-built instance (the kernels trust these invariants: an item index past
        the catalog would read out of bounds)."""
        indptr, items = np.asarray(self.indptr), np.asarray(self.items)
        n_users, n_items = len(self.user_ids), len(self.item_ids)
        if indptr.ndim != 1 or len(indptr) != n_users + 1 or indptr.dtype.kind not in "iu":
            raise DataValidationError(f"Interactions.indptr must be an integer array of n_users + 1 "
                                      f"= {n_users + 1} entries, got {indptr.dtype} {indptr.shape}")
        nnz = int(indptr[-1]) if len(indptr) else 0
        if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise DataValidationError("Interactions.indptr must start at 0 and never decrease")
        for name in ("items", "values", "timestamps"):
            a = getattr(self, name)
            if a is not None and (np.ndim(a) != 1 or len(a) != nnz):
                raise DataValidationError(f"Interactions.{name} must have indptr[-1] = {nnz} "
                                          f"entries, got shape {np.shape(a)}")
        if items.dtype.kind not in "iu" or (nnz and (items.min() < 0 or items.max() >= n_items)):
            bad = items[(items < 0) | (items >= n_items)][0] if items.dtype.kind in "iu" else items.dtype
            raise DataValidationError(f"Interactions.items must be integer indices in [0, {n_items}) "
                                      f"(the item_ids catalog); found {bad}")
        if not np.isfinite(self.values).all():
            row = int(np.flatnonzero(~np.isfinite(self.values))[0])
            raise DataValidationError(f"Interactions.values has a non-finite value at entry {row}")
        if self.items.dtype != np.int32 and n_items < 2**31:
            object.__setattr__(self, "items", np.ascontiguousarray(items, dtype=np.int32))
        if indptr.dtype != np.int64:
            object.__setattr__(self, "indptr", indptr.astype(np.int64))
        if self.values.dtype != np.float64:
            object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float64))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls,
        users,
        items,
        ratings=None,
        timestamps=None,
        *,
        rating_scale=None,
        duplicates: str = "error",
        item_catalog=None,
        user_catalog=None,
        names=("user", "item", "rating", "timestamp"),
    ) -> Interactions:
        """Build from parallel arrays of raw ids, ratings (default 1.0) and timestamps.

        Parameters
        ----------
        rating_scale : (low, high) or None
            When given, a rating outside it is an error.
        duplicates : {"error", "last", "mean"}
            What to do with a repeated (user, item) pair: refuse (naming it), keep the last
            occurrence in input order, or average the ratings (keeping the latest timestamp).
        item_catalog, user_catalog : array-like or None
            Fix the id maps (e.g. to share a trained model's item ids); an id outside the catalog
            is an error. Catalog entries without interactions are kept (empty users / items).
        """
        ucol, icol, rcol, tcol = names
        n = check_same_length(**{ucol: users, icol: items, rcol: ratings, tcol: timestamps})
        if duplicates not in ("error", "last", "mean"):
            raise ValueError(f"duplicates must be 'error', 'last' or 'mean', got {duplicates!r}")
        raw_u = check_ids(users, ucol)
        raw_i = check_ids(items, icol)
        vals = np.ones(n) if ratings is None else check_numeric(ratings, rcol, "rating")
        check_scale(vals, rating_scale, rcol)
        ts = None if timestamps is None else check_numeric(timestamps, tcol, "timestamp")

        u, user_ids = _factorize(raw_u, user_catalog, ucol)
        i, item_ids = _factorize(raw_i, item_catalog, icol)
        n_users, n_items = len(user_ids), len(item_ids)

        # duplicates: identify (user, item) pairs; order kept = input order
        key = u * max(n_items, 1) + i
        order = np.argsort(key, kind="stable")
        ks = key[order]
        dup_next = ks[1:] == ks[:-1]
        if np.any(dup_next):
            if duplicates == "error":
                j = int(np.flatnonzero(dup_next)[0])
                r1, r2 = sorted((int(order[j]), int(order[j + 1])))
                raise DataValidationError(
                    f"duplicate ({ucol}, {icol}) pair ({show(raw_u[r1])}, {show(raw_i[r1])}) at rows {r1} "
                    f"and {r2}; pass duplicates='last' or duplicates='mean' to resolve"
                )
            starts = np.flatnonzero(np.r_[True, ~dup_next])
            ends = np.r_[starts[1:], len(ks)]
            if duplicates == "last":
                keep = order[ends - 1]
                u, i, vals = u[keep], i[keep], vals[keep]
                ts = None if ts is None else ts[keep]
            else:
                sums = np.add.reduceat(vals[order], starts)
                vals = sums / (ends - starts)
                keep = order[starts]
                u, i = u[keep], i[keep]
                ts = None if ts is None else np.maximum.reduceat(ts[order], starts)
        return cls._from_dense(u, i, vals, ts, user_ids, item_ids, n_users)

    @classmethod
    def _from_dense(cls, u, i, vals, ts, user_ids, item_ids, n_users) -> Interactions:
        """Sort dense triples into user-grouped CSR (by user, then timestamp, then item)."""
        keys = (i, u) if ts is None else (i, ts, u)
        order = np.lexsort(keys)
        counts = np.bincount(u, minlength=n_users)
        indptr = np.zeros(n_users + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        itype = np.int32 if len(item_ids) < 2**31 else np.int64
        return cls(
            indptr=indptr,
            items=np.ascontiguousarray(i[order], dtype=itype),
            values=np.ascontiguousarray(vals[order], dtype=np.float64),
            timestamps=None if ts is None else np.ascontiguousarray(ts[order], dtype=np.float64),
            user_ids=np.asarray(user_ids),
            item_ids=np.asarray(item_ids),
        )

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        *,
        user_col: str = "user",
        item_col: str = "item",
        rating_col: str | None = "rating",
        timestamp_col=_DEFAULT_TS,
        rating_scale=None,
        duplicates: str = "error",
        item_catalog=None,
        user_catalog=None,
    ) -> Interactions:
        """Build from a DataFrame. ``rating_col=None`` means implicit feedback (all 1.0).

        ``timestamp_col`` defaults to using a ``"timestamp"`` column when present; pass a name to
        require one, or ``None`` to ignore timestamps.
        """
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
        if timestamp_col is _DEFAULT_TS:
            timestamp_col = "timestamp" if "timestamp" in df.columns else None
        _require_columns(df, (user_col, item_col, rating_col, timestamp_col))
        if len(df) == 0:
            raise DataValidationError("no interactions: the DataFrame is empty")
        return cls.from_arrays(
            df[user_col],
            df[item_col],
            None if rating_col is None else df[rating_col],
            None if timestamp_col is None else df[timestamp_col],
            rating_scale=rating_scale,
            duplicates=duplicates,
            item_catalog=item_catalog,
            user_catalog=user_catalog,
            names=(user_col, item_col, rating_col or "rating", timestamp_col or "timestamp"),
        )

    @classmethod
    def from_sparse(cls, matrix, *, rating_scale=None, duplicates: str = "error") -> Interactions:
        """Build from a scipy sparse (users × items) matrix; explicit zeros are kept as entries.

        A COO matrix may hold the same (row, column) twice: like the DataFrame path this is
        refused (naming the pair) unless ``duplicates="last"`` or ``"mean"`` says what to do —
        it is never silently summed.
        """
        if not sp.issparse(matrix):
            raise TypeError(f"expected a scipy sparse matrix, got {type(matrix).__name__}")
        n_users, n_items = matrix.shape
        coo = sp.coo_array(matrix)
        if coo.nnz == 0:
            raise DataValidationError("no interactions: the sparse matrix has no stored entries")
        return cls.from_arrays(coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data,
                               rating_scale=rating_scale, duplicates=duplicates,
                               user_catalog=np.arange(n_users), item_catalog=np.arange(n_items),
                               names=("row", "column", "data", "timestamp"))

    @classmethod
    def coerce(cls, X, y=None, **kwargs) -> Interactions:
        """Accept an Interactions, a DataFrame, a scipy sparse matrix, or the scikit-learn form:
        X the (user, item) pairs (a DataFrame with user/item columns or an (n, 2) array of raw
        ids) and y their ratings. ``rating_col=None`` means implicit feedback (strength 1.0 per
        pair unless y gives strengths)."""
        known = {"user_col", "item_col", "rating_col", "timestamp_col", "rating_scale",
                 "duplicates", "item_catalog", "user_catalog"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            hint = (" (item features are FedReconMF's: FedReconMF.fit(X, item_features=...))"
                    if unknown[0] == "item_features" else "")
            raise TypeError(f"unexpected data argument {unknown[0]!r}{hint}; the data take "
                            f"{sorted(known)}")
        if y is not None:
            return cls.from_pairs(X, y, **kwargs)
        if isinstance(X, Interactions):
            return X
        if hasattr(X, "to_interactions"):  # a population described, not built (population.py)
            if kwargs:
                raise TypeError(f"{next(iter(kwargs))!r} does not apply to a "
                                f"{type(X).__name__}: it describes its own ratings")
            return X.to_interactions()
        if isinstance(X, pd.DataFrame):
            return cls.from_dataframe(X, **kwargs)
        if sp.issparse(X):
            bad = [k for k in kwargs if k not in ("rating_scale", "duplicates")]
            if bad:
                raise TypeError(f"{bad[0]!r} does not apply to a sparse matrix input (it takes "
                                "rating_scale and duplicates)")
            return cls.from_sparse(X, **kwargs)
        if isinstance(X, (np.ndarray, list, tuple)):
            return cls.from_pairs(X, None, **kwargs)
        raise TypeError(
            "expected an Interactions, a pandas DataFrame with user/item/rating columns, a "
            "scipy sparse user × item matrix, or (n, 2) (user, item) pairs with ratings as y; "
            f"got {type(X).__name__}"
        )

    @classmethod
    def from_pairs(cls, X, y=None, *, user_col: str = "user", item_col: str = "item",
                   rating_col: str | None = "rating", timestamp_col=_DEFAULT_TS,
                   **kwargs) -> Interactions:
        """Build from (user, item) pairs X — a DataFrame with ``user_col``/``item_col`` (and
        optional timestamp) columns, or an (n, 2) array of raw ids — and their ratings y.
        Without y the pairs are implicit feedback (1.0 each), allowed only with
        ``rating_col=None``."""
        if isinstance(X, Interactions) or sp.issparse(X):
            raise TypeError(f"y applies to (user, item) pairs; a {type(X).__name__} carries its "
                            "own values, so pass y=None")
        if not isinstance(X, pd.DataFrame):
            X = X if isinstance(X, np.ndarray) else np.asarray(X, dtype=object)
            if X.ndim != 2 or X.shape[1] != 2:
                raise DataValidationError(
                    f"X must be a DataFrame with {user_col!r}/{item_col!r} columns or an (n, 2) "
                    f"array of (user, item) pairs; got an array of shape {X.shape}")
        if y is None and rating_col is not None:
            raise DataValidationError(
                "this estimator requires y to be passed, but the target y is None: X holds "
                "(user, item) pairs without ratings; pass the ratings as y, fit(X, y) "
                "(implicit-feedback models take the pairs alone)")
        ratings = None if y is None else _as_1d(y, "y")
        if not isinstance(X, pd.DataFrame):
            return cls.from_arrays(X[:, 0], X[:, 1], ratings, **kwargs,
                                   names=(user_col, item_col, "y", "timestamp"))
        if ratings is None:
            return cls.from_dataframe(X, user_col=user_col, item_col=item_col, rating_col=None,
                                      timestamp_col=timestamp_col, **kwargs)
        if rating_col is not None and rating_col in X.columns:
            raise DataValidationError(
                f"ratings given twice: X has a {rating_col!r} column and y was passed; drop the "
                "column or pass y=None")
        if timestamp_col is _DEFAULT_TS:
            timestamp_col = "timestamp" if "timestamp" in X.columns else None
        _require_columns(X, (user_col, item_col, timestamp_col))
        return cls.from_arrays(X[user_col], X[item_col], ratings,
                               None if timestamp_col is None else X[timestamp_col],
                               names=(user_col, item_col, "y", timestamp_col or "timestamp"),
                               **kwargs)

    # ------------------------------------------------------------------ views
    @property
    def n_users(self) -> int:
        return len(self.indptr) - 1

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def value_stats(self) -> dict:
        """mean, mean of squares, min and max of the values (what a fit needs of them)."""
        v = self.values
        if not len(v):
            return {"mean": float("nan"), "mean_sq": float("nan"), "min": float("nan"),
                    "max": float("nan")}
        return {"mean": float(v.mean()), "mean_sq": float(np.mean(v ** 2)),
                "min": float(v.min()), "max": float(v.max())}

    def counts(self) -> np.ndarray:
        """Number of entries per user."""
        return np.diff(self.indptr)

    def user_index(self) -> np.ndarray:
        """Dense user id of every entry (nnz,)."""
        return np.repeat(np.arange(self.n_users, dtype=np.int64), self.counts())

    def to_csr(self) -> sp.csr_array:
        """users × items CSR of the values (float64)."""
        return sp.csr_array(
            (self.values, self.items, self.indptr), shape=(self.n_users, self.n_items)
        )

    def to_item_csr(self):
        """Item-grouped view: (indptr, users, values) with items as rows, for item-side solves."""
        csc = self.to_csr().tocsc()
        csc.sort_indices()
        return csc.indptr.astype(np.int64), csc.indices.astype(np.int32), csc.data

    def to_dataframe(self) -> pd.DataFrame:
        cols = {
            "user": self.user_ids[self.user_index()],
            "item": self.item_ids[self.items],
            "rating": self.values,
        }
        if self.timestamps is not None:
            cols["timestamp"] = self.timestamps
        return pd.DataFrame(cols)

    def take(self, mask: np.ndarray) -> Interactions:
        """Keep the entries where ``mask`` is true; users, items and their maps stay the same."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (self.nnz,):
            raise ValueError(f"mask must have shape ({self.nnz},), got {mask.shape}")
        cs = np.zeros(self.nnz + 1, dtype=np.int64)
        np.cumsum(mask, out=cs[1:])
        indptr = cs[self.indptr]
        return Interactions(
            indptr=indptr,
            items=self.items[mask],
            values=self.values[mask],
            timestamps=None if self.timestamps is None else self.timestamps[mask],
            user_ids=self.user_ids,
            item_ids=self.item_ids,
        )

    def subset_users(self, users: np.ndarray) -> Interactions:
        """The given dense users (in that order), with the same item map."""
        users = np.asarray(users, dtype=np.int64)
        if users.size and (users.min() < 0 or users.max() >= self.n_users):
            bad = users[(users < 0) | (users >= self.n_users)][0]
            raise IndexError(f"user index {bad} out of range for {self.n_users} users")
        indptr, pos = csr_take(self.indptr, users)
        return Interactions(
            indptr=indptr,
            items=self.items[pos],
            values=self.values[pos],
            timestamps=None if self.timestamps is None else self.timestamps[pos],
            user_ids=self.user_ids[users],
            item_ids=self.item_ids,
        )

    def __repr__(self) -> str:
        ts = "with" if self.timestamps is not None else "without"
        return (
            f"Interactions({self.n_users} users, {self.n_items} items, {self.nnz} entries, "
            f"{ts} timestamps)"
        )
