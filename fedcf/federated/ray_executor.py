"""Client work on a Ray cluster: the population in shards held by actors, one round = one call
per shard, partial sums back (optional extra ``fedcf[ray]``).

``FedReconMF(executor=RayExecutor(n_shards=4))`` runs phase 2 of every round on Ray instead of
in this process. The users are cut into shards by reduce group (``partials.reduce_group``): a
shard holds a contiguous range of the 64 groups. Each shard is a Ray actor that gets its users'
ratings once, when the run starts — its own rows cut from the driver's arrays (one object per
shard), or built on the worker from a population spec (``SyntheticPopulation``; the driver
then never holds a rating, see ``RemotePopulation``) — and keeps them for the whole run, in a
CSR over its users only. Each round the driver puts the round's arguments (global parameters,
aggregator, hyperparameters) in the object store once; every actor runs the same Numba client
kernel on its sampled clients and returns, for a linear aggregator (weighted mean, norm
clipping, DP), only the sums of its subtrees of the fixed reduction tree
(``PartialSums.compact``) — never a client's upload. Reducer tasks add adjacent shards' sums
pairwise up the same tree (``combine``) until two objects remain, so the driver fetches at
most two rows per touched item whatever the number of shards, and the fitted model is bit
for bit the local executor's for any number of shards.
Aggregators that need every upload (trimmed mean, median, FoolsGold, secure aggregation,
learning the client-weighting exponent) get the per-client outputs, put back in
cohort order.

Faults: if an actor dies (a crash, a lost node, ``ray.kill``), the driver starts a new actor from
the same shard spec and runs the shard's part of the round again. Clients are deterministic given
(seed, round, client), so the retried round is the round that would have been; ``history_``
records ``shard_restarts`` per round. After ``max_restarts`` failures of one round the fit stops
with an error naming the shard.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import socket
import sys
import time

import numpy as np

from .contracts import Executor, RoundExecutor
from .partials import REDUCE_GROUPS, PartialSums, reduce_group
from .phases import BoundLocalExecutor, ClientOutputs, Cohort, cohort_order
from .reports import Reports
from .secagg_protocol import ClientHalves

START_TIMEOUT = 300  # seconds for the shard actors to come up (Numba compiles on first use)


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("RayExecutor needs Ray: pip install 'fedcf[ray]' (or 'ray[default]')"
                          ) from e
    return ray


class RayExecutor(Executor):
    """Where the client work of a federated fit runs: ``n_shards`` Ray actors.

    Parameters
    ----------
    n_shards : int in [1, 64], default 2
        Actors holding the population (at most ``REDUCE_GROUPS`` = 64: a shard holds a range
        of whole reduce groups).
    address : str or None
        A running cluster (``"HEAD_IP:6379"``, ``"ray://host:10001"``, or ``"auto"``); None
        joins the Ray instance already started in this process, else starts a local one that
        listens on 127.0.0.1 only.
    num_cpus : float or None
        CPUs reserved per actor; its Numba kernel runs on that many threads (at least one).
        None: the cluster's CPUs shared evenly among the shards.
    resources : dict or None
        Extra Ray resources per actor (e.g. ``{"worker_node": 1}``).
    max_restarts : int, default 3
        How often a shard may be restarted within one round before the fit stops.
    shard_timeout : float or None, default 600
        Seconds a round waits for a shard's answer; a shard that gives none in time (a stuck
        worker) is restarted and its part of the round run again, as a dead one is. None:
        wait forever.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import RayExecutor
    >>> est = FedReconMF(executor=RayExecutor(n_shards=4, num_cpus=1))  # Ray starts at fit
    >>> est.get_params()["executor__n_shards"]
    4
    """

    def __init__(self, n_shards: int = 2, *, address: str | None = None,
                 num_cpus: float | None = None,
                 resources: dict | None = None, max_restarts: int = 3,
                 shard_timeout: float | None = 600.0):
        self.n_shards, self.address, self.num_cpus = n_shards, address, num_cpus
        self.resources, self.max_restarts = resources, max_restarts
        self.shard_timeout = shard_timeout
        self.validate()

    def validate(self):
        n_shards, num_cpus, max_restarts = self.n_shards, self.num_cpus, self.max_restarts
        if isinstance(n_shards, bool) or not isinstance(n_shards, numbers.Integral) or \
                not 1 <= n_shards <= REDUCE_GROUPS:
            raise ValueError(f"n_shards must be an int in [1, {REDUCE_GROUPS}] (a shard holds "
                             f"whole reduce groups), got {n_shards!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"address must be a string such as '127.0.0.1:6379' or None, got "
                            f"{type(self.address).__name__}")
        if num_cpus is not None and (isinstance(num_cpus, bool) or
                                     not isinstance(num_cpus, numbers.Real) or
                                     not (np.isfinite(num_cpus) and num_cpus > 0)):
            raise ValueError(f"num_cpus must be a number > 0 or None, got {num_cpus!r}")
        if self.resources is not None and not isinstance(self.resources, dict):
            raise TypeError(f"resources must be a dict or None, got "
                            f"{type(self.resources).__name__}")
        for key, v in (self.resources or {}).items():
            if not isinstance(key, str) or isinstance(v, bool) or \
                    not isinstance(v, numbers.Real) or not (np.isfinite(v) and v >= 0):
                raise ValueError(f"resources must map resource names to numbers >= 0 (e.g. "
                                 f"{{'worker_node': 1}}), got {key!r}: {v!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, numbers.Integral) or \
                max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        t = self.shard_timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or
                              not (np.isfinite(t) and t > 0)):
            raise ValueError(f"shard_timeout must be a number of seconds > 0 or None, got {t!r}")

    def bind(self, program, data, local_state=None) -> BoundRayExecutor:
        """Connect, ship the shards once, and start the actors for one run."""
        if local_state is not None:
            raise ValueError("RayExecutor runs stateless clients only (Federated "
                             "Reconstruction): the stateful baselines keep user rows here")
        return BoundRayExecutor(self, data).set_program(program)

    def open(self, source) -> RemotePopulation:
        """Start the actors on a population *spec* (``fedcf.datasets.SyntheticPopulation``, or
        a ``RatingsFile`` they read): each builds its own users on its worker; the driver learns
        only their counts (and, for a file, the raw ids)."""
        t0 = time.perf_counter()
        pop = RemotePopulation(source, BoundRayExecutor(self, source))
        pop.build_seconds = time.perf_counter() - t0  # actors up, shards built and described
        return pop


def connect(address: str | None):
    """Join ``address`` (or the running / a new local Ray instance); errors name the address.

    A local instance that fedcf starts listens on 127.0.0.1 only when Ray is first imported
    here (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by Ray at import: the node then takes
    the loopback address instead of binding every interface)."""
    if (address is None or _loopback(address)) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = _ray()
    if ray.is_initialized():
        return ray
    _probe(address)
    try:
        if address is None:
            ray.init(include_dashboard=False, log_to_driver=False, **LOOPBACK,
                     runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}})
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        raise ConnectionError(f"could not reach a Ray cluster at address={address!r} ({e}); "
                              "start one with `ray start --head` or pass address=None for a "
                              "local one") from e
    return ray


LOOPBACK = {"_node_ip_address": "127.0.0.1"}  # ray.init arguments of a local instance


def _loopback(address: str) -> bool:
    """Whether a ``host:port`` address is this machine's loopback (joining a head there needs
    Ray's single-machine setting, else the driver waits ~10 minutes for a node that never
    answers)."""
    host = address.split("://")[-1].rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _probe(address: str | None, timeout: float = 5.0):
    """Fail fast, naming the address, when nothing listens at a ``host:port`` address (Ray
    itself retries for minutes). "auto", "ray://…" and None are left to Ray."""
    if address is None or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must look like 'host:port' (e.g. '127.0.0.1:6379'), 'auto' "
                         f"or 'ray://host:port', got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(f"could not reach a Ray cluster at address={address!r} ({e}); "
                              "start one with `ray start --head` or pass address=None for a "
                              "local one") from e


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

    def __init__(self, shard: int, n_shards: int, threads: int, data):
        import numba

        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        self.shard, self.n_shards = shard, n_shards
        if isinstance(data, tuple):
            users, self.data, self.stats = data[0], data[1:], None
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

    def rows_of(self, clients) -> np.ndarray:
        """The CSR rows of dense ids of this shard's groups."""
        a, b = shard_groups(self.shard, self.n_shards)
        clients = np.asarray(clients, np.int64)
        return clients // REDUCE_GROUPS * (b - a) + clients % REDUCE_GROUPS - a

    def held_bytes(self) -> int:
        """Bytes of what the shard keeps for the run (stream keys, CSR index, items, ratings)."""
        return int(self.keys.nbytes + sum(a.nbytes for a in self.data))

    def set_program(self, program) -> int:
        self.executor = BoundLocalExecutor(program, self.data)
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

    def call(self, method: str, clients, args):
        """One round's work: ``method`` on this shard's clients, with the round's arguments
        (one object in the store for all shards)."""
        calls = {"run": self.run, "partials": self.partials, "tangents": self.tangents,
                 "secure_begin": self.secure_begin, "reports_begin": self.reports_begin}
        return calls[method](clients, *args)

    def secure_begin(self, clients, params, ids, hp, enc, session, t, neighbours=None):
        """Secure aggregation, in this actor: run the clients, encode their uploads and make
        their protocol halves (kept here). Returns their identity keys' public halves — never
        an upload."""
        out = self.run(clients, params, ids)
        self.halves = ClientHalves(out.client_ids(), enc.encode(out, hp)[0], t, session,
                                   neighbours)
        return self.halves.verifying()

    def reports_begin(self, clients, params, tangents, ids, enc, session, t, neighbours=None):
        """As ``secure_begin`` for hypergradient reports: the clients compute, clip, weigh and
        encode their reports here (``ReportEncoding``); only keys leave."""
        reports = Reports(np.asarray(clients, np.int64),
                          *self.tangents(clients, params, tangents, ids))
        self.halves = ClientHalves(reports.clients, enc.encode(reports), t, session, neighbours)
        return self.halves.verifying()

    def secure(self, step: str, *args):
        """One protocol step of this actor's client halves (``ClientHalves``' methods); an
        actor restarted mid-round holds none, so its clients count as dropped."""
        if step not in ("advertise", "share", "mask", "consistency", "unmask"):
            raise ValueError(f"unknown protocol step {step!r}")
        halves = getattr(self, "halves", None)
        return [] if halves is None else getattr(halves, step)(*args)

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


