"""The paper's evaluation protocols.

- ``standard_eval`` (STANDARDEVAL, seen users): the model predicts held-out ratings of users it was
  fitted on (FedRecon reconstructs them from their fit data; stateful models use stored rows).
- ``recon_eval`` (RECONEVAL, unseen users): each held-out user reconstructs local parameters from
  a support part of their ratings and is scored on the query part.
- ``random_embedding_eval``: unseen users with a randomly initialized embedding (the paper's
  "STANDARDEVAL (UNSEEN)" row) — what happens without reconstruction.

Each returns pooled metrics, per-user metrics and the paper's bootstrap (repeat: sample 50 test
users, pool their ratings, compute the metrics; report mean and std over repeats).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from ..datasets import Interactions
from .metrics import per_user_rating_metrics, rating_metrics, round_to_scale
from .splits import device_support_query_split, support_query_split


def bootstrap(users, y_true, y_pred, rating_scale=None, *, n_repeats=200, clients=50,
              random_state=0) -> dict:
    """Mean and std over repeats of metrics on ``clients`` users sampled without replacement."""
    users = np.asarray(users)
    uniq, inv = np.unique(users, return_inverse=True)
    n_u = len(uniq)
    if n_u == 0:
        raise ValueError("bootstrap needs at least one user")
    se = (np.asarray(y_true) - np.asarray(y_pred)) ** 2
    hit = (np.abs(round_to_scale(y_pred, rating_scale) - np.asarray(y_true)) < 1e-9).astype(float)
    se_u = np.bincount(inv, weights=se, minlength=n_u)
    hit_u = np.bincount(inv, weights=hit, minlength=n_u)
    n_per = np.bincount(inv, minlength=n_u).astype(float)
    rng = np.random.default_rng(random_state)
    k = min(clients, n_u)
    draws = np.array([rng.choice(n_u, size=k, replace=False) for _ in range(n_repeats)])
    rmse = np.sqrt(se_u[draws].sum(1) / n_per[draws].sum(1))
    acc = hit_u[draws].sum(1) / n_per[draws].sum(1)
    return {"rmse_mean": float(rmse.mean()), "rmse_std": float(rmse.std()),
            "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std()),
            "n_repeats": n_repeats, "clients": k}


def _report(model, users, y, pred, n_repeats, random_state):
    scale = model.rating_scale_
    out = rating_metrics(y, pred, scale)
    out["n_users"] = int(len(np.unique(users)))
    out["n_ratings"] = int(len(y))
    out["bootstrap"] = bootstrap(users, y, pred, scale, n_repeats=n_repeats,
                                 random_state=random_state)
    out["per_user"] = per_user_rating_metrics(users, y, pred, scale)
    return out


def standard_eval(model, test: Interactions, *, n_repeats: int = 200, random_state=0) -> dict:
    """STANDARDEVAL: score held-out ratings of users the model was fitted on.

    ``test`` must use the fit data's user map (e.g. a part of ``per_user_time_split``).
    """
    check_is_fitted(model, "item_factors_")
    users = pd.Index(model.user_ids_).get_indexer(pd.Index(test.user_ids))
    if np.any(users < 0):
        bad = test.user_ids[users < 0][0]
        raise ValueError(f"standard_eval is for users seen in fit; user {bad!r} was not — use "
                         "recon_eval for unseen users")
    pred = model.predict(test)
    return _report(model, test.user_ids[test.user_index()], test.values, pred, n_repeats,
                   random_state)


def check_k(k) -> int:
    """The cut-off of ranking metrics: an integer >= 1."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (the cut-off of ranking metrics) must be an integer >= 1, got {k!r}")
    return int(k)


def known_user_eval(model, test: pd.DataFrame, *, history: pd.DataFrame | None = None,
                    k: int = 10) -> dict:
    """STANDARDEVAL from files: held-out rows (``test``: user, item[, rating] columns) of users
    the model knows — from its stored user rows, or, for a model that keeps none (FedRecon),
    reconstructed from their training rows ``history`` (default: the fit data a model fitted
    in this process holds; a loaded one needs ``history``), as their devices would. Rating models
    give RMSE, MAE and accuracy; implicit ones precision, recall and NDCG at ``k`` with the
    users' history filtered. Rows of unknown users (or, for implicit models, items) are left out.
    """
    from .._ranking import ranking_metrics
    from ..models.base import RankingScoreMixin

    check_is_fitted(model, "item_factors_")
    check_k(k)
    implicit = isinstance(model, RankingScoreMixin)  # every implicit-feedback estimator
    test_inter, users, seen = _known_users(model, test, history, implicit)
    if implicit:
        res = ranking_metrics(users, seen, test_inter, k, with_auc=False)
        out = {f"{m}@{k}": res[m] for m in ("precision", "recall", "ndcg")}
    else:
        out = rating_metrics(test_inter.values, model.predict_entries(test_inter, *users),
                             model.rating_scale_)
    return {**out, "users": test_inter.n_users, "rows": test_inter.nnz}


