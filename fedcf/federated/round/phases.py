"""The phases of one federated round, each replaceable on its own:

    select(round)                       → Cohort
    executor.run(cohort, params, ids)   → ClientOutputs     (the only thing clients send up)
    aggregator(outputs, hp)             → GlobalDelta
    server_update(opt, state, params, delta, hp)   → new params (sparse in place where possible)
    finish (RoundFinisher)              → guard, history, callback, checkpoint

Round-level hyperparameters that a hyper-learner may change between rounds live in one
``RoundHyperparams`` object, read by the aggregator and the server update. The weighted mean
(the summing aggregator the others build on) is in weighted.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import pandas as pd

from ..._kernels.server import finite_clients
from ..._threads import small
from ...datasets._validation import show
from . import secret
from .contracts import Executor, RoundExecutor
from .device import Device, DevicePolicy
from .partials import Merged, merged_sums
from .reports import Reports


@dataclass(frozen=True)
class RoundHyperparams:
    """What a round reads that may change between rounds (a hyper-learner changes them).

    Parameters
    ----------
    server_learning_rate : float
        η_s of the server optimizer.
    server_options : dict
        The server optimizer's options (momentum, beta1, ...), see optimizers.py.
    weight_exponent : float, default 1
        Client weight w_i = n_i ** weight_exponent for a client with n_i > 0 query examples (1:
        by examples, 0: uniform); clients with n_i = 0 weigh 0.

    Examples
    --------
    >>> from fedcf.federated import RoundHyperparams
    >>> RoundHyperparams(1.0, {}, weight_exponent=0.0).weight_exponent
    0.0
    """

    server_learning_rate: float
    server_options: dict = field(default_factory=dict)
    weight_exponent: float = 1.0


# ---------------------------------------------------------------------- 1. select
@dataclass(frozen=True)
class Cohort:
    """The clients of one round, as the selector chose them.

    Parameters
    ----------
    clients : ndarray of int64
        Dense ids of the clients whose reports are used, in report order.
    n_sampled, n_dropped, n_surplus : int
        Invited; invited but never reported; reported after the first m and ignored.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import Cohort
    >>> Cohort(np.array([3, 7]), n_sampled=3, n_dropped=1, n_surplus=0).clients
    array([3, 7])
    """

    clients: np.ndarray  # dense ids of the clients whose reports are used, in report order
    n_sampled: int  # invited this round (after oversampling)
    n_dropped: int  # invited but never reported
    n_surplus: int  # reported after the first m and were ignored


@dataclass(frozen=True)
class Selector:
    """Who takes part in a round: invite ceil(m·(1+oversample)) clients, without replacement, from
    the eligible ones (at least ``min_examples`` examples) that ``availability`` says are
    reachable; each fails to report with probability ``dropout``; of those that report, the
    first m to finish (random finishing times) are used. Depends only on (seed, round).

    Parameters
    ----------
    seed : int
        The run seed; a round's cohort depends only on (seed, round).
    eligible : ndarray
        Sorted dense ids of the clients that may be sampled.
    clients_per_round : int
        m, the clients used per round (the expected cohort with Poisson sampling).
    oversample, dropout : float, default 0
    availability : callable(round) -> sorted dense ids, or None
    poisson : bool, default False
        Sample each eligible client independently with q = m / len(eligible) (for DP).
    secret : bool, default False
        Draw the Poisson cohorts from the OS's secure generator (``secret.uniform``), not from
        the seed: differential privacy's amplification by sampling assumes a secret cohort.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import Selector
    >>> select = Selector(seed=0, eligible=np.arange(100), clients_per_round=10)
    >>> len(select(0).clients), len(select(1).clients)
    (10, 10)
    """

    seed: int
    eligible: np.ndarray  # sorted dense ids
    clients_per_round: int
    oversample: float = 0.0
    dropout: float = 0.0
    availability: object = None  # callable(round) -> sorted dense ids, or None
    poisson: bool = False  # each eligible client independently with q = m / len(eligible)
    secret: bool = False  # Poisson cohorts from the OS's secure generator

    def __call__(self, round_idx: int) -> Cohort:
        pool = self.eligible
        if self.availability is not None:
            pool = np.intersect1d(pool, self.availability(round_idx), assume_unique=True)
        rng = np.random.default_rng([int(self.seed), int(round_idx), 0x5EED])
        if self.poisson:  # the sampling differential-privacy accountants assume
            q = min(1.0, self.clients_per_round / max(len(self.eligible), 1))
            draw = secret.uniform if self.secret else rng.random
            invited = pool[bernoulli_positions(len(pool), q, draw)]
            reported = invited[draw(len(invited)) >= self.dropout] if self.dropout > 0 \
                else invited
            return Cohort(reported.astype(np.int64), len(invited), len(invited) - len(reported),
                          0)
        n_invite = min(len(pool), int(np.ceil(self.clients_per_round * (1.0 + self.oversample))))
        invited = rng.choice(pool, size=n_invite, replace=False) if n_invite else pool[:0]
        reported = invited[rng.random(n_invite) >= self.dropout] if self.dropout > 0 else invited
        finish = rng.exponential(size=len(reported))
        used = reported[np.argsort(finish, kind="stable")][:self.clients_per_round]
        return Cohort(used.astype(np.int64), n_invite, n_invite - len(reported),
                      len(reported) - len(used))


def reachable_users(availability, inter):
    """Wrap ``availability(round) -> raw user ids`` into a function returning sorted dense ids;
    anything else (a boolean mask, unknown ids, a non-1-D result) is refused, naming it."""
    if availability is None:
        return None
    if not callable(availability):
        raise TypeError(f"availability must be a function round -> raw user ids, got "
                        f"{type(availability).__name__}")
    index = pd.Index(inter.user_ids)

    def dense(round_idx):
        raw = np.asarray(availability(round_idx))
        if raw.ndim != 1:
            raise ValueError(f"availability({round_idx}) must return a 1-D array of raw user ids, "
                             f"got shape {raw.shape}")
        if raw.dtype == bool:
            raise TypeError(f"availability({round_idx}) returned a boolean mask; return the raw "
                            "ids of the reachable users instead (e.g. user_ids[mask])")
        ids = index.get_indexer(pd.Index(raw))
        if np.any(ids < 0):
            bad = show(raw[ids < 0][0])
            raise ValueError(f"availability({round_idx}) returned user id {bad}, which is not a "
                             "user of the training data")
        return np.unique(ids).astype(np.int64)

    return dense


def bernoulli_positions(n: int, q: float, draw) -> np.ndarray:
    """Sorted positions in [0, n), each present independently with probability q, in time
    O(n·q) rather than O(n): the gaps between successive positions are Geometric(q), each drawn
    by inversion from one uniform of ``draw(size)`` (values in (0, 1)):
    P(⌊ln U / ln(1−q)⌋ ≥ g) = P(U ≤ (1−q)^g) = (1−q)^g.

    >>> import numpy as np
    >>> bernoulli_positions(10, 1.0, np.random.default_rng(0).random)
    array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """
    if q >= 1.0:
        return np.arange(n, dtype=np.int64)
    if n <= 0 or q <= 0.0:
        return np.zeros(0, np.int64)
    scale, parts, last = 1.0 / np.log1p(-q), [], -1
    while True:  # almost always one batch: the expected count plus 6 standard deviations
        batch = int(n * q + 6.0 * np.sqrt(n * q) + 16)
        u = np.maximum(draw(batch), 5e-324)  # a uniform of exactly 0 would be an infinite gap
        gaps = np.minimum(np.floor(np.log(u) * scale), float(n)).astype(np.int64) + 1
        pos = last + np.cumsum(gaps)
        if pos[-1] >= n:
            parts.append(pos[pos < n])
            return np.concatenate(parts)
        parts.append(pos)
        last = int(pos[-1])


# ---------------------------------------------------------------------- 2. client work
@dataclass(frozen=True)
class ClientOutputs:
    """What a round's clients send to the server, and nothing else.

    Client k's sparse delta sits in slots [offsets[k], offsets[k+1]) of ``items`` (item −1 =
    padding), ``d_Q`` and ``d_b``. ``weights`` are the query sizes n_k, ``losses`` the query loss
    before the update. ``rank_terms`` (m, K, K) carries the full-catalog negative map of
    FedReconImplicitMF(full_negatives=True) — it reveals p up to sign, so that option is for
    deployments under secure aggregation. No field holds a user embedding, a user bias or any
    other local parameter.

    Parameters
    ----------
    offsets : ndarray (m + 1,)
    items : ndarray of int64
        Item row of each slot (−1 = padding).
    d_Q, d_b : ndarray
        Row deltas (slots × K) and bias deltas (slots,).
    weights, losses : ndarray (m,)
        Query sizes and query losses before the update.
    rank_terms : ndarray (m, K, K) or None
    clients : ndarray (m,) or None

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import ClientOutputs
    >>> out = ClientOutputs(offsets=np.array([0, 2, 3]), items=np.array([4, 9, 4]),
    ...                     d_Q=np.zeros((3, 2)), d_b=np.zeros(3), weights=np.array([2.0, 1.0]),
    ...                     losses=np.array([0.5, 0.7]))
    >>> out.n_clients, out.take([1]).items
    (2, array([4]))
    """

    offsets: np.ndarray
    items: np.ndarray
    d_Q: np.ndarray
    d_b: np.ndarray
    weights: np.ndarray
    losses: np.ndarray
    rank_terms: np.ndarray | None = None
    clients: np.ndarray | None = None  # dense ids in cohort order (None: 0, 1, ...)

    @property
    def n_clients(self) -> int:
        return len(self.weights)

    def finite_clients(self) -> np.ndarray:
        """True for each client whose upload (row and bias deltas) is all finite."""
        return small(finite_clients, self.d_Q.size, self.offsets, self.d_Q, self.d_b)

    def client_ids(self) -> np.ndarray:
        return np.arange(self.n_clients) if self.clients is None else self.clients

    def take(self, order) -> ClientOutputs:
        """The outputs of clients ``order`` (positions), in that order."""
        order = np.asarray(order, np.int64)
        sizes = np.diff(self.offsets)[order]
        offsets = np.zeros(len(order) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        slots = np.repeat(self.offsets[order] - offsets[:-1], sizes) + np.arange(offsets[-1])
        return ClientOutputs(offsets, self.items[slots], self.d_Q[slots], self.d_b[slots],
                             self.weights[order], self.losses[order],
                             None if self.rank_terms is None else self.rank_terms[order],
                             None if self.clients is None else self.clients[order])

    @classmethod
    def concat(cls, parts) -> ClientOutputs:
        """The outputs of consecutive groups of a cohort, as one batch (in the given order)."""
        parts = list(parts)
        sizes = [int(p.offsets[-1]) for p in parts]
        starts = np.cumsum([0] + sizes[:-1])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        ranks = [p.rank_terms for p in parts]
        pick = attrgetter("items", "d_Q", "d_b", "weights", "losses")
        return cls(offsets.astype(np.int64), *(np.concatenate(col)
                                               for col in zip(*(pick(p) for p in parts))),
                   None if ranks[0] is None else np.concatenate(ranks),
                   None if parts[0].clients is None else
                   np.concatenate([p.client_ids() for p in parts]))


def cohort_order(cohort: Cohort, parts) -> np.ndarray:
    """The permutation that puts results concatenated part by part (``parts``: the client ids
    each part returned, in its order) back in cohort order; clients absent from the parts
    (a refused reply) are simply not in it."""
    sent = np.concatenate(parts) if len(parts) else np.zeros(0, np.int64)
    by_id = np.argsort(cohort.clients, kind="stable")  # a cohort's ids are distinct
    position = by_id[np.searchsorted(cohort.clients, sent, sorter=by_id)]
    return np.argsort(position, kind="stable")


class LocalExecutor(Executor):
    """Runs a cohort's client work in this process: one Numba call over the cohort's clients
    (a shared queue, largest first). The default executor.

    Parameters
    ----------
    device_policy : DevicePolicy or None, default None
        The simulated devices' own rules under secure aggregation (None: the default
        ``DevicePolicy``); a server's job cannot change them.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import LocalExecutor
    >>> FedReconMF(executor=LocalExecutor()).executor
    LocalExecutor(device_policy=None)
    """

    device_policy = None  # a subclass that sets no policy runs the default one

    def __init__(self, device_policy=None):
        self.device_policy = device_policy

    def bind(self, program, data, local_state=None) -> BoundLocalExecutor:
        return BoundLocalExecutor(program, data, local_state, Device(
            self.device_policy or DevicePolicy()))


class BoundLocalExecutor(RoundExecutor):
    """``LocalExecutor`` bound to one run: ``program`` (see fedrecon.py, stateful.py,
    implicit.py) lays out the output slots and calls its kernel; ``data`` is the population's
    user-grouped CSR; ``local_state`` the stateful baselines' per-user rows (or None).

    Parameters
    ----------
    program : ClientProgram
    data : (indptr, items, values)
    local_state : (P, c) or None
    device : Device or None
        The clients' device (its policy and ledger) under secure aggregation.

    Examples
    --------
    >>> from fedcf.federated import LocalExecutor
    >>> LocalExecutor().bind  # doctest: +ELLIPSIS
    <bound method LocalExecutor.bind of LocalExecutor(...)>
    """

    supports_secure = True  # the clients' protocol halves run here, in the driver

    def __init__(self, program, data, local_state=None, device=None):
        self.program, self.data, self.local_state = program, data, local_state
        self.counts = np.diff(data[0])
        self.device = device or Device()

    def secure_clients(self, cohort: Cohort, params: dict, ids: np.ndarray, hp, job):
        """The cohort's protocol halves: its clients train, then the device begins the
        aggregator's ``job`` on their outputs under its own policy."""
        return self.device.begin_updates(job, self.run(cohort, params, ids), hp, params, ids)

    def secure_reports(self, cohort: Cohort, params: dict, tangents, ids: np.ndarray, job):
        """As ``secure_clients``, for masked hypergradient reports."""
        return self.device.begin_reports(job, Reports(cohort.clients, *self.tangents(
            cohort, params, tangents, ids)), params, tangents, ids)

    def run(self, cohort: Cohort, params: dict, ids: np.ndarray) -> ClientOutputs:
        clients = cohort.clients
        weights, slots = self.program.layout(self.counts[clients])
        offsets = np.zeros(len(clients) + 1, np.int64)
        np.cumsum(slots, out=offsets[1:])
        total, K = int(offsets[-1]), params["Q"].shape[1]
        dt = params["Q"].dtype
        out = (offsets, np.empty(total, np.int64), np.empty((total, K), dt), np.empty(total, dt),
               np.full(len(clients), np.nan))
        rank_terms = self.program.run(self.data, clients, params, self.local_state, ids, out)
        return ClientOutputs(offsets, out[1], out[2], out[3], weights.astype(np.float64), out[4],
                             rank_terms, clients)

    def tangents(self, cohort: Cohort, params: dict, tangents, ids: np.ndarray):
        """The cohort's query losses at ``params`` and their derivatives along ``tangents``
        (federated hypergradients, see hyper.py): (losses (m,), jvp (m, H), query sizes (m,))."""
        clients = cohort.clients
        weights, _ = self.program.layout(self.counts[clients])
        losses, jvp = self.program.tangents(self.data, clients, params, self.local_state,
                                            tangents, ids)
        return losses, jvp, weights.astype(np.float64)


