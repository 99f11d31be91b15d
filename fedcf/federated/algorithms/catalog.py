"""Scoring with an open item space (``items.OpenCatalog``): reconstruction with local out-of-catalog
rows and predictions of items outside the catalog (kernels in ``_kernels/catalog.py``).

``OpenScorer(model, rows)`` has the public scoring methods of an estimator — ``predict``,
``recon_predict``, ``reconstruct_users``, ``reconstruct``, ``predict_local``, ``recommend`` — for
a fitted FedReconMF whose item space is open; FedReconMF hands each call to it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..._kernels.catalog import base_vectors, catalog_recon_predict, reconstruct_one
from ..._validation import raw_ids
from ...datasets import DataValidationError, Interactions, hash_buckets
from ...datasets.interactions import csr_take
from ...models.base import LocalParams, _as_pairs, _as_ratings, content_key, user_keys
from ...models.prediction import check_reconstructed, inference_keys
from .items import CatalogLocalParams, ItemRows


class OpenScorer:
    """The scoring methods of ``model`` (a fitted FedReconMF) with its open item ``rows``.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import OpenCatalog
    >>> model = FedReconMF(n_factors=4, n_rounds=2, clients_per_round=20, random_state=0,
    ...                    item_space=OpenCatalog(0.5, local_item_buckets=4)).fit(
    ...     make_synthetic_ratings(60, 20, 600, random_state=0))
    >>> model.predict_local(model.reconstruct([1, 2], [5.0, 4.0]), [1, 999]).shape
    (2,)
    """

    def __init__(self, model, rows: ItemRows):
        self.model, self.rows = model, rows

    def _settings(self):
        m = self.model
        mu = float(m.global_mean_)
        return m._recon_cfg(), self.rows.cc(), m._recon_hp(mu)

    def _predict_rows(self, support, query, keys, finetune=None):
        """Reconstruct each row of ``support`` = (indptr, raw items, values) (and finetune, see
        ``recon_predict``) and score the raw items of the same row of ``query`` = (indptr, raw
        items). Returns (pred, P, c)."""
        m, rows = self.model, self.rows
        support = self._kept(support)
        inv, uniq = pd.factorize(np.concatenate([np.asarray(support[1]), np.asarray(query[1])]))
        imap = rows.item_map(np.asarray(uniq))
        ns = len(support[1])
        sup = (support[0], inv[:ns].astype(np.int64), np.asarray(support[2], np.float64))
        qry = (query[0], inv[ns:].astype(np.int64))
        n = len(support[0]) - 1
        pred, P, c = np.empty(len(query[1])), np.empty((n, m.n_factors)), np.empty(n)
        cfg, cc, hp = self._settings()
        row_lo = {None: -1, "all": 0, "adapter": rows.n_catalog}[finetune]
        ft_hp = np.concatenate([[row_lo], m._update_hp(float(m.global_mean_), False)])
        catalog_recon_predict(sup, qry, rows.join(m), imap, cfg, cc, hp, ft_hp,
                              inference_keys(m._seed(), keys), (pred, P, c))
        return pred, P, c

    def _kept(self, support):
        """``support`` = (indptr, raw items, values) with the entries a device reconstructs
        from: all, or with ``drop_out_of_catalog`` the catalog's only."""
        keep = self.rows.kept(np.asarray(support[1]))
        if keep.all():
            return support
        cs = np.zeros(len(keep) + 1, np.int64)
        np.cumsum(keep, out=cs[1:])
        return cs[np.asarray(support[0])], np.asarray(support[1])[keep], \
            np.asarray(support[2])[keep]

    def recon_predict(self, support: Interactions, query: Interactions, *, clip: bool = True,
                      finetune=None):
        """See ``FedReconMF.recon_predict``."""
        if not (isinstance(support, Interactions) and isinstance(query, Interactions)):
            raise TypeError(f"recon_predict takes two Interactions (support, query), got "
                            f"{type(support).__name__} and {type(query).__name__}")
        if support.n_users != query.n_users or not np.array_equal(support.user_ids,
                                                                  query.user_ids):
            raise ValueError("support and query must hold the same users in the same order "
                             "(e.g. the two parts of support_query_split)")
        pred, _, _ = self._predict_rows(_raw_csr(support), _raw_csr(query)[:2],
                                        user_keys(support.user_ids), finetune)
        return self.model._clip(pred, clip)

    def reconstruct_users(self, inter: Interactions):
        """See ``FedReconMF.reconstruct_users``."""
        if not isinstance(inter, Interactions):
            raise TypeError(f"reconstruct_users takes an Interactions, got {type(inter).__name__}")
        empty = (np.zeros(inter.n_users + 1, np.int64), inter.item_ids[:0])
        _, P, c = self._predict_rows(_raw_csr(inter), empty, user_keys(inter.user_ids))
        dt = self.model.item_factors_.dtype
        return P.astype(dt), c.astype(dt)

    def reconstruct(self, items, ratings=None) -> LocalParams:
        """A new user's local parameters; with local rows a ``CatalogLocalParams`` holding the
        buckets their out-of-catalog items reconstructed."""
        m, rows = self.model, self.rows
        items, ratings = _history(items, ratings)
        keep = rows.kept(items)
        items, ratings = items[keep], ratings[keep]
        cfg, cc, hp = self._settings()
        G, gb = rows.join(m)
        key = inference_keys(m._seed(), np.array(
            [content_key(hash_buckets(items, 2**62), ratings)], np.uint64))[0]
        x, lb, V, dv = reconstruct_one(np.arange(len(items), dtype=np.int64), ratings, G, gb,
                                       rows.item_map(items), cfg, cc, hp,
                                       np.array([key], np.uint64))
        K = m.n_factors
        check_reconstructed(x[:K], x[K], ratings, m.rating_scale_, m.item_factors_)
        return CatalogLocalParams(x[:K].copy(), float(x[K]), lb, V, dv)

    def predict_local(self, local: LocalParams, items, *, clip: bool = True) -> np.ndarray:
        """Scores of a reconstructed user on raw items: catalog rows, the adapter / UNK row for
        other items, plus the user's local row of an item's bucket when it has one."""
        m, rows = self.model, self.rows
        P, c = m._check_local(local)
        items = raw_ids(items, "items")
        imap = rows.item_map(items)
        G, gb = rows.join(m)
        Zb, bb = base_vectors(np.arange(len(items), dtype=np.int64), G, gb, imap)
        if isinstance(local, CatalogLocalParams) and local.buckets is not None and \
                len(local.buckets):
            pos = np.searchsorted(local.buckets, imap[3])
            hit = (imap[3] >= 0) & (pos < len(local.buckets))
            hit[hit] = local.buckets[pos[hit]] == imap[3][hit]
            Zb[hit] += local.bucket_factors[pos[hit]]
            bb[hit] += local.bucket_biases[pos[hit]]
        out = float(m.global_mean_) + bb + float(c[0]) + Zb @ P[0].astype(np.float64)
        return m._clip(out, clip)

    def predict(self, X, *, clip: bool = True, user_col: str = "user", item_col: str = "item"):
        """A seen user is reconstructed from their fit data with their local rows; an
        out-of-catalog item is scored by UNK / the adapter / the user's local row."""
        m = self.model
        raw_u, raw_i = _as_pairs(X, user_col, item_col)
        m._warn_withheld(len(raw_u))
        codes, users = pd.factorize(np.asarray(raw_u))
        order = np.argsort(codes, kind="stable")
        qptr = np.zeros(len(users) + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=len(users)), out=qptr[1:])
        sup = self._support_of(m._user_index(np.asarray(users)))
        pred = np.empty(len(codes))
        pred[order] = self._predict_rows(sup, (qptr, np.asarray(raw_i)[order]),
                                         user_keys(np.asarray(users)))[0]
        return m._clip(pred, clip)

    def _support_of(self, dense):
        """(indptr, raw items, values) of the fit data of dense users (−1: none)."""
        inter = self.model.interactions_
        if inter is None and (dense >= 0).any():
            raise ValueError("this model was loaded from disk and holds no user data; "
                             "reconstruct users with reconstruct(items, ratings)")
        if inter is None:
            return np.zeros(len(dense) + 1, np.int64), self.rows.catalog_ids[:0], np.zeros(0)
        known = np.where(dense >= 0, dense, 0)
        counts = np.where(dense >= 0, inter.indptr[known + 1] - inter.indptr[known], 0)
        indptr, take = csr_take(inter.indptr, known, counts)
        return indptr, inter.item_ids[inter.items[take]], inter.values[take]

    def recommend(self, items=None, ratings=None, *, user=None, n: int = 10,
                  filter_seen: bool = True, extra_items=None):
        """Top-``n`` of the catalog and of ``extra_items`` (raw ids outside it, e.g. the
        stickers on this device, scored with UNK / adapter / the user's local rows)."""
        u = self.model._check_recommend(items, user, n)
        if user is not None:
            _, items, ratings = self._support_of(np.array([u]))
        items, ratings = _history(items, ratings)
        if isinstance(extra_items, (str, bytes)):
            raise TypeError(f"extra_items must be a list of raw item ids, got the string "
                            f"{extra_items!r}; wrap one id in a list")
        extra = np.asarray([] if extra_items is None else list(extra_items), dtype=object)
        cand = pd.unique(np.concatenate([np.asarray(self.rows.catalog_ids, object), extra]))
        scores = self.predict_local(self.reconstruct(items, ratings), cand, clip=False)
        if filter_seen:
            scores[pd.Index(cand).isin(items.tolist())] = -np.inf
        top = np.argsort(-scores, kind="stable")[:min(int(n), int(np.isfinite(scores).sum()))]
        return pd.DataFrame({"item": cand[top], "score": scores[top]})


def _raw_csr(inter: Interactions):
    """(indptr, raw item ids, values) of an Interactions."""
    return inter.indptr, inter.item_ids[inter.items], inter.values


def _history(items, ratings):
    """A user's raw items and ratings (default 1.0 each), checked."""
    items = raw_ids(items, "items")
    ratings = np.ones(len(items)) if ratings is None else _as_ratings(ratings)
    if items.ndim != 1 or len(ratings) != len(items):
        raise DataValidationError(f"mismatched lengths: items has {len(items)} entries but "
                                  f"ratings has {len(ratings)}")
    return items, ratings
