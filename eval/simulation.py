"""A simulated expression-recommendation population (GIFs, stickers, ...) with a ground-truth
click model, for rehearsing the paper's deployment offline.

Generative story (all seeded and vectorized; memory is O(users·K + items·K + shares)):

- The catalog has several expression types, each with its own size (hundreds to tens of
  thousands). Item i has a latent vector q_i (K_true dims), a type, and a popularity weight
  drawn from a heavy tail (``pop_i ∝ rank^-popularity_exponent`` in a random order).
- User u has a latent taste p_u, a preference over types, an activity level (number of shares
  over the training period, log-normal so many users share once or twice) and an availability
  (the chance of being reachable in a round: charging, idle, on Wi-Fi).
- Affinity a(u, i) = taste_scale · p_u·q_i + log pop_i + log typepref_u[type_i].
- Shares: each share of u picks item i with probability ∝ exp(a(u, i)) (sampled by
  sampling-importance-resampling from ``candidates`` popularity draws per share, so no
  users × items matrix is ever formed).
- Clicks on a shown slate: P(click | u, i, position k) = position_bias[k] · σ(a(u, i) − mean log pop
  + click_bias) — the ground truth every CTR estimate is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..datasets import Interactions
from ..datasets.synthetic import heavy_tailed_counts

DEFAULT_TYPES = {"gif": 2000, "sticker": 1500, "emoji_kitchen": 300}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class ExpressionPopulation:
    """Ground truth of a simulated population; build it with :func:`make_expression_population`."""

    user_factors: np.ndarray  # (n_users, K_true)
    item_factors: np.ndarray  # (n_items, K_true)
    item_type: np.ndarray  # (n_items,) int
    type_names: tuple
    log_popularity: np.ndarray  # (n_items,)
    log_type_pref: np.ndarray  # (n_users, n_types)
    activity: np.ndarray  # (n_users,) shares in the training period
    availability: np.ndarray  # (n_users,) per-round probability of being reachable
    taste_scale: float
    click_bias: float
    position_bias: np.ndarray  # (slate_size,)
    seed: int

    @property
    def n_users(self) -> int:
        return len(self.user_factors)

    @property
    def n_items(self) -> int:
        return len(self.item_factors)

    def affinity(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """a(u, i) for aligned arrays of users and items (or a broadcastable (m, k) item array)."""
        users = np.asarray(users)
        items = np.asarray(items)
        if items.ndim == 2:
            dot = np.einsum("uk,usk->us", self.user_factors[users], self.item_factors[items])
            tp = np.take_along_axis(self.log_type_pref[users], self.item_type[items], axis=1)
        else:
            dot = np.einsum("uk,uk->u", self.user_factors[users], self.item_factors[items])
            tp = self.log_type_pref[users, self.item_type[items]]
        return self.taste_scale * dot + self.log_popularity[items] + tp

    def click_probability(self, users, items, positions) -> np.ndarray:
        """Ground-truth P(click) of showing ``items`` to ``users`` at slate ``positions``."""
        a = self.affinity(users, items) - self.log_popularity.mean()
        return self.position_bias[np.asarray(positions)] * _sigmoid(a + self.click_bias)

    def sample_shares(self, users: np.ndarray, counts: np.ndarray, *, candidates: int = 16,
                      random_state=None, chunk: int = 200_000) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``counts[j]`` shares for ``users[j]`` from softmax(a(u, ·)) (SIR, vectorized)."""
        rng = np.random.default_rng(random_state)
        u_all = np.repeat(np.asarray(users), np.asarray(counts))
        pop = np.exp(self.log_popularity - self.log_popularity.max())
        pop /= pop.sum()
        out = np.empty(len(u_all), np.int64)
        for s in range(0, len(u_all), chunk):
            u = u_all[s:s + chunk]
            cand = rng.choice(self.n_items, size=(len(u), candidates), p=pop)
            # importance weight of a popularity draw under softmax(a): exp(a − log pop)
            w = self.affinity(u, cand) - self.log_popularity[cand]
            pick = np.argmax(w + rng.gumbel(size=w.shape), axis=1)
            out[s:s + chunk] = cand[np.arange(len(u)), pick]
        return u_all, out

    def shares(self, users=None, *, random_state=None) -> Interactions:
        """Each user's training-period shares as implicit Interactions (strength = share count),
        over the full user and item id ranges."""
        users = np.arange(self.n_users) if users is None else np.asarray(users)
        u, i = self.sample_shares(users, self.activity[users], random_state=random_state)
        key = u * self.n_items + i
        uk, cnt = np.unique(key, return_counts=True)
        return Interactions._from_dense(uk // self.n_items, uk % self.n_items, cnt.astype(float),
                                        None, np.arange(self.n_users), np.arange(self.n_items),
                                        self.n_users)

    def available(self, round_idx: int, random_state=None) -> np.ndarray:
        """Users reachable in a round (independent draws per round)."""
        rng = np.random.default_rng([self.seed, round_idx, 0xA7A1])
        return np.flatnonzero(rng.random(self.n_users) < self.availability)


