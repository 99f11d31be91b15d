"""Evaluating the evaluators: many independent simulated slate logs per setting, every estimator's
estimate and interval on each, against the target's exact value.

A *world* is a set of users with their ground-truth click probabilities over the catalog (from
an :class:`~fedcf.eval.simulation.ExpressionPopulation`) and the position bias. Logging policies
are context-free and factored (each position drawn independently, so propensities are exact);
targets are stochastic: a softmax over a model's scores, or ε-greedy around the model's slate.
The logs are drawn and evaluated by the streaming kernel ``fedcf._kernels.ope`` — no log is
stored — so 100 logs of 10⁷ impressions take minutes, not hours.

Estimators (per-row weights w = π_e/π0 unless said): ``ips`` (= independent IPS on slates),
``snips``, ``dm``, ``dr`` (per position), ``rips``, ``sips`` (the whole slate as one action),
``pi`` (pseudo-inverse), ``cascade_dr`` and ``dros`` (λ from a grid by estimated MSE); see
``fedcf.eval.slate``. Intervals are normal over slates (SNIPS: delta method).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import norm

from .._kernels import ope as kope
from .slate import SHRINKAGE_GRID

STUDY_ESTIMATORS = ("ips", "snips", "dm", "dr", "rips", "sips", "pi", "cascade_dr", "dros")
_LIN = {"ips": kope.LIN_IPS, "dm": kope.LIN_DM, "dr": kope.LIN_DR, "rips": kope.LIN_RIPS,
        "sips": kope.LIN_SIPS, "pi": kope.LIN_PI, "cascade_dr": kope.LIN_CDR}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class SlateWorld:
    """Users' click probabilities at the top position, click[u, a] (float32), and the position
    bias: P(click | u, a, k) = pos_bias[k]·click[u, a]."""

    click: np.ndarray
    pos_bias: np.ndarray

    @classmethod
    def from_population(cls, pop, users, chunk: int = 512) -> SlateWorld:
        users = np.asarray(users)
        click = np.empty((len(users), pop.n_items), np.float32)
        items = np.arange(pop.n_items)
        for s in range(0, len(users), chunk):
            u = users[s:s + chunk]
            a = pop.affinity(u, np.broadcast_to(items, (len(u), pop.n_items)))
            click[s:s + chunk] = _sigmoid(a - pop.log_popularity.mean() + pop.click_bias)
        return cls(click, np.asarray(pop.position_bias, np.float64))

    @property
    def slate_size(self) -> int:
        return len(self.pos_bias)


@dataclass(frozen=True)
class Policy:
    """A factored policy. Context-free (``probs`` (L, n_items)) for logging; for a target either
    a softmax (``probs`` (n_users, n_items), the same at every position) or ε-greedy around
    ``slates`` (n_users, L)."""

    kind: str
    probs: np.ndarray
    slates: np.ndarray | None = None
    epsilon: float = 0.0
    explore: np.ndarray | None = None

    def kernel_logging(self):
        p = np.asarray(self.probs, np.float64)
        cdf = np.cumsum(p, axis=1)
        last = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
        for k, j in enumerate(last):  # the last possible item takes every u ≥ the rounded total
            cdf[k, j:] = np.inf
        return cdf, p

    def kernel_target(self, n_items, L):
        if self.kind == "softmax":
            return 0, self.probs, np.zeros((0, L), np.int64), 0.0, np.zeros(n_items)
        # contiguous: a sliced argsort would make the kernels compile a second signature
        return (1, np.zeros((0, n_items), np.float32), np.ascontiguousarray(self.slates),
                float(self.epsilon), self.explore)

    def marginal(self, u_rows, k):
        """π(· | u, k) of a target as a dense (len(u_rows), n_items) array."""
        if self.kind == "softmax":
            return self.probs[u_rows].astype(np.float64)
        out = np.tile(self.epsilon * self.explore, (len(u_rows), 1))
        out[np.arange(len(u_rows)), self.slates[u_rows, k]] += 1 - self.epsilon
        return out


def context_free(probs_per_position) -> Policy:
    p = np.asarray(probs_per_position, np.float64)
    if p.ndim != 2 or np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0):
        raise ValueError("a logging policy needs (positions, items) probabilities summing to 1 "
                         "per position")
    return Policy("logging", p)


def _uniform_over(n_items, support):
    u = np.zeros(n_items)
    idx = np.arange(n_items) if support is None else np.asarray(support)
    if len(idx) == 0:
        raise ValueError("the support (candidate items) is empty")
    u[idx] = 1.0 / len(idx)
    return u


def uniform_logging(n_items: int, L: int, support=None) -> Policy:
    """Uniform over the catalog, or over the candidate items ``support``, at each position."""
    return context_free(np.tile(_uniform_over(n_items, support), (L, 1)))


def _check_epsilon(epsilon, low_open=True):
    ok = isinstance(epsilon, (int, float, np.floating)) and not isinstance(epsilon, bool) \
        and (0 < epsilon <= 1 if low_open else 0 <= epsilon <= 1)
    if not ok:
        raise ValueError(f"epsilon must be in {'(0, 1]' if low_open else '[0, 1]'}, got "
                         f"{epsilon!r}")


def epsilon_greedy_logging(scores, epsilon: float, L: int, support=None) -> Policy:
    """Position k shows the k-th best item by ``scores`` with probability 1 − ε, else an item
    uniform over the catalog (or ``support``)."""
    _check_epsilon(epsilon, low_open=False)
    p = np.tile(epsilon * _uniform_over(len(scores), support), (L, 1))
    p[np.arange(L), np.argsort(-np.asarray(scores), kind="stable")[:L]] += 1 - epsilon
    return context_free(p)


def softmax_target(scores, temperature: float) -> Policy:
    """π(a | u) ∝ exp(score[u, a] / T) at every position (drawn independently); items scored
    −inf get probability 0."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    z = np.asarray(scores, np.float64) / temperature
    bad = np.isnan(z) | (z == np.inf)
    if bad.any() or np.all(z == -np.inf, axis=-1).any():
        where = np.argwhere(bad)[0] if bad.any() else (int(np.flatnonzero(
            np.all(z == -np.inf, axis=-1))[0]), "all")
        raise ValueError(f"scores must be finite (or -inf to exclude an item) with at least one "
                         f"item per user; see user row {where[0]}, item {where[1]}")
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return Policy("softmax", p.astype(np.float32))


