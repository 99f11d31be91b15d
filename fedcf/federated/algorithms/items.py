"""The item space of a model: which raw items have rows of the global matrix and what every other
item is scored with (FedRecon §5.1.2; OOV expansion, Shenoy et al.). A phase object,
``FedReconMF(item_space=OpenCatalog(catalog=0.25, local_item_buckets=100))`` or by name
(``"full"``, ``"open"``).

- ``FullCatalog()`` (the default): every training item has its own global row; an item the model
  never saw scores μ + c_u, no item term.
- ``OpenCatalog(...)``: the global model holds a *catalog* (all training items, the most popular
  share, or a list) plus, as chosen, one shared UNK row, a linear adapter over item features
  (``fit(X, item_features=...)``: Σ x_f · W_f), hashed *local* rows per user (reconstructed on the
  device, never uploaded) and a learned default (p₀, c₀) of the local parameters.

A bound open space (``ItemRows``) maps raw items to global rows [catalog | UNK | features |
default] and local buckets, sizes and splits the global matrix and supplies the client program.
Scoring with it is in ``catalog.py``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..._kernels.layout import catalog_cfg
from ..._validation import raw_ids
from ...datasets import ItemFeatures, hash_buckets
from ...datasets._validation import show
from ...models.base import LocalParams
from ...models.persistence import _ids_to_array
from ..round.params import Params
from ..round.state import INLINE, ModelState, Part
from .programs import CatalogProgram

FEATURE_ARRAYS = ("feature_item_ids_", "feature_indptr_", "feature_indices_", "feature_values_",
                  "feature_shape_")
OPEN_ARRAYS = ("adapter_factors_", "adapter_biases_", "default_params_", *FEATURE_ARRAYS)


class ItemSpace(Params):
    """Which raw items have global rows. ``open`` tells whether other items get any (an
    ``OpenCatalog``); ``bind`` fixes the space to a fit's training items and item features.

    Examples
    --------
    >>> from fedcf.federated import FullCatalog, ItemSpace, OpenCatalog
    >>> isinstance(OpenCatalog(0.5), ItemSpace), FullCatalog.open, OpenCatalog.open
    (True, False, True)
    """

    open: ClassVar[bool] = False
    drop_out_of_catalog: bool = False  # entries of items outside the space left out on devices

    def bind(self, item_ids, counts, features) -> ItemRows | None:
        """The rows of this space for training items ``item_ids`` (with ``counts``
        interactions) and ``features`` (an ``ItemFeatures`` or None); None: one row per item."""
        if features is not None:
            raise ValueError(f"item_features need an open item space (item_space=OpenCatalog(); "
                             f"its adapter scores items by their features); this model has "
                             f"item_space={self!r}")
        return None


class FullCatalog(ItemSpace):
    """Every training item has its own global row; other items score μ + c_u. The default.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import FullCatalog
    >>> FedReconMF(item_space=FullCatalog()).item_space
    FullCatalog()
    """

    def __init__(self):
        pass


def _check_feature_ids(feature_ids, item_ids) -> None:
    """Item features must be indexed by the items' raw ids: features for none of the training
    items (e.g. ids '0', '1' for items 0, 1) would never apply."""
    if len(item_ids) == 0 or (pd.Index(item_ids).get_indexer(pd.Index(feature_ids)) >= 0).any():
        return
    raise ValueError(f"item_features: none of its {len(feature_ids)} item ids (e.g. "
                     f"{show(feature_ids[0])}) is an item of the training data (e.g. "
                     f"{show(item_ids[0])}); index the features by the items' raw ids, of the "
                     "same type (5 and '5' differ)")


def _count(name, value, low, high, *, none=False):
    if none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not low <= value <= high:
        raise ValueError(f"{name} must be {'None or ' if none else ''}an integer in "
                         f"[{low}, {high}], got {value!r}")


class OpenCatalog(ItemSpace):
    """Global rows for a catalog, and what items outside it are scored with.

    Parameters
    ----------
    catalog : None, float in (0, 1] or list of raw item ids, default None
        The items with global rows: all training items (None), the most popular share of them
        (by training interactions), or this list. Other items are *out of catalog*.
    unknown_item_row : bool, default False
        One shared global UNK row for out-of-catalog items (with item features: the adapter's
        intercept).
    local_item_buckets : int >= 1 or None, default None
        B hashed local rows (raw item id → bucket) of out-of-catalog items: local parameters,
        reconstructed with the user's embedding from the support set, never uploaded (B = 1 is
        a personal "unknown item" row).
    local_item_sweeps : int in [1, 1000], default 3
        Alternating exact solves (user, then local rows) of ridge reconstruction with local rows.
    learned_default : bool, default False
        Learn a global default (p₀, c₀) of the local parameters: the prior mean of the ridge
        reconstruction and the start of SGD reconstruction. Its client delta is the exact
        query-loss gradient only for ridge reconstruction without local rows; with local rows
        the local rows are held fixed in it, and with SGD reconstruction it is first order
        (``fedcf._kernels.catalog``).
    drop_out_of_catalog : bool, default False
        Each device leaves its entries of items outside the catalog out of every training round
        and every reconstruction, so nothing it uploads depends on them; such items are then
        scored only on the device (``fedcf.federated.OOVExpansion``), else with no item term.
        Needs no UNK row, local rows or item features (they would learn from those entries).

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import OpenCatalog
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedReconMF(n_factors=4, n_rounds=3, clients_per_round=20, random_state=0,
    ...                    item_space=OpenCatalog(0.5, unknown_item_row=True)).fit(ratings)
    >>> len(model.item_ids_), model.adapter_factors_.shape
    (10, (1, 4))
    """

    open = True

    def __init__(self, catalog=None, *, unknown_item_row=False, local_item_buckets=None,
                 local_item_sweeps=3, learned_default=False, drop_out_of_catalog=False):
        if isinstance(catalog, (np.ndarray, pd.Index, pd.Series)):
            catalog = catalog.tolist()  # a list compares by value (a clone equals its original)
        self.catalog = catalog
        self.unknown_item_row = unknown_item_row
        self.local_item_buckets = local_item_buckets
        self.local_item_sweeps = local_item_sweeps
        self.learned_default = learned_default
        self.drop_out_of_catalog = drop_out_of_catalog
        self.validate()

    def validate(self):
        _check_catalog(self.catalog)
        for name, v in (("unknown_item_row", self.unknown_item_row),
                        ("learned_default", self.learned_default),
                        ("drop_out_of_catalog", self.drop_out_of_catalog)):
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {v!r}")
        _count("local_item_buckets", self.local_item_buckets, 1, 2**31 - 1, none=True)
        _count("local_item_sweeps", self.local_item_sweeps, 1, 1000)
        if self.drop_out_of_catalog and (self.unknown_item_row or self.local_item_buckets):
            raise ValueError("drop_out_of_catalog=True leaves out-of-catalog entries out of "
                             "training, so an UNK row or local item rows could never learn; "
                             "set unknown_item_row=False and local_item_buckets=None")

    def bind(self, item_ids, counts, features) -> ItemRows:
        if features is not None and self.drop_out_of_catalog:
            raise ValueError("item_features train the global adapter from out-of-catalog "
                             "entries, which drop_out_of_catalog=True leaves out; serve those "
                             "items on the device with fedcf.federated.OOVExpansion instead")
        if features is not None:
            _check_feature_ids(features.item_ids, np.asarray(item_ids))
        return ItemRows(self, self._catalog_ids(np.asarray(item_ids), counts), features)

    def _catalog_ids(self, item_ids, counts) -> np.ndarray:
        """Raw ids of the catalog: all training items, the most popular share, or the list."""
        cat = self.catalog
        if cat is None:
            return item_ids
        if isinstance(cat, (float, np.floating)):
            k = max(1, int(np.ceil(cat * len(item_ids) - 1e-9)))
            return item_ids[np.sort(np.argsort(-np.asarray(counts), kind="stable")[:k])]
        cat = raw_ids(cat, "catalog")
        present = pd.Index(item_ids).get_indexer(pd.Index(cat)) >= 0
        if not present.any():
            raise ValueError(f"catalog: none of its {len(cat)} item ids (e.g. {show(cat[0])}) is "
                             "an item of the training data; pass raw ids as they appear there "
                             "(the same type: 5 and '5' differ)")
        if not present.all():  # no client could ever train their rows
            warnings.warn(f"catalog: {int((~present).sum())} of its {len(cat)} item ids (e.g. "
                          f"{show(cat[~present][0])}) never appear in the training data; they "
                          "get no global row and score as items outside the catalog",
                          UserWarning, stacklevel=6)
        return cat[present]


def _check_catalog(v) -> None:
    """None, a share in (0, 1] of the most popular training items, or a list of raw item ids."""
    if v is None:
        return
    if isinstance(v, (float, np.floating)):
        if not 0.0 < v <= 1.0:
            raise ValueError(f"catalog as a share of the training items must be in (0, 1], got {v}")
        return
    if not isinstance(v, (list, tuple, np.ndarray, pd.Index, pd.Series)):
        raise TypeError(f"catalog must be None, a float share in (0, 1], or a list of raw item "
                        f"ids; got {v!r}")
    ids = np.asarray(v)
    if ids.ndim != 1 or len(ids) == 0:
        raise ValueError(f"catalog must list at least one raw item id (1-D), got shape {ids.shape}")
    dup = pd.Index(ids).duplicated()
    if dup.any():
        raise ValueError(f"catalog: item {show(ids[dup][0])} appears twice; an item is either in "
                         "the catalog or out of it, once")


@dataclass(frozen=True)
class ItemRows:
    """An open item space bound to its catalog (raw ids) and item features (or None): global
    rows [catalog | UNK | one per feature | default], local buckets of the other items.

    Parameters
    ----------
    space : OpenCatalog
    catalog_ids : ndarray
        Raw ids of the items with their own global rows, in row order.
    features : ItemFeatures or None
        The adapter's item features.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import OpenCatalog
    >>> rows = OpenCatalog([10, 20], unknown_item_row=True).bind([10, 20, 30], [5, 3, 1], None)
    >>> rows.n_global, rows.item_map(np.array([20, 99]))[1].tolist()  # 99: the UNK row
    (3, [1, 2])
    """

    space: OpenCatalog
    catalog_ids: np.ndarray
    features: ItemFeatures | None

    @property
    def n_catalog(self) -> int:
        return len(self.catalog_ids)

    @property
    def n_adapter(self) -> int:
        """Global rows beside the catalog's: UNK (intercept) and one per item feature."""
        n_feat = 0 if self.features is None else self.features.matrix.shape[1]
        return int(self.space.unknown_item_row) + n_feat

    @property
    def n_global(self) -> int:
        return self.n_catalog + self.n_adapter + int(self.space.learned_default)

    def cc(self) -> np.ndarray:
        """The kernels' catalog settings (``layout.catalog_cfg``)."""
        default_row = self.n_catalog + self.n_adapter if self.space.learned_default else -1
        return catalog_cfg(self.space.local_item_buckets or 0, default_row,
                           self.space.local_item_sweeps)

    def init(self, rng, n_factors: int, scale: float, dtype) -> dict:
        """g(0): uniform in ±scale (the learned default at zero), zero biases."""
        G = rng.uniform(-scale, scale, (self.n_global, n_factors))
        if self.space.learned_default:
            G[-1] = 0.0
        return {"Q": G.astype(dtype), "b": np.zeros(self.n_global, dtype)}

    def state(self, n_factors: int) -> ModelState:
        """The global arrays (``round.state``): the catalog's rows, the adapter's (UNK, one per
        feature), and the learned default as [row | bias]."""
        parts = [Part("item_factors_", self.n_catalog, bias="item_biases_"),
                 Part("adapter_factors_", self.n_adapter, bias="adapter_biases_")]
        if self.learned:
            parts.append(Part("default_params_", 1, bias=INLINE))
        return ModelState(tuple(parts), n_factors)

    @property
    def learned(self) -> bool:
        """Whether the rows end with a learned default."""
        return bool(self.space.learned_default)

    def join(self, model) -> tuple[np.ndarray, np.ndarray]:
        """A fitted model's global rows (G, gb) in the kernels' layout (``state``'s table)."""
        state = self.state(model.item_factors_.shape[1])
        table = state.pack({n: model._fitted(n) for n in state.names},
                           model.item_factors_.dtype)
        return table["Q"], table["b"]

    def check(self, model, where: str) -> None:
        """Refuse a loaded model whose open-space arrays do not fit these rows."""
        A, d, K = model.adapter_factors_, model.default_params_, model.n_factors
        ok = A is not None and A.shape == (self.n_adapter, K)
        if self.space.learned_default:
            ok = ok and d is not None and d.shape == (K + 1,)
        if not ok:
            raise ValueError(f"{where}: the out-of-catalog arrays do not match the model's "
                             "parameters (adapter rows, learned default): damaged or edited")

    def kept(self, raw_items) -> np.ndarray:
        """Which of a device's raw items take part in training and reconstruction: all of
        them, or with ``drop_out_of_catalog`` the catalog's only."""
        raw_items = raw_ids(raw_items, "items")
        if not self.space.drop_out_of_catalog:
            return np.ones(len(raw_items), bool)
        return pd.Index(self.catalog_ids).get_indexer(pd.Index(raw_items)) >= 0

    def item_map(self, raw_items) -> tuple:
        """(rptr, rows, coef, bucket) of raw items: a catalog item is its own row; another item
        is UNK + its feature rows (if any), and its hashed local bucket."""
        raw_items = raw_ids(raw_items, "items")
        n_catalog, feats = self.n_catalog, self.features
        cat = pd.Index(self.catalog_ids).get_indexer(pd.Index(raw_items))
        out = cat < 0
        unk = int(self.space.unknown_item_row)
        frow = feats.rows_of(raw_items) if feats is not None else np.full(len(raw_items), -1)
        has_f = out & (frow >= 0)
        nnz = np.zeros(len(raw_items), np.int64)
        if feats is not None:
            nnz[has_f] = np.diff(feats.matrix.indptr)[frow[has_f]]
        rptr = np.zeros(len(raw_items) + 1, np.int64)
        np.cumsum(np.where(out, unk + nnz, 1), out=rptr[1:])
        rows, coef = np.empty(rptr[-1], np.int64), np.ones(rptr[-1])
        rows[rptr[:-1][~out]] = cat[~out]
        if unk:
            rows[rptr[:-1][out]] = n_catalog
        if has_f.any():
            sub = feats.matrix[frow[has_f]]
            pos = np.repeat(rptr[:-1][has_f] + unk, np.diff(sub.indptr)) + \
                np.arange(sub.nnz) - np.repeat(sub.indptr[:-1], np.diff(sub.indptr))
            rows[pos] = n_catalog + unk + sub.indices
            coef[pos] = sub.data
        B = self.space.local_item_buckets
        bucket = np.where(out, hash_buckets(raw_items, B), -1) if B else \
            np.full(len(raw_items), -1, np.int64)
        return rptr, rows, coef, bucket.astype(np.int64)

    def program(self, train_item_ids, cfg, recon_hp, update_hp) -> CatalogProgram:
        """The client program over the training population's items."""
        imap = self.item_map(train_item_ids)
        return CatalogProgram(cfg, self.cc(), recon_hp, update_hp, imap,
                              max(int(np.diff(imap[0]).max(initial=0)), 1))


