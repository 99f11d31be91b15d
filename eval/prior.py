"""A popularity prior re-ranked by a personal model: the scores a click ranker can pool across
users.

A weighted-ALS model's scores live on a per-user scale (a heavy user's p is long), so pooling
them across users (click AUC over logged impressions) ranks users rather than items, and their
order deep in the catalog's tail is noise. The prior ``log(1 + n_i)`` (n_i: how often item i
was shared, a federated histogram) orders the whole catalog on one scale for every user; the
personal term, each user's scores standardised over the catalog, re-ranks it:

    s(u, i) = log(1 + n_i) + w · (x_ui − mean_j x_uj) / sd_j x_uj.

w = 0 is the popularity policy; w is chosen on validation users from their held-out shares
(``choose_prior_weight``), never on the users a result is reported for.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

from ..datasets import Interactions
from .ctr import click_auc
from .splits import support_query_split

PRIOR_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)


def _weight(w, name="weight") -> float:
    if isinstance(w, bool) or not isinstance(w, numbers.Real) or not np.isfinite(w) or w < 0:
        raise ValueError(f"{name} must be a finite real number >= 0, got {w!r}")
    return float(w)


def _numeric(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {type(x).__name__} that does not convert "
                         "to numbers") from None


def _counts(item_counts, n_items: int) -> np.ndarray:
    c = _numeric(item_counts, "item_counts")
    if c.ndim != 1 or len(c) != n_items:
        raise ValueError(f"item_counts must be 1-D with one count per item ({n_items}), got "
                         f"shape {c.shape}")
    bad = np.flatnonzero(~np.isfinite(c) | (c < 0))
    if len(bad):
        raise ValueError(f"item_counts must be finite and >= 0; item {bad[0]} has {float(c[bad[0]])!r}")
    return c


def popularity_prior(scores, item_counts, weight: float) -> np.ndarray:
    """log(1 + n_i) + weight · (each row of ``scores`` standardised over its items).

    scores : (n_users, n_items) personal scores (e.g. ``model.score_all_items``);
    item_counts : (n_items,) share counts in the same item order. A row whose scores are all
    equal adds nothing (it is popularity). Returns a new float64 array.
    """
    S = _numeric(scores, "scores")
    if S.ndim != 2:
        raise ValueError(f"scores must be 2-D (users × items), got shape {S.shape}")
    if not np.isfinite(S).all():
        r, c = np.argwhere(~np.isfinite(S))[0]
        raise ValueError(f"scores must be finite; row {r}, item {c} is {float(S[r, c])!r}")
    prior = np.log1p(_counts(item_counts, S.shape[1]))
    w = _weight(weight)
    if w == 0.0 or S.shape[1] == 0:
        return np.broadcast_to(prior, S.shape).copy()
    return prior + w * _standardised(S)


def _standardised(S: np.ndarray) -> np.ndarray:
    """Each row minus its mean over the items, over its SD (a constant row becomes zeros)."""
    sd = S.std(axis=1, keepdims=True)
    return (S - S.mean(axis=1, keepdims=True)) / np.where(sd > 0, sd, 1.0)


def _held_out_pairs(model, validation: Interactions, negatives: int, rng):
    """(support, rows, cols, labels): each validation user's random half of shares as support;
    every held-out share of theirs (label 1) with ``negatives`` items they never shared, drawn
    uniformly from the model's catalog (label 0), as (row of support, model column) pairs."""
    support, query = support_query_split(validation, "random", 0.5,
                                         random_state=int(rng.integers(2**31)))
    catalog = pd.Index(model.item_ids_)
    n_items = len(catalog)
    rows, cols, labels = [], [], []
    for u in np.flatnonzero(query.counts()):
        raw = query.item_ids[query.items[query.indptr[u]:query.indptr[u + 1]]]
        pos = catalog.get_indexer(raw)
        pos = pos[pos >= 0]
        shared = set(catalog.get_indexer(validation.item_ids[
            validation.items[validation.indptr[u]:validation.indptr[u + 1]]]).tolist())
        neg = rng.integers(0, n_items, size=negatives * len(pos))
        neg = neg[~np.isin(neg, list(shared))]
        rows.append(np.full(len(pos) + len(neg), u))
        cols.append(np.concatenate([pos, neg]))
        labels.append(np.r_[np.ones(len(pos)), np.zeros(len(neg))])
    if not rows or not np.concatenate(labels).any():
        raise ValueError("validation has no user with two or more interactions on the model's "
                         "items; a prior weight needs held-out shares to be chosen")
    return support, np.concatenate(rows), np.concatenate(cols), np.concatenate(labels)


def choose_prior_weight(model, validation: Interactions, item_counts, weights=PRIOR_WEIGHTS, *,
                        negatives: int = 20, random_state=None) -> tuple[float, pd.DataFrame]:
    """The prior weight whose scores rank validation users' held-out shares best, pooled.

    Each validation user is reconstructed from a random half of their shares; their other half
    (positives) and ``negatives`` never-shared catalog items per positive are scored with
    ``popularity_prior`` at each weight; the pooled AUC picks the weight (the smallest on a tie).
    ``item_counts`` is in the model's item order (``model.item_ids_``); validation items the
    model does not know are left out. Returns (weight, table of weight → AUC).
    """
    if not isinstance(validation, Interactions):
        raise TypeError(f"validation must be an Interactions, got {type(validation).__name__}")
    if not hasattr(model, "item_ids_"):
        raise ValueError("model is not fitted; fit it before choosing a prior weight")
    grid = sorted({_weight(w, "each of weights") for w in weights})
    if not grid:
        raise ValueError("weights is empty; give at least one weight, e.g. PRIOR_WEIGHTS")
    if isinstance(negatives, bool) or not isinstance(negatives, numbers.Integral) or negatives < 1:
        raise ValueError(f"negatives must be an integer >= 1, got {negatives!r}")
    counts = _counts(item_counts, len(model.item_ids_))
    rng = np.random.default_rng(random_state)
    support, rows, cols, labels = _held_out_pairs(model, validation, int(negatives), rng)
    z = _standardised(np.asarray(model.score_all_items(*model.reconstruct_users(support)),
                                 dtype=float))[rows, cols]
    prior = np.log1p(counts)[cols]
    auc = [click_auc(prior + w * z, labels) for w in grid]
    table = pd.DataFrame({"weight": grid, "auc": auc})
    return float(grid[int(np.argmax(auc))]), table
