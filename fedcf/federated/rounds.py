"""Round machinery shared by every federated algorithm: client sampling with production knobs,
deterministic sparse aggregation with a non-finite guard, and atomic checkpoints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._kernels.federated import sum_sorted_runs
from .._kernels.server import finite_clients


@dataclass(frozen=True)
class RoundSample:
    clients: np.ndarray  # dense ids of the clients whose reports are used, in report order
    n_sampled: int  # invited this round (after oversampling)
    n_dropped: int  # invited but never reported
    n_surplus: int  # reported after the first m and were ignored


def sample_round(seed: int, round_idx: int, eligible: np.ndarray, m: int, *, oversample: float = 0.0,
                 dropout: float = 0.0) -> RoundSample:
    """Invite ceil(m·(1+oversample)) eligible clients without replacement; each fails to report
    with probability ``dropout``; of those that report, the first m to finish (random finishing
    times) are used. Depends only on (seed, round): resuming reproduces the same clients."""
    rng = np.random.default_rng([int(seed), int(round_idx), 0x5EED])
    n_invite = min(len(eligible), int(np.ceil(m * (1.0 + oversample))))
    invited = rng.choice(eligible, size=n_invite, replace=False) if n_invite else eligible[:0]
    reported = invited[rng.random(n_invite) >= dropout] if dropout > 0 else invited
    finish = rng.exponential(size=len(reported))
    used = reported[np.argsort(finish, kind="stable")][:m]
    return RoundSample(used.astype(np.int64), n_invite, n_invite - len(reported),
                       len(reported) - len(used))


@dataclass(frozen=True)
class Aggregate:
    items: np.ndarray  # distinct items touched, sorted
    d_Q: np.ndarray  # weighted mean delta rows (len(items), K), float64
    d_b: np.ndarray
    n_used: int  # clients with positive weight
    n_nonfinite: int  # clients dropped because their update was not finite
    n_empty: int  # clients with nothing to contribute (empty query set)
    values_up: int  # numbers sent up by the used clients (item ids not counted)
    total_weight: float
    client_weights: np.ndarray | None = None  # effective weight per client (0 = not used)


def aggregate(offsets, d_items, d_Q, d_b, weights, weighting: str = "num_examples") -> Aggregate:
    """Weighted mean of the clients' sparse deltas, Σ_k w_k Δ_k / Σ_k w_k (Δ_k = 0 off its rows).

    Clients with a non-finite value anywhere in their delta get weight 0. The sum runs in a
    fixed order (item, then client) in a small sequential kernel, so it does not depend on
    thread scheduling and costs O(entries × K), never O(n_items × K).
    """
    m = len(weights)
    K = d_Q.shape[1]
    lengths = np.diff(offsets)
    owner = np.repeat(np.arange(m), lengths)
    bad_client = ~finite_clients(np.asarray(offsets, np.int64), d_Q, d_b)
    w = np.asarray(weights, dtype=np.float64).copy()
    if weighting == "uniform":
        w = (w > 0).astype(np.float64)
    n_empty = int(np.sum((w == 0) & ~bad_client))
    w[bad_client] = 0.0
    total = w.sum()
    valid = (d_items >= 0) & (w[owner] > 0)
    if total <= 0 or not valid.any():
        return Aggregate(np.zeros(0, np.int64), np.zeros((0, K)), np.zeros(0), 0,
                         int(bad_client.sum()), n_empty, 0, 0.0, w)
    scale = np.where(valid, w[owner] / total, 0.0)
    order = np.argsort(np.where(valid, d_items, -1), kind="stable")
    n_valid = int(valid.sum())
    dq = np.empty((n_valid, K))
    db = np.empty(n_valid)
    items = np.empty(n_valid, np.int64)
    m = sum_sorted_runs(order, d_items, d_Q, d_b, scale, dq, db, items)
    return Aggregate(items[:m], dq[:m], db[:m], int(np.sum(w > 0)), int(bad_client.sum()),
                     n_empty, n_valid * (K + 1), float(total), w)


# ---------------------------------------------------------------------- checkpoints
def save_checkpoint(path, arrays: dict, meta: dict) -> None:
    """Atomic: write to a temporary file in the same folder, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, __meta__=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_checkpoint(path):
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
    return arrays, meta
