"""The device side of the Flower app: a node's own ratings and what it does with a message.

A deployed node is a device holding its own data: its node config names a ratings file
(``--node-config "data-path=/data/ratings.csv"``) that only it reads; the server never names it.
The server sends the run's item catalog with its directory query (kept in the run's
``context.state`` for the later messages); the node maps its items into it (unknown items are
left out and counted) and sizes every array by its own users. The simulation harness is the
other mode: a node keeps one partition of the dataset named in the run config — the users whose
position in the dataset's sorted user ids is ``partition-id`` modulo ``num-partitions`` (Flower's
simulation engine sets both; ``--node-config "partition-id=0 num-partitions=2"`` on a SuperNode)
— so every node sees the same catalog.

A train message asks for FedRecon client work for some of the node's users: the reply is their
uploads, or, when the message carries a linear aggregator's recipe, only their sums per reduce
group and item (``node_sums``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import numbers
from pathlib import Path

import numpy as np

from ..datasets import Interactions, load_movielens, load_ratings_file, make_synthetic_ratings
from ..eval.protocols import recon_sums
from ..federated.aggregators.weighted import recipe_numerators
from ..federated.round.device import model_digest
from ..federated.round.partials import PartialSums, group_sums
from ..federated.round.phases import (
    BoundLocalExecutor,
    ClientOutputs,
    Cohort,
    RoundHyperparams,
    client_weights,
)
from .ledger import keep_device, node_device
from .rows import NodeRows
from .wire import (
    NO_CATALOG,
    ReplyError,
    arrays,
    client_estimator,
    encode_sums,
    encode_upload,
    flwr,
    record_arrays,
)

_PARTITIONS: dict = {}  # (dataset key, partition, partitions) -> Interactions, per process
_DEVICE: dict = {}  # (path, mtime, size) -> the device's own ratings
_MAPPED: dict = {}  # (id of a node's data, catalog digest) -> (data, data in the catalog)
CATALOG_STATE = "fedcf-catalog"  # the run's catalog in context.state (sent with the query)
log = logging.getLogger(__name__)


class NodeDataError(ValueError):
    """The node cannot serve: no partition, a bad data source, users it does not hold."""


def _dataset_key(run_config) -> tuple:
    keys = ("dataset", "data-path", "synthetic-users", "synthetic-items", "synthetic-ratings",
            "synthetic-seed")
    return tuple(str(run_config.get(k, "")) for k in keys)


def load_dataset(run_config) -> Interactions:
    """The whole dataset the run's config names (each node then keeps only its partition)."""
    name = run_config.get("dataset", "ml-100k")
    path = run_config.get("data-path") or None
    if name == "ml-100k":
        return load_movielens("100k", path=path)
    if name == "file":
        if path is None:
            raise NodeDataError("dataset='file' needs data-path (a ratings file) in the run config")
        return load_ratings_file(path)
    if name == "synthetic":
        df = make_synthetic_ratings(int(run_config.get("synthetic-users", 500)),
                                    int(run_config.get("synthetic-items", 100)),
                                    int(run_config.get("synthetic-ratings", 10_000)),
                                    random_state=int(run_config.get("synthetic-seed", 0)))
        return Interactions.coerce(df)
    raise NodeDataError(f"unknown dataset {name!r} in the run config; use 'ml-100k', "
                        "'synthetic' or 'file' (with data-path)")


def node_data(run_config, node_config, state=None, catalog=None) -> Interactions:
    """This node's ratings: its own file (node config ``data-path``: a device holding its own
    data) or its partition of the run's dataset (the simulation harness, node config
    ``partition-id``/``num-partitions``). In the run's catalog when the server sent one with
    its directory query (``catalog``, kept in the run's ``state`` for the later messages)."""
    if "data-path" in node_config:
        base = device_data(node_config["data-path"])
    else:
        base = partition(run_config, node_config)
    if catalog is not None:
        if state is not None:
            state[CATALOG_STATE] = arrays(items=np.asarray(catalog, np.int64))
    elif state is not None and CATALOG_STATE in state:
        catalog = named(state[CATALOG_STATE], "catalog")["items"]
    if catalog is None:
        if "data-path" in node_config:
            raise NodeDataError(f"this node holds its own data (data-path) and {NO_CATALOG}: "
                                "the server sends one with its directory query (its run config "
                                "needs catalog-path), and again to a node that restarted")
        return base
    return in_catalog(base, catalog)


