"""Streaming off-policy evaluation on simulated slate logs: draw a log and accumulate every
estimator's sufficient statistics without storing it (what makes 100 logs of 10⁷ impressions
cheap). ``fedcf.eval.ope_study`` wraps it; its tests check that the statistics equal the pandas
estimators of ``fedcf.eval`` on the same log, which the kernel can also write out.

A log: ``n_slates`` slates; each draws a user uniformly from the world's users and, for each of
the L positions independently, an action from the (context-free) logging distribution of that
position, and a click with the world's probability pos_bias[k]·click[u, a]. The target is
factored too: a softmax over the user's model scores (the same at every position), or ε-greedy
around the user's model slate. Every random number comes from a stream keyed by (seed, log).

Statistics per log (``layout``): for each linear estimator the sum and the sum of squares of
its per-slate values; for SNIPS the sums needed by the delta method; weight diagnostics.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .rng import next_below, next_float, stream_key

# linear estimators (per-slate value, averaged over slates), then DRos at each λ of the grid
LIN_IPS, LIN_DM, LIN_DR, LIN_RIPS, LIN_SIPS, LIN_PI, LIN_CDR = range(7)
N_FIXED = 7
# after the 2 · (N_FIXED + G) sums: SNIPS (ΣA, ΣB, ΣA², ΣB², ΣAB) and weights (Σw, Σw², max w,
# matched rows)
N_TAIL = 9


@njit(cache=True)
def n_stats(n_grid):
    """Statistics per log for a DRos grid of n_grid values."""
    return 2 * (N_FIXED + n_grid) + N_TAIL


@njit(cache=True, inline="always")
def _sample(cdf_row, u):
    """The first index whose cumulative probability exceeds u (binary search)."""
    lo, hi = 0, cdf_row.shape[0] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cdf_row[mid] > u:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, inline="always")
def _target_prob(target, u, k, a):
    """π_e(a | u, k): softmax probabilities (kind 0) or ε-greedy around the user's slate,
    exploring by the distribution ``explore``."""
    kind, probs, slates, eps, explore = target[0], target[1], target[2], target[3], target[4]
    if kind == 0:
        return float(probs[u, a])
    greedy = 1.0 if slates[u, k] == a else 0.0
    return (1.0 - eps) * greedy + eps * explore[a]


@njit(cache=True)
def slate_log(key, n_slates, world, logging, target, model, grid, stats, emit):
    """Draw one log from stream ``key`` and add its statistics into ``stats`` (``n_stats``).

    world = (click (n_users, n_items), pos_bias (L,));  logging = (cdf (L, n_items), p0 (L,
    n_items));  target = (kind 0 softmax / 1 ε-greedy, probs (n_users, n_items), slates
    (n_users, L), ε, explore (n_items,));  model = (reward-model logit without position (n_users, n_items),
    position logits (L,), q_target (n_users, L) = E_target q̂);  grid: DRos's λ values;
    emit = (user, action, reward, p0, pe, q_logged) arrays of n_slates·L or empty ones.
    """
    click, pos_bias = world[0], world[1]
    cdf, p0m = logging[0], logging[1]
    qbase, qpos, qtgt = model[0], model[1], model[2]
    L, n_users, G = pos_bias.shape[0], click.shape[0], grid.shape[0]
    nl = N_FIXED + G
    tail = 2 * nl
    v = np.zeros(nl)
    state = np.array([key])
    out = emit[0].shape[0] > 0
    for s in range(n_slates):
        u = next_below(state, n_users)
        W, sum_w, sum_r = 1.0, 0.0, 0.0
        v[:] = 0.0
        for k in range(L):
            a = _sample(cdf[k], next_float(state))
            r = 1.0 if next_float(state) < pos_bias[k] * click[u, a] else 0.0
            p0 = p0m[k, a]
            pe = _target_prob(target, u, k, a)
            w = pe / p0
            q = 1.0 / (1.0 + np.exp(-(qbase[u, a] + qpos[k])))
            qt = qtgt[u, k]
            W_prev = W
            W *= w
            v[LIN_IPS] += w * r
            v[LIN_DM] += qt
            v[LIN_DR] += qt + w * (r - q)
            v[LIN_RIPS] += W * r
            v[LIN_CDR] += W * (r - q) + W_prev * qt
            for g in range(G):
                wh = grid[g] * w / (w * w + grid[g])
                v[N_FIXED + g] += qt + wh * (r - q)
            sum_w += w
            sum_r += r
            stats[tail + 5] += w
            stats[tail + 6] += w * w
            stats[tail + 7] = max(stats[tail + 7], w)
            stats[tail + 8] += 1.0 if w > 0 else 0.0
            if out:
                i = s * L + k
                emit[0][i], emit[1][i], emit[2][i] = u, a, r
                emit[3][i], emit[4][i], emit[5][i] = p0, pe, q
        v[LIN_SIPS] = W * sum_r
        v[LIN_PI] = (sum_w - L + 1.0) * sum_r
        A, B = v[LIN_IPS] / L, sum_w / L
        for e in range(nl):
            x = v[e] / L
            stats[e] += x
            stats[nl + e] += x * x
        stats[tail] += A
        stats[tail + 1] += B
        stats[tail + 2] += A * A
        stats[tail + 3] += B * B
        stats[tail + 4] += A * B


@njit(cache=True, parallel=True)
def slate_study(seed, setting, n_slates, n_logs, world, logging, target, model, grid):
    """``slate_log`` for logs 0..n_logs−1 of one setting, each from its own stream (seed,
    setting, log) — the same numbers for any thread count. Returns (n_logs, n_stats)."""
    stats = np.zeros((n_logs, n_stats(grid.shape[0])))
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0),
             np.zeros(0), np.zeros(0))
    for i in prange(n_logs):
        slate_log(stream_key(seed, setting, i), n_slates, world, logging, target, model, grid,
                  stats[i], empty)
    return stats
