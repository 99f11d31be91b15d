"""The population of a Ray run as the driver sees it: sizes, counts and value sums; the ratings
stay in the shard actors (``executor``, a bound RayExecutor, runs them)."""

from __future__ import annotations

import numpy as np

from ..round.partials import REDUCE_GROUPS
from .ray_shard import START_TIMEOUT


class RemotePopulation:
    """A population that lives in the shard actors of a run (built there from its spec): what
    the driver knows of it is its sizes, each user's number of ratings (the sampling frame)
    and the sums a fit needs of the ratings — never a rating. ``fit`` takes it where it takes
    an Interactions; anything that needs users' ratings on the driver (evaluating seen users
    after the fit) builds those users' blocks from the spec here."""

    timestamps = None
    holds_ratings = True  # (by building a user's block from the spec)

    def __init__(self, source, executor):
        self.source, self.executor = source, executor
        self._local = None  # the whole population, built here when a caller needs every user
        try:
            if source.remote_vocabulary:  # the ids, from a worker's read
                self.user_ids, self.item_ids = executor.ray.get(
                    executor.actors[0].vocabulary.remote(), timeout=START_TIMEOUT)
            else:  # raw ids = dense ids
                self.user_ids = np.arange(source.n_users)
                self.item_ids = np.arange(source.n_items)
            self.n_users, self.n_items = len(self.user_ids), len(self.item_ids)
            if executor.spec.n_shards > self.n_users:
                raise ValueError(f"n_shards={executor.spec.n_shards} is more than the "
                                 f"{self.n_users} users; use fewer shards")
            parts = executor.ray.get([a.describe.remote() for a in executor.actors],
                                     timeout=START_TIMEOUT)
        except BaseException:
            executor.close()
            raise
        self._counts = np.zeros(self.n_users, np.int64)
        blocks = []
        for users, counts, stats in parts:
            self._counts[users] = counts
            blocks.extend(stats)
        executor.counts = self._counts
        blocks.sort()  # block order: the sums do not depend on the shard count
        self.nnz = sum(b[1] for b in blocks)
        total, squares = sum(b[2] for b in blocks), sum(b[3] for b in blocks)
        self._stats = {"mean": total / self.nnz, "mean_sq": squares / self.nnz,
                       "min": min(b[4] for b in blocks), "max": max(b[5] for b in blocks)}

    def __repr__(self):
        return (f"RemotePopulation({self.source!r}: {self.n_users} users, {self.n_items} items, "
                f"{self.nnz} ratings in {self.executor.spec.n_shards} Ray shards)")

    def __getstate__(self):  # a fitted model keeps this; the run's actors do not travel
        return {"source": self.source, "executor": _Closed(self.executor.spec),
                "user_ids": self.user_ids, "item_ids": self.item_ids, "n_users": self.n_users,
                "n_items": self.n_items, "_counts": self._counts, "nnz": self.nnz,
                "_stats": self._stats, "_local": None}

    def counts(self) -> np.ndarray:
        return self._counts

    def value_stats(self) -> dict:
        return dict(self._stats)

    def subset_users(self, users):
        """The given users' ratings, built here from the spec (their blocks only)."""
        from ...datasets import Interactions

        users = np.asarray(users, np.int64)
        if users.size and (users.min() < 0 or users.max() >= self.n_users):
            bad = users[(users < 0) | (users >= self.n_users)][0]
            raise IndexError(f"user index {bad} out of range for {self.n_users} users")
        held, indptr, items, values = self.source.build_rows(np.unique(users % REDUCE_GROUPS))
        rows = Interactions(indptr, items, values, None, self.user_ids[held], self.item_ids)
        return rows.subset_users(np.searchsorted(held, users))

    @property
    def _full(self):
        if self._local is None:
            self._local = self.source.to_interactions()
        return self._local

    @property
    def indptr(self):  # evaluating every seen user needs the whole population here
        return self._full.indptr

    @property
    def items(self):
        return self._full.items

    @property
    def values(self):
        return self._full.values


class _Closed:
    """What a pickled RemotePopulation keeps of its run's executor: the settings."""

    def __init__(self, spec):
        self.spec, self.actors = spec, []

    def close(self):
        pass