def device_data(path) -> Interactions:
    """A device's own ratings (a file ``load_ratings_file`` reads: u.data, ratings.dat or a
    MovieLens ratings.csv), with integer ids; re-read when the file changes."""
    p = Path(str(path))
    try:
        st = p.stat()
    except OSError as e:
        raise NodeDataError(f"this node's data-path {str(p)!r} cannot be read ({e})") from None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _DEVICE:
        own = load_ratings_file(p)
        if not np.issubdtype(np.asarray(own.user_ids).dtype, np.integer) or \
                not np.issubdtype(np.asarray(own.item_ids).dtype, np.integer):
            raise NodeDataError(f"{str(p)!r}: the Flower app needs integer user and item ids")
        _DEVICE.clear()  # a device holds one file: the old version goes
        _DEVICE[key] = own
    return _DEVICE[key]


def in_catalog(own: Interactions, catalog: np.ndarray) -> Interactions:
    """``own`` with its items mapped into the run's ``catalog``: ratings of items outside it
    are left out (counted in the node's log), users left with none are not listed."""
    catalog = np.asarray(catalog, np.int64)
    digest = hashlib.sha256(catalog.tobytes()).hexdigest()
    key = (id(own), digest)
    if key not in _MAPPED:
        raw_items = np.asarray(own.item_ids)[own.items]
        keep = np.isin(raw_items, catalog)
        if not keep.any():
            raise NodeDataError(f"none of this node's {len(keep)} ratings names an item of the "
                                f"run's catalog ({len(catalog)} items)")
        if not keep.all():
            log.info("fedcf node: %d of %d ratings name items outside the run's catalog; "
                     "left out", int((~keep).sum()), len(keep))
        users = np.asarray(own.user_ids)[own.user_index()]
        times = None if own.timestamps is None else own.timestamps[keep]
        mapped = Interactions.from_arrays(users[keep], raw_items[keep], own.values[keep], times,
                                          item_catalog=catalog)
        _MAPPED.clear()
        _MAPPED[key] = (own, mapped)  # ``own`` kept alive: its id stays its own
    return _MAPPED[key][1]


def partition(run_config, node_config) -> Interactions:
    """This node's users (cached per process: a SuperNode serves many messages)."""
    for key in ("partition-id", "num-partitions"):
        if key not in node_config:
            raise NodeDataError(f"this node has no {key!r} in its node config, so it holds no "
                                "data; start the SuperNode with --node-config "
                                "\"partition-id=0 num-partitions=2\"")
    try:
        p, n = int(node_config["partition-id"]), int(node_config["num-partitions"])
    except (TypeError, ValueError) as e:
        raise NodeDataError(f"partition-id and num-partitions must be integers, got "
                            f"{node_config['partition-id']!r}, {node_config['num-partitions']!r}"
                            ) from e
    if not 0 <= p < n:
        raise NodeDataError(f"partition-id={p} is not in [0, num-partitions={n})")
    key = (_dataset_key(run_config), p, n)
    if key not in _PARTITIONS:
        full = load_dataset(run_config)
        if not np.issubdtype(np.asarray(full.user_ids).dtype, np.integer) or \
                not np.issubdtype(np.asarray(full.item_ids).dtype, np.integer):
            raise NodeDataError("the Flower app needs integer user and item ids")
        _PARTITIONS[key] = full.subset_users(np.arange(p, full.n_users, n))
    return _PARTITIONS[key]