def _known_users(model, test, history, implicit):
    """(test rows as Interactions, the users — (P, c) of a rating model, a score_fn of an
    implicit one —, their seen items or None) of ``known_user_eval``."""
    if getattr(model, "user_factors_", None) is not None:
        known = model._user_index(test["user"].unique())
        users = np.sort(known[known >= 0])
        scored = (lambda b: model._dense_user_scores(users[b])) if implicit else \
            model._user_params(users)
        seen = model._seen_interactions().subset_users(users) if implicit else None
        user_ids = model.user_ids_[users]
    elif history is not None or model.interactions_ is not None:
        if history is None:  # a model fitted in this process: its users' fit data
            history = model.interactions_.to_dataframe()
        hist = history[model._item_index(history["item"]) >= 0]
        user_ids = np.array(sorted(set(hist["user"]) & set(test["user"])), dtype=object)
        hist = hist[hist["user"].isin(user_ids)]
        seen = Interactions.from_pairs(hist[["user", "item"]], None, rating_col=None,
                                       user_catalog=user_ids, item_catalog=model.item_ids_,
                                       duplicates="last")
        own = Interactions.coerce(hist, user_catalog=user_ids, item_catalog=model.item_ids_,
                                  rating_col="rating" if "rating" in hist else None,
                                  duplicates="last")
        scored = model._held_out_scores(own) if implicit else model.reconstruct_users(own)
    else:
        raise ValueError(f"{type(model).__name__} keeps no user data; evaluating its known users "
                         "needs their training rows as history (or use recon_eval)")
    test = test[test["user"].isin(set(user_ids))]
    if implicit:
        test = test[model._item_index(test["item"]) >= 0]
    if len(test) == 0:
        raise ValueError("no test row belongs to a user the model knows (or has a history)")
    test_inter = Interactions.coerce(
        test, user_catalog=user_ids, rating_col="rating" if "rating" in test else None,
        item_catalog=model.item_ids_ if implicit else None, duplicates="last")
    return test_inter, scored, seen


def recon_eval(model, users: Interactions, *, split: str = "random", support_fraction: float = 0.5,
               n_repeats: int = 200, random_state=0) -> dict:
    """RECONEVAL: reconstruct each (unseen) user from a support part, score on the query part.

    Uses the model's own reconstruction (exact ridge, or its k_r SGD steps for FedReconMF with
    reconstruction="sgd"; with out-of-catalog options, the user's local item rows too). Users
    with an empty query part add nothing; query items the model never saw are scored with the
    documented fallback (no item term) unless the model has UNK / adapter / local rows.
    ``users``: an Interactions or anything ``Interactions.coerce`` takes (a DataFrame with
    user, item and rating columns).
    """
    users = _eval_users(users, split, support_fraction)
    support, query = support_query_split(users, split, support_fraction, random_state)
    pred = model.recon_predict(support, query)
    return _report(model, query.user_ids[query.user_index()], query.values, pred, n_repeats,
                   random_state)


def _eval_users(users, split: str, support_fraction) -> Interactions:
    """The users to evaluate as Interactions; a support fraction that leaves no query part
    (1 with a split) is named here, not found later as "no ratings to score"."""
    users = Interactions.coerce(users)
    if split != "none" and isinstance(support_fraction, (int, float, np.number)) and \
            not isinstance(support_fraction, bool) and support_fraction >= 1.0:
        raise ValueError(f"support_fraction={support_fraction} leaves no query ratings to score "
                         f"with split={split!r}; use a fraction in (0, 1), or split='none' to "
                         "score on the support set itself")
    return users


def random_embedding_eval(model, users: Interactions, *, scale: float = 0.1,
                          n_repeats: int = 200, random_state=0) -> dict:
    """Unseen users scored with a random N(0, scale²) embedding and zero bias (no reconstruction).

    Scored on the same query part as ``recon_eval`` with the same ``random_state``.
    """
    check_is_fitted(model, "item_factors_")
    _, query = support_query_split(_eval_users(users, "random", 0.5), "random", 0.5,
                                   random_state)
    rng = np.random.default_rng(random_state)
    K = model.item_factors_.shape[1]
    P = (rng.standard_normal((query.n_users, K)) * scale).astype(model.item_factors_.dtype)
    c = np.zeros(query.n_users, model.item_factors_.dtype)
    pred = model.predict_entries(query, P, c)
    return _report(model, query.user_ids[query.user_index()], query.values, pred, n_repeats,
                   random_state)


def recon_sums(model, users: Interactions, *, support_fraction: float = 0.5, seed: int = 0) -> dict:
    """What one evaluation client (or a device holding several users) reports in federated
    ReconEval: sums over its query ratings — squared and absolute errors, rounded hits, count —
    after reconstructing each user on its support set (``device_support_query_split``). The
    server adds the reports of all clients and calls ``finish_recon_sums``."""
    support, query = device_support_query_split(users, support_fraction, seed)
    pred = model.recon_predict(support, query)
    err = query.values - pred
    hit = np.abs(round_to_scale(pred, model.rating_scale_) - query.values) < 1e-9
    return {"sse": float(err @ err), "sae": float(np.abs(err).sum()), "hits": int(hit.sum()),
            "n": int(query.nnz), "users": int(np.count_nonzero(query.counts()))}


def finish_recon_sums(parts) -> dict:
    """RMSE, MAE and accuracy over the query ratings of all reports of ``recon_sums``."""
    tot = {k: sum(p[k] for p in parts) for k in ("sse", "sae", "hits", "n", "users")}
    n = max(tot["n"], 1)
    return {"rmse": float(np.sqrt(tot["sse"] / n)), "mae": tot["sae"] / n,
            "accuracy": tot["hits"] / n, "n_ratings": tot["n"], "n_users": tot["users"]}


def federated_recon_eval(model, users: Interactions, *, support_fraction: float = 0.5,
                         seed: int = 0) -> dict:
    """RECONEVAL as a federated evaluation computes it, in this process: every user splits its
    own ratings (``device_support_query_split``), reconstructs, and reports sums; the same
    figures a Flower deployment's evaluation round gives for these users and this model."""
    check_is_fitted(model, "item_factors_")
    return finish_recon_sums([recon_sums(model, users, support_fraction=support_fraction,
                                         seed=seed)])
