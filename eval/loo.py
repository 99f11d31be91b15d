"""Leave-one-out ranking protocols, as the federated-recommendation papers use them, without
their leaks.

Each user's newest interaction is the *test* item and the one before it the *validation* item;
the rest is training data. A model is scored by where it ranks the held-out item:

* **sampled** — against ``n`` negatives drawn once per user from the items that user never
  interacted with (the papers' 99, or 999);
* **full** — against every item of the catalog, the user's other interactions masked.

Ties are broken *against* the model: a negative scored equal to the held-out item ranks above
it, so a model that scores everything alike gets the worst rank, not the best.

What the training sampler may draw as a negative decides whether the figure means anything
(:func:`training_exclusions`):

* ``"clean"`` — never the user's evaluation candidates (held-out items and their sampled
  negatives), so the held-out item and its negatives are treated alike in training;
* ``"paper-compat"`` — what the published implementations do: never an item the user
  interacted with *in the whole log*, held-out items included, so the held-out item is the one
  candidate the model is never taught to push down, while the sampled negatives are.
  Leaky; reported with ``leaky=True``;
* ``"full"`` — never the user's training items only: what a device that cannot see the future
  does. Used with full ranking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_random_state

from ..datasets import DataValidationError, Interactions
from ..models.base import _plain

MODES = ("clean", "paper-compat", "full")


@dataclass(frozen=True)
class LeaveOneOut:
    """A leave-one-out split (made by :func:`leave_one_out`).

    Attributes
    ----------
    train : Interactions
        Every user's interactions but the held-out ones (same user and item maps as source).
    validation, test : int arrays (n_users,)
        Each dense user's held-out item (validation −1 when the split has none).
    source : Interactions

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.eval import leave_one_out, loo_metrics, sample_negatives
    >>> data = make_synthetic_ratings(60, 40, 1200, random_state=0)
    >>> data = data.subset_users(np.flatnonzero(data.counts() >= 3))
    >>> split = leave_one_out(data, order="random", random_state=0)
    >>> negatives = sample_negatives(split, 10, random_state=0)
    >>> popularity = np.bincount(split.train.items, minlength=split.train.n_items)
    >>> res = loo_metrics(lambda u: np.tile(popularity, (len(u), 1)), split,
    ...                   negatives=negatives, k=3)
    >>> sorted(res)
    ['hr@3', 'mrr', 'n_users', 'ndcg@3']
    """

    train: Interactions
    validation: np.ndarray
    test: np.ndarray
    source: Interactions

    @property
    def n_users(self) -> int:
        return self.train.n_users

    def held_out(self, part: str) -> np.ndarray:
        if part not in ("test", "validation"):
            raise ValueError(f"part must be 'test' or 'validation', got {part!r}")
        items = self.test if part == "test" else self.validation
        if np.all(items < 0):
            raise ValueError("this split has no validation item; make it with validation=True")
        return items


def _short_users(inter: Interactions, need: int) -> np.ndarray:
    return np.flatnonzero(inter.counts() < need)


TIES = ("random", "item")


def leave_one_out(inter: Interactions, *, validation: bool = True, order: str = "time",
                  ties: str = "random", random_state=None) -> LeaveOneOut:
    """Hold out each user's newest interaction (and the one before it with ``validation``).

    ``order="time"`` needs timestamps. Interactions of one user with equal timestamps are put
    in order by ``ties``: ``"random"`` (default) shuffles them, seeded by ``random_state``, so
    the held-out item among equals is a random one; ``"item"`` keeps the (timestamp, item id)
    order, so it is the largest id among equals (what ranking code that sorts by time usually
    does without saying so). ``order="random"`` holds out random interactions instead (for data
    without time), seeded by ``random_state``. Every user needs at least 2 interactions (3 with
    validation), so that some training data remains: otherwise the error names the users and
    how to drop them.
    """
    if not isinstance(inter, Interactions):
        raise TypeError(f"leave_one_out needs Interactions, got {type(inter).__name__}")
    if order not in ("time", "random"):
        raise ValueError(f"order must be 'time' or 'random', got {order!r}")
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    if order == "time" and inter.timestamps is None:
        raise ValueError("order='time' needs timestamps and these interactions have none; "
                         "pass order='random' (with random_state) to hold out random items")
    need = 3 if validation else 2
    short = _short_users(inter, need)
    if len(short):
        raise DataValidationError(
            f"{len(short)} user(s) have fewer than {need} interactions, leaving nothing to train "
            f"on after holding out {need - 1} (e.g. user {_plain(inter.user_ids[short[0]])!r} with "
            f"{int(inter.counts()[short[0]])}); keep users with enough: "
            f"inter.subset_users(np.flatnonzero(inter.counts() >= {need}))")
    counts = inter.counts()
    from_end = np.repeat(counts, counts) - _positions(inter, order, ties, random_state)  # 1: newest
    test = np.full(inter.n_users, -1, np.int64)
    val = np.full(inter.n_users, -1, np.int64)
    users = np.repeat(np.arange(inter.n_users), counts)
    test[users[from_end == 1]] = inter.items[from_end == 1]
    if validation:
        val[users[from_end == 2]] = inter.items[from_end == 2]
    return LeaveOneOut(inter.take(from_end > need - 1), val, test, inter)


def _positions(inter: Interactions, order: str, ties: str, random_state) -> np.ndarray:
    """Each entry's position (0 = oldest) within its user: by time, equal times by ``ties``,
    or at random (``order="random"``). Entries are stored by (user, timestamp, item)."""
    counts = inter.counts()
    start = np.repeat(inter.indptr[:-1], counts)
    if order == "time" and ties == "item":
        return np.arange(inter.nnz) - start
    keys = check_random_state(random_state).random_sample(inter.nnz)
    users = np.repeat(np.arange(inter.n_users), counts)
    rank = np.lexsort((keys, users) if order == "random" else (keys, inter.timestamps, users))
    pos = np.empty(inter.nnz, np.int64)
    pos[rank] = np.arange(inter.nnz) - start
    return pos


def _check_k(k, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {k!r}")
    return int(k)



def sample_negatives(split: LeaveOneOut, n_negatives: int, *, random_state=None,
                     short_users: str = "error", chunk: int = 1024) -> np.ndarray:
    """``n_negatives`` items per user, drawn once, without replacement, uniformly from the items
    the user never interacted with (training and held-out alike). Returns an int array
    (n_users, n_negatives); a row of −1 marks a user dropped for having too few such items.

    ``short_users="error"`` (default) refuses when some user has fewer than ``n_negatives``
    items left (the error names one); ``"drop"`` leaves those users out of sampled metrics.
    """
    n = _check_k(n_negatives, "n_negatives")
    if short_users not in ("error", "drop"):
        raise ValueError(f"short_users must be 'error' or 'drop', got {short_users!r}")
    src = split.source
    if n > src.n_items - 1:
        raise ValueError(f"n_negatives={n} is larger than the catalog allows ({src.n_items} "
                         f"items, so at most {src.n_items - 1} besides the held-out one)")
    free = src.n_items - src.counts()
    if short_users == "error" and np.any(free < n):
        u = int(np.flatnonzero(free < n)[0])
        raise ValueError(f"user {_plain(src.user_ids[u])!r} interacted with {int(src.counts()[u])} of "
                         f"{src.n_items} items, leaving {int(free[u])} < n_negatives={n} to "
                         f"draw from ({int(np.sum(free < n))} such users); lower n_negatives or "
                         "pass short_users='drop'")
    rng = check_random_state(random_state)
    csr = src.to_csr()
    out = np.full((src.n_users, n), -1, np.int64)
    for start in range(0, src.n_users, chunk):
        stop = min(start + chunk, src.n_users)
        keys = rng.random_sample((stop - start, src.n_items))
        block = csr[start:stop]
        keys[np.repeat(np.arange(stop - start), np.diff(block.indptr)), block.indices] = np.inf
        pick = np.argpartition(keys, n - 1, axis=1)[:, :n] if n < src.n_items else \
            np.argsort(keys, axis=1)[:, :n]
        pick.sort(axis=1)
        ok = free[start:stop] >= n
        out[start:stop][ok] = pick[ok]
    return out


def training_exclusions(split: LeaveOneOut, mode: str, negatives=None) -> Interactions:
    """The items each user's training sampler must never draw as a negative, by ``mode`` (see
    the module doc): the user's training items always; with ``"paper-compat"`` also their
    held-out items; with ``"clean"`` also their held-out items and their sampled ``negatives``
    (required). Same user and item maps (raw ids) as ``split.train``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    train = split.train
    parts = [(np.repeat(np.arange(train.n_users), train.counts()), train.items)]
    if mode != "full":
        for held in (split.test, split.validation):
            u = np.flatnonzero(held >= 0)
            parts.append((u, held[u]))
    if mode == "clean":
        if negatives is None:
            raise ValueError("mode='clean' needs the sampled evaluation negatives "
                             "(negatives=sample_negatives(split, n))")
        neg = _check_negatives(split, negatives)
        u, j = np.nonzero(neg >= 0)
        parts.append((u, neg[u, j]))
    u = np.concatenate([p[0] for p in parts])
    i = np.concatenate([p[1] for p in parts])
    return Interactions.from_arrays(train.user_ids[u], train.item_ids[i], duplicates="last",
                                    user_catalog=train.user_ids, item_catalog=train.item_ids)