def epsilon_greedy_target(slates, epsilon: float, n_items: int, support=None) -> Policy:
    """Position k shows the user's k-th slate item with probability 1 − ε, else an item
    uniform over the catalog (or ``support``)."""
    _check_epsilon(epsilon)
    return Policy("epsilon", np.zeros((0, n_items), np.float32), np.asarray(slates, np.int64),
                  float(epsilon), _uniform_over(n_items, support))


def target_value(world: SlateWorld, target: Policy, chunk: int = 512) -> float:
    """The target's exact CTR: mean over users and positions of Σ_a π(a|u,k) P(click|u,a,k)."""
    total = 0.0
    n_users = len(world.click)
    for s in range(0, n_users, chunk):
        rows = np.arange(s, min(s + chunk, n_users))
        for k in range(world.slate_size):
            pi = target.marginal(rows, k)
            total += world.pos_bias[k] * float(np.sum(pi * world.click[rows]))
    return total / (n_users * world.slate_size)


@dataclass(frozen=True)
class RewardModel:
    """q̂(u, a, k) = σ(base[u, a] + pos[k]) and its expectation under a target per (u, k)."""

    base: np.ndarray
    pos: np.ndarray

    def expected(self, target: Policy, chunk: int = 512) -> np.ndarray:
        n_users, L = len(self.base), len(self.pos)
        out = np.empty((n_users, L))
        for s in range(0, n_users, chunk):
            rows = np.arange(s, min(s + chunk, n_users))
            for k in range(L):
                q = _sigmoid(self.base[rows].astype(np.float64) + self.pos[k])
                out[rows, k] = np.sum(target.marginal(rows, k) * q, axis=1)
        return out


def draw_log(world, logging, target, model, q_target, n_slates, *, seed=0, setting=0,
             log_index=0, grid=SHRINKAGE_GRID) -> tuple[pd.DataFrame, np.ndarray]:
    """One log, written out (DataFrame: slate_id, context (world row), position, action,
    reward, propensity, target_probs, q_logged, q_target), and the kernel's statistics of it."""
    L = world.slate_size
    n = n_slates * L
    emit = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n), np.empty(n),
            np.empty(n), np.empty(n))
    stats = np.zeros(kope.n_stats(len(grid)))
    kope.slate_log(np.uint64(kope.stream_key(np.uint64(seed), setting, log_index)), n_slates,
                   _world(world),
                   logging.kernel_logging(), target.kernel_target(world.click.shape[1], L),
                   (model.base, model.pos, q_target), np.asarray(grid, np.float64), stats, emit)
    pos = np.tile(np.arange(L), n_slates)
    log = pd.DataFrame({"slate_id": np.repeat(np.arange(n_slates), L), "context": emit[0],
                        "position": pos, "action": emit[1], "reward": emit[2],
                        "propensity": emit[3], "target_probs": emit[4], "q_logged": emit[5],
                        "q_target": q_target[emit[0], pos]})
    return log, stats


