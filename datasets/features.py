"""Item side features: what is known about an item besides who rated it (title words, year,
genres, tags, type). ``ItemFeatures`` is the one checked form the estimators take; the MovieLens
loader reads ``ml-100k.item`` from the ``recbole==1.2.1`` wheel (the same offline source as the
ratings, see movielens.py) or from a local file.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._validation import DataValidationError, show
from .movielens import (
    ITEM_MEMBER,
    ITEM_SHA256,
    DataUnavailableError,
    _pip_download_recbole,
    data_home,
    sha256_bytes,
)


@dataclass(frozen=True)
class ItemFeatures:
    """A sparse (n_items × n_features) float64 matrix whose row k describes raw item ``item_ids[k]``.

    Build it with ``ItemFeatures.coerce`` from a DataFrame (index: raw item ids, numeric columns),
    an ``(item_ids, matrix)`` pair (matrix dense or scipy sparse), or another ItemFeatures; every
    value must be finite and every id distinct.

    Parameters
    ----------
    item_ids : ndarray
        Raw item id of each row (distinct).
    matrix : scipy.sparse.csr_matrix (n_items, n_features), float64
    names : tuple of str
        Feature names (may be empty).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.datasets import ItemFeatures
    >>> feats = ItemFeatures.coerce((np.array([10, 20]), np.array([[1.0, 0.0], [0.0, 1.0]])))
    >>> feats.matrix.shape
    (2, 2)
    """

    item_ids: np.ndarray
    matrix: sp.csr_matrix
    names: tuple

    @classmethod
    def coerce(cls, obj, what: str = "item_features") -> ItemFeatures:
        if isinstance(obj, ItemFeatures):
            ids, mat, names = obj.item_ids, obj.matrix, obj.names
        elif isinstance(obj, pd.DataFrame):
            bad = [c for c in obj.columns if not pd.api.types.is_numeric_dtype(obj[c])]
            if bad:
                raise DataValidationError(f"{what} column {bad[0]!r} is not numeric "
                                          f"(dtype {obj[bad[0]].dtype}); encode it as numbers "
                                          "(e.g. one-hot with pandas.get_dummies)")
            ids, mat, names = obj.index.to_numpy(), obj.to_numpy(np.float64), obj.columns
        elif isinstance(obj, tuple) and len(obj) == 2:
            ids, mat = obj
            names = None
        else:
            raise TypeError(f"{what} must be an ItemFeatures, a DataFrame indexed by raw item id, "
                            f"or an (item_ids, matrix) pair; got {type(obj).__name__}")
        ids = np.asarray(ids)
        mat = sp.csr_matrix(mat, dtype=np.float64) if not sp.issparse(mat) or \
            mat.dtype != np.float64 else sp.csr_matrix(mat)
        _check(ids, mat, what)
        mat.sum_duplicates()
        mat.sort_indices()
        names = tuple(str(n) for n in names) if names is not None else \
            tuple(f"f{k}" for k in range(mat.shape[1]))
        return cls(ids, mat, names)

    @property
    def n_features(self) -> int:
        return self.matrix.shape[1]

    def rows_of(self, raw_items) -> np.ndarray:
        """Row of each raw item in the matrix (−1: the item has no features)."""
        return pd.Index(self.item_ids).get_indexer(pd.Index(np.asarray(raw_items)))


def _check(ids, mat, what):
    if ids.ndim != 1:
        raise DataValidationError(f"{what}: item ids must be 1-D, got shape {ids.shape}")
    if mat.ndim != 2 or mat.shape[0] != len(ids):
        raise DataValidationError(f"{what}: the matrix has {mat.shape[0]} rows but there are "
                                  f"{len(ids)} item ids; row k must describe item_ids[k]")
    if mat.shape[1] == 0:
        raise DataValidationError(f"{what} has no feature column")
    dup = pd.Index(ids).duplicated()
    if dup.any():
        raise DataValidationError(f"{what}: item id {show(ids[dup][0])} appears twice; "
                                  "give each item one row")
    bad = ~np.isfinite(mat.data)
    if bad.any():
        row = int(np.searchsorted(mat.indptr, np.flatnonzero(bad)[0], side="right") - 1)
        raise DataValidationError(f"{what}: item {show(ids[row])} has a non-finite feature value "
                                  f"({mat.data[bad][0]}); fill or drop it")


def parse_movielens_items(data: bytes) -> pd.DataFrame:
    """``ml-100k.item`` (recbole atomic format, latin-1) → DataFrame item, title, year, genres."""
    text = data.decode("latin-1")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("item_id:token"):
        raise DataValidationError("not an ml-100k.item file: the header should start with "
                                  f"'item_id:token', got {lines[0][:60]!r}" if lines else
                                  "not an ml-100k.item file: it is empty")
    rows = [ln.split("\t") for ln in lines[1:] if ln.strip()]
    bad = next((k for k, r in enumerate(rows) if len(r) != 4), None)
    if bad is not None:
        raise DataValidationError(f"ml-100k.item line {bad + 2} has {len(rows[bad])} fields, "
                                  "expected 4 (item, title, year, genres)")
    df = pd.DataFrame(rows, columns=["item", "title", "year", "genres"])
    df["item"] = df["item"].astype(np.int64)
    df["year"] = pd.to_numeric(df["year"], errors="coerce")
    return df


def _movielens_item_bytes(path, data_home_dir, download) -> bytes:
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no such file or directory: {path}")
        if path.is_dir():
            path = path / "ml-100k.item"
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                if ITEM_MEMBER not in zf.namelist():
                    raise DataUnavailableError(f"{path} has no member {ITEM_MEMBER}")
                return zf.read(ITEM_MEMBER)
        return path.read_bytes()
    cached = data_home(data_home_dir) / "movielens" / "100k" / "ml-100k.item"
    if cached.is_file():
        return cached.read_bytes()
    if not download:
        raise DataUnavailableError(f"ml-100k.item is not in the cache ({cached}) and "
                                   "download=False; pass path= (ml-100k.item or the recbole "
                                   "1.2.1 wheel)")
    _pip_download_recbole(item_folder=cached.parent)
    return cached.read_bytes()


def movielens_item_features(*, path=None, data_home_dir=None, download: bool = True,
                            min_word_items: int = 5) -> ItemFeatures:
    """ML-100K item features: genres, release decade, and title words used by at least
    ``min_word_items`` movies (lower-cased; years in parentheses dropped). Each group is scaled
    to unit L2 norm per item so no group dominates a linear adapter by its size.

    ``path``: ``ml-100k.item``, a folder holding it, or the ``recbole==1.2.1`` wheel; else the
    cache, else ``pip download`` of that wheel (its sha256 pinned; the member checked).
    """
    data = _movielens_item_bytes(path, data_home_dir, download)
    if path is None and sha256_bytes(data) != ITEM_SHA256:
        raise DataUnavailableError(f"cached ml-100k.item has sha256 {sha256_bytes(data)}, expected "
                                   f"{ITEM_SHA256}; delete it from {data_home(data_home_dir)}")
    df = parse_movielens_items(data)
    genres = df["genres"].str.split()
    decade = df["year"].map(lambda y: [] if pd.isna(y) else [f"decade:{int(y) // 10 * 10}"])
    words = df["title"].map(lambda t: sorted(set(re.findall(r"[a-z]+", re.sub(
        r"\(\d{4}\)", "", str(t).lower())))))
    counts = pd.Series([w for ws in words for w in ws]).value_counts()
    vocab = set(counts.index[counts >= max(int(min_word_items), 1)])
    groups = [genres.map(lambda g: ["genre:" + x for x in g]), decade,
              words.map(lambda ws: ["word:" + w for w in ws if w in vocab])]
    names = sorted({n for g in groups for ns in g for n in ns})
    col = {n: k for k, n in enumerate(names)}
    r, c, v = [], [], []
    for g in groups:
        for i, ns in enumerate(g):
            for n in ns:
                r.append(i)
                c.append(col[n])
                v.append(1.0 / np.sqrt(len(ns)))
    mat = sp.csr_matrix((v, (r, c)), shape=(len(df), len(names)))
    return replace(ItemFeatures.coerce((df["item"].to_numpy(), mat)), names=tuple(names))


def hash_buckets(raw_ids, n_buckets: int) -> np.ndarray:
    """Bucket in [0, n_buckets) of each raw id: a fixed hash of its text, the same on every run
    and machine (int 7 and str "7" share a bucket)."""
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, (int, np.integer)) or \
            n_buckets < 1:
        raise ValueError(f"n_buckets must be a positive integer, got {n_buckets!r}")
    h = pd.util.hash_array(np.asarray(raw_ids).astype(str).astype(object))
    return (h % np.uint64(n_buckets)).astype(np.int64)


def hashed_item_features(item_ids, n_buckets: int) -> ItemFeatures:
    """One-hot ``hash_buckets`` features: with a catalog, the B hashed out-of-catalog rows
    become *global* adapter rows (the fully global baseline of OOV finetuning)."""
    ids = np.asarray(item_ids)
    cols = hash_buckets(ids, n_buckets)
    mat = sp.csr_matrix((np.ones(len(ids)), (np.arange(len(ids)), cols)),
                        shape=(len(ids), n_buckets))
    return replace(ItemFeatures.coerce((ids, mat)),
                   names=tuple(f"bucket:{k}" for k in range(n_buckets)))
