"""Seeded synthetic rating populations: low-rank tastes, heavy-tailed activity and popularity."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .interactions import Interactions


@dataclass(frozen=True)
class SyntheticTruth:
    """Ground truth behind a synthetic population (dense ids of the returned Interactions).

    Parameters
    ----------
    user_factors, item_factors : ndarray
        The generating factors (dense ids of the returned Interactions).
    user_biases, item_biases : ndarray
    global_mean : float
    activity, popularity : ndarray
        Each user's and item's sampling weight.

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> inter, truth = make_synthetic_ratings(30, 10, 200, n_factors=3, random_state=0,
    ...                                       return_truth=True)
    >>> truth.user_factors.shape, truth.item_factors.shape
    ((30, 3), (10, 3))
    """

    user_factors: np.ndarray
    item_factors: np.ndarray
    user_biases: np.ndarray
    item_biases: np.ndarray
    global_mean: float
    activity: np.ndarray  # target ratings per user
    popularity: np.ndarray  # item sampling probabilities

    def expected_rating(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Noise-free rating before clipping and rounding."""
        return (self.global_mean + self.user_biases[users] + self.item_biases[items]
                + np.einsum("ij,ij->i", self.user_factors[users], self.item_factors[items]))


def heavy_tailed_counts(n: int, total: int, rng: np.random.Generator, *, sigma: float = 1.4,
                        min_count: int = 1, max_count: int | None = None) -> np.ndarray:
    """``n`` positive integers summing to about ``total``, log-normally spread (many 1-5, few 100s)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    raw = rng.lognormal(mean=0.0, sigma=sigma, size=n)
    counts = np.maximum(min_count, np.floor(raw / raw.sum() * total + rng.random(n))).astype(np.int64)
    if max_count is not None:
        counts = np.minimum(counts, max_count)
    return counts


def make_synthetic_ratings(
    n_users: int = 1000,
    n_items: int = 500,
    n_ratings: int = 50_000,
    *,
    n_factors: int = 8,
    activity_sigma: float = 1.4,
    popularity_exponent: float = 0.8,
    factor_scale: float = 1.0,
    bias_scale: float = 0.3,
    noise: float = 0.3,
    rating_scale: tuple[float, float] | None = (1.0, 5.0),
    round_ratings: bool = True,
    global_mean: float = 3.5,
    random_state: int | None = 0,
    return_truth: bool = False,
):
    """A low-rank explicit-rating population with heterogeneous users.

    Activity per user is log-normal (``activity_sigma``): with the defaults about a third of the
    users have at most 5 ratings and a few have hundreds. Items are drawn with Zipf-like popularity
    ``rank ** -popularity_exponent``. Ratings are ``mean + b_u + b_i + p_u·q_i + noise``, where the
    dot product has standard deviation ``factor_scale``; then clipped to ``rating_scale`` and
    rounded when ``round_ratings``. Timestamps grow per user by exponential gaps (a day on
    average), starting at a per-user join time.

    Returns ``Interactions`` (and :class:`SyntheticTruth` with ``return_truth=True``). The dense ids
    equal the raw ids (users ``0..n_users-1``, items ``0..n_items-1``), so truth arrays line up.
    """
    for name, val in (("n_users", n_users), ("n_items", n_items), ("n_ratings", n_ratings),
                      ("n_factors", n_factors)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if n_ratings > n_users * n_items:
        raise ValueError(f"n_ratings={n_ratings} exceeds n_users * n_items = {n_users * n_items}")
    rng = np.random.default_rng(random_state)
    cap = max(1, n_items // 2)
    activity = heavy_tailed_counts(n_users, n_ratings, rng, sigma=activity_sigma, max_count=cap)

    ranks = rng.permutation(n_items) + 1.0
    popularity = ranks ** -popularity_exponent
    popularity /= popularity.sum()

    # Sample with replacement (oversampled), drop repeated pairs, keep each user's first draws.
    users_parts, items_parts = [], []
    need = activity.copy()
    for _ in range(8):
        todo = np.flatnonzero(need > 0)
        if todo.size == 0:
            break
        draws = np.ceil(need[todo] * 1.3 + 2).astype(np.int64)
        u = np.repeat(todo, draws)
        it = rng.choice(n_items, size=u.size, p=popularity)
        users_parts.append(u)
        items_parts.append(it)
        allu = np.concatenate(users_parts)
        alli = np.concatenate(items_parts)
        key = allu * n_items + alli
        _, first = np.unique(key, return_index=True)
        first.sort()  # first occurrence in draw order
        allu, alli = allu[first], alli[first]
        # rank within user in draw order; keep up to activity[u]
        order = np.argsort(allu, kind="stable")
        allu, alli = allu[order], alli[order]
        starts = np.searchsorted(allu, np.arange(n_users))
        rank = np.arange(allu.size) - starts[allu]
        keep = rank < activity[allu]
        allu, alli = allu[keep], alli[keep]
        users_parts, items_parts = [allu], [alli]
        need = activity - np.bincount(allu, minlength=n_users)
    u, it = users_parts[0], items_parts[0]

    P = rng.normal(0.0, 1.0, (n_users, n_factors)) * np.sqrt(factor_scale / np.sqrt(n_factors))
    Q = rng.normal(0.0, 1.0, (n_items, n_factors)) * np.sqrt(factor_scale / np.sqrt(n_factors))
    bu = rng.normal(0.0, bias_scale, n_users)
    bi = rng.normal(0.0, bias_scale, n_items)
    truth = SyntheticTruth(P, Q, bu, bi, float(global_mean), activity, popularity)
    r = truth.expected_rating(u, it) + rng.normal(0.0, noise, u.size)
    if rating_scale is not None:
        r = np.clip(r, *rating_scale)
    if round_ratings:
        r = np.round(r)
        if rating_scale is not None:
            r = np.clip(r, *rating_scale)

    join = rng.uniform(0, 365 * 86400.0, n_users)
    gaps = rng.exponential(86400.0, u.size)
    order = np.argsort(u, kind="stable")
    u, it, r, gaps = u[order], it[order], r[order], gaps[order]
    cum = np.cumsum(gaps)
    starts = np.searchsorted(u, np.arange(n_users))
    base = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    ts = join[u] + cum - base[u]

    inter = Interactions._from_dense(u, it, r, np.round(ts), np.arange(n_users), np.arange(n_items),
                                     n_users)
    return (inter, truth) if return_truth else inter
