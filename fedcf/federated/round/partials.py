"""Partial sums: how a linear aggregate is reduced the same way wherever the clients ran.

A linear aggregator (the weighted mean, norm clipping, DP) needs only Σ_k num_k·Δ_k over the
cohort, a denominator and a few counts. The cohort is cut into ``REDUCE_GROUPS`` fixed groups by
client id; each group's sums run over its clients in cohort order, and the groups are then added
up a fixed binary tree (left + right at every node). A shard of a cluster holds a contiguous
range of groups and returns the sums of the largest subtrees inside it (``compact``) — never
one client's upload, and at most a row per item per subtree — and the driver's ``merge`` ends
the tree: bit for bit what the local executor gives, for any number of shards (a float sum
depends on its order; the tree fixes the order). The local executor's clients are all in one
process, so it takes ``merged_sums``: the same additions in the same order, in one pass, without
a row per group and item.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from operator import attrgetter

import numpy as np

from ..._kernels.server import group_counters, grouped_tree_sum, sum_sorted_runs, tree_sum_runs
from ..._threads import small

TREE_DEPTH = 6
REDUCE_GROUPS = 2 ** TREE_DEPTH  # leaves of the reduction tree

# per-group counters, in this order in PartialSums.stats (the columns _kernels.server.group_counters
# writes)
STATS = ("weight", "n_clients", "n_used", "n_nonfinite", "n_nonfinite_recon", "n_empty",
         "values_up", "loss_sum", "loss_weight")


def reduce_group(clients) -> np.ndarray:
    """The reduce group of each dense client id (fixed: it depends on the id only)."""
    return np.asarray(clients, np.int64) % REDUCE_GROUPS


@dataclass(frozen=True)
class PartialSums:
    """Sums of several reduce groups of one round.

    Row r: item ``items[r]``, Σ num_k·Δq_k (``s_Q``) and Σ num_k·Δb_k (``s_b``) over the
    clients that touched the item in tree node ``groups[r]`` … ``groups[r] + 2**levels[r] − 1``
    (level 0: one group, its clients in cohort order).
    Per group ``stat_groups[g]``: ``stats[g]`` (see STATS), ``rank[g]`` = Σ num_k·M_k (K×K) when
    the clients send a rank map, and the group's worst client (largest query loss; −1 if none).
    """

    groups: np.ndarray
    items: np.ndarray
    s_Q: np.ndarray
    s_b: np.ndarray
    stat_groups: np.ndarray
    stats: np.ndarray  # (g, len(STATS)) float64
    worst_client: np.ndarray  # (g,) int64
    worst_loss: np.ndarray  # (g,) float64
    rank: np.ndarray | None = None  # (g, K, K)
    levels: np.ndarray | None = None  # (rows,) tree level of each row's node; None: all 0

    def node_levels(self) -> np.ndarray:
        return np.zeros(len(self.items), np.int64) if self.levels is None else self.levels

    def compact(self, a: int, b: int) -> PartialSums:
        """Rows summed up the tree as far as groups [a, b) go (a shard's range): what the
        shard sends instead of a row per group and item."""
        items, lo, lv, s_Q, s_b = tree_sums(self.items, self.groups, self.node_levels(),
                                            self.s_Q, self.s_b, a, b)
        return replace(self, groups=lo, items=items, s_Q=s_Q, s_b=s_b, levels=lv)

    @classmethod
    def concat(cls, parts) -> PartialSums:
        parts = [p if p.levels is not None else replace(p, levels=p.node_levels())
                 for p in parts]
        columns = zip(*map(attrgetter(*(f.name for f in fields(cls))), parts))
        return cls(*(None if parts[0].rank is None and f.name == "rank" else np.concatenate(col)
                     for f, col in zip(fields(cls), columns)))

    def arrays(self) -> dict:
        """The arrays by field name (None for an absent rank map or levels)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # declared fields only

    def nbytes(self) -> int:
        """Bytes of the arrays (what a shard sends)."""
        return int(sum(a.nbytes for a in self.arrays().values() if a is not None))

    def totals(self) -> dict:
        """Each counter summed over the groups one after another in group order, from 0
        (deterministic)."""
        rows = self.stats[np.argsort(self.stat_groups, kind="stable")]
        acc = np.cumsum(np.vstack([np.zeros(len(STATS)), rows]), axis=0)[-1]
        return {name: float(v) for name, v in zip(STATS, acc)}


def group_sums(out, clients, num, w, bad, empty) -> PartialSums:
    """The PartialSums of one batch of client outputs: client k's entries weighted by num[k]
    (0 leaves them out), its weight w[k] (0: not used) counted in the denominator; ``clients``
    are the dense ids in cohort order, ``bad`` the non-finite uploads, ``empty`` the clients
    with nothing to send."""
    parts = _group_counters(out, clients, num, w, bad, empty)
    K = out.d_Q.shape[1]
    owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
    valid = (out.items >= 0) & (num[owner] != 0)
    span = int(out.items.max()) + 1 if len(out.items) else 1
    keys = np.where(valid, reduce_group(clients)[owner] * span + out.items, -1)
    order = np.argsort(keys, kind="stable")  # by group, item, then cohort position
    n = int(valid.sum())
    dq, db, key = np.empty((n, K)), np.empty(n), np.empty(n, np.int64)
    r = small(sum_sorted_runs, out.d_Q.size, order[len(order) - n:], keys, out.d_Q, out.d_b,
              num[owner], dq, db, key)
    return replace(parts, groups=key[:r] // span, items=key[:r] % span, s_Q=dq[:r], s_b=db[:r])


def add_nodes(parts) -> PartialSums:
    """Level-0 sums of several nodes whose clients share reduce groups (Flower nodes: a
    device's users fall in any group), added row by row in the given order: one row per
    (group, item), the groups' counters added, each group's worst client the largest loss.
    Deterministic for a fixed order; equal to the in-process sums up to float rounding, since
    a group's clients are added node by node rather than in cohort order."""
    cat = PartialSums.concat(parts)
    if (cat.node_levels() != 0).any():
        raise ValueError("add_nodes takes level-0 sums (group_sums), not compacted ones")
    span = int(cat.items.max()) + 1 if len(cat.items) else 1
    key = cat.groups * span + cat.items
    order = np.argsort(key, kind="stable")
    starts = np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1]]) \
        if len(order) else np.zeros(0, np.int64)
    first = order[starts]
    s_Q = np.add.reduceat(cat.s_Q[order], starts) if len(order) else cat.s_Q
    s_b = np.add.reduceat(cat.s_b[order], starts) if len(order) else cat.s_b
    g_order = np.argsort(cat.stat_groups, kind="stable")
    g_sorted = cat.stat_groups[g_order]
    g_starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]]) \
        if len(g_order) else np.zeros(0, np.int64)
    stats = np.add.reduceat(cat.stats[g_order], g_starts) if len(g_order) else cat.stats
    worst_c, worst_l = [], []
    for a, b in zip(g_starts, np.r_[g_starts[1:], len(g_order)]):
        run = g_order[a:b]
        has = run[cat.worst_client[run] >= 0]
        pick = has[np.lexsort((cat.worst_client[has], -cat.worst_loss[has]))[0]] \
            if len(has) else run[0]
        worst_c.append(cat.worst_client[pick])
        worst_l.append(cat.worst_loss[pick])
    rank = None
    if cat.rank is not None:
        rank = np.add.reduceat(cat.rank[g_order], g_starts) if len(g_order) else cat.rank
    return PartialSums(cat.groups[first], cat.items[first], s_Q, s_b, g_sorted[g_starts],
                       stats, np.asarray(worst_c, np.int64), np.asarray(worst_l, np.float64),
                       rank, None)


