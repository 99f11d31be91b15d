"""Items outside the global catalog (FedRecon §5.1.2; OOV expansion, Shenoy et al.).

The global model may hold rows for a *catalog* only (the most popular items, or a given list).
Every other item — the long tail, items added after the catalog was fixed, a user's own items —
is *out of catalog* and scored by what the options give it (see ``_kernels/catalog.py``):

- nothing (``fallback``): μ + c_u, no item term — plain FedReconMF's behaviour for unknown items;
- ``unknown_item_row``: one shared *global* row (UNK), trained like any item;
- ``item_features`` (a fit argument): a global linear adapter, one row per feature, so the item's
  row is Σ x_f · W_f (with the UNK row as its intercept when both are on) — OOV expansion;
- ``local_item_buckets=B``: B hashed *local* rows per user (raw item id → bucket), reconstructed
  on the device with the user's embedding, added to the global part, never uploaded.

``learned_default`` adds a global (p₀, c₀): the prior mean of the ridge reconstruction (and the
start of SGD reconstruction), trained by the server from the clients' query-loss gradients.
This module holds the mix-in FedReconMF uses when any of these is on; without them FedReconMF
runs its own kernel unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._kernels.catalog import base_vectors, catalog_clients, catalog_recon_predict, reconstruct_one
from .._kernels.clients import query_sizes
from .._kernels.layout import OC_DEFAULT, catalog_cfg
from ..datasets import DataValidationError, Interactions, ItemFeatures, hash_buckets
from ..datasets._validation import show
from ..models.base import LocalParams, _as_pairs, _as_ratings, _ids_to_array, content_key, user_keys
from ..models.prediction import inference_keys
from .contracts import WholeModelBroadcast


def CatalogRule():
    """None, a share in (0, 1] of the most popular training items, or a list of raw item ids."""
    def rule(name, v):
        if v is None:
            return None
        if isinstance(v, float):
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{name} as a share of the training items must be in (0, 1], "
                                 f"got {v}")
            return v
        if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__len__"):
            raise TypeError(f"{name} must be None, a float share in (0, 1], or a list of raw "
                            f"item ids; got {v!r}")
        ids = np.asarray(list(v))
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError(f"{name} must list at least one raw item id (1-D), got shape "
                             f"{ids.shape}")
        dup = pd.Index(ids).duplicated()
        if dup.any():
            raise ValueError(f"{name}: item {show(ids[dup][0])} appears twice; an item is either "
                             "in the catalog or out of it, once")
        return ids
    return rule


CATALOG_CONSTRAINTS = {"catalog": CatalogRule()}
_FEATURE_ARRAYS = ("feature_item_ids_", "feature_indptr_", "feature_indices_", "feature_values_",
                   "feature_shape_")
CATALOG_ARRAYS = ("adapter_factors_", "adapter_biases_", "default_params_", *_FEATURE_ARRAYS)


@dataclass(frozen=True)
class CatalogLocalParams(LocalParams):
    """A reconstructed user with local out-of-catalog rows: ``buckets`` (m,) their bucket ids,
    ``bucket_factors`` (m, K), ``bucket_biases`` (m,). Never leaves the device."""

    buckets: np.ndarray = None
    bucket_factors: np.ndarray = None
    bucket_biases: np.ndarray = None


@dataclass(frozen=True)
class CatalogProgram(WholeModelBroadcast):
    """Client work with a catalog: ``catalog_clients`` over the training items' map."""

    cfg: np.ndarray
    cc: np.ndarray
    recon_hp: np.ndarray
    update_hp: np.ndarray
    imap: tuple  # (rptr, rows, coef, bucket) over the training population's items
    max_terms: int

    def layout(self, counts):
        q = query_sizes(counts.astype(np.int64), int(self.cfg[0]), float(self.cfg[1]))
        return q, q * self.max_terms + int(self.cc[OC_DEFAULT] >= 0)

    def run(self, data, clients, params, local, ids, out):
        catalog_clients(data, clients, (params["Q"], params["b"]), self.imap, self.cfg, self.cc,
                        self.recon_hp, self.update_hp, ids, out)


