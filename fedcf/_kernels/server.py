"""Server-side kernels: the non-finite guard over client deltas, the deterministic sparse
reduction of client deltas, and sparse row updates of the server optimizers.

Parallel over independent clients / rows (each result is computed by one thread in a fixed
order, so nothing depends on the thread count); flags are written through ``store``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .util import chunk_span, store

# x·0 is 0 for a finite x and NaN otherwise, so a sum of such terms tells whether all are
# finite in any order: "reassoc" lets it run in SIMD lanes ("nnan"/"ninf" stay off).
_ANY_ORDER = {"reassoc"}


@njit(cache=True, fastmath=_ANY_ORDER)
def _client_finite(d_Q, d_b, lo, hi):
    K = d_Q.shape[1]
    acc = 0.0
    for e in range(lo, hi):
        acc += d_b[e] * 0.0
        for a in range(K):
            acc += d_Q[e, a] * 0.0
    return acc == 0.0


@njit(cache=True, parallel=True)
def finite_clients(offsets, d_Q, d_b):
    """ok[k] = every value in client k's slots [offsets[k], offsets[k+1]) is finite."""
    m = offsets.shape[0] - 1
    ok = np.ones(m, np.bool_)
    for k in prange(m):
        store(ok, np.int64(k), _client_finite(d_Q, d_b, offsets[k], offsets[k + 1]))
    return ok


@njit(cache=True, fastmath=_ANY_ORDER)
def _sgd_row(x, r, delta, t, lr):
    acc = 0.0
    for a in range(x.shape[1]):
        x[r, a] = x[r, a] + lr * delta[t, a]
        acc += x[r, a] * 0.0
    return acc == 0.0


@njit(cache=True, parallel=True)
def sgd_rows(x, rows, delta, lr):
    """x[rows] += lr · delta (x: (n, K) or (n, 1) view); returns True if the rows stay finite.
    ``rows`` must be distinct (they are: the aggregate's sorted unique items)."""
    ok = np.ones(rows.shape[0], np.bool_)
    for t in prange(rows.shape[0]):
        store(ok, np.int64(t), _sgd_row(x, rows[t], delta, np.int64(t), lr))
    return ok.all()


@njit(cache=True)
def _adagrad_row(x, acc, r, delta, t, lr, eps):
    ok = True
    for a in range(x.shape[1]):
        g = -delta[t, a]
        acc[r, a] += g * g
        x[r, a] = x[r, a] - lr * g / (np.sqrt(acc[r, a]) + eps)
        ok = ok and np.isfinite(x[r, a])
    return ok


@njit(cache=True, parallel=True)
def adagrad_rows(x, acc, rows, delta, lr, eps):
    """Adagrad on the given (distinct) rows with g = −delta: acc += g²; x −= lr g / (√acc + eps)."""
    ok = np.ones(rows.shape[0], np.bool_)
    for t in prange(rows.shape[0]):
        store(ok, np.int64(t), _adagrad_row(x, acc, rows[t], delta, np.int64(t), lr, eps))
    return ok.all()


@njit(cache=True)
def item_runs(order, d_items, scale, out_items):
    """Group entries ``order`` (sorted by item) into runs of one item, skipping entries whose
    scale is 0. Returns (keep, starts, m): run r is keep[starts[r]:starts[r+1]] and its item is
    written to out_items[r]."""
    n = order.shape[0]
    keep = np.empty(n, np.int64)
    nk = 0
    for t in range(n):
        if scale[order[t]] != 0.0:
            keep[nk] = order[t]
            nk += 1
    starts = np.empty(nk + 1, np.int64)
    m = 0
    last = -1
    for t in range(nk):
        j = d_items[keep[t]]
        if j != last:
            starts[m] = t
            out_items[m] = j
            m += 1
            last = j
    starts[m] = nk
    return keep, starts, m


@njit(cache=True)
def _sum_run(order, lo, hi, d_Q, d_b, scale, out_Q, out_b, m):
    K = d_Q.shape[1]
    for a in range(K):
        out_Q[m, a] = 0.0
    out_b[m] = 0.0
    for t in range(lo, hi):
        e = order[t]
        w = scale[e]
        for a in range(K):
            out_Q[m, a] += w * d_Q[e, a]
        out_b[m] += w * d_b[e]