def _check_negatives(split: LeaveOneOut, negatives) -> np.ndarray:
    neg = np.asarray(negatives)
    if neg.ndim != 2 or neg.shape[0] != split.n_users or neg.dtype.kind not in "iu":
        raise ValueError(f"negatives must be an integer array (n_users={split.n_users}, n), as "
                         f"sample_negatives returns; got {neg.dtype} {neg.shape}")
    if neg.size and (neg.max() >= split.train.n_items or neg.min() < -1):
        raise ValueError(f"negatives must be item indices in [0, {split.train.n_items}) "
                         "(or -1 for a dropped user)")
    return neg


def rank_of_target(scores: np.ndarray, target: np.ndarray) -> np.ndarray:
    """0-based rank of column ``target[r]`` in each row of ``scores`` among the row's finite
    entries and itself, ties counted against it (a tied competitor ranks above)."""
    t = scores[np.arange(len(scores)), target][:, None]
    return (scores >= t).sum(axis=1) - 1


def _score_rows(score_fn, users: np.ndarray, n_items: int) -> np.ndarray:
    s = np.array(score_fn(users), dtype=np.float64, copy=True)
    if s.shape != (len(users), n_items):
        raise ValueError(f"score_fn returned shape {s.shape}, expected {(len(users), n_items)}")
    if np.isnan(s).any():
        r = int(np.flatnonzero(np.isnan(s).any(axis=1))[0])
        raise ValueError(f"score_fn returned NaN scores for dense user {int(users[r])}: the "
                         "model is broken (diverged?); a ranking cannot be computed")
    return s