# ---------------------------------------------------------------------- 3. aggregate
@dataclass(frozen=True)
class RoundSummary:
    """What the round loop needs to know about the clients besides the aggregate: counts, the
    mean query loss (weighted by query size, over used clients with a finite loss), and the
    worst client (largest query loss, −1 if none)."""

    n_clients: int
    n_used: int  # clients in the aggregate (weight > 0)
    n_nonfinite: int  # uploads left out for a non-finite value
    n_nonfinite_recon: int  # ... of which the query loss was already non-finite
    n_empty: int  # clients with nothing to contribute (empty query set)
    loss: float
    worst_client: int
    worst_loss: float

    @classmethod
    def from_merged(cls, mg: Merged) -> RoundSummary:
        t = mg.totals
        loss = t["loss_sum"] / t["loss_weight"] if t["loss_weight"] > 0 else float("nan")
        return cls(int(t["n_clients"]), int(t["n_used"]), int(t["n_nonfinite"]),
                   int(t["n_nonfinite_recon"]), int(t["n_empty"]), loss, mg.worst_client,
                   mg.worst_loss)


@dataclass(frozen=True)
class GlobalDelta:
    """One round's aggregated update: mean row deltas on ``items`` (sorted, distinct), plus an
    optional dense rank map M (K, K) applied as −Q·M (full-catalog implicit negatives).

    Parameters
    ----------
    items : ndarray
        Sorted, distinct item rows the update touches.
    d_Q, d_b : ndarray
        Their mean row and bias deltas (float64).
    rank_map : ndarray (K, K) or None
    summary : RoundSummary
    values_up : int
        Numbers sent up by the used clients.
    client_weights : ndarray or None
    exponent_terms : (items, dQ, db) or None
        ∂Δ̄/∂α of the mean, when the aggregator computed it from sums (secure aggregation
        learning the weight exponent); None: the learner takes it from the clients' outputs.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import ClientOutputs, RoundHyperparams, WeightedMean
    >>> out = ClientOutputs(np.array([0, 1, 2]), np.array([4, 4]), np.array([[1.0], [3.0]]),
    ...                     np.zeros(2), np.array([1.0, 1.0]), np.zeros(2))
    >>> delta = WeightedMean()(out, RoundHyperparams(1.0))
    >>> delta.items, delta.d_Q
    (array([4]), array([[2.]]))
    """

    items: np.ndarray
    d_Q: np.ndarray  # (len(items), K) float64
    d_b: np.ndarray
    rank_map: np.ndarray | None
    summary: RoundSummary
    values_up: int  # numbers sent up by the used clients (item ids not counted)
    client_weights: np.ndarray | None = None  # per client, when computed from ClientOutputs
    # (items, dQ, db) of ∂Δ̄/∂α when the aggregator summed it (secure aggregation learning α)
    exponent_terms: tuple | None = None

    @property
    def n_used(self) -> int:
        return self.summary.n_used

    @property
    def n_empty(self) -> int:
        return self.summary.n_empty