@njit(cache=True, parallel=True)
def sum_sorted_runs(order, d_items, d_Q, d_b, scale, out_Q, out_b, out_items):
    """Deterministic sparse reduction: Σ scale[e] · delta[e] per item, over entries ``order``
    sorted by item (stable, so ties keep client order). Entries with scale 0 are skipped.

    out_Q (≥ m, K) float64, out_b, out_items (≥ m) receive the m distinct items. Returns m.
    Each item's sum is one thread's sequential loop in that fixed order, so the result does not
    depend on the thread count.
    """
    keep, starts, m = item_runs(order, d_items, scale, out_items)
    for r in prange(m):
        _sum_run(keep, starts[r], starts[r + 1], d_Q, d_b, scale, out_Q, out_b, np.int64(r))
    return m


@njit(cache=True)
def _robust_run(keep, lo, hi, d_Q, d_b, cover, beta, use_median, out_Q, out_b, r):
    n = hi - lo
    K = d_Q.shape[1]
    col = np.empty(n)
    frac = 0.0
    for t in range(lo, hi):
        frac += cover[keep[t]]
    trim = int(np.floor(beta * n))
    for a in range(K + 1):
        for t in range(n):
            e = keep[lo + t]
            col[t] = d_Q[e, a] if a < K else d_b[e]
        col.sort()
        if use_median:
            v = col[n // 2] if n % 2 == 1 else 0.5 * (col[n // 2 - 1] + col[n // 2])
        else:
            v = 0.0
            for t in range(trim, n - trim):
                v += col[t]
            v /= n - 2 * trim
        if a < K:
            out_Q[r, a] = frac * v
        else:
            out_b[r] = frac * v


@njit(cache=True, parallel=True)
def robust_sorted_runs(order, d_items, d_Q, d_b, cover, beta, use_median, out):
    """Per item, over the clients that touched it: the coordinate-wise median (``use_median``)
    or β-trimmed mean of their deltas, times the share of the cohort's weight that touched it
    (Σ cover over the run), so that for identical clients it equals the weighted mean.

    order : entries sorted by item (entries with cover 0 are skipped); out : (out_Q (≥ m, K),
    out_b, out_items) receive the m distinct items; returns m. One thread per item, fixed order.
    """
    out_Q, out_b, out_items = out[0], out[1], out[2]
    keep, starts, m = item_runs(order, d_items, cover, out_items)
    for r in prange(m):
        _robust_run(keep, starts[r], starts[r + 1], d_Q, d_b, cover, beta, use_median, out_Q,
                    out_b, np.int64(r))
    return m


@njit(cache=True)
def _tree_run(lo_, hi_, ent_lo, ent_level, work_Q, work_b, depth, a, b):
    """One item's entries in slots [lo_, hi_) of the work arrays (sorted by node start),
    combined up a fixed binary tree: at level L, two sibling nodes whose parent lies inside
    groups [a, b) become the parent, left + right; a lone child becomes its parent unchanged.
    Returns the number of entries left (in slots lo_, lo_ + 1, ...)."""
    K = work_Q.shape[1]
    c = hi_ - lo_
    for L in range(1, depth + 1):
        i, j = 0, 0
        while i < c:
            s = lo_ + i
            anc = ent_lo[s] >> L
            inside = (anc << L) >= a and ((anc + 1) << L) <= b
            if ent_level[s] < L and inside:
                d = lo_ + j
                has_right = i + 1 < c and ent_level[s + 1] < L and (ent_lo[s + 1] >> L) == anc
                for q in range(K):
                    v = work_Q[s, q]
                    if has_right:
                        v = v + work_Q[s + 1, q]
                    work_Q[d, q] = v
                vb = work_b[s] + work_b[s + 1] if has_right else work_b[s]
                work_b[d] = vb
                ent_lo[d], ent_level[d] = anc << L, L
                i += 2 if has_right else 1
            else:
                d = lo_ + j
                if d != s:
                    for q in range(K):
                        work_Q[d, q] = work_Q[s, q]
                    work_b[d] = work_b[s]
                    ent_lo[d], ent_level[d] = ent_lo[s], ent_level[s]
                i += 1
            j += 1
        c = j
    return c


ITEMS_PER_CHUNK = 64


@njit(cache=True)
def _tree_item(order, lo, hi, node_lo, node_level, s_Q, s_b, depth, a, b, scratch, dest,
               out_lo, out_level, out_Q, out_b):
    """One item's entries order[lo:hi] combined up the tree in ``scratch`` (so only the
    remaining rows touch the outputs), written to output rows dest, dest + 1, ...; returns
    their count."""
    ent_lo, ent_level, work_Q, work_b = scratch
    K = s_Q.shape[1]
    for t in range(hi - lo):
        e = order[lo + t]
        ent_lo[t], ent_level[t] = node_lo[e], node_level[e]
        for q in range(K):
            work_Q[t, q] = s_Q[e, q]
        work_b[t] = s_b[e]
    c = _tree_run(0, hi - lo, ent_lo, ent_level, work_Q, work_b, depth, a, b)
    for t in range(c):
        for q in range(K):
            out_Q[dest + t, q] = work_Q[t, q]
        out_b[dest + t] = work_b[t]
        out_lo[dest + t], out_level[dest + t] = ent_lo[t], ent_level[t]
    return c


@njit(cache=True, parallel=True)
def tree_sum_runs(order, items, node_lo, node_level, s_Q, s_b, depth, a, b,
                  out_items, out_lo, out_level, out_Q, out_b):
    """Deterministic sum of partial sums over a fixed binary tree of 2**depth reduce groups.

    Entry e is the sum (s_Q[e], s_b[e]) of item ``items[e]`` over the tree node of groups
    [node_lo[e], node_lo[e] + 2**node_level[e]); ``order`` sorts the entries by (item, node).
    Per item, sibling nodes are added (left + right) up the tree while the parent lies inside
    groups [a, b) (all groups: the per-item total; a shard's range: its subtree sums). The
    result is the same wherever a subtree was summed first, so for any number of shards.
    Writes the remaining entries to out_* (≥ len(order) rows) and returns their count, or −1
    when [a, b) spans the whole tree but an item does not reduce to one root (entries outside
    the tree). Items are combined in parallel, each in a thread's scratch, in a fixed order.
    """
    n = order.shape[0]
    starts = np.empty(n + 1, np.int64)
    m = 0
    for t in range(n):
        if t == 0 or items[order[t]] != items[order[t - 1]]:
            starts[m] = t
            m += 1
    starts[m] = n
    whole = a <= 0 and b >= (1 << depth)  # one root per item: item r's row is r
    counts = np.empty(m, np.int64)
    n_chunks = (m + ITEMS_PER_CHUNK - 1) // ITEMS_PER_CHUNK
    for ch in prange(n_chunks):
        r0, r1, longest = chunk_span(starts, np.int64(ch), ITEMS_PER_CHUNK, m)
        scratch = (np.empty(longest, np.int64), np.empty(longest, np.int64),
                   np.empty((longest, s_Q.shape[1])), np.empty(longest))
        for r in range(r0, r1):
            counts[r] = _tree_item(order, starts[r], starts[r + 1], node_lo, node_level, s_Q,
                                   s_b, depth, a, b, scratch, r if whole else starts[r],
                                   out_lo, out_level, out_Q, out_b)
    if whole:
        for r in range(m):
            if counts[r] != 1:
                return -1
            out_items[r] = items[order[starts[r]]]
        return m
    return _compact_runs(starts, counts, order, items, out_items, out_lo, out_level, out_Q,
                         out_b)


@njit(cache=True)
def _counting_order(keys, src, n_keys):
    """Positions ``src`` stably sorted by keys[src] (each in [0, n_keys)): a counting sort."""
    ptr = np.zeros(n_keys + 1, np.int64)
    for e in src:
        ptr[keys[e] + 1] += 1
    for k in range(n_keys):
        ptr[k + 1] += ptr[k]
    out = np.empty(src.shape[0], np.int64)
    for e in src:
        out[ptr[keys[e]]] = e
        ptr[keys[e]] += 1
    return out


@njit(cache=True)
def _msb_below(x, y):
    """The highest set bit of x is below that of y (x, y ≥ 0)."""
    return x < y and x < (x ^ y)


@njit(cache=True)
def _add_down(st_Q, st_b, t):
    """Stack entry t − 1 becomes entry t − 1 + entry t (left + right)."""
    for q in range(st_Q.shape[1]):
        st_Q[t - 1, q] = st_Q[t - 1, q] + st_Q[t, q]
    st_b[t - 1] = st_b[t - 1] + st_b[t]


@njit(cache=True)
def _grouped_item(ent, lo, hi, groups, scale, d_Q, d_b, stack, r, out_Q, out_b):
    """One item's entries ent[lo:hi] (sorted by group, then cohort order) summed as
    ``tree_sum_runs`` sums the per-group sums: each group's Σ scale·delta in that order, from
    0, then sibling subtrees added left + right. Two present groups a < b meet at the level of
    the highest bit of a ^ b, so the stack (subtree sums, left to right; st_x[j] = the last
    group of entry j ^ the first of entry j + 1) adds its top two entries while they meet
    below where the next group meets them. Row r of the outputs receives the total."""
    st_x, st_Q, st_b = stack
    K = d_Q.shape[1]
    n = 0
    for t in range(lo, hi):
        e, w = ent[t], scale[ent[t]]
        if t > lo and groups[e] == groups[ent[t - 1]]:
            for q in range(K):
                st_Q[n - 1, q] += w * d_Q[e, q]
            st_b[n - 1] += w * d_b[e]
            continue
        if t > lo:  # a new group: first add the subtrees that meet below it
            x = groups[ent[t - 1]] ^ groups[e]
            while n >= 2 and _msb_below(st_x[n - 2], x):
                _add_down(st_Q, st_b, n - 1)
                n -= 1
            st_x[n - 1] = x
        for q in range(K):
            st_Q[n, q] = 0.0 + w * d_Q[e, q]
        st_b[n] = 0.0 + w * d_b[e]
        n += 1
    while n >= 2:
        _add_down(st_Q, st_b, n - 1)
        n -= 1
    for q in range(K):
        out_Q[r, q] = st_Q[0, q]
    out_b[r] = st_b[0]


@njit(cache=True, parallel=True)
def grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth, out_items, out_Q, out_b):
    """``tree_sum_runs`` over all groups of the per-(item, group) sums that ``sum_sorted_runs``
    makes, in one pass and bit for bit the same: per item, each reduce group's Σ scale ·
    delta over its entries in entry (cohort) order, from 0, then the groups added up the
    fixed binary tree of 2**depth leaves (left + right; a lone child moves up).

    Client k owns entries [offsets[k], offsets[k + 1]), is in reduce group group[k] and
    weighs its entries by scale[k] (0: left out); entries with item < 0 are skipped. Writes
    the m touched items in increasing order with their sums to out_* (≥ m rows) and returns
    m, or −1 if a used client's group is outside [0, 2**depth). Entries are ordered by two
    counting sorts (group, then item); items are summed in parallel, each by one thread in
    that fixed order.
    """
    n = items.shape[0]
    used = np.empty(n, np.int64)
    eg, es = np.empty(n, np.int64), np.empty(n)
    nu, span = 0, 1
    for k in range(offsets.shape[0] - 1):
        if scale[k] == 0.0:
            continue
        if group[k] < 0 or group[k] >= (1 << depth):
            return -1
        for e in range(offsets[k], offsets[k + 1]):
            if items[e] >= 0:
                used[nu], eg[e], es[e] = e, group[k], scale[k]
                nu += 1
                span = max(span, items[e] + 1)
    ent = _counting_order(items, _counting_order(eg, used[:nu], 1 << depth), span)
    starts = np.empty(nu + 1, np.int64)
    m = 0
    for t in range(nu):
        if t == 0 or items[ent[t]] != items[ent[t - 1]]:
            starts[m] = t
            out_items[m] = items[ent[t]]
            m += 1
    starts[m] = nu
    n_chunks = (m + ITEMS_PER_CHUNK - 1) // ITEMS_PER_CHUNK
    for ch in prange(n_chunks):
        stack = (np.empty(depth + 1, np.int64), np.empty((depth + 1, d_Q.shape[1])),
                 np.empty(depth + 1))  # at most one subtree per level
        for r in range(ch * ITEMS_PER_CHUNK, min(m, (ch + 1) * ITEMS_PER_CHUNK)):
            _grouped_item(ent, starts[r], starts[r + 1], eg, es, d_Q, d_b, stack, r, out_Q,
                          out_b)
    return m