def loo_ranks(score_fn, split: LeaveOneOut, *, negatives=None, part: str = "test",
              users=None, chunk: int = 512) -> np.ndarray:
    """Rank (0 = top) of each user's held-out ``part`` item: against the user's ``negatives``
    (sampled protocol) or, when None, against every item except the user's other interactions
    (full ranking). ``score_fn(dense_users)`` returns (len(users), n_items) scores. Users with a
    dropped negative row, or outside ``users``, get rank −1."""
    held = split.held_out(part)
    neg = None if negatives is None else _check_negatives(split, negatives)
    chosen = np.arange(split.n_users) if users is None else np.asarray(users)
    if chosen.dtype.kind not in "iu" or chosen.ndim != 1 or (
            len(chosen) and (chosen.min() < 0 or chosen.max() >= split.n_users)):
        raise ValueError(f"users must be dense user indices in [0, {split.n_users}) of the split")
    if neg is not None:
        chosen = chosen[neg[chosen, 0] >= 0]
    ranks = np.full(split.n_users, -1, np.int64)
    src_csr = split.source.to_csr()
    for start in range(0, len(chosen), chunk):
        batch = chosen[start:start + chunk]
        s = _score_rows(score_fn, batch, split.train.n_items)
        if neg is not None:
            cand = np.concatenate([held[batch, None], neg[batch]], axis=1)
            ranks[batch] = rank_of_target(np.take_along_axis(s, cand, axis=1),
                                          np.zeros(len(batch), np.int64))
            continue
        block = src_csr[batch]
        rows = np.repeat(np.arange(len(batch)), np.diff(block.indptr))
        t = s[np.arange(len(batch)), held[batch]].copy()
        s[rows, block.indices] = -np.inf  # the user's other interactions never compete
        s[np.arange(len(batch)), held[batch]] = t
        ranks[batch] = rank_of_target(s, held[batch])
    return ranks


def rank_metrics(ranks: np.ndarray, k: int = 10) -> dict:
    """HR@k, NDCG@k and MRR (untruncated) from 0-based ranks; entries < 0 are skipped."""
    k = _check_k(k)
    r = np.asarray(ranks)
    r = r[r >= 0]
    if len(r) == 0:
        raise ValueError("no user has a rank to score (every user dropped?)")
    hit = r < k
    return {f"hr@{k}": float(hit.mean()),
            f"ndcg@{k}": float(np.where(hit, 1.0 / np.log2(r + 2.0), 0.0).mean()),
            "mrr": float((1.0 / (r + 1.0)).mean()), "n_users": int(len(r))}


def loo_metrics(score_fn, split: LeaveOneOut, *, negatives=None, k: int = 10,
                part: str = "test", users=None) -> dict:
    """:func:`rank_metrics` of :func:`loo_ranks` (same arguments)."""
    k = _check_k(k)
    return rank_metrics(loo_ranks(score_fn, split, negatives=negatives, part=part, users=users), k)