def expression_types(n_items: int) -> dict:
    """A catalog of ``n_items`` split over gif / sticker / emoji_kitchen in the default
    proportions (53 / 39 / 8 %), at least one item of each type.

    Examples
    --------
    >>> expression_types(3800)
    {'gif': 2014, 'sticker': 1482, 'emoji_kitchen': 304}
    """
    sizes = np.maximum(1, np.round(np.array([0.53, 0.39, 0.08]) * n_items)).astype(int)
    return {"gif": int(sizes[0]), "sticker": int(sizes[1]), "emoji_kitchen": int(sizes[2])}


def make_expression_population(n_users: int = 50_000, types: dict | None = None, *,
                               n_factors: int = 8, taste_scale: float = 1.5,
                               popularity_exponent: float = 1.0, mean_shares: float = 6.0,
                               activity_sigma: float = 1.5, availability=(2.0, 8.0),
                               position_bias=(1.0, 0.7, 0.5, 0.35, 0.25), click_bias: float = -9.0,
                               random_state: int = 0) -> ExpressionPopulation:
    """Build a population. ``types`` maps type name → catalog size (default
    {"gif": 2000, "sticker": 1500, "emoji_kitchen": 300}); ``availability`` are Beta(a, b)
    parameters of the per-round reachability (mean a/(a+b) = 0.2 by default); activity is
    log-normal with the given mean shares per user (at least one share each)."""
    if n_users < 1:
        raise ValueError(f"n_users must be positive, got {n_users}")
    types = dict(DEFAULT_TYPES if types is None else types)
    if not types or any(int(v) < 1 for v in types.values()):
        raise ValueError(f"types must map names to positive catalog sizes, got {types!r}")
    rng = np.random.default_rng(random_state)
    names = tuple(types)
    sizes = np.array([int(types[t]) for t in names])
    n_items = int(sizes.sum())
    item_type = np.repeat(np.arange(len(names)), sizes)
    scale = 1.0 / np.sqrt(n_factors)
    P = rng.normal(0.0, 1.0, (n_users, n_factors)) * np.sqrt(scale)
    Qf = rng.normal(0.0, 1.0, (n_items, n_factors)) * np.sqrt(scale)
    ranks = rng.permutation(n_items) + 1.0
    log_pop = -popularity_exponent * np.log(ranks)
    log_pop -= np.log(np.exp(log_pop).sum())
    type_pref = rng.dirichlet(np.full(len(names), 1.0), size=n_users)
    activity = heavy_tailed_counts(n_users, int(mean_shares * n_users), rng, sigma=activity_sigma)
    avail = rng.beta(*availability, size=n_users)
    return ExpressionPopulation(P, Qf, item_type, names, log_pop, np.log(type_pref + 1e-12),
                                activity, avail, float(taste_scale), float(click_bias),
                                np.asarray(position_bias, float), int(random_state))