@njit(cache=True)
def group_counters(clients, group, offsets, items, num, w, bad, empty, losses, weights,
                   values_per_row, rank_values, n_groups):
    """Per reduce group present (ascending): the counters of ``partials.STATS`` summed over
    its clients in cohort order from 0 (as ``np.bincount`` adds them), and its worst client
    (largest query loss, a non-finite one counting as largest, ties to the smaller id; only
    clients with a query set; −1 and −inf if none). Client k: dense id clients[k], group
    group[k] in [0, n_groups), entries [offsets[k], offsets[k + 1]) (item −1: padding),
    factor num[k] (its entries count in values_up when ≠ 0), weight w[k] (used when > 0),
    flags bad[k] (non-finite upload) and empty[k], query loss losses[k] and size weights[k].
    A sent row counts values_per_row numbers (K + 1); a used client sends rank_values more
    (K² for a rank map, else 0).
    Returns (present, stats (g, 9), worst_client, worst_loss)."""
    slot = np.full(n_groups, -1, np.int64)
    for k in range(clients.shape[0]):
        slot[group[k]] = 0
    present = np.flatnonzero(slot == 0)
    for s in range(present.shape[0]):
        slot[present[s]] = s
    stats = np.zeros((present.shape[0], 9))
    worst_c = np.full(present.shape[0], -1, np.int64)
    worst_l = np.full(present.shape[0], -np.inf)
    for k in range(clients.shape[0]):
        s = slot[group[k]]
        used = w[k] > 0
        finite = np.isfinite(losses[k])
        loss_w = weights[k] if used and finite else 0.0
        n_sent = 0
        if num[k] != 0:
            for e in range(offsets[k], offsets[k + 1]):
                n_sent += items[e] >= 0
        stats[s, 0] += w[k] if used else 0.0
        stats[s, 1] += 1.0
        stats[s, 2] += 1.0 if used else 0.0
        stats[s, 3] += 1.0 if bad[k] else 0.0
        stats[s, 4] += 1.0 if bad[k] and not finite else 0.0
        stats[s, 5] += 1.0 if empty[k] else 0.0
        stats[s, 6] += n_sent * values_per_row + (rank_values if used else 0.0)
        stats[s, 7] += loss_w * (losses[k] if loss_w > 0 else 0.0)
        stats[s, 8] += loss_w
        key = losses[k] if finite else np.inf
        if weights[k] > 0 and (key > worst_l[s] or (key == worst_l[s] and
                                                    clients[k] < worst_c[s])):
            worst_c[s], worst_l[s] = clients[k], key
    return present, stats, worst_c, worst_l


@njit(cache=True)
def _compact_runs(starts, counts, order, items, out_items, out_lo, out_level, out_Q, out_b):
    """Move item r's rows from starts[r] … to follow item r − 1's, in item order."""
    K = out_Q.shape[1]
    w = 0
    for r in range(counts.shape[0]):
        for t in range(starts[r], starts[r] + counts[r]):
            if w != t:
                for q in range(K):
                    out_Q[w, q] = out_Q[t, q]
                out_b[w] = out_b[t]
                out_lo[w], out_level[w] = out_lo[t], out_level[t]
            out_items[w] = items[order[starts[r]]]
            w += 1
    return w