def merged_sums(out, clients, num, w, bad, empty) -> Merged:
    """``merge(group_sums(...))``, bit for bit, in one pass over the entries without making
    a row per group and item (for client outputs that are all in this process)."""
    parts = _group_counters(out, clients, num, w, bad, empty)
    n = len(out.items)
    items, dq, db = np.empty(n, np.int64), np.empty((n, out.d_Q.shape[1])), np.empty(n)
    # each value is read, added into its group's subtree sum and carried up the tree: about
    # three touches, so a round of ML-100K's size is worth the second thread's wake-up
    m = small(grouped_tree_sum, 3 * out.d_Q.size, out.offsets, out.items, reduce_group(clients),
              np.asarray(num, np.float64), out.d_Q, out.d_b, TREE_DEPTH, items, dq, db)
    return Merged(items[:m], dq[:m], db[:m], *_merge_counters(parts))


def _group_counters(out, clients, num, w, bad, empty) -> PartialSums:
    """PartialSums with the per-group counters and no rows."""
    K = out.d_Q.shape[1]
    g_client = reduce_group(clients)
    present, stats, worst_c, worst_l = group_counters(
        np.asarray(clients, np.int64), g_client, out.offsets, out.items,
        np.asarray(num, np.float64), np.asarray(w, np.float64), np.asarray(bad, bool),
        np.asarray(empty, bool), out.losses, out.weights, K + 1.0,
        float(K * K) if out.rank_terms is not None else 0.0, REDUCE_GROUPS)
    rank = None
    if out.rank_terms is not None:
        rank = np.zeros((len(present), K, K))
        at = np.searchsorted(present, g_client)
        for k in np.flatnonzero(w > 0):
            rank[at[k]] += num[k] * out.rank_terms[k]
    none = np.zeros(0, np.int64)
    return PartialSums(none, none, np.zeros((0, K)), np.zeros(0), present, stats, worst_c,
                       worst_l, rank)


