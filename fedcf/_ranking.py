"""Top-k ranking metrics with seen items filtered out (below the layers, like ``_topk``: the
estimators' ``score`` and ``fedcf.eval`` share it)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from ._topk import top_k
from .datasets import Interactions


def _check_same_maps(a: Interactions, b: Interactions, what: str):
    if a.n_users != b.n_users or a.n_items != b.n_items:
        raise ValueError(f"{what}: seen and relevant interactions must share users and items "
                         f"({a.n_users}×{a.n_items} vs {b.n_users}×{b.n_items})")


def ranking_metrics(score_fn, seen: Interactions | None, relevant: Interactions, k: int = 10,
                    *, chunk: int = 512, with_auc: bool = True) -> dict:
    """Top-k metrics with already-seen items filtered out.

    Parameters
    ----------
    score_fn : callable(dense_users: int array) -> (len(users), n_items) float array
        Scores of every item for the given users (rows in ``relevant``'s dense order).
    seen : Interactions or None
        Items each user already has (e.g. their training data); never recommended, never counted.
    relevant : Interactions
        Held-out items per user; users with none are skipped.
    k : int

    Returns
    -------
    dict with pooled means ``precision``, ``recall``, ``ndcg``, ``map``, ``hit_rate`` (@k) and
    ``auc`` (relevant vs. every other unseen item), ``n_users``, and ``per_user`` (a DataFrame).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if seen is not None:
        _check_same_maps(seen, relevant, "ranking_metrics")
    rel_csr = relevant.to_csr()
    seen_csr = seen.to_csr() if seen is not None else None
    users = np.flatnonzero(relevant.counts() > 0)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    rows = []
    for start in range(0, len(users), chunk):
        batch = users[start:start + chunk]
        scores = np.array(score_fn(batch), dtype=np.float64, copy=True)
        if scores.shape != (len(batch), relevant.n_items):
            raise ValueError(f"score_fn returned shape {scores.shape}, expected "
                             f"{(len(batch), relevant.n_items)}")
        if seen_csr is not None:
            s = seen_csr[batch]
            r_idx = np.repeat(np.arange(len(batch)), np.diff(s.indptr))
            scores[r_idx, s.indices] = -np.inf
        rel = rel_csr[batch].toarray() > 0
        if seen_csr is not None:  # an item both seen and held out cannot be recommended: drop it
            rel[r_idx, s.indices] = False
        n_rel = rel.sum(axis=1)
        kk = min(k, scores.shape[1])
        top = top_k(scores, kk)
        top_scores = np.take_along_axis(scores, top, axis=1)
        hits = np.take_along_axis(rel, top, axis=1) & np.isfinite(top_scores)
        n_hit = hits.sum(axis=1)
        dcg = hits @ discounts[:kk]
        idcg = np.array([discounts[:min(n, kk)].sum() for n in n_rel])
        prec_at = np.cumsum(hits, axis=1) / np.arange(1, kk + 1)
        ap = (prec_at * hits).sum(axis=1) / np.maximum(np.minimum(n_rel, kk), 1)
        row = {"user": batch, "n_relevant": n_rel, "precision": n_hit / k,
               "recall": n_hit / np.maximum(n_rel, 1), "ndcg": dcg / np.maximum(idcg, 1e-12),
               "map": ap, "hit_rate": (n_hit > 0).astype(np.float64)}
        if with_auc:
            cand = np.isfinite(scores)
            n_neg = cand.sum(axis=1) - n_rel
            # rank of each score among the user's candidates (average ranks for ties)
            ranks = rankdata(np.where(cand, scores, -np.inf), method="average", axis=1)
            pos_rank_sum = np.where(rel, ranks, 0.0).sum(axis=1)
            n_excluded = (~cand).sum(axis=1)  # -inf items rank lowest; shift them out
            pos_rank_sum -= n_rel * n_excluded
            auc = (pos_rank_sum - n_rel * (n_rel + 1) / 2) / np.maximum(n_rel * n_neg, 1)
            row["auc"] = np.where((n_rel > 0) & (n_neg > 0), auc, np.nan)
        rows.append(pd.DataFrame(row))
    per_user = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    per_user = per_user[per_user["n_relevant"] > 0] if len(per_user) else per_user
    out = {m: float(per_user[m].mean()) if len(per_user) else float("nan")
           for m in ("precision", "recall", "ndcg", "map", "hit_rate")}
    if with_auc:
        out["auc"] = float(np.nanmean(per_user["auc"])) if len(per_user) else float("nan")
    out["k"] = k
    out["n_users"] = int(len(per_user))
    out["per_user"] = per_user
    return out
