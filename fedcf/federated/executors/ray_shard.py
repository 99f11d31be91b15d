"""A Ray shard's state: the ratings of the users of its reduce groups, held by one actor for a
whole run (``RayExecutor``), and the client work it runs on them."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np

from ...datasets.interactions import csr_take
from ..round.device import Device, DevicePolicy
from ..round.partials import REDUCE_GROUPS, PartialSums, reduce_group
from ..round.phases import BoundLocalExecutor, ClientOutputs, Cohort, LocalExecutor
from ..round.reports import Reports

START_TIMEOUT = 300  # seconds for the shard actors to come up (Numba compiles on first use)


def shard_of(clients, n_shards: int) -> np.ndarray:
    """The shard holding each dense client id: shard s holds a contiguous range of reduce
    groups (``shard_groups``), so it can sum whole subtrees of the reduction tree."""
    return reduce_group(clients) * n_shards // REDUCE_GROUPS


def shard_groups(shard: int, n_shards: int) -> tuple[int, int]:
    """The reduce groups [a, b) of a shard."""
    g = np.flatnonzero(np.arange(REDUCE_GROUPS) * n_shards // REDUCE_GROUPS == shard)
    return int(g[0]), int(g[-1]) + 1


class Shard:
    """One actor's part of the population: the ratings of the users of its shard in a CSR
    over those users only, so its memory falls as shards are added. The shard's users are every
    dense id in its reduce groups [a, b), ascending: user u is row (u // 64)·(b − a) + u % 64 − a.
    Each row's random stream is keyed by its dense user id (``rng.client_key``; ``keys`` =
    [seed, round, id per row]), so client outputs are exactly the local executor's. ``data`` is
    (users, indptr, items, values), the shard's rows cut on the driver, or a population spec
    whose blocks it builds."""

    def __init__(self, shard: int, n_shards: int, threads: int, data, device_policy=None):
        import numba

        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        self.shard, self.n_shards = shard, n_shards
        if isinstance(data, tuple):
            users, self.data, self.stats = data[0], writable(data[1:]), None
        else:  # population blocks = reduce groups, so the shard's blocks are whole
            blocks = list(range(*shard_groups(shard, n_shards)))
            self.source = data
            users, *rows = data.build_rows(blocks)
            self.data = tuple(rows)
            self.stats = _value_sums(users, self.data, blocks)
        if not np.array_equal(self.rows_of(users), np.arange(len(users))):
            raise ValueError(f"shard {shard} was given users that are not all the ids of its "
                             "reduce groups, in order")
        self.keys = np.empty(len(users) + 2, np.uint64)  # [seed, round, key per row]
        self.keys[2:] = users
        self.executor = None
        self.local = None  # stateful clients: the rows of this round's clients, as sent
        self.halves = None  # the protocol's client halves of a secure round in progress
        self.device = Device(device_policy or DevicePolicy())  # its clients' rules and ledger

    def rows_of(self, clients) -> np.ndarray:
        """The CSR rows of dense ids of this shard's groups."""
        a, b = shard_groups(self.shard, self.n_shards)
        clients = np.asarray(clients, np.int64)
        return clients // REDUCE_GROUPS * (b - a) + clients % REDUCE_GROUPS - a

    def held_bytes(self) -> int:
        """Bytes of what the shard keeps for the run (stream keys, CSR index, items, ratings)."""
        return int(self.keys.nbytes + sum(a.nbytes for a in self.data))

    def set_program(self, program: bytes, local_layout=None) -> int:
        """Run the pickled ``program`` from now on; ``local_layout`` = (width, dtype) of
        stateful clients' rows, which each call brings (the driver keeps them between rounds).
        The driver pickles the program itself: unpickled here, its arrays are this process's
        own, where Ray's object store would hand read-only views (see ``writable``)."""
        if local_layout is not None:
            n, (K, dtype) = len(self.keys) - 2, local_layout
            self.local = (np.zeros((n, K), dtype), np.zeros(n, dtype))
        program = pickle.loads(program).for_users(self.keys[2:].astype(np.int64))  # its users
        self.executor = BoundLocalExecutor(program, self.data, self.local)
        return self.shard

    def vocabulary(self):
        """(raw user ids, raw item ids) of a spec that has them (a ``RatingsFile``)."""
        return self.source.vocabulary()

    def describe(self):
        """(users, their counts, per-block value sums) of a shard built from a spec."""
        return self.keys[2:].astype(np.int64), np.diff(self.data[0]), self.stats

    def _rows(self, clients, ids):
        """The CSR rows of dense ``clients`` (all must be this shard's) and the round's
        stream keys."""
        clients = np.asarray(clients, np.int64)
        rows = self.rows_of(clients)
        a, b = shard_groups(self.shard, self.n_shards)
        group = clients % REDUCE_GROUPS
        if len(clients) and ((clients < 0) | (group < a) | (group >= b) |
                             (rows >= len(self.keys) - 2)).any():
            raise ValueError(f"shard {self.shard} was sent clients it does not hold")
        self.keys[:2] = np.asarray(ids, np.uint64)[:2]
        return _cohort(rows), self.keys

    def call(self, method: str, clients, args, rows=None):
        """One round's work: ``method`` on this shard's clients, with the round's arguments
        (one object in the store for all shards). Stateful clients: ``rows`` are their rows,
        set before they run; the answer carries their rows after it (beside the size of a
        ``partials`` answer, whose sums stay in the store)."""
        calls = {"run": self.run, "partials": self.partials, "tangents": self.tangents,
                 "secure_begin": self.secure_begin, "reports_begin": self.reports_begin}
        args = writable(args)
        if rows is None:
            return calls[method](clients, *args)
        if self.local is None:
            raise ValueError(f"shard {self.shard} was sent client rows but runs a stateless "
                             "program")
        at = self.rows_of(clients)
        for kept, given in zip(self.local, rows):
            kept[at] = given
        result = calls[method](clients, *args)
        new = tuple(a[at].copy() for a in self.local)
        if method == "partials":
            return (result[0], new), result[1]
        return result, new

    def secure_begin(self, clients, params, ids, hp, job):
        """Secure aggregation, in this actor: run the clients and begin the aggregator's
        ``job`` on their outputs (encode, make the protocol halves, kept here). Returns their
        identity keys' public halves — never an upload."""
        self.halves = self.device.begin_updates(job, self.run(clients, params, ids), hp,
                                                params, ids)
        return self.halves.verifying()

    def reports_begin(self, clients, params, tangents, ids, job):
        """As ``secure_begin`` for hypergradient reports: the clients compute their reports
        here and begin the job on them; only keys leave."""
        reports = Reports(np.asarray(clients, np.int64),
                          *self.tangents(clients, params, tangents, ids))
        self.halves = self.device.begin_reports(job, reports, params, tangents, ids)
        return self.halves.verifying()

    def secure(self, step: str, *args):
        """One protocol step of this actor's client halves (``ClientHalves``' methods); an
        actor restarted mid-round holds none, so its clients count as dropped."""
        if step not in ("advertise", "share", "mask", "consistency", "unmask"):
            raise ValueError(f"unknown protocol step {step!r}")
        if self.halves is None:
            return []
        h = self.halves
        return {"advertise": h.advertise, "share": h.share, "mask": h.mask,
                "consistency": h.consistency, "unmask": h.unmask}[step](*args)

    def run(self, clients, params, ids) -> ClientOutputs:
        cohort, keys = self._rows(clients, ids)
        out = self.executor.run(cohort, params, keys)
        return dataclasses.replace(out, clients=np.asarray(clients, np.int64))

    def partials(self, clients, params, ids, aggregator, hp) -> tuple[int, PartialSums]:
        """This shard's sums, added up its subtrees of the reduction tree, and their size in
        bytes (two objects: the driver fetches the size, the sums go to the reducers)."""
        parts = aggregator.partials(self.run(clients, params, ids), hp)
        parts = parts.compact(*shard_groups(self.shard, self.n_shards))
        return parts.nbytes(), parts

    def tangents(self, clients, params, tangents, ids):
        cohort, keys = self._rows(clients, ids)
        return self.executor.tangents(cohort, params, tangents, keys)

    def peak_memory(self) -> int:
        """This worker's peak resident memory in bytes."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def combine(left: PartialSums, right: PartialSums, a: int, b: int) -> PartialSums:
    """Two adjacent ranges' sums, added up the tree as far as groups [a, b) go (a reducer
    task's work)."""
    return PartialSums.concat([left, right]).compact(a, b)


