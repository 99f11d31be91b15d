"""The device's part of secure aggregation: how a client turns its upload (or its
hypergradient report) into the integers it masks — clipped, weighed, a noise share added,
quantized, all from public figures (``Encoding``) — the job that begins the protocol's client
half on them (``SecureJob``), run where the client runs, and the client halves of a group of
clients (``ClientHalves``; ``simulate`` runs one aggregation with every half here)."""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numba
import numpy as np

from ..round.client_steps import ClipValues, NoiseShare, Quantize, run_steps
from ..round.device import DeviceRefusal
from ..round.phases import ClientOutputs, RoundHyperparams, client_weights
from ..round.reports import ReportEncoding, fixed_point_scale, signed_sum
from ..round.spread import SpreadHalves
from .secagg_protocol import Identities, ProtocolAbort, SecAggClient, SecAggServer, run_round
from .weighted import clip_factors

STATS = ("loss", "weight", "unclipped", "used", "empty", "nonfinite", "nonfinite_recon")


@dataclass(frozen=True)
class Encoding:
    """What every client of a round needs to turn its upload into the integers it masks — all
    public: the catalog shape, the number of clients asked (m), the bounds, and under DP the
    clip rule and the share of distributed noise. ``encode`` runs where the clients run.

    Every client asked takes part; one with nothing to send (an empty query set, a non-finite
    update) sends zeros, so the server cannot tell it apart. Row layout: [s·Δ over every item
    row (K factors and the bias) | r·loss | r | not-clipped bit | used | empty bit | non-finite
    bit | non-finite-reconstruction bit | count of clipped values], u = min(w, W)/W the
    normalised weight, r = min(n, W)/W the normalised query size (the loss is weighted by
    query size as in the plain round; sizes above W weigh as W), both 0 for a client not
    used; s = u (plain) or the DP factor; "used" = s (plain) or 1 (DP: counts the clients in
    the fixed-denominator sum). Under DP the loss and r are sent as zeros: the round's mean
    loss is a statistic ε does not cover. Each column has its own fixed-point scale, so that m
    clients sum without overflow modulo 2³²."""

    n_items: int
    K: int
    m: int
    value_bound: float
    max_weight: float
    loss_bound: float = 1e3
    noise_std: float = 0.0
    secret_noise: bool = True
    seed: tuple = (0, 0)  # (run seed, round): only for insecure seeded noise
    clip: float | None = None  # under DP: the round's clip norm C (``weighted.clip_factors``)
    weight_cap: float | None = None  # under DP: the cap of the client weights, if any
    # learning the weight exponent α: each client also sends s'·Δ and s' = ∂s/∂α
    exponent: bool = False
    # under DP with adaptive clipping: the not-clipped bit is sent centred (b − ½) with the
    # client's share N(0, count_noise_std²) of the count's noise; else it is not sent
    adaptive: bool = False
    count_noise_std: float = 0.0
    # the dense values travel in the fewest whole bytes that hold the cohort's sum with a step
    # of at most value_bound·2^-precision (``word_bytes``); None: 4-byte words at the finest step
    precision: int | None = None

    @property
    def n_values(self) -> int:
        return self.n_items * (self.K + 1)

    @property
    def n_dense(self) -> int:
        """The dense part of a row: s·Δ, and with ``exponent`` s'·Δ after it."""
        return self.n_values * (2 if self.exponent else 1)

    @property
    def stats(self) -> tuple:
        return STATS + (("dweight",) if self.exponent else ())

    @property
    def log_bound(self) -> float:
        """|ln n| of a weight below the cap W: the bound of s'/s."""
        return max(1.0, float(np.log(self.max_weight)))

    @property
    def width(self) -> int:
        """Words per client row: the dense part, ``stats`` and the clip count."""
        return self.n_dense + len(self.stats) + 1

    def _dense_reach(self) -> tuple:
        """The sums' magnitude bound of the dense blocks (s·Δ, then s'·Δ), noise headroom in."""
        values = self.m * self.value_bound + 8.0 * self.noise_std * np.sqrt(self.m)
        return (values,) + ((self.m * self.value_bound * self.log_bound,) if self.exponent
                            else ())

    def _block_bytes(self) -> list:
        """Bytes per word of each dense block (see ``precision``); at most 4."""
        if self.precision is None:
            return [4] * len(self._dense_reach())
        scale = 2.0 ** np.ceil(self.precision - np.log2(self.value_bound))  # a power of two
        steps = [r * scale for r in self._dense_reach()]
        return [min(4, int(np.ceil((np.ceil(np.log2(s + 1)) + 1) / 8))) for s in steps]

    def word_bytes(self) -> np.ndarray:
        """Bytes of each masked word on the wire: the dense blocks' (``precision``), then 4 for
        each of ``stats`` and the clip count. A public function of public figures."""
        return np.concatenate([np.full(self.n_values, b, np.int64) for b in self._block_bytes()]
                              + [np.full(len(self.stats) + 1, 4, np.int64)])

    def scales(self) -> np.ndarray:
        """Fixed-point scale of each column (the values, then ``STATS``, then the clip count):
        the finest power of two whose sum over the cohort fits the column's word."""
        def scale(reach, nbytes=4):
            return fixed_point_scale(reach, f"value_bound={self.value_bound:g} with {self.m} "
                                            "clients", 8 * nbytes)
        dense = [np.full(self.n_values, scale(r, b))
                 for r, b in zip(self._dense_reach(), self._block_bytes())]
        unit = scale(self.m)
        count = scale(self.m / 2 + 8.0 * self.count_noise_std * np.sqrt(self.m))
        stats = [scale(self.m * self.loss_bound), unit, count, unit, 1, 1, 1]
        if self.exponent:
            stats.append(scale(self.m * self.log_bound))
        return np.concatenate(dense + [stats, [1]])

    def encode(self, out: ClientOutputs, hp: RoundHyperparams):
        """(uint32 rows of every client of ``out``, the float rows before clipping and
        rounding — a simulation's diagnostic only)."""
        bad, w, _ = client_weights(out, hp)
        used = w > 0
        u = np.minimum(w, self.max_weight) / self.max_weight
        rows = np.zeros((out.n_clients, self.n_dense + len(self.stats)))
        s, bit = (u, np.zeros(len(w))) if self.clip is None else \
            clip_factors(out, w, self.clip, self.weight_cap)
        ds = np.where(used & (w < self.max_weight),
                      u * np.log(np.where(used, out.weights, 1.0)), 0.0)
        for k in np.flatnonzero(used):
            lo, hi = out.offsets[k], out.offsets[k + 1]
            ok = out.items[lo:hi] >= 0
            for start, f in ((0, s[k]), (self.n_values, ds[k])) if self.exponent else \
                    ((0, s[k]),):
                block = rows[k, start:start + self.n_values].reshape(self.n_items, self.K + 1)
                np.add.at(block, (out.items[lo:hi][ok], slice(0, self.K)),
                          f * out.d_Q[lo:hi][ok])
                np.add.at(block[:, self.K], out.items[lo:hi][ok], f * out.d_b[lo:hi][ok])
        loss = np.where(used, np.minimum(np.nan_to_num(out.losses), self.loss_bound), 0.0)
        recon_bad = bad & ~np.isfinite(out.losses)
        r = np.where(used, np.minimum(out.weights, self.max_weight) / self.max_weight, 0.0)
        if self.clip is not None:  # under DP the loss is outside ε: not sent (the round's
            loss = r = np.zeros(len(w))  # mean loss reads as NaN)
        rows[:, self.n_dense:] = np.column_stack([  # the loss is weighted by query size
            r * loss, r, np.where(used & self.adaptive, bit - 0.5, 0.0),
            np.where(used, s if self.clip is None else 1.0, 0.0), ~used & ~bad,
            bad & ~recon_bad, recon_bad, *((ds,) if self.exponent else ())])
        return run_steps(self.steps(), rows.copy(), out.client_ids()), rows

    def steps(self) -> tuple:
        """The device's steps after its row is weighed, clipped and spread over the catalog:
        values clipped to ±value_bound (and counted), then its shares of the noise — never
        clipped: the scale leaves 8σ√m of headroom — then its words."""
        bound = self.value_bound * self.log_bound
        count = self.n_dense + self.stats.index("unclipped")
        return (ClipValues(((0, self.n_values, self.value_bound),
                            (self.n_values, self.n_dense, bound))),
                NoiseShare(self.n_values, self.noise_std, self.secret_noise, (*self.seed, 0x5EC)),
                NoiseShare(1, self.count_noise_std, self.secret_noise, (*self.seed, 0xC1),
                           start=count),
                Quantize(self.scales()))

    def decode(self, total: np.ndarray) -> tuple[np.ndarray, dict]:
        """(the summed dense part, the summed ``stats`` and clip count by name)."""
        got = signed_sum(total, self.word_bytes()) / self.scales()
        return got[:self.n_dense], dict(zip(self.stats + ("clipped",), got[self.n_dense:]))