def _own_rows(shard, n_shards, indptr, items, values):
    """(users, indptr, items, values): the users of ``shard`` out of the driver's CSR, in a
    CSR over those users only."""
    users = np.flatnonzero(shard_of(np.arange(len(indptr) - 1), n_shards) == shard)
    counts = np.diff(indptr)[users]
    own = np.zeros(len(users) + 1, np.int64)
    np.cumsum(counts, out=own[1:])
    take = np.repeat(indptr[users] - own[:-1], counts) + np.arange(int(own[-1]))
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


def combine(left: PartialSums, right: PartialSums, a: int, b: int) -> PartialSums:
    """Two adjacent ranges' sums, added up the tree as far as groups [a, b) go."""
    return PartialSums.concat([left, right]).compact(a, b)


_COMBINE = {}


def _combine_task(ray):
    """``combine`` as a Ray task that takes no CPU from the shards (it adds a few rows)."""
    if "task" not in _COMBINE:
        _COMBINE["task"] = ray.remote(num_cpus=0, max_retries=2)(combine)
    return _COMBINE["task"]


def _cohort(clients) -> Cohort:
    return Cohort(np.asarray(clients, np.int64), len(clients), 0, 0)


class BoundRayExecutor(RoundExecutor):
    """The executor of one run (made by ``RayExecutor.bind``): ``LocalExecutor``'s ``run``,
    ``tangents`` and ``counts``, plus ``partials`` (the shards' sums, which the loop reduces),
    ``round_stats`` (restarts and the seconds of broadcast, client work and reduce) and
    ``close``."""

    supports_partials = True

    def __init__(self, spec: RayExecutor, data):
        ray = connect(spec.address)
        self.spec, self.ray = spec, ray
        n_users = len(data[0]) - 1 if isinstance(data, tuple) else getattr(data, "n_users", None)
        if n_users is not None and spec.n_shards > n_users:  # (a file: checked once read)
            raise ValueError(f"n_shards={spec.n_shards} is more than the {n_users} users; "
                             "use fewer shards")
        cpus = float(ray.cluster_resources().get("CPU", 0))
        self.num_cpus = spec.num_cpus if spec.num_cpus is not None else cpus / spec.n_shards
        if self.num_cpus * spec.n_shards > cpus + 1e-9:
            raise ValueError(f"n_shards={spec.n_shards} actors × num_cpus={self.num_cpus:g} need "
                             f"more than the cluster's {cpus:g} CPUs, so some would never start; "
                             "use fewer shards, a smaller num_cpus, or num_cpus=None")
        # each shard's rows of the driver's arrays go to the object store once (a worker
        # fetches its own only); a spec is all a worker needs
        self.data_refs = [ray.put(_own_rows(s, spec.n_shards, *data)) for s in
                          range(spec.n_shards)] if isinstance(data, tuple) else \
            [data] * spec.n_shards
        self.actor_cls = ray.remote(Shard).options(num_cpus=self.num_cpus,
                                                   resources=spec.resources or {})
        self.program, self.round_stats, self.counts = None, {}, None
        self.actors = [self._start(s) for s in range(spec.n_shards)]
        if isinstance(data, tuple):
            self.counts = np.diff(data[0])

    def set_program(self, program) -> BoundRayExecutor:
        """Give every actor the client program of this run (and wait until all are up)."""
        self.program = program
        try:
            self.ray.get([a.set_program.remote(program) for a in self.actors],
                         timeout=START_TIMEOUT)
        except self.ray.exceptions.GetTimeoutError as e:
            self.close()
            raise RuntimeError(f"the {self.spec.n_shards} Ray shard actors did not start within "
                               f"{START_TIMEOUT} s (resources={self.spec.resources}); check that "
                               "the cluster has the CPUs and resources they ask for") from e
        return self

    def _start(self, s: int):
        actor = self.actor_cls.remote(s, self.spec.n_shards, int(self.num_cpus) or 1,
                                      self.data_refs[s])
        if self.program is not None:  # a restarted actor: calls to it run in order
            actor.set_program.remote(self.program)
        return actor

    def _split(self, clients) -> list[np.ndarray]:
        where = shard_of(clients, self.spec.n_shards)
        return [clients[where == s] for s in range(self.spec.n_shards)]

    def _map(self, method: str, cohort: Cohort, *args):
        """Call ``method`` on every shard with its clients (cohort order) and ``args``; a shard
        whose actor died is restarted from its spec and called again. Results in shard order."""
        ray, t0 = self.ray, time.perf_counter()
        ref = ray.put(args)  # serialized once per round, not once per shard
        t1 = time.perf_counter()
        parts = self._split(cohort.clients)
        two = method == "partials"  # (size, sums): the sums stay in the object store

        def send(s):
            call = self.actors[s].call.options(num_returns=2) if two else self.actors[s].call
            return call.remote(method, parts[s], ref)

        pending = {s: send(s) for s in range(len(parts))}
        results, restarts = {}, 0
        lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError)  # dead, unreachable, or stuck past the deadline
        limit = self.spec.shard_timeout
        deadline = None if limit is None else time.monotonic() + limit
        for s in range(len(parts)):
            for attempt in range(self.spec.max_restarts + 1):
                try:
                    wait = None if deadline is None else max(deadline - time.monotonic(), 0.01)
                    results[s] = (ray.get(pending[s][0], timeout=wait), pending[s][1]) \
                        if two else ray.get(pending[s], timeout=wait)
                    break
                except lost as e:
                    if attempt == self.spec.max_restarts:
                        raise RuntimeError(f"Ray shard {s} failed {attempt + 1} times in one "
                                           f"round ({type(e).__name__}); raise max_restarts or "
                                           "check the cluster") from e
                    restarts += 1
                    ray.kill(self.actors[s], no_restart=True)
                    self.actors[s] = self._start(s)
                    pending[s] = send(s)
                    if limit is not None:  # the restarted shard gets a whole deadline
                        deadline = time.monotonic() + limit
        t2 = time.perf_counter()
        self.round_stats = {"shard_restarts": restarts, "broadcast_seconds": t1 - t0,
                            "client_seconds": t2 - t1}
        return [results[s] for s in range(len(parts))], parts

    def partials(self, cohort, params, ids, aggregator, hp) -> PartialSums:
        """The cohort's sums: each shard's subtree sums, added pairwise by reducer tasks up a
        tree of adjacent shards (``combine``) until two objects remain, so the driver fetches
        at most two rows per touched item however many shards there are."""
        for attempt in range(self.spec.max_restarts + 1):
            res, _ = self._map("partials", cohort, params, ids, aggregator, hp)
            t0 = time.perf_counter()
            try:
                out = PartialSums.concat(self.ray.get(self._reduce([r for _, r in res]),
                                                      timeout=self.spec.shard_timeout))
                break
            except self.ray.exceptions.RayError as e:  # sums lost with a worker
                if attempt == self.spec.max_restarts:
                    raise RuntimeError(f"the reduction of a round's partial sums failed "
                                       f"{attempt + 1} times ({type(e).__name__}); raise "
                                       "max_restarts or check the cluster") from e
        self.round_stats.update(shard_bytes_up=int(sum(b for b, _ in res)),
                                driver_bytes_up=out.nbytes(),
                                combine_seconds=time.perf_counter() - t0)
        return out

    def _reduce(self, refs) -> list:
        """References to at most two objects holding the sums of all shards: adjacent ranges
        added pairwise, level by level, in reducer tasks (bit for bit the driver's merge: the
        tree is fixed). The last pair is the driver's: one more task hop would cost more than
        fetching two objects."""
        combine = _combine_task(self.ray)
        n = self.spec.n_shards
        ranges = [shard_groups(s, n) for s in range(n)]
        while len(refs) > 2:
            pairs = range(0, len(refs) - 1, 2)
            nxt = [combine.remote(refs[i], refs[i + 1], ranges[i][0], ranges[i + 1][1])
                   for i in pairs]
            spans = [(ranges[i][0], ranges[i + 1][1]) for i in pairs]
            if len(refs) % 2:
                nxt.append(refs[-1])
                spans.append(ranges[-1])
            refs, ranges = nxt, spans
        return refs

    def run(self, cohort, params, ids) -> ClientOutputs:
        """Per-client outputs (for aggregators that need every upload), in cohort order."""
        res, parts = self._map("run", cohort, params, ids)
        return ClientOutputs.concat(res).take(cohort_order(cohort, parts))

    supports_secure = True

    def secure_clients(self, cohort, params, ids, hp, enc, session, t, neighbours=None):
        """The shards' client halves as one ``ShardedHalves``: each shard runs, encodes and
        masks its own clients."""
        return self._halves("secure_begin", cohort, params, ids, hp, enc, session, t,
                            neighbours)

    def secure_reports(self, cohort, params, tangents, ids, enc, session, t, neighbours=None):
        """The shards' client halves for a round of hypergradient reports (``reports_begin``)."""
        return self._halves("reports_begin", cohort, params, tangents, ids, enc, session, t,
                            neighbours)

    def _halves(self, method, cohort, *args):
        res, _ = self._map(method, cohort, *args)
        registry = {}
        for keys in res:
            registry.update(keys)
        return ShardedHalves(self, registry)

    def tangents(self, cohort, params, tangents, ids):
        res, parts = self._map("tangents", cohort, params, tangents, ids)
        order = cohort_order(cohort, parts)
        return tuple(np.concatenate([r[i] for r in res])[order] for i in range(3))

    def peak_memory(self) -> list[int]:
        return self.ray.get([a.peak_memory.remote() for a in self.actors], timeout=30)

    def close(self):
        """Stop the actors (their peak memory, in bytes, is kept in ``worker_peak_bytes``)."""
        try:
            self.worker_peak_bytes = self.peak_memory()
        except Exception:  # a dead actor: its memory is unknown
            self.worker_peak_bytes = None
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        self.actors = []


