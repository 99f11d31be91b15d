"""A synthetic rating population described by a few numbers and built block by block, in any
process: what a cluster shard generates on its worker instead of receiving the data.

User u belongs to block ``u % BLOCKS``; a block's users, their items and ratings are a pure
function of (the population's parameters, the block). Any process can therefore build any set of
blocks and get the same ratings as any other — a Ray shard builds only its own, the driver never
holds the population. Ratings are whole stars (1–5), so sums over them are exact in float64 and
the global mean does not depend on the order of the blocks.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from ._files import fits_in_ram
from .interactions import Interactions

BLOCKS = 64


@dataclass(frozen=True)
class SyntheticPopulation:
    """Low-rank star ratings for ``n_users`` users, generated where they are needed.

    Parameters
    ----------
    n_users, n_items : int
        Population and catalog size (n_items ≥ 2).
    ratings_per_user : float, default 20
        Mean number of ratings per user before duplicates are removed (log-normally spread,
        at least 1, at most n_items).
    n_factors : int, default 8
        Rank of the true taste model.
    activity_sigma : float, default 1.0
        Spread of the log-normal activity (0: every user rates about the same number).
    popularity_exponent : float, default 0.8
        Item popularity ∝ rank^-exponent (0: uniform).
    noise : float, default 0.5
        Standard deviation of the rating noise before rounding.
    random_state : int, default 0

    Examples
    --------
    >>> from fedcf.datasets import SyntheticPopulation
    >>> spec = SyntheticPopulation(1000, 50, ratings_per_user=10, random_state=0)
    >>> spec.to_interactions().n_users
    1000
    """

    n_users: int
    n_items: int
    ratings_per_user: float = 20.0
    n_factors: int = 8
    activity_sigma: float = 1.0
    popularity_exponent: float = 0.8
    noise: float = 0.5
    random_state: int = 0

    remote_vocabulary = False  # raw ids are the dense ids: nothing to learn from a worker

    @property
    def known_users(self) -> int:
        """The number of users, known before any block is built."""
        return self.n_users

    def __post_init__(self):
        for name, low in (("n_users", 1), ("n_items", 2), ("n_factors", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"SyntheticPopulation.{name} must be an int >= {low}, got {v!r}")
        for name, low in (("ratings_per_user", 1.0), ("activity_sigma", 0.0),
                          ("popularity_exponent", 0.0), ("noise", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or \
                    not np.isfinite(v) or v < low:
                raise ValueError(f"SyntheticPopulation.{name} must be a finite number >= {low}, "
                                 f"got {v!r}")
        rs = self.random_state
        if isinstance(rs, bool) or not isinstance(rs, (int, np.integer)) or rs < 0:
            raise ValueError(f"SyntheticPopulation.random_state must be an int >= 0, got {rs!r}")

    def block_users(self, block: int) -> np.ndarray:
        return np.arange(block, self.n_users, BLOCKS, dtype=np.int64)

    def build_block(self, block: int):
        """(users, counts, items, values) of one block: users ascending, each user's items
        ascending and distinct, ratings in {1, …, 5}."""
        Q, b_i, cdf = _item_truth(self.random_state, self.n_items, self.n_factors,
                                  self.popularity_exponent)
        rng = np.random.default_rng([self.random_state, 0xB10C, block])
        users = self.block_users(block)
        n = len(users)
        raw = rng.lognormal(0.0, self.activity_sigma, n) / np.exp(self.activity_sigma ** 2 / 2)
        draws = np.clip(np.round(raw * self.ratings_per_user), 1, self.n_items).astype(np.int64)
        owner = np.repeat(np.arange(n), draws)
        item = np.minimum(np.searchsorted(cdf, rng.random(len(owner)), side="right"),
                          self.n_items - 1)
        key = np.sort(owner * self.n_items + item)  # distinct (user, item), sorted
        key = key[np.r_[True, key[1:] != key[:-1]]]
        owner, item = key // self.n_items, (key % self.n_items).astype(np.int32)
        P = rng.normal(0.0, 1.0 / np.sqrt(self.n_factors), (n, self.n_factors))
        b_u = rng.normal(0.0, 0.3, n)
        score = 3.5 + b_u[owner] + b_i[item] + np.einsum("ij,ij->i", P[owner], Q[item])
        values = np.clip(np.round(score + rng.normal(0.0, self.noise, len(owner))), 1.0, 5.0)
        return users, np.bincount(owner, minlength=n).astype(np.int64), item, values

    def build(self, blocks=None):
        """A CSR over *all* dense user ids (``indptr`` of n_users + 1) holding the users of
        ``blocks`` (default: every block); other users have no entries."""
        users, indptr, items, values = self.build_rows(blocks)
        counts = np.zeros(self.n_users, np.int64)
        counts[users] = np.diff(indptr)
        full = np.zeros(self.n_users + 1, np.int64)
        np.cumsum(counts, out=full[1:])
        return full, items, values  # users ascending: the rows keep their order

    def build_rows(self, blocks=None):
        """(users, indptr, items, values): the users of ``blocks`` (default: every block),
        ascending, and a CSR over them only — row r holds user ``users[r]`` — so its memory
        grows with those users, not with n_users (what a Ray shard keeps). User 64q + b of
        the j-th selected block is row q·(number of blocks) + j: the blocks' ratings are
        written straight into place, each block freed once written."""
        blocks = sorted({int(b) for b in (range(BLOCKS) if blocks is None else blocks)
                         if int(b) < min(self.n_users, BLOCKS)})
        self._check_memory(len(blocks))
        parts = [self.build_block(b) for b in blocks]
        n_rows = sum(len(p[0]) for p in parts)
        rows = [p[0] // BLOCKS * len(blocks) + j for j, p in enumerate(parts)]
        users, counts = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
        for r, (u, c, _, _) in zip(rows, parts):
            users[r], counts[r] = u, c
        indptr = np.zeros(n_rows + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        items = np.empty(int(indptr[-1]), np.int32)
        values = np.empty(int(indptr[-1]))
        for j, r in enumerate(rows):
            _, c, it, v = parts[j]
            dest = np.repeat(indptr[r], c) + _within(c)
            items[dest], values[dest] = it, v
            parts[j] = None  # freed as the result's pages fill
        return users, indptr, items, values

    def _check_memory(self, n_blocks: int):
        """Refuse up front, with the figure, a build that would not fit in this machine's RAM
        (about 40 bytes per rating while building, plus the item model and the user index)."""
        ratings = self.n_users * n_blocks / BLOCKS * min(self.ratings_per_user, self.n_items)
        need = 40.0 * ratings + 8.0 * self.n_items * (self.n_factors + 2) + 16.0 * self.n_users
        fits, gib = fits_in_ram(need)
        if not fits:
            raise MemoryError(f"building {n_blocks} of the {BLOCKS} blocks of {self!r} needs about "
                              f"{need / 2**30:.1f} GiB, more than this machine's "
                              f"{gib:.1f} GiB of RAM allows; lower n_users or "
                              "ratings_per_user, or fit with a RayExecutor on a cluster (each "
                              "shard builds only its own blocks)")

    def to_interactions(self) -> Interactions:
        """The whole population in this process (raw ids = dense ids)."""
        indptr, items, values = self.build()
        return Interactions(indptr, items, values, None, np.arange(self.n_users),
                            np.arange(self.n_items))

    def describe(self) -> dict:
        return {"kind": type(self).__name__, **asdict(self)}


def _within(counts) -> np.ndarray:
    """0, 1, …, c−1 for each count c, concatenated."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum())) - starts


@functools.lru_cache(maxsize=4)
def _item_truth(seed: int, n_items: int, k: int, exponent: float):
    rng = np.random.default_rng([seed, 0x17E3])
    Q = rng.normal(0.0, 1.0 / np.sqrt(k), (n_items, k))
    b_i = rng.normal(0.0, 0.3, n_items)
    weight = rng.permutation((np.arange(n_items) + 1.0) ** -exponent)
    cdf = np.cumsum(weight)
    return Q, b_i, cdf / cdf[-1]