@dataclass(frozen=True)
class SecureJob:
    """The clients' part of one secure round, as the aggregator's public recipe fixes it:
    encode each upload (clip, weigh, add a noise share, quantize: ``enc``), then mask it in
    the protocol's session (threshold ``t``, ``neighbours``). An executor carries the job to
    where its clients run, and the device there begins it under its own policy
    (``device.Device.begin_updates``/``begin_reports``); the executor needs to know nothing
    else of secure aggregation. The same code runs in process, on a Ray shard and on a
    Flower node (which rebuilds the job from the message's public fields)."""

    enc: Encoding | ReportEncoding
    t: int
    session: bytes
    neighbours: int | None = None

    def begin(self, clients, rows: np.ndarray, policy=None) -> ClientHalves:
        """The protocol halves of ``clients`` with their encoded ``rows``, under the device's
        ``policy`` (a ``DevicePolicy``; None: the protocol's own rules only)."""
        return ClientHalves(clients, rows, self.t, self.session, self.neighbours, policy,
                            self.enc.word_bytes())


class ClientHalves:
    """The protocol's client halves of some clients, held where those clients run (the
    driver's process for the local executor, a shard's actor on Ray): their encoded rows,
    keys and received shares never leave this object except as protocol messages."""

    def __init__(self, ids, q: np.ndarray, threshold: int, session: bytes,
                 neighbours: int | None = None, policy=None, word_bytes=None):
        self.ids = [int(c) for c in ids]
        self.q = {c: q[r] for r, c in enumerate(self.ids)}
        self.identities = Identities(self.ids)
        self.t, self.session, self.halves = int(threshold), session, {}
        self.neighbours, self.policy = neighbours, policy
        # bytes of each masked word on the wire (the encoding's; 4 each when None)
        self.word_bytes = np.full(q.shape[1], 4) if word_bytes is None else word_bytes

    def verifying(self) -> dict:
        return self.identities.public_bytes()

    def trust(self, registry: dict) -> None:
        """Take the other clients' verifying keys (after ``advertise`` with this object's own,
        where the keys of the whole cohort arrive in a later message, as in a Flower round).
        A registry that names one of these clients with another key is refused."""
        own = self.verifying()
        if any(bytes(registry.get(c, k)) != k for c, k in own.items()):
            raise ProtocolAbort("the cohort's key registry replaces the identity key of a "
                                "client held here")
        pki = Identities.verifiers(registry)
        for half in self.halves.values():
            half.trust(pki)

    def advertise(self, registry: dict) -> list:
        pki, checked = Identities.verifiers(registry), {}  # this device checks a signature once
        self.halves = {c: SecAggClient(c, self.t, self.session, self.identities.signing_key(c),
                                       pki, self.neighbours, self.policy, checked)
                       for c in self.ids}
        return [h.advertise() for h in self.halves.values()]

    def share(self, adverts) -> list:
        return self._each(self.ids, lambda h: h.share_keys(adverts))

    def mask(self, inboxes: dict, dropped) -> list:
        """Each client's masked vector; the clients run side by side on this machine's threads
        (their mask expansions and additions release the GIL), each one's result its own."""
        gone = set(int(c) for c in dropped)
        return self._each([c for c in self.ids if c in inboxes and c not in gone],
                          lambda h: h.masked_input(self.q[h.id], inboxes[h.id]), parallel=True)

    def consistency(self, u3) -> list:
        here = set(u3)
        return self._each([c for c in self.ids if c in here], lambda h: h.consistency(u3))

    def unmask(self, u3, sigs) -> list:
        here = set(u3)
        return self._each([c for c in self.ids if c in here], lambda h: h.unmask(u3, sigs))

    def _each(self, ids, step, parallel: bool = False) -> list:
        """``step`` of each client half in ``ids`` still here, in ``ids``' order (``parallel``:
        on a pool of fedcf's thread count); one its device's policy refuses falls silent from
        then on (the refusal is logged on the device, never sent)."""
        here = [c for c in ids if c in self.halves]

        def one(c):
            try:
                return step(self.halves[c])
            except DeviceRefusal as refused:
                return refused

        threads = min(numba.get_num_threads(), len(here)) if parallel else 1
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:
                results = list(pool.map(one, here))
        else:
            results = [one(c) for c in here]
        for c, r in zip(here, results):
            if isinstance(r, DeviceRefusal):
                del self.halves[c]
        return [r for r in results if not isinstance(r, DeviceRefusal)]