class CatalogMixin:
    """FedReconMF's out-of-catalog behaviour (active when ``_catalog_active()``)."""

    def _catalog_active(self) -> bool:
        """Any out-of-catalog option is on (item features: given to this fit, or stored)."""
        feats = self._pending_features if hasattr(self, "_pending_features") else \
            getattr(self, "feature_shape_", None)
        return (self.catalog is not None or self.local_item_buckets is not None
                or self.unknown_item_row or self.learned_default or feats is not None)

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, item_features=None, **kwargs):
        """As FederatedMFBase.fit; ``item_features`` (``ItemFeatures``, a DataFrame indexed by raw
        item id, or an (item_ids, matrix) pair) turns on the OOV-expansion adapter."""
        feats = None if item_features is None else ItemFeatures.coerce(item_features)
        self._pending_features = feats
        try:
            return super().fit(X, y, **kwargs)
        finally:
            del self._pending_features

    def _check_combinations(self):
        super()._check_combinations()
        if not self._catalog_active():
            return
        blocked = {"joint": self.joint, "learn_hyperparams": self.learn_hyperparams,
                   "executor": self.executor not in (None, "local")}
        bad = [k for k, v in blocked.items() if v]
        if bad:
            raise ValueError(f"{bad[0]}={getattr(self, bad[0])!r} is not available with a catalog, "
                             "local item rows, item features or a learned default; leave it at "
                             "its default")

    def _init_globals(self, inter, rng, dtype) -> dict:
        if not self._catalog_active():
            return super()._init_globals(inter, rng, dtype)
        self._catalog_ids = self._resolve_catalog(inter)
        self._set_features(self._pending_features)
        n_glob = len(self._catalog_ids) + self._n_adapter() + int(self.learned_default)
        G = rng.uniform(-self.init_scale, self.init_scale, (n_glob, self.n_factors))
        if self.learned_default:
            G[-1] = 0.0
        return {"Q": G.astype(dtype), "b": np.zeros(n_glob, dtype)}

    def _resolve_catalog(self, inter) -> np.ndarray:
        """Raw ids of the catalog: all training items, the most popular share, or the list."""
        cat = self._check_params()["catalog"]
        if cat is None:
            return inter.item_ids
        if isinstance(cat, float):
            counts = np.bincount(inter.items, minlength=inter.n_items)
            k = max(1, int(np.ceil(cat * inter.n_items - 1e-9)))
            return inter.item_ids[np.sort(np.argsort(-counts, kind="stable")[:k])]
        if not (pd.Index(inter.item_ids).get_indexer(pd.Index(cat)) >= 0).any():
            raise ValueError(f"catalog: none of its {len(cat)} item ids (e.g. {show(cat[0])}) is "
                             "an item of the training data; pass raw ids as they appear there "
                             "(the same type: 5 and '5' differ)")
        return cat

    def _set_features(self, feats):
        """Keep the item features as arrays (saved with the model)."""
        if feats is None:
            for a in _FEATURE_ARRAYS:
                setattr(self, a, None)
            return
        m = feats.matrix
        self.feature_item_ids_ = _ids_to_array(feats.item_ids, "item feature")
        self.feature_indptr_, self.feature_indices_ = m.indptr.astype(np.int64), m.indices
        self.feature_values_ = m.data
        self.feature_shape_ = np.array(m.shape, np.int64)

    @property
    def item_features_(self):
        """The item features the model was fitted with (``ItemFeatures``), or None."""
        return self._features()

    def _global_params(self) -> dict:
        if self._catalog_active():
            raise ValueError("client_uploads is not available with catalog options yet (their "
                             "clients also hold local item rows)")
        return super()._global_params()

    def _features(self):
        """The stored item features (ItemFeatures), or None."""
        if getattr(self, "feature_shape_", None) is None:
            return None
        import scipy.sparse as sp

        mat = sp.csr_matrix((self.feature_values_, self.feature_indices_, self.feature_indptr_),
                            shape=tuple(int(v) for v in self.feature_shape_))
        return ItemFeatures(self.feature_item_ids_, mat, ())

    def _n_adapter(self) -> int:
        """Global rows beside the catalog's: UNK (intercept) and one per item feature."""
        shape = getattr(self, "feature_shape_", None)
        return int(self.unknown_item_row) + (int(shape[1]) if shape is not None else 0)

    def _catalog_program(self, inter, mu):
        """FedReconMF's client program with a catalog (see ``client_program``)."""
        imap = self._item_map(inter.item_ids, len(self._catalog_ids), self._catalog_ids)
        cfg = self._recon_cfg()
        return CatalogProgram(cfg, self._cc(len(self._catalog_ids)), self._recon_hp(mu),
                              self._update_hp(mu, False), imap,
                              max(int(np.diff(imap[0]).max(initial=0)), 1))

    def _cc(self, n_catalog: int):
        default_row = n_catalog + self._n_adapter() if self.learned_default else -1
        return catalog_cfg(self.local_item_buckets or 0, default_row, self.local_item_sweeps)

    def _item_map(self, raw_items, n_catalog: int, catalog_ids=None) -> tuple:
        """(rptr, rows, coef, bucket) of raw items: a catalog item is its own row; another item
        is UNK + its feature rows (if any), and its hashed local bucket."""
        catalog_ids = self.item_ids_ if catalog_ids is None else catalog_ids
        raw_items = np.asarray(raw_items)
        cat = pd.Index(catalog_ids).get_indexer(pd.Index(raw_items))
        out = cat < 0
        unk = int(self.unknown_item_row)
        feats = self._features()
        frow = feats.rows_of(raw_items) if feats is not None else np.full(len(raw_items), -1)
        has_f = out & (frow >= 0)
        nnz = np.zeros(len(raw_items), np.int64)
        if feats is not None:
            nnz[has_f] = np.diff(feats.matrix.indptr)[frow[has_f]]
        counts = np.where(out, unk + nnz, 1)
        rptr = np.zeros(len(raw_items) + 1, np.int64)
        np.cumsum(counts, out=rptr[1:])
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
        B = self.local_item_buckets
        bucket = np.where(out, hash_buckets(raw_items, B), -1) if B else \
            np.full(len(raw_items), -1, np.int64)
        return rptr, rows, coef, bucket.astype(np.int64)

    # ------------------------------------------------------------------ fitted state
    def _set_globals(self, params):
        if not self._catalog_active():
            return super()._set_globals(params)
        G, gb = params["Q"], params["b"]
        C, A = len(self._catalog_ids), self._n_adapter()
        self.item_ids_ = self._catalog_ids
        self.item_factors_, self.item_biases_ = G[:C], gb[:C]
        self.adapter_factors_, self.adapter_biases_ = G[C:C + A], gb[C:C + A]
        self.default_params_ = np.append(G[C + A], gb[C + A]) if self.learned_default else None

    def _guard(self, inter, mu, opt):
        guard = super()._guard(inter, mu, opt)
        if self._catalog_active():  # the diagnosis solves over the full catalog's rows
            guard.diagnose = None
        return guard

    def _glob(self):
        """The global rows (G, gb) in the kernels' layout: catalog, adapter, default."""
        K = self.item_factors_.shape[1]
        parts = [self.item_factors_, self.adapter_factors_]
        bias = [self.item_biases_, self.adapter_biases_]
        if self.learned_default:
            parts.append(self.default_params_[None, :K])
            bias.append(self.default_params_[K:])
        dt = self.item_factors_.dtype
        return np.vstack(parts).astype(dt), np.concatenate(bias).astype(dt)

    def _recon_settings(self):
        cfg = self._recon_cfg()
        return cfg, self._cc(len(self.item_ids_)), self._recon_hp(float(self.global_mean_))

    def _catalog_predict(self, support, query, keys, finetune=None):
        """Reconstruct each row of ``support`` = (indptr, raw items, values) (and finetune, see
        ``recon_predict``) and score the raw items of the same row of ``query`` = (indptr, raw
        items). Returns (pred, P, c)."""
        inv, uniq = pd.factorize(np.concatenate([np.asarray(support[1]), np.asarray(query[1])]))
        imap = self._item_map(np.asarray(uniq), len(self.item_ids_))
        ns = len(support[1])
        sup = (support[0], inv[:ns].astype(np.int64), np.asarray(support[2], np.float64))
        qry = (query[0], inv[ns:].astype(np.int64))
        n = len(support[0]) - 1
        pred, P, c = np.empty(len(query[1])), np.empty((n, self.n_factors)), np.empty(n)
        cfg, cc, hp = self._recon_settings()
        row_lo = {None: -1, "all": 0, "adapter": len(self.item_ids_)}[finetune]
        ft_hp = np.concatenate([[row_lo], self._update_hp(float(self.global_mean_), False)])
        catalog_recon_predict(sup, qry, self._glob(), imap, cfg, cc, hp, ft_hp,
                              inference_keys(self._seed(), keys), (pred, P, c))
        return pred, P, c

    # ------------------------------------------------------------------ public API
    def recon_predict(self, support: Interactions, query: Interactions, *, clip: bool = True,
                      finetune=None):
        """Reconstruct each user of ``support`` (local out-of-catalog rows included) and predict
        the entries of ``query`` (same users, same order) — ReconEval's step.

        ``finetune`` (Table 2 of the paper): after reconstruction the user also runs the model's
        client update (``update_steps`` at ``learning_rate``) on its support set, on the global
        rows it touches — "all" of them (FedRecon + finetune; full finetuning) or only the
        "adapter" rows (UNK, features, hashed global rows: OOV finetuning) — and scores the
        query with those finetuned copies. Nothing is sent or stored."""
        if finetune not in (None, "all", "adapter"):
            raise ValueError(f"finetune must be None, 'all' or 'adapter', got {finetune!r}")
        if not self._catalog_active():
            if finetune is not None:
                raise ValueError("finetune needs a model with out-of-catalog options (e.g. "
                                 "catalog=1.0 for the full catalog)")
            return super().recon_predict(support, query, clip=clip)
        self._check_fitted()
        if not (isinstance(support, Interactions) and isinstance(query, Interactions)):
            raise TypeError(f"recon_predict takes two Interactions (support, query), got "
                            f"{type(support).__name__} and {type(query).__name__}")
        if support.n_users != query.n_users or not np.array_equal(support.user_ids,
                                                                  query.user_ids):
            raise ValueError("support and query must hold the same users in the same order "
                             "(e.g. the two parts of support_query_split)")
        pred, _, _ = self._catalog_predict(_raw_csr(support), _raw_csr(query)[:2],
                                           user_keys(support.user_ids), finetune)
        return self._clip(pred, clip)

    def reconstruct_users(self, inter: Interactions):
        if not self._catalog_active():
            return super().reconstruct_users(inter)
        self._check_fitted()
        if not isinstance(inter, Interactions):
            raise TypeError(f"reconstruct_users takes an Interactions, got {type(inter).__name__}")
        empty = (np.zeros(inter.n_users + 1, np.int64), inter.item_ids[:0])
        _, P, c = self._catalog_predict(_raw_csr(inter), empty, user_keys(inter.user_ids))
        dt = self.item_factors_.dtype
        return P.astype(dt), c.astype(dt)

    def reconstruct(self, items, ratings=None) -> LocalParams:
        """A new user's local parameters from their ratings of raw items — with local rows, a
        ``CatalogLocalParams`` holding the buckets their out-of-catalog items reconstructed."""
        if not self._catalog_active():
            return super().reconstruct(items, ratings)
        self._check_fitted()
        items, ratings = _history(items, ratings)
        cfg, cc, hp = self._recon_settings()
        G, gb = self._glob()
        key = inference_keys(self._seed(), np.array(
            [content_key(hash_buckets(items, 2**62), ratings)], np.uint64))[0]
        x, lb, V, dv = reconstruct_one(np.arange(len(items), dtype=np.int64), ratings, G, gb,
                                       self._item_map(items, len(self.item_ids_)), cfg, cc, hp,
                                       np.array([key], np.uint64))
        K = self.n_factors
        return CatalogLocalParams(x[:K].copy(), float(x[K]), lb, V, dv)

    def predict_local(self, local: LocalParams, items, *, clip: bool = True) -> np.ndarray:
        """Scores of a reconstructed user on raw items: catalog rows, the adapter / UNK row for
        other items, plus the user's local row of an item's bucket when it has one."""
        if not self._catalog_active():
            return super().predict_local(local, items, clip=clip)
        self._check_fitted()
        P, c = self._check_local(local)
        items = np.atleast_1d(np.asarray(items))
        imap = self._item_map(items, len(self.item_ids_))
        G, gb = self._glob()
        Zb, bb = base_vectors(np.arange(len(items), dtype=np.int64), G, gb, imap)
        if isinstance(local, CatalogLocalParams) and local.buckets is not None and \
                len(local.buckets):
            pos = np.searchsorted(local.buckets, imap[3])
            hit = (imap[3] >= 0) & (pos < len(local.buckets))
            hit[hit] = local.buckets[pos[hit]] == imap[3][hit]
            Zb[hit] += local.bucket_factors[pos[hit]]
            bb[hit] += local.bucket_biases[pos[hit]]
        out = float(self.global_mean_) + bb + float(c[0]) + Zb @ P[0].astype(np.float64)
        return self._clip(out, clip)

    def predict(self, X, *, clip: bool = True, user_col: str = "user", item_col: str = "item"):
        """As FedReconMF.predict; a seen user is reconstructed from their fit data with their
        local rows, an out-of-catalog item is scored by UNK / the adapter / the user's local row."""
        if not self._catalog_active():
            return super().predict(X, clip=clip, user_col=user_col, item_col=item_col)
        self._check_fitted()
        raw_u, raw_i = _as_pairs(X, user_col, item_col)
        codes, users = pd.factorize(np.asarray(raw_u))
        order = np.argsort(codes, kind="stable")
        qptr = np.zeros(len(users) + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=len(users)), out=qptr[1:])
        sup = self._support_of(self._user_index(np.asarray(users)))
        pred = np.empty(len(codes))
        pred[order] = self._catalog_predict(sup, (qptr, np.asarray(raw_i)[order]),
                                            user_keys(np.asarray(users)))[0]
        return self._clip(pred, clip)

    def _support_of(self, dense):
        """(indptr, raw items, values) of the fit data of dense users (−1: none)."""
        inter = getattr(self, "interactions_", None)
        if inter is None and (dense >= 0).any():
            raise ValueError("this model was loaded from disk and holds no user data; "
                             "reconstruct users with reconstruct(items, ratings)")
        if inter is None:
            return np.zeros(len(dense) + 1, np.int64), self.item_ids_[:0], np.zeros(0)
        known = np.where(dense >= 0, dense, 0)
        counts = np.where(dense >= 0, inter.indptr[known + 1] - inter.indptr[known], 0)
        indptr = np.zeros(len(dense) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        take = np.repeat(inter.indptr[known] - indptr[:-1], counts) + np.arange(indptr[-1])
        return indptr, inter.item_ids[inter.items[take]], inter.values[take]

    def recommend(self, items=None, ratings=None, *, user=None, n: int = 10,
                  filter_seen: bool = True, extra_items=None) -> pd.DataFrame:
        """Top-``n`` of the catalog and of ``extra_items`` (raw ids outside it, e.g. the
        stickers on this device, scored with UNK / adapter / the user's local rows)."""
        if not self._catalog_active():
            if extra_items is not None:
                raise ValueError("extra_items needs a model with out-of-catalog items (catalog, "
                                 "local_item_buckets, unknown_item_row or item features)")
            return super().recommend(items, ratings, user=user, n=n, filter_seen=filter_seen)
        u = self._check_recommend(items, user, n)
        if user is not None:
            _, items, ratings = self._support_of(np.array([u]))
        items, ratings = _history(items, ratings)
        if isinstance(extra_items, (str, bytes)):
            raise TypeError(f"extra_items must be a list of raw item ids, got the string "
                            f"{extra_items!r}; wrap one id in a list")
        extra = np.asarray([] if extra_items is None else list(extra_items), dtype=object)
        cand = pd.unique(np.concatenate([np.asarray(self.item_ids_, object), extra]))
        scores = self.predict_local(self.reconstruct(items, ratings), cand, clip=False)
        if filter_seen:
            scores[pd.Index(cand).isin(items.tolist())] = -np.inf
        top = np.argsort(-scores, kind="stable")[:min(int(n), int(np.isfinite(scores).sum()))]
        return pd.DataFrame({"item": cand[top], "score": scores[top]})

    def _check_loaded(self, where: str):
        super()._check_loaded(where)
        if self._catalog_active():
            A = getattr(self, "adapter_factors_", None)
            ok = A is not None and A.shape == (self._n_adapter(), self.n_factors)
            ok = ok and (not self.learned_default or getattr(self, "default_params_", None)
                         is not None and self.default_params_.shape == (self.n_factors + 1,))
            if not ok:
                raise ValueError(f"{where}: the out-of-catalog arrays do not match the model's "
                                 "parameters (adapter rows, learned default): damaged or edited")


def _raw_csr(inter: Interactions):
    """(indptr, raw item ids, values) of an Interactions."""
    return inter.indptr, inter.item_ids[inter.items], inter.values


def _history(items, ratings):
    """A user's raw items and ratings (default 1.0 each), checked."""
    items = np.atleast_1d(np.asarray(items))
    ratings = np.ones(len(items)) if ratings is None else _as_ratings(ratings)
    if items.ndim != 1 or len(ratings) != len(items):
        raise DataValidationError(f"mismatched lengths: items has {len(items)} entries but "
                                  f"ratings has {len(ratings)}")
    return items, ratings