def describe(own: Interactions, config=None, catalog_sent: bool = False) -> dict:
    """The directory entry of this node: its users' raw ids and rating counts, per user the
    sums a fit needs of the ratings (count, Σv, Σv², min, max — for μ and the rating scale),
    and the item catalog. Never a rating or an item a user rated.

    Under differential privacy the query's config has ``private-floor`` (the run's
    min_examples): the node then lists only its users with at least that many ratings and
    sends no count and no sum — each device decides its own eligibility, and the server learns
    a user's query size only from an upload (covered by the DP aggregator)."""
    ids = np.asarray(own.user_ids, np.int64)
    catalog = np.asarray(own.item_ids, np.int64)
    counts = own.counts()
    if config is not None and "private-floor" in config:
        floor = int(config["private-floor"])
        listed = ids[counts >= max(floor, 1)]
        return arrays(users=listed) if catalog_sent else arrays(users=listed, catalog=catalog)
    v, users = own.values, own.user_index()
    sums = np.zeros((own.n_users, 4))
    sums[:, 0] = np.bincount(users, v, own.n_users)
    sums[:, 1] = np.bincount(users, v * v, own.n_users)
    sums[:, 2], sums[:, 3] = np.inf, -np.inf
    np.minimum.at(sums[:, 2], users, v)
    np.maximum.at(sums[:, 3], users, v)
    entry = dict(users=ids, counts=counts.astype(np.int64), sums=sums)
    return arrays(**entry) if catalog_sent else arrays(**entry, catalog=catalog)


def _rows(own: Interactions, raw_users) -> np.ndarray:
    """Positions in ``own`` of the raw user ids the server asked for."""
    raw = np.asarray(raw_users, np.int64)
    pos = np.searchsorted(own.user_ids, raw)
    pos = np.minimum(pos, max(own.n_users - 1, 0))
    bad = (own.n_users == 0) | (np.asarray(own.user_ids)[pos] != raw) if len(raw) else []
    if np.any(bad):
        raise NodeDataError(f"user {int(raw[np.flatnonzero(bad)[0]])} is not held by this node")
    return pos


def named(rec, what: str, only=None) -> dict:
    """The arrays of one of the message's records (``wire.record_arrays``; ``only``: just
    those), or a NodeDataError naming the record."""
    try:
        return record_arrays(rec, only)
    except ReplyError as e:
        raise NodeDataError(f"the message's {what} record is refused: {e}") from None


def global_model(own: Interactions, est, glob) -> tuple:
    """(Q, b) of the message, checked against this node's catalog and the parameters (a wrong
    shape would otherwise index past the arrays inside the kernels)."""
    g = named(glob, "global", ("Q", "b"))
    try:
        Q, b = g["Q"], g["b"]
    except KeyError as e:
        raise NodeDataError(f"the message's global record lacks {e}") from None
    state = est._model_state(own.n_items)
    shape = state.shape
    if Q.shape != shape or b.shape != shape[:1]:
        raise NodeDataError(f"the message's model has Q {Q.shape} and b {b.shape}; this node's "
                            f"catalog and parameters declare Q {shape} and b {shape[:1]} "
                            f"({'; '.join(state.describe())})")
    if Q.dtype != np.dtype(est.dtype) or b.dtype != Q.dtype:
        raise NodeDataError(f"the message's model has dtype {Q.dtype}/{b.dtype}, expected "
                            f"{np.dtype(est.dtype)}")
    return Q, b


def train(own: Interactions, config, glob, rows: NodeRows | None = None) -> dict:
    """The client work for the asked users (FedRecon: reconstruct, update) and the reply's
    records — every user's upload, or, when the message carries a linear aggregator's
    ``recipe``, only their sums per reduce group and item (``node_sums``); ``rows``: a stateful
    estimator's user rows (``rows.NodeRows``; FedAvg's trained rows join the reply)."""
    rows = rows or NodeRows(None)
    out = client_outputs(own, config, glob, rows)
    if "recipe" not in config:
        return {"upload": encode_upload(out), **rows.reply}
    return {"sums": encode_sums(node_sums(out, read_recipe(config))), **rows.reply}


def node_sums(out: ClientOutputs, recipe: dict) -> PartialSums:
    """The node's clients' sums for a linear aggregate: each client's factor from the public
    recipe (``weighted.recipe_numerators``), then the per-group sums a shard would send."""
    hp = RoundHyperparams(1.0, {}, weight_exponent=recipe["exponent"])
    bad, w, _ = client_weights(out, hp)
    num = np.where(w > 0, recipe_numerators(out, w, recipe), 0.0)
    return group_sums(out, out.client_ids(), num, w, bad, (w == 0) & ~bad)