def summarize(out: ClientOutputs, hp: RoundHyperparams) -> RoundSummary:
    """The RoundSummary of per-client outputs (for aggregators that need every upload)."""
    bad, w, _ = client_weights(out, hp)
    return RoundSummary.from_merged(merged_sums(
        out, out.client_ids(), np.zeros(out.n_clients), w, bad, (w == 0) & ~bad))


def empty_delta(K: int, summary: RoundSummary, client_w=None) -> GlobalDelta:
    return GlobalDelta(np.zeros(0, np.int64), np.zeros((0, K)), np.zeros(0), None, summary, 0,
                       client_w)


def client_weights(out: ClientOutputs, hp: RoundHyperparams):
    """(non-finite mask, weights w_k = n_k ** exponent with 0 for empty or non-finite uploads,
    number of empty clients)."""
    bad = ~small(finite_clients, out.d_Q.size, out.offsets, out.d_Q, out.d_b)
    if out.rank_terms is not None:
        bad |= ~np.isfinite(out.rank_terms).all(axis=(1, 2))
    w = np.where(out.weights > 0, out.weights ** hp.weight_exponent, 0.0)
    n_empty = int(np.sum((w == 0) & ~bad))
    w[bad] = 0.0
    return bad, w, n_empty


# ---------------------------------------------------------------------- 4. server update
def server_update(opt, state: dict, params: dict, delta: GlobalDelta, hp: RoundHyperparams):
    """Apply the server optimizer to the antigradient −Δ̄. SGD/Adagrad with a sparse delta update
    the touched rows in place (O(rows × K)); momentum, Adam, Yogi and a dense rank map move every
    row and go through the dense path. Returns (state, params, finite)."""
    Q = params["Q"]
    if opt.sparse and delta.rank_map is None:
        state, params = opt.step_rows(state, params, delta.items, {"Q": delta.d_Q, "b": delta.d_b},
                                      learning_rate=hp.server_learning_rate)
        return state, params, state.pop("rows_finite")
    dQ = np.zeros(Q.shape)
    db = np.zeros(Q.shape[0])
    dQ[delta.items] = delta.d_Q
    db[delta.items] = delta.d_b
    if delta.rank_map is not None:
        dQ -= Q.astype(np.float64) @ delta.rank_map
    state, params = opt.step(state, params, {"Q": dQ, "b": db},
                             learning_rate=hp.server_learning_rate, options=hp.server_options)
    return state, params, all(bool(np.isfinite(v).all()) for v in params.values())