def writable(x):
    """``x`` with each read-only array replaced by a copy (in dicts, lists and plain tuples).
    Arrays from Ray's object store are read-only, and Numba types a read-only array apart from
    a writable one: without the copies every actor would compile, in its own process, a second
    signature of each client kernel instead of loading the one in the cache."""
    if isinstance(x, np.ndarray):
        return x if x.flags.writeable else x.copy()
    if isinstance(x, dict):
        return {k: writable(v) for k, v in x.items()}
    if type(x) in (tuple, list):
        return type(x)(writable(v) for v in x)
    return x


def _own_rows(shard, n_shards, indptr, items, values):
    """(users, indptr, items, values): the users of ``shard`` out of the driver's CSR, in a
    CSR over those users only."""
    users = np.flatnonzero(shard_of(np.arange(len(indptr) - 1), n_shards) == shard)
    own, take = csr_take(indptr, users)
    return users, own, np.ascontiguousarray(items[take]), np.ascontiguousarray(values[take])


def _value_sums(users, data, blocks) -> list:
    """Per block: (block, nnz, Σv, Σv², min, max) of its ratings (exact sums for ratings on a
    half-star grid, so μ does not depend on the shard count)."""
    indptr, _, values = data
    entry_block = np.repeat(users % REDUCE_GROUPS, np.diff(indptr))
    out = []
    for b in blocks:
        v = values[entry_block == b]
        out.append((b, len(v), float(v.sum()), float((v * v).sum()),
                    float(v.min()) if len(v) else np.inf, float(v.max()) if len(v) else -np.inf))
    return out


def _cohort(clients) -> Cohort:
    return Cohort(np.asarray(clients, np.int64), len(clients), 0, 0)


class InProcessShards(LocalExecutor):
    """The Ray executor's reduction in this process, for the warm-up: the cohort cut into
    three shards' group ranges, each reduced to its subtree sums (``PartialSums.compact``) and
    two of them added as a reducer task adds them, so the Numba kernels of a sharded round get
    compiled into the cache before any actor needs them."""

    def bind(self, program, data, local_state=None) -> BoundLocalExecutor:
        return _BoundInProcessShards(program, data, local_state)


class _BoundInProcessShards(BoundLocalExecutor):
    supports_partials = True

    def partials(self, cohort, params, ids, aggregator, hp) -> PartialSums:
        g = reduce_group(cohort.clients)
        parts = [aggregator.partials(self.run(dataclasses.replace(
            cohort, clients=cohort.clients[(g >= a) & (g < b)]), params, ids), hp).compact(a, b)
            for a, b in ((0, 16), (16, 32), (32, REDUCE_GROUPS))]
        return PartialSums.concat([combine(parts[0], parts[1], 0, 32), parts[2]])
