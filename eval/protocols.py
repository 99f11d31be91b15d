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


def recon_eval(model, users: Interactions, *, split: str = "random", support_fraction: float = 0.5,
               n_repeats: int = 200, random_state=0) -> dict:
    """RECONEVAL: reconstruct each (unseen) user from a support part, score on the query part.

    Uses the model's own reconstruction (exact ridge, or its k_r SGD steps for FedReconMF with
    reconstruction="sgd"; with out-of-catalog options, the user's local item rows too). Users
    with an empty query part add nothing; query items the model never saw are scored with the
    documented fallback (no item term) unless the model has UNK / adapter / local rows.
    """
    support, query = support_query_split(users, split, support_fraction, random_state)
    pred = model.recon_predict(support, query)
    return _report(model, query.user_ids[query.user_index()], query.values, pred, n_repeats,
                   random_state)


def random_embedding_eval(model, users: Interactions, *, scale: float = 0.1,
                          n_repeats: int = 200, random_state=0) -> dict:
    """Unseen users scored with a random N(0, scale²) embedding and zero bias (no reconstruction).

    Scored on the same query part as ``recon_eval`` with the same ``random_state``.
    """
    check_is_fitted(model, "item_factors_")
    _, query = support_query_split(users, "random", 0.5, random_state)
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