class ShardedHalves:
    """The client halves of a round spread over the shards, as the server half talks to them:
    each step goes to every shard and the messages come back; ``received`` lists the types of
    everything the driver got (for the test that no upload arrives). A shard whose actor
    failed mid-round answers nothing (its clients drop) and is restarted."""

    def __init__(self, executor: BoundRayExecutor, registry: dict):
        self.executor, self.registry, self.received = executor, registry, []

    def verifying(self) -> dict:
        return dict(self.registry)

    def _all(self, step: str, *args, per_shard=None) -> list:
        ex, ray = self.executor, self.executor.ray
        pending = [a.secure.remote(step, *(args if per_shard is None else per_shard[s]))
                   for s, a in enumerate(ex.actors)]
        out = []
        for s, p in enumerate(pending):
            try:
                got = ray.get(p, timeout=ex.spec.shard_timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError):  # a stuck shard drops out as a dead one
                ray.kill(ex.actors[s], no_restart=True)
                ex.actors[s] = ex._start(s)
                ex.round_stats["shard_restarts"] = ex.round_stats.get("shard_restarts", 0) + 1
                got = []
            out += got
        self.received += [type(m).__name__ for m in out]
        return out

    def advertise(self, registry):
        return self._all("advertise", registry)

    def share(self, adverts):
        return self._all("share", adverts)

    def mask(self, inboxes, dropped):
        """Each shard gets only the inboxes of its own clients."""
        n = self.executor.spec.n_shards
        where = {c: int(shard_of(np.array([c]), n)[0]) for c in inboxes}
        return self._all("mask", per_shard=[({c: b for c, b in inboxes.items() if where[c] == s},
                                             dropped) for s in range(n)])

    def consistency(self, u3):
        return self._all("consistency", u3)

    def unmask(self, u3, sigs):
        return self._all("unmask", u3, sigs)


