"""NumPy twins of ``fedcf._kernels.server`` (the server reduction and robust aggregation):
slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np


def robust_rows(items, d_Q, d_b, cover, beta, median):
    """Twin of ``robust_sorted_runs``: per item (sorted), over entries with cover > 0, the
    coordinate-wise median or β-trimmed mean of [d_Q | d_b], times the item's Σ cover."""
    keep = cover > 0
    out_items = np.unique(items[keep])
    X = np.hstack([d_Q, d_b[:, None]]).astype(np.float64)
    rows = []
    for j in out_items:
        sel = keep & (items == j)
        v = np.sort(X[sel], axis=0)
        n = len(v)
        if median:
            stat = np.median(v, axis=0)
        else:
            t = int(np.floor(beta * n))
            stat = v[t:n - t].mean(axis=0)
        rows.append(cover[sel].sum() * stat)
    R = np.array(rows).reshape(len(out_items), X.shape[1])
    return out_items, R[:, :-1], R[:, -1]


def tree_sum(items, node_lo, node_level, s_Q, s_b, depth, a, b):
    """Twin of ``tree_sum_runs``: per item, a dict of tree nodes {(lo, level): row}, combined
    level by level (left + right; a lone child moves up) while the parent lies in [a, b)."""
    X = np.hstack([s_Q, s_b[:, None]]).astype(np.float64)
    out = []
    for j in np.unique(items):
        nodes = {(int(lo), int(lv)): X[e] for e, (lo, lv) in
                 enumerate(zip(node_lo, node_level)) if items[e] == j}
        for L in range(1, depth + 1):
            for p in sorted({lo >> L for lo, lv in nodes if lv < L}):
                if (p << L) < a or ((p + 1) << L) > b:
                    continue
                kids = [(lo, lv) for lo, lv in sorted(nodes) if lv < L and lo >> L == p]
                row = nodes.pop(kids[0])
                if len(kids) == 2:
                    row = row + nodes.pop(kids[1])
                nodes[(p << L, L)] = row
        out += [(j, lo, lv, row) for (lo, lv), row in sorted(nodes.items())]
    R = np.array([r for *_, r in out]).reshape(len(out), X.shape[1])
    return (np.array([o[0] for o in out]), np.array([o[1] for o in out]),
            np.array([o[2] for o in out]), R[:, :-1], R[:, -1])


def grouped_tree_sum(offsets, items, group, scale, d_Q, d_b, depth):
    """Twin of ``grouped_tree_sum``: per (item, group), Σ scale·delta in entry order from 0;
    then ``tree_sum`` of those group sums over the whole tree. Returns (items, s_Q, s_b)."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    groups, scale = group[owner], scale[owner]
    used = [e for e in range(len(items)) if items[e] >= 0 and scale[e] != 0.0]
    keys = sorted({(int(items[e]), int(groups[e])) for e in used})
    row = {k: i for i, k in enumerate(keys)}
    S = np.zeros((len(keys), d_Q.shape[1] + 1))
    for e in used:
        S[row[(int(items[e]), int(groups[e]))]] += scale[e] * np.append(
            d_Q[e].astype(np.float64), d_b[e])
    it = np.array([k[0] for k in keys], np.int64)
    lo = np.array([k[1] for k in keys], np.int64)
    j, _, _, s_Q, s_b = tree_sum(it, lo, np.zeros_like(lo), S[:, :-1], S[:, -1], depth, 0,
                                 2 ** depth)
    return j, s_Q, s_b


def group_counters(clients, group, offsets, items, num, w, bad, empty, losses, weights,
                   values_per_row, rank_values, n_groups):
    """Twin of ``group_counters``: each counter column by ``np.bincount`` over the clients'
    groups (it adds in input order), the worst client by a lexsort per group."""
    owner = np.repeat(np.arange(len(clients)), np.diff(offsets))
    sent = np.bincount(owner[(items >= 0) & (num[owner] != 0)], minlength=len(clients))
    used, finite = w > 0, np.isfinite(losses)
    loss_w = np.where(used & finite, weights, 0.0)
    cols = [np.where(used, w, 0.0), np.ones(len(clients)), used * 1.0, bad * 1.0,
            (bad & ~finite) * 1.0, empty * 1.0, sent * values_per_row + used * rank_values,
            loss_w * np.where(loss_w > 0, losses, 0.0), loss_w]
    present = np.unique(group)
    at = np.searchsorted(present, group)
    stats = np.stack([np.bincount(at, weights=c, minlength=len(present)) for c in cols], 1)
    key = np.where(finite, losses, np.inf)
    worst_c, worst_l = np.full(len(present), -1, np.int64), np.full(len(present), -np.inf)
    for s in range(len(present)):
        k = np.flatnonzero((at == s) & (weights > 0))
        if len(k):
            best = k[np.lexsort((clients[k], -key[k]))[0]]
            worst_c[s], worst_l[s] = clients[best], key[best]
    return present, stats.reshape(len(present), len(cols)), worst_c, worst_l