def read_recipe(config) -> dict:
    """The message's aggregation recipe, checked: a device computes with finite numbers only."""
    try:
        raw = json.loads(str(config["recipe"]))
        clip, cap = raw["clip"], raw["cap"]
        recipe = {"clip": None if clip is None else float(clip),
                  "cap": None if cap is None else float(cap),
                  "weighted": bool(raw["weighted"]), "exponent": float(raw["exponent"])}
    except (ValueError, TypeError, KeyError) as e:
        raise NodeDataError(f"the message's recipe is not a JSON object with clip, cap, "
                            f"weighted and exponent ({e})") from None
    for key in ("clip", "cap"):
        v = recipe[key]
        if v is not None and not (math.isfinite(v) and v > 0):
            raise NodeDataError(f"the message's recipe has {key}={v}; it must be a finite "
                                "number > 0 or null")
    if not math.isfinite(recipe["exponent"]):
        raise NodeDataError(f"the message's recipe has exponent={recipe['exponent']}")
    return recipe


def client_outputs(own: Interactions, config, glob, rows: NodeRows | None = None
                   ) -> ClientOutputs:
    """The asked users' client work (FedRecon: reconstruct, then update) as ClientOutputs in
    the order of the message's clients; a stateful estimator's trained rows go where
    ``rows`` keeps them."""
    clients, executor, cohort, params, keys = _client_work(own, config, glob, rows)
    out = executor.run(cohort, params, keys)
    if executor.local_state is not None:
        rows.keep(config["users"], executor.local_state,
                  on_device=not executor.program.server_rows)
    return dataclasses.replace(out, clients=clients)


def tangent_reports(own: Interactions, config, glob, tangents, rows=None) -> dict:
    """The asked users' hypergradient reports (hyper.py): each one's query loss and its
    derivatives along the last server step's tangents (the message's ``tangents`` record,
    TQ (H, n_items, K) and Tb (H, n_items)), in the order of the message's clients."""
    clients, losses, jvp, _ = report_arrays(own, config, glob, tangents, rows)
    return {"reports": arrays(clients=clients, losses=losses, jvp=jvp)}


def report_arrays(own: Interactions, config, glob, tangents, rows=None) -> tuple:
    """(client ids, query losses, derivatives (m, H), query sizes) of the asked users (a
    stateful estimator's at their current rows, which a report does not change)."""
    clients, executor, cohort, params, keys = _client_work(own, config, glob, rows)
    TQ, Tb = read_tangents(tangents, params["Q"].shape)
    losses, jvp, weights = executor.tangents(cohort, params, (TQ, Tb), keys)
    return (clients, np.asarray(losses, np.float64), np.asarray(jvp, np.float64),
            np.asarray(weights, np.float64))


def read_tangents(tangents, shape) -> tuple[np.ndarray, np.ndarray]:
    """(TQ, Tb) of the message, checked: H ≥ 1 directions over this node's catalog, finite."""
    try:
        t = named(tangents, "tangents")
        TQ, Tb = t["TQ"], t["Tb"]
    except (KeyError, TypeError) as e:
        raise NodeDataError(f"the message's tangents record lacks {e}") from None
    H = TQ.shape[0] if TQ.ndim == 3 else 0
    if not 1 <= H <= 8 or TQ.shape != (H, *shape) or Tb.shape != (H, shape[0]):
        raise NodeDataError(f"the message's tangents have TQ {TQ.shape} and Tb {Tb.shape}; this "
                            f"node's catalog and n_factors need (H, {shape[0]}, {shape[1]}) "
                            f"and (H, {shape[0]}) with 1 <= H <= 8")
    if not (np.issubdtype(TQ.dtype, np.floating) and np.issubdtype(Tb.dtype, np.floating)
            and np.isfinite(TQ).all() and np.isfinite(Tb).all()):
        raise NodeDataError("the message's tangents must be finite floating-point numbers")
    return TQ.astype(np.float64, copy=False), Tb.astype(np.float64, copy=False)


