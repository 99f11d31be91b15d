"""Splits of interaction data: per-user by time, random over ratings, over users, support/query.

Every split returns ``Interactions`` that keep the source's user and item maps where that makes
sense (per-entry splits keep all users, some possibly empty), so models and metrics line up.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from ..datasets import Interactions
from ..models.base import user_keys


def _check_fractions(fractions) -> np.ndarray:
    f = np.asarray(fractions, dtype=np.float64)
    if f.ndim != 1 or len(f) < 2 or np.any(f < 0) or not np.isclose(f.sum(), 1.0):
        raise ValueError(f"fractions must be >= 2 non-negative numbers summing to 1, got {fractions!r}")
    return f


def _part_labels_by_position(pos: np.ndarray, n: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Label each entry of a group by its position ``pos`` among ``n``: held-out parts (all but the
    first) get floor(n × fraction) entries taken from the end, the first part keeps the rest."""
    sizes = np.floor(n[:, None] * fractions[None, 1:] + 1e-9).astype(np.int64)  # (m, parts-1)
    # boundaries from the end: last part occupies the last sizes[-1] positions, etc.
    tail = np.cumsum(sizes[:, ::-1], axis=1)[:, ::-1]  # entries at or after each held-out part
    labels = np.zeros(len(pos), dtype=np.int64)
    for k in range(tail.shape[1]):
        labels[pos >= (n - tail[:, k])] = k + 1
    return labels


def per_user_time_split(inter: Interactions, fractions=(0.8, 0.1, 0.1)) -> tuple[Interactions, ...]:
    """Split each user's ratings by time (oldest first) into parts, e.g. train/validation/test.

    A user with n ratings puts floor(n·f_k) of their newest ratings in each held-out part k (the
    last part newest) and the rest in the first part, so users with few ratings keep them all in
    training. Ties in time keep the stable (timestamp, item) order of ``Interactions``.
    Interactions without timestamps are refused (``ValueError``).
    """
    if inter.timestamps is None:
        raise ValueError("per_user_time_split needs timestamps; these interactions have none "
                         "(use random_split or user_split instead)")
    f = _check_fractions(fractions)
    counts = inter.counts()
    pos = np.arange(inter.nnz) - np.repeat(inter.indptr[:-1], counts)
    labels = _part_labels_by_position(pos, np.repeat(counts, counts), f)
    return tuple(inter.take(labels == k) for k in range(len(f)))


def random_split(inter: Interactions, fractions=(0.9, 0.1), random_state=None
                 ) -> tuple[Interactions, ...]:
    """Assign each rating to a part at random, exactly round(nnz × f) ratings per held-out part."""
    f = _check_fractions(fractions)
    rng = check_random_state(random_state)
    perm = rng.permutation(inter.nnz)
    sizes = np.floor(inter.nnz * f[1:] + 0.5).astype(np.int64)
    labels = np.zeros(inter.nnz, dtype=np.int64)
    start = inter.nnz - sizes.sum()
    for k, s in enumerate(sizes):
        labels[perm[start:start + s]] = k + 1
        start += s
    return tuple(inter.take(labels == k) for k in range(len(f)))


def user_split(inter: Interactions, fractions=(0.8, 0.1, 0.1), random_state=None
               ) -> tuple[Interactions, ...]:
    """Partition the users at random (e.g. 80/10/10 train/validation/test users).

    Each part is an Interactions over its own users (same item map). Held-out parts get
    round(n_users × f) users.
    """
    return tuple(inter.subset_users(part)
                 for part in user_split_indices(inter.n_users, fractions, random_state))


def user_split_indices(n_users: int, fractions=(0.8, 0.1, 0.1), random_state=None
                       ) -> tuple[np.ndarray, ...]:
    """The sorted dense user ids of each part of ``user_split`` (for a server that knows only
    how many users there are, e.g. the Flower ServerApp)."""
    f = _check_fractions(fractions)
    perm = check_random_state(random_state).permutation(n_users)
    sizes = np.floor(n_users * f[1:] + 0.5).astype(np.int64)
    cuts = np.r_[0, n_users - sizes.sum(), n_users - sizes.sum() + np.cumsum(sizes)]
    return tuple(np.sort(perm[cuts[k]:cuts[k + 1]]) for k in range(len(f)))


def support_query_split(inter: Interactions, mode: str = "random", support_fraction: float = 0.5,
                        random_state=None) -> tuple[Interactions, Interactions]:
    """Split each user's data into a support set (for reconstruction) and a query set.

    Parameters
    ----------
    inter : Interactions
    mode : {"random", "time", "none"}
        "time": the oldest ceil(n·support_fraction) ratings are support, the rest query;
        "random": a random ceil(n·support_fraction) of each user's ratings are support;
        "none": support and query are both the whole data (the paper's NO SPLIT setting).
        A user with one rating puts it in the support set under "time" and "random".
    support_fraction : float in (0, 1]
    random_state : int, Generator or None

    Returns
    -------
    support, query : Interactions
    """
    if mode not in ("time", "random", "none"):
        raise ValueError(f"mode must be 'time', 'random' or 'none', got {mode!r}")
    if not 0.0 < support_fraction <= 1.0:
        raise ValueError(f"support_fraction must be in (0, 1], got {support_fraction}")
    if mode == "none":
        return inter, inter
    counts = inter.counts()
    n_s = np.ceil(counts * support_fraction - 1e-9).astype(np.int64)
    if mode == "time":
        if inter.timestamps is None:
            raise ValueError("mode='time' needs timestamps; these interactions have none")
        pos = np.arange(inter.nnz) - np.repeat(inter.indptr[:-1], counts)
    else:
        rng = check_random_state(random_state)
        keys = rng.random(inter.nnz)
        users = inter.user_index()
        order = np.lexsort((keys, users))
        pos = np.empty(inter.nnz, np.int64)
        pos[order] = np.arange(inter.nnz) - np.repeat(inter.indptr[:-1], counts)
    support = pos < np.repeat(n_s, counts)
    return inter.take(support), inter.take(~support)


def device_support_query_split(inter: Interactions, support_fraction: float = 0.5, seed: int = 0
                               ) -> tuple[Interactions, Interactions]:
    """A random support/query split that each device can draw on its own: user u's ratings are
    shuffled by a stream seeded with (seed, key of u's raw id), so a user's split does not depend
    on which other users are in ``inter`` (federated ReconEval: each evaluation client splits its
    own ratings; the simulation draws the same split). ceil(n·support_fraction) ratings go to the
    support set, as in ``support_query_split``."""
    if not 0.0 < support_fraction < 1.0:
        raise ValueError(f"support_fraction must be in (0, 1), got {support_fraction}")
    counts = inter.counts()
    keys = user_keys(inter.user_ids)
    rank = np.empty(inter.nnz, np.int64)
    for u in np.flatnonzero(counts):
        rank[inter.indptr[u]:inter.indptr[u + 1]] = np.random.default_rng(
            [int(seed), int(keys[u])]).permutation(int(counts[u]))
    n_s = np.ceil(counts * support_fraction - 1e-9).astype(np.int64)
    support = rank < np.repeat(n_s, counts)
    return inter.take(support), inter.take(~support)