class RemotePopulation:
    """A population that lives in the shard actors of a run (built there from its spec): what
    the driver knows of it is its sizes, each user's number of ratings (the sampling frame)
    and the sums a fit needs of the ratings — never a rating. ``fit`` takes it where it takes
    an Interactions; anything that needs users' ratings on the driver (evaluating seen users
    after the fit) builds those users' blocks from the spec here."""

    timestamps = None
    holds_ratings = True  # (by building a user's block from the spec)

    def __init__(self, source, executor: BoundRayExecutor):
        self.source, self.executor = source, executor
        try:
            if getattr(source, "remote_vocabulary", False):  # the ids, from a worker's read
                self.user_ids, self.item_ids = executor.ray.get(
                    executor.actors[0].vocabulary.remote(), timeout=START_TIMEOUT)
            else:  # raw ids = dense ids
                self.user_ids = np.arange(source.n_users)
                self.item_ids = np.arange(source.n_items)
            self.n_users, self.n_items = len(self.user_ids), len(self.item_ids)
            if executor.spec.n_shards > self.n_users:
                raise ValueError(f"n_shards={executor.spec.n_shards} is more than the "
                                 f"{self.n_users} users; use fewer shards")
            parts = executor.ray.get([a.describe.remote() for a in executor.actors],
                                     timeout=START_TIMEOUT)
        except BaseException:
            executor.close()
            raise
        self._counts = np.zeros(self.n_users, np.int64)
        blocks = []
        for users, counts, stats in parts:
            self._counts[users] = counts
            blocks.extend(stats)
        executor.counts = self._counts
        blocks.sort()  # block order: the sums do not depend on the shard count
        self.nnz = sum(b[1] for b in blocks)
        total, squares = sum(b[2] for b in blocks), sum(b[3] for b in blocks)
        self._stats = {"mean": total / self.nnz, "mean_sq": squares / self.nnz,
                       "min": min(b[4] for b in blocks), "max": max(b[5] for b in blocks)}

    def __repr__(self):
        return (f"RemotePopulation({self.source!r}: {self.n_users} users, {self.n_items} items, "
                f"{self.nnz} ratings in {self.executor.spec.n_shards} Ray shards)")

    def __getstate__(self):  # a fitted model keeps this; the run's actors do not travel
        return {**self.__dict__, "executor": _Closed(self.executor.spec), "_local": None}

    def counts(self) -> np.ndarray:
        return self._counts

    def value_stats(self) -> dict:
        return dict(self._stats)

    def subset_users(self, users):
        """The given users' ratings, built here from the spec (their blocks only)."""
        from ..datasets import Interactions

        users = np.asarray(users, np.int64)
        if users.size and (users.min() < 0 or users.max() >= self.n_users):
            bad = users[(users < 0) | (users >= self.n_users)][0]
            raise IndexError(f"user index {bad} out of range for {self.n_users} users")
        held, indptr, items, values = self.source.build_rows(np.unique(users % REDUCE_GROUPS))
        rows = Interactions(indptr, items, values, None, self.user_ids[held], self.item_ids)
        return rows.subset_users(np.searchsorted(held, users))

    @property
    def _full(self):
        if self.__dict__.get("_local") is None:
            self._local = self.source.to_interactions()
        return self._local

    @property
    def indptr(self):  # evaluating every seen user needs the whole population here
        return self._full.indptr

    @property
    def items(self):
        return self._full.items

    @property
    def values(self):
        return self._full.values


class _Closed:
    """What a pickled RemotePopulation keeps of its run's executor: the settings."""

    def __init__(self, spec):
        self.spec, self.actors = spec, []

    def close(self):
        pass
