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

import numbers
import os
import pickle
import socket
import sys
import time

import numpy as np

from ..round.contracts import Executor, RoundExecutor
from ..round.partials import REDUCE_GROUPS, PartialSums
from ..round.phases import ClientOutputs, Cohort, cohort_order
from ..round.spread import SpreadHalves
from .ray_population import RemotePopulation
from .ray_shard import START_TIMEOUT, Shard, _own_rows, combine, shard_groups, shard_of


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
    device_policy : DevicePolicy or None, default None
        The devices' own rules under secure aggregation, held by each shard (None: the
        default ``DevicePolicy``); a server's job cannot change them.

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
                 shard_timeout: float | None = 600.0, device_policy=None):
        self.n_shards, self.address, self.num_cpus = n_shards, address, num_cpus
        self.resources, self.max_restarts = resources, max_restarts
        self.shard_timeout, self.device_policy = shard_timeout, device_policy
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
        """Connect, ship the shards once, and start the actors for one run. ``local_state``:
        the stateful clients' rows (P, c), kept here between rounds as in process; each round
        ships the cohort's rows to their shards and takes the updated rows back."""
        return BoundRayExecutor(self, data).set_program(program, local_state)

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

    For a local instance or a loopback head the driver must take Ray's single-machine setting
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: its node is then the loopback address, not the
    host's; without it the driver waits ~10 minutes for a node that never answers). Ray reads
    it at import, so it is set before the import here, and a driver that imported ``ray``
    first gets the setting too (``_single_machine``).

    A local instance's workers do the fit's work while the driver waits, so they run at the
    driver's priority (``RAY_worker_niceness=0`` unless set): at Ray's default (nice 15) they
    got a few percent of a core beside any other busy process and a fit on a shared machine
    stalled behind it."""
    local = address is None or _loopback(address)
    if local and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if address is None:  # the workers of a local instance run at the driver's priority
        os.environ.setdefault("RAY_worker_niceness", "0")
    ray = _ray()
    if ray.is_initialized():
        return ray
    if local:
        _single_machine()
    _probe(address)
    try:
        if address is None:
            ray.init(include_dashboard=False, log_to_driver=False, **LOOPBACK,
                     runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}})
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        if address is None or address == "auto" or "://" in address:
            hint = "start one with `ray start --head` or pass address=None for a local one"
        else:  # _probe found something listening there
            hint = ("something listens there but did not accept this driver: a cluster with "
                    "token authentication (RAY_AUTH_MODE=token) needs the same RAY_AUTH_MODE "
                    "and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) in the driver's environment; "
                    "else check that the driver runs the cluster's Ray version")
        raise ConnectionError(f"could not join the Ray cluster at address={address!r} ({e}); "
                              f"{hint}") from e
    return ray


LOOPBACK = {"_node_ip_address": "127.0.0.1"}  # ray.init arguments of a local instance


def _single_machine() -> None:
    """Ray's single-machine setting for this driver even when ``ray`` was imported before
    fedcf without it: Ray computed ``ray_constants.ENABLE_RAY_CLUSTER`` from the variable at
    import and reads the constant when the driver looks up its node's address; the variable
    is set too, for the processes Ray starts. An explicit
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`` is left as it is."""
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0") != "0":
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


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


_COMBINE = {}


def _combine_task(ray):
    """``combine`` as a Ray task that takes no CPU from the shards (it adds a few rows)."""
    if "task" not in _COMBINE:
        _COMBINE["task"] = ray.remote(num_cpus=0, max_retries=2)(combine)
    return _COMBINE["task"]


class BoundRayExecutor(RoundExecutor):
    """The executor of one run (made by ``RayExecutor.bind``): ``LocalExecutor``'s ``run``,
    ``tangents`` and ``counts``, plus ``partials`` (the shards' sums, which the loop reduces),
    ``round_stats`` (restarts and the seconds of broadcast, client work and reduce) and
    ``close``."""

    supports_partials = True

    def __init__(self, spec: RayExecutor, data):
        ray = connect(spec.address)
        self.spec, self.ray = spec, ray
        n_users = len(data[0]) - 1 if isinstance(data, tuple) else data.known_users
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
        self.program, self.round_stats, self.counts, self.local = None, {}, None, None
        self.actors = [self._start(s) for s in range(spec.n_shards)]
        if isinstance(data, tuple):
            self.counts = np.diff(data[0])

    def set_program(self, program, local_state=None) -> BoundRayExecutor:
        """Give every actor the client program of this run (and wait until all are up);
        ``local_state``: the stateful clients' rows, kept here (see ``RayExecutor.bind``).
        The program goes pickled (``Shard.set_program``)."""
        self.program, self.local = pickle.dumps(program), local_state
        try:
            self.ray.get([a.set_program.remote(self.program, self._local_layout())
                          for a in self.actors], timeout=START_TIMEOUT)
        except self.ray.exceptions.GetTimeoutError as e:
            self.close()
            raise RuntimeError(f"the {self.spec.n_shards} Ray shard actors did not start within "
                               f"{START_TIMEOUT} s (resources={self.spec.resources}); check that "
                               "the cluster has the CPUs and resources they ask for") from e
        return self

    def _start(self, s: int):
        actor = self.actor_cls.remote(s, self.spec.n_shards, int(self.num_cpus) or 1,
                                      self.data_refs[s], self.spec.device_policy)
        if self.program is not None:  # a restarted actor: calls to it run in order
            actor.set_program.remote(self.program, self._local_layout())
        return actor

    def _local_layout(self):
        """(width, dtype) of the stateful clients' rows, or None (stateless clients)."""
        return None if self.local is None else (self.local[0].shape[1], self.local[0].dtype)

    def _rows_of(self, clients):
        """The stateful rows of ``clients`` (what their shard runs them from), or None."""
        return None if self.local is None else tuple(a[clients] for a in self.local)

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
            return call.remote(method, parts[s], ref, self._rows_of(parts[s]))

        pending = {s: send(s) for s in range(len(parts))}
        results, restarts = {}, 0
        lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError)  # dead, unreachable, or stuck past the deadline
        limit = self.spec.shard_timeout
        deadline = None if limit is None else time.monotonic() + limit
        for s in range(len(parts)):
            for attempt in range(self.spec.max_restarts + 1):
                try:
                    if attempt:  # a restarted shard: its start (a new process, imports,
                        # kernels; seconds on a busy machine) is not held to shard_timeout
                        ray.get(self.actors[s].__ray_ready__.remote(), timeout=START_TIMEOUT)
                        pending[s] = send(s)
                        if limit is not None:  # and its call gets a whole deadline
                            deadline = time.monotonic() + limit
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
        t2 = time.perf_counter()
        self.round_stats = {"shard_restarts": restarts, "broadcast_seconds": t1 - t0,
                            "client_seconds": t2 - t1}
        out = [results[s] for s in range(len(parts))]
        if self.local is not None:  # every shard answered: the round's rows, kept here
            out = [self._keep_rows(parts[s], r, two) for s, r in enumerate(out)]
        return out, parts

    def _keep_rows(self, clients, result, two: bool):
        """A stateful shard's answer without the updated rows of its clients, which go into
        the rows kept here (a round retried after a failure starts again from the old rows,
        which are replaced only once every shard answered)."""
        (head, rows), rest = (result[0], result[1]) if two else (result, None)
        for kept, new in zip(self.local, rows):
            kept[clients] = new
        return (head, rest) if two else head

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

    def secure_clients(self, cohort, params, ids, hp, job):
        """The shards' client halves as one ``ShardedHalves``: each shard runs its own clients
        and begins the aggregator's ``job`` on them."""
        return self._halves("secure_begin", cohort, params, ids, hp, job)

    def secure_reports(self, cohort, params, tangents, ids, job):
        """The shards' client halves for a round of hypergradient reports (``reports_begin``)."""
        return self._halves("reports_begin", cohort, params, tangents, ids, job)

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


class ShardedHalves(SpreadHalves):
    """The client halves of a round spread over the shards, as the server half talks to them.
    A shard whose actor failed mid-round answers nothing (its clients drop) and is
    restarted."""

    def __init__(self, executor: BoundRayExecutor, registry: dict):
        self.executor, self.registry = executor, registry

    def verifying(self) -> dict:
        return dict(self.registry)

    def _parts_of(self, clients: list) -> list:
        return shard_of(np.array(clients, np.int64), self.executor.spec.n_shards).tolist()

    def _ask(self, step: str, args_of) -> list:
        ex, ray = self.executor, self.executor.ray
        pending = [a.secure.remote(step, *args_of(s)) for s, a in enumerate(ex.actors)]
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
        return out