def features_arrays(feats: ItemFeatures | None) -> dict:
    """The saved arrays of item features (all None without)."""
    if feats is None:
        return dict.fromkeys(FEATURE_ARRAYS)
    m = feats.matrix
    return {"feature_item_ids_": _ids_to_array(feats.item_ids, "item feature"),
            "feature_indptr_": m.indptr.astype(np.int64), "feature_indices_": m.indices,
            "feature_values_": m.data, "feature_shape_": np.array(m.shape, np.int64)}


def features_of(model) -> ItemFeatures | None:
    """The item features stored in a model's arrays (inverse of ``features_arrays``)."""
    if model.feature_shape_ is None:
        return None
    mat = sp.csr_matrix((model.feature_values_, model.feature_indices_, model.feature_indptr_),
                        shape=tuple(int(v) for v in model.feature_shape_))
    return ItemFeatures(model.feature_item_ids_, mat, ())


@dataclass(frozen=True)
class CatalogLocalParams(LocalParams):
    """A reconstructed user with local out-of-catalog rows. Never leaves the device.

    Parameters
    ----------
    factors : ndarray (K,)
    bias : float
    buckets : ndarray (m,)
        The bucket ids of the user's local rows, sorted.
    bucket_factors : ndarray (m, K)
    bucket_biases : ndarray (m,)

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import CatalogLocalParams
    >>> local = CatalogLocalParams(np.zeros(2), 0.0, np.array([3]), np.ones((1, 2)), np.zeros(1))
    >>> local.buckets.tolist()
    [3]
    """

    buckets: np.ndarray = None
    bucket_factors: np.ndarray = None
    bucket_biases: np.ndarray = None