@dataclass(frozen=True)
class Merged:
    """The cohort's sums after merging every group in group order."""

    items: np.ndarray
    s_Q: np.ndarray
    s_b: np.ndarray
    rank: np.ndarray | None
    totals: dict
    worst_client: int
    worst_loss: float


def tree_sums(items, lo, levels, s_Q, s_b, a=0, b=REDUCE_GROUPS):
    """Per item, the tree nodes' sums added up the fixed tree inside groups [a, b)."""
    order = np.lexsort((lo, items))
    n = len(order)
    out = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
           np.empty((n, s_Q.shape[1])), np.empty(n))
    m = small(tree_sum_runs, s_Q.size, order, items, lo, levels, s_Q, s_b, TREE_DEPTH, a, b, *out)
    if m < 0:
        raise ValueError(f"partial sums hold tree nodes outside groups [0, {REDUCE_GROUPS}): "
                         "they were not made by group_sums/compact of this fedcf version")
    return tuple(o[:m] for o in out)


def merge(parts: PartialSums) -> Merged:
    """Add the groups' sums per item up the whole tree; counters in group order."""
    items, _, _, dq, db = tree_sums(parts.items, parts.groups, parts.node_levels(),
                                    parts.s_Q, parts.s_b)
    return Merged(items, dq, db, *_merge_counters(parts))


def _merge_counters(parts: PartialSums):
    """(rank, totals, worst client, its loss) over the groups, in group order."""
    K = parts.s_Q.shape[1]
    totals = parts.totals()
    rank = None
    if parts.rank is not None:
        rank = np.zeros((K, K))
        for g in np.argsort(parts.stat_groups, kind="stable"):
            rank += parts.rank[g]
    c, loss = parts.worst_client, parts.worst_loss
    has = np.flatnonzero(c >= 0)
    if not len(has):
        return rank, totals, -1, -np.inf
    g = has[np.lexsort((c[has], -loss[has]))[0]]  # largest loss, then smallest id
    return rank, totals, int(c[g]), float(loss[g])