def _client_work(own: Interactions, config, glob, user_rows: NodeRows | None = None):
    """What running the asked users needs: (their ids in the run, an executor over this node's
    rows of them, its cohort, the message's model, the streams' keys). Row k is the message's
    k-th user; each row's stream is keyed by its client id in the run, so the results are the
    simulation's while the arrays are sized by this node's users (rng.client_key). A stateful
    estimator's users train with the rows ``user_rows`` loads (``NodeRows.load``)."""
    rows = _rows(own, config["users"])
    clients = np.asarray(config["clients"], np.int64)
    if len(clients) != len(rows) or (len(clients) and clients.min() < 0) or \
            len(np.unique(clients)) != len(clients):
        raise NodeDataError("the message's clients must be distinct ids >= 0, one per user")
    est = client_estimator(config["params"])
    sub = own.subset_users(rows)  # this node's users only
    alg = est._algorithm(sub, message_number(config, "mu"))  # built on its own data
    program = alg.program
    Q, b = global_model(own, est, glob)
    ids = named(glob, "global", ("ids",)).get("ids", np.zeros(0))
    if ids.shape != (2,) or not np.issubdtype(ids.dtype, np.integer):
        raise NodeDataError("the message's ids must be two integers [seed, round]")
    keys = np.concatenate([ids, clients]).astype(np.uint64)
    local = None if alg.local is None else (user_rows or NodeRows(None)).load(
        config["users"], Q.shape[1], est.dtype, on_device=not program.server_rows)
    executor = BoundLocalExecutor(program, (sub.indptr, sub.items, sub.values), local)
    cohort = Cohort(np.arange(len(rows), dtype=np.int64), len(rows), 0, 0)
    return clients, executor, cohort, {"Q": Q, "b": b}, keys


ROUND_STATE = "fedcf-round"  # the latest round this node worked (in the run's context.state)


def check_fresh(state, glob) -> None:
    """Refuse a message for a round older than one this node already worked (a stalled node
    catching up on its queue works only the current round); remember the round otherwise."""
    try:
        ids = named(glob, "global", ("ids",)).get("ids") if state is not None else None
    except NodeDataError:
        return  # the work itself refuses a malformed record
    if ids is None or ids.shape != (2,):
        return  # the work itself refuses malformed ids
    now, last = int(ids[1]), int(state[ROUND_STATE]["round"]) if ROUND_STATE in state else -1
    if now < last:
        raise NodeDataError(f"a stale message for round {now}: this node has worked round "
                            f"{last} already")
    state[ROUND_STATE] = flwr().ConfigRecord({"round": now})


def evaluate(own: Interactions, config, glob, state=None, node_config=None) -> dict:
    """Federated ReconEval for the asked users: each reconstructs on its support set and the
    node reports sums over their query ratings (``eval.protocols.recon_sums``). The device's
    policy (``node_config``) and ledger (``state``) decide who reports: each user once per
    model, and only a cohort of at least ``min-cohort`` (``Device.admit_eval``)."""
    rows = _rows(own, config["users"])
    if len(np.unique(rows)) != len(rows):
        raise NodeDataError("the evaluation asks for a user more than once; each user "
                            "reports once")
    est = client_estimator(config["params"])
    est.item_ids_, est.user_ids_ = own.item_ids, np.zeros(0, np.int64)
    Q, b = global_model(own, est, glob)
    est._set_globals({"Q": Q, "b": b})  # the declared arrays (FedNCF's dense part too)
    est.global_mean_ = message_number(config, "mu")
    lo, hi = (message_number(config, "rating_scale", i) for i in (0, 1))
    if not lo < hi:
        raise NodeDataError(f"the message's rating_scale ({lo}, {hi}) is not (low < high)")
    est.rating_scale_ = (lo, hi)
    support = message_number(config, "support")
    if not 0.0 < support < 1.0:
        raise NodeDataError(f"the message's support fraction {support} is not in (0, 1)")
    seed = int(message_number(config, "seed", integer=True))
    device = node_device(state, node_config)  # the message is sound: now the device's rules
    rows = rows[device.admit_eval(model_digest(Q, b), rows)]
    if state is not None:
        keep_device(state, device)
    return recon_sums(est, own.subset_users(rows), support_fraction=support, seed=seed)


def message_number(config, key: str, index: int | None = None, *, integer=False) -> float:
    """A finite number the message's config carries under ``key`` (element ``index`` of a
    list), or an error naming it: a device computes nothing with NaN, inf or a missing value."""
    try:
        value = config[key] if index is None else config[key][index]
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and \
            math.isfinite(value) and (not integer or value == int(value))
    except (KeyError, IndexError, TypeError):
        value, ok = "nothing", False
    if not ok:
        name = key if index is None else f"{key}[{index}]"
        raise NodeDataError(f"the message's {name} must be a finite "
                            f"{'integer' if integer else 'number'}, got {value!r}")
    return float(value)
