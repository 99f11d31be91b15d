"""CTR measurement on a simulated population: online A/B-style tests of slates, logged
impressions with exact propensities for off-policy evaluation, and click AUC."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from .simulation import ExpressionPopulation


def online_ctr_test(pop: ExpressionPopulation, slates: dict, users: np.ndarray, *,
                    baseline: str = "popularity", sessions: int = 10, n_bootstrap: int = 1000,
                    alpha: float = 0.05, random_state=0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Show each user their slate in ``sessions`` sessions per policy and draw clicks from the
    ground-truth click model (users are the randomization unit, as in an A/B test).

    slates : {policy name: (len(users), k) item array}. Returns (per-policy table with sampled
    CTR, its bootstrap interval and the exact expected CTR; lift table of every policy over
    ``baseline``: lift = CTR / CTR_baseline − 1 with a paired bootstrap interval over users).
    """
    rng = np.random.default_rng(random_state)
    users = np.asarray(users)
    n = len(users)
    boot = rng.integers(0, n, size=(n_bootstrap, n))
    clicks, expected = {}, {}
    for name, slate in slates.items():
        slate = np.asarray(slate)
        if slate.shape[0] != n:
            raise ValueError(f"slates[{name!r}] has {slate.shape[0]} rows for {n} users")
        pos = np.broadcast_to(np.arange(slate.shape[1]), slate.shape)
        prob = pop.click_probability(users, slate, pos)
        expected[name] = prob.mean(axis=1)
        clicks[name] = rng.binomial(sessions, prob).mean(axis=1) / sessions
    rows = []
    for name in slates:
        c = clicks[name]
        b = c[boot].mean(axis=1)
        rows.append({"policy": name, "ctr": float(c.mean()),
                     "ctr_low": float(np.quantile(b, alpha / 2)),
                     "ctr_high": float(np.quantile(b, 1 - alpha / 2)),
                     "ctr_expected": float(expected[name].mean()), "users": n})
    table = pd.DataFrame(rows).set_index("policy")
    lifts = []
    if baseline in slates:
        cb = clicks[baseline][boot].mean(axis=1)
        for name in slates:
            if name == baseline:
                continue
            ratio = clicks[name][boot].mean(axis=1) / np.maximum(cb, 1e-12)
            base_ctr = clicks[baseline].mean()  # lift is undefined (NaN) when it drew no click
            lifts.append({"policy": name, "baseline": baseline,
                          "lift": float(clicks[name].mean() / base_ctr - 1) if base_ctr > 0
                          else float("nan"),
                          "lift_low": float(np.quantile(ratio, alpha / 2) - 1),
                          "lift_high": float(np.quantile(ratio, 1 - alpha / 2) - 1),
                          "lift_expected": float(expected[name].mean()
                                                 / expected[baseline].mean() - 1)})
    return table, pd.DataFrame(lifts).set_index("policy") if lifts else pd.DataFrame()


def simulate_log(pop: ExpressionPopulation, users: np.ndarray, n_impressions: int, *,
                 policy: str = "uniform", slate_size: int = 3, scores=None, epsilon: float = 0.1,
                 temperature: float = 1.0, random_state=0) -> pd.DataFrame:
    """Logged impressions of a logging policy, with exact propensities.

    Each impression: a user drawn uniformly from ``users``, a position drawn uniformly from the
    slate, and an item drawn independently per position by the logging policy (so the propensity
    of the shown item at that position is exact):
      - "uniform": 1 / n_items;
      - "epsilon": with prob 1 − ε the position's greedy item (the k-th best of a context-free
        ``scores`` vector), else uniform — propensity (1 − ε)·1[greedy] + ε / n_items;
      - "softmax": softmax(scores / temperature), context-free.
    Returns columns context (user), position, action, reward, propensity, expected_reward.
    """
    rng = np.random.default_rng(random_state)
    n_items = pop.n_items
    u = rng.choice(np.asarray(users), size=n_impressions)
    k = rng.integers(0, slate_size, size=n_impressions)
    if policy == "uniform":
        a = rng.integers(0, n_items, size=n_impressions)
        prop = np.full(n_impressions, 1.0 / n_items)
    elif policy in ("epsilon", "softmax"):
        if scores is None or len(scores) != n_items:
            raise ValueError(f"policy {policy!r} needs context-free scores for all {n_items} items")
        scores = np.asarray(scores, float)
        if policy == "epsilon":
            greedy = np.argsort(-scores, kind="stable")[:slate_size]
            explore = rng.random(n_impressions) < epsilon
            a = np.where(explore, rng.integers(0, n_items, size=n_impressions), greedy[k])
            prop = (1 - epsilon) * (a == greedy[k]) + epsilon / n_items
        else:
            z = scores / temperature
            pr = np.exp(z - z.max())
            pr /= pr.sum()
            a = rng.choice(n_items, size=n_impressions, p=pr)
            prop = pr[a]
    else:
        raise ValueError(f"policy must be 'uniform', 'epsilon' or 'softmax', got {policy!r}")
    q = pop.click_probability(u, a, k)
    r = (rng.random(n_impressions) < q).astype(float)
    return pd.DataFrame({"context": u, "position": k, "action": a, "reward": r,
                         "propensity": prop, "expected_reward": q})


def slate_target_probs(log: pd.DataFrame, slates: np.ndarray, user_row: dict | np.ndarray
                       ) -> np.ndarray:
    """π_e(logged action | user, position) for a deterministic slate policy: 1 when the target
    shows the logged action at the logged position to that user, else 0. ``user_row`` maps a
    user id to its row in ``slates`` (an array indexed by user id works too)."""
    rows = np.asarray([user_row[u] for u in log["context"]]) if isinstance(user_row, dict) \
        else np.asarray(user_row)[log["context"].to_numpy()]
    shown = slates[rows, log["position"].to_numpy()]
    return (shown == log["action"].to_numpy()).astype(float)


def click_auc(scores: np.ndarray, clicks: np.ndarray) -> float:
    """AUC of predicted click scores against observed clicks (Mann-Whitney, ties averaged)."""
    scores = np.asarray(scores, float)
    clicks = np.asarray(clicks) > 0
    n_pos, n_neg = clicks.sum(), (~clicks).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(scores)
    return float((r[clicks].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def expected_click_auc(scores: np.ndarray, click_probability: np.ndarray) -> float:
    """The click AUC with every impression counted as a click with weight p and a non-click
    with weight 1 − p (p its exact click probability): the AUC without the noise of drawing the
    clicks, for simulations that know p. Ties count one half; with p in {0, 1} it equals
    ``click_auc``."""
    try:
        scores = np.asarray(scores, float)
        p = np.asarray(click_probability, float)
    except (TypeError, ValueError):
        raise ValueError("scores and click_probability must be numeric") from None
    if scores.shape != p.shape or scores.ndim != 1:
        raise ValueError(f"scores and click_probability must be 1-D of one length, got shapes "
                         f"{scores.shape} and {p.shape}")
    if not (np.isfinite(scores).all() and np.isfinite(p).all()) or ((p < 0) | (p > 1)).any():
        raise ValueError("scores must be finite and click_probability in [0, 1]")
    _, group = np.unique(scores, return_inverse=True)
    pos = np.bincount(group, weights=p)
    neg = np.bincount(group, weights=1.0 - p)
    if pos.sum() <= 0 or neg.sum() <= 0:
        return float("nan")
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))