def _world(world):
    return world.click, world.pos_bias


def study_stats(world, logging, target, model, q_target, n_slates, n_logs, *, seed=0,
                setting=0, grid=SHRINKAGE_GRID) -> np.ndarray:
    """(n_logs, n_stats) statistics of n_logs independent logs of n_slates slates."""
    return kope.slate_study(np.uint64(seed), setting, n_slates, n_logs, _world(world),
                            logging.kernel_logging(),
                            target.kernel_target(world.click.shape[1], world.slate_size),
                            (model.base, model.pos, q_target), np.asarray(grid, np.float64))


def estimates_from_stats(stats: np.ndarray, n_slates: int, slate_size: int, *,
                         grid=SHRINKAGE_GRID, alpha: float = 0.05) -> pd.DataFrame:
    """Every estimator's estimate, std error and normal interval for each log's statistics.
    Returns a long DataFrame (log, estimator, estimate, se, low, high, shrinkage, and the
    per-position weights' ess, ess_share, max_weight, matched_share)."""
    stats = np.atleast_2d(stats)
    G = len(grid)
    nl = kope.N_FIXED + G
    n = float(n_slates)
    mean = stats[:, :nl] / n
    var = np.maximum(stats[:, nl:2 * nl] / n - mean ** 2, 0.0) * n / max(n - 1, 1)
    se = np.sqrt(var / n)
    z = norm.ppf(1 - alpha / 2)
    t = stats[:, 2 * nl:]
    rows = []
    n_rows = n * slate_size
    for i in range(len(stats)):
        ess = t[i, 5] ** 2 / t[i, 6] if t[i, 6] > 0 else 0.0
        diag = {"ess": ess, "ess_share": ess / n_rows, "max_weight": t[i, 7],
                "matched_share": t[i, 8] / n_rows}
        for name, e in _LIN.items():
            rows.append({"log": i, "estimator": name, "estimate": mean[i, e], "se": se[i, e],
                         "shrinkage": np.nan, **diag})
        mse = (mean[i, kope.N_FIXED:] - mean[i, kope.LIN_DR]) ** 2 + var[i, kope.N_FIXED:] / n
        g = int(np.argmin(mse))
        rows.append({"log": i, "estimator": "dros", "estimate": mean[i, kope.N_FIXED + g],
                     "se": se[i, kope.N_FIXED + g], "shrinkage": float(grid[g]), **diag})
        sA, sB, sAA, sBB, sAB = t[i, :5]
        est = sA / sB if sB > 0 else np.nan
        mb = sB / n
        v_snips = (sAA - 2 * est * sAB + est ** 2 * sBB) / n / mb ** 2 if sB > 0 else np.nan
        rows.append({"log": i, "estimator": "snips", "estimate": est,
                     "se": np.sqrt(max(v_snips, 0.0) / n), "shrinkage": np.nan, **diag})
    out = pd.DataFrame(rows)
    out["low"] = out["estimate"] - z * out["se"]
    out["high"] = out["estimate"] + z * out["se"]
    return out


def warm_up() -> None:
    """Compile this module's kernels (``fedcf.warmup``'s "ope" path): one written-out log and a
    study of two, on a tiny world, with the array types the study uses."""
    from .simulation import make_expression_population

    pop = make_expression_population(12, {"gif": 6}, position_bias=(1, .5), random_state=0)
    world = SlateWorld.from_population(pop, np.arange(12))
    model = RewardModel(np.zeros((12, 6), np.float32), np.zeros(2))
    target = epsilon_greedy_target(np.tile(np.arange(2), (12, 1)), 0.2, 6)
    q = model.expected(target)
    draw_log(world, uniform_logging(6, 2), target, model, q, 3)
    study_stats(world, uniform_logging(6, 2), target, model, q, 3, 2)