def _serve(conn, ids, X, threshold, session, neighbours):
    """A worker process of ``ProcessHalves``: the client halves of ``ids``, one step per
    message, each answered with (seconds it took, result or the exception it raised)."""
    numba.set_num_threads(1)  # the processes are the parallelism
    h = ClientHalves(ids, X, threshold, session, neighbours)
    steps = {"verifying": h.verifying, "advertise": h.advertise, "share": h.share,
             "mask": h.mask, "consistency": h.consistency, "unmask": h.unmask}
    while (msg := conn.recv()) is not None:
        t0 = time.perf_counter()
        try:
            out = steps[msg[0]](*msg[1])
        except Exception as e:  # noqa: BLE001  (handed to the driver, raised there)
            out = e
        conn.send((time.perf_counter() - t0, out))


class ProcessHalves(SpreadHalves):
    """The client halves of a cohort spread over worker processes, as devices run side by
    side (a simulation's stand-in for a cohort of devices; the server half stays in the
    caller's process). ``seconds`` sums the time the processes spent in client steps. Use as
    a context manager: the processes end on exit, also on an error."""

    def __init__(self, ids, X: np.ndarray, threshold: int, session: bytes,
                 neighbours: int | None, processes: int):
        ctx = multiprocessing.get_context("spawn")
        ids = [int(c) for c in ids]
        groups = [g for g in np.array_split(np.arange(len(ids)), processes) if len(g)]
        self.conns, self.procs, self.seconds = [], [], 0.0
        self.where = {ids[i]: s for s, g in enumerate(groups) for i in g}
        for g in groups:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_serve, daemon=True, args=(
                there, [ids[i] for i in g], X[g], threshold, session, neighbours))
            proc.start()
            there.close()  # a dead worker then reads as EOFError here, never a hang
            self.conns.append(here)
            self.procs.append(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def _each_part(self, step: str, args_of) -> list:
        """Every process's answer to ``step``, in process order."""
        try:
            for s, conn in enumerate(self.conns):
                conn.send((step, args_of(s)))
            answers = [conn.recv() for conn in self.conns]
        except (EOFError, OSError):  # a closed pipe: the worker is gone
            raise RuntimeError(f"a worker process of the simulated cohort ended during "
                               f"the step {step!r}") from None
        self.seconds += sum(secs for secs, _ in answers)
        for _, out in answers:
            if isinstance(out, Exception):
                raise out
        return [out for _, out in answers]

    def _ask(self, step: str, args_of) -> list:
        return [msg for part in self._each_part(step, args_of) for msg in part]

    def _parts_of(self, clients: list) -> list:
        return [self.where.get(c, -1) for c in clients]

    def verifying(self) -> dict:
        return {c: k for part in self._each_part("verifying", lambda s: ())
                for c, k in part.items()}


def simulate(X: np.ndarray, clients, threshold: int, *, drop_after_shares=(),
             clock: dict | None = None, neighbours: int | None = None, processes: int = 1):
    """One aggregation of the rows of ``X`` (uint32, one per client) with every client half
    simulated on this machine: returns (sum mod 2³² of the survivors' rows, U3, the server
    half). Clients in ``drop_after_shares`` vanish after round 1. ``clock`` (a dict)
    accumulates seconds: in the client halves ("clients": their own time, summed over
    ``processes``), in the server half ("server") and in the whole protocol ("round": the wall
    time of its five message rounds; starting the processes is not in it). ``neighbours``: the
    SecAgg+ graph degree (``share_graph``; None: every pair). ``processes`` > 1 runs the
    client halves in that many spawned processes (``ProcessHalves``), as devices run side by
    side; the caller's main module must then be importable (the ``__main__`` guard)."""
    if isinstance(processes, bool) or not isinstance(processes, (int, np.integer)) or \
            processes < 1:
        raise ValueError(f"processes must be a count >= 1, got {processes!r}")
    session = os.urandom(16)
    server = SecAggServer(threshold, X.shape[1], session, neighbours)
    gone = [int(c) for c in drop_after_shares]
    with ProcessHalves(clients, X, threshold, session, neighbours, processes) \
            if processes > 1 else nullcontext(ClientHalves(clients, X, threshold, session,
                                                           neighbours)) as halves:
        wall: dict = {}
        t0 = time.perf_counter()
        total, u3 = run_round(halves, server, lambda u2: gone, clock=wall)
        wall["round"] = time.perf_counter() - t0
    if processes > 1:  # the processes' own time, not the caller's wait for them
        wall["clients"] = halves.seconds
    for side, secs in wall.items() if clock is not None else ():
        clock[side] = clock.get(side, 0.0) + secs
    return total, u3, server
