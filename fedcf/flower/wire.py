"""What crosses the wire between the fedcf ServerApp and ClientApp, and the checks every reply
passes before the server uses it.

Down (server → node), every message: record ``"global"`` (ArrayRecord: the item factors ``Q``,
the item biases ``b`` and ``ids`` = [seed, round]) and record ``"config"`` (ConfigRecord: the raw
ids of the node's users asked to work, their dense ids in the run, the FedReconMF parameters a
client needs as JSON, μ, and for evaluation the rating scale and the split seed).

Up (node → server) after training: record ``"upload"`` (ArrayRecord) with exactly the fields of
``phases.ClientOutputs`` for the node's clients — sparse item-row deltas (``offsets``, ``items``,
``d_Q``, ``d_b``), query sizes ``weights``, query losses ``losses`` and the dense ``clients``.
For a linear aggregator (weighted mean, norm clipping with a fixed clip, DP with a fixed clip)
the train message's config also carries the aggregator's public ``recipe`` (clip, weight cap,
weighting, exponent) and the node answers with record ``"sums"`` instead: its clients' sums
per reduce group and item and the groups' counters (``partials.PartialSums``), never one
client's upload; ``decode_sums`` checks them against what those clients could send.
After evaluation: record ``"recon"`` (MetricRecord) with sums over the query ratings. After the
directory query: record ``"users"`` (ArrayRecord) — raw user ids, rating counts, per-user rating
sums — and the item catalog; under DP only the ids of the users with at least ``private-floor``
ratings and the catalog. For FedRecon (explicit and implicit) and FURL no message carries a
user embedding or a user bias; FedAvg's messages carry the asked users' rows down and back up
(record ``"rows"``: ``P``, ``c``), because FedAvg keeps them on the server (``rows.py``).

Every ArrayRecord named here holds its arrays packed into one uint8 Array (``arrays``; read
back, checked, by ``record_arrays``): Flower moves each Array as objects of its own, one
request each.
"""

from __future__ import annotations

import json
import math
from operator import attrgetter

import numpy as np

from .. import registry
from ..federated.algorithms.base import FederatedMFBase, run_seed
from ..federated.round.partials import STATS, PartialSums, reduce_group
from ..federated.round.phases import ClientOutputs

UPLOAD_FIELDS = ("offsets", "items", "d_Q", "d_b", "weights", "losses", "clients")
SUM_FIELDS = ("groups", "items", "s_Q", "s_b", "stat_groups", "stats", "worst_client",
              "worst_loss")
DIRECTORY_FIELDS = ("users", "counts", "sums", "catalog")
RECON_FIELDS = ("sse", "sae", "hits", "n", "users")
# what a node that lost the run's catalog (a restart) says, so the server re-sends it
NO_CATALOG = "has no item catalog yet"
ERROR_CODE = 4201  # a fedcf node could not do what the message asked (the reason says why)


def flower_estimator(model):
    """The estimator class registered as ``model``, if a Flower run can train it: one that
    declares the parameters its clients compute with (``_client_params``): every federated
    estimator — FedRecon explicit and implicit, and those whose user rows the nodes keep or
    carry (FURL, FedAvg, FedMF, PFedRec, FedNCF; ``rows.NodeRows``); anything else (a
    centralized model) is refused, naming it."""
    try:
        cls = registry.lookup("estimator", model)
    except ValueError as e:
        raise ValueError(f"fedcf-model={model!r}: {e}") from None
    if not isinstance(cls, type) or not issubclass(cls, FederatedMFBase) or \
            cls._client_params is None:
        raise ValueError(f"fedcf-model={model!r}: a Flower run trains estimators that declare "
                         "their client parameters (a federated estimator: "
                         f"{', '.join(_federated_names())}); {cls.__name__} is not one")
    return cls


def _federated_names() -> list[str]:
    return [n for n in registry.names("estimator") if isinstance(
        c := registry.lookup("estimator", n), type) and issubclass(c, FederatedMFBase)]


class ReplyError(ValueError):
    """A reply the server refuses (the reason is logged; the round goes on without it)."""


def flwr():
    """The Flower modules fedcf uses, or an ImportError saying how to install them."""
    try:
        import flwr.app as app
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fedcf.flower needs Flower: pip install 'fedcf[flower]' "
                          "(or 'flwr[simulation]>=1.41')") from e
    return app


PACKED = "packed"  # the one Array of a record: every named array in one buffer
_KINDS = "biuf"  # bool, integer and floating arrays cross the wire; nothing else is read


def arrays(**named) -> object:
    """An ArrayRecord holding the named NumPy arrays packed into one uint8 Array (``PACKED``):
    Flower moves every Array as objects of its own, one HTTP request each, so a record of
    seven arrays cost fourteen requests; packed it costs two. Layout: an 8-byte length, a
    JSON header [[name, dtype, shape], ...], then each array's bytes, in header order."""
    app = flwr()
    parts = [np.asarray(v) for v in named.values()]  # tobytes() writes C order
    head = json.dumps([[k, a.dtype.str, list(a.shape)] for k, a in zip(named, parts)]).encode()
    buf = b"".join([len(head).to_bytes(8, "little"), head] + [a.tobytes() for a in parts])
    return app.ArrayRecord({PACKED: app.Array(np.frombuffer(buf, np.uint8))})


def record_arrays(rec, only=None) -> dict:
    """The named arrays of a record ``arrays`` made (fresh, writable copies; ``only``: just
    those names, the whole record still checked), checked: a header that does not describe
    the buffer exactly, or an array that is not bool, integer or floating, is a ReplyError
    naming it (a node's record is never trusted to be well formed)."""
    buf, specs, at = _packed(rec)
    out, seen = {}, set()
    for name, dt, shape in specs:
        if dt.kind not in _KINDS or dt.hasobject or any(x < 0 for x in shape) or name in seen:
            raise ReplyError(f"the record's field {name!r} ({dt}, shape {shape}) is refused: "
                             "only bool, integer and floating arrays, each named once")
        size = dt.itemsize * math.prod(shape)
        if at + size > len(buf):
            raise ReplyError(f"the record's field {name!r} runs past the buffer")
        if only is None or name in only:  # one copy, aligned and writable
            out[name] = np.frombuffer(buf, dt, size // max(dt.itemsize, 1), at).reshape(
                shape).copy()
        seen.add(name)
        at += size
    if at != len(buf):
        raise ReplyError(f"the {PACKED!r} array has {len(buf) - at} bytes its header does not "
                         "describe")
    return out


def _packed(rec) -> tuple:
    """(the buffer, its header's [(name, dtype, shape)], where the arrays begin)."""
    if rec is None or PACKED not in rec or len(rec) != 1:
        raise ReplyError(f"the record holds {sorted(rec or ())}, not one {PACKED!r} array")
    buf = rec[PACKED].numpy()
    if buf.dtype != np.uint8 or buf.ndim != 1 or len(buf) < 8:
        raise ReplyError(f"the {PACKED!r} array is not a byte buffer")
    n = int.from_bytes(buf[:8].tobytes(), "little")
    try:
        head = json.loads(buf[8:8 + n].tobytes()) if 8 + n <= len(buf) else None
        specs = [(str(k), np.dtype(d), tuple(int(x) for x in shape)) for k, d, shape in head]
    except (TypeError, ValueError):
        raise ReplyError(f"the {PACKED!r} array's header is not a list of "
                         "[name, dtype, shape]") from None
    return buf, specs, 8 + n


def record_fields(rec) -> list:
    """The field names a record carries: a packed ArrayRecord's arrays as its header names
    them (its own keys if it is not one), any other record's keys."""
    try:
        return [name for name, _, _ in _packed(rec)[1]]
    except (ReplyError, TypeError, AttributeError):
        return list(rec.keys())


def read_arrays(content, record: str, fields) -> dict:
    """The arrays ``fields`` of ``content[record]``; a missing record or field is a ReplyError."""
    rec = content.array_records.get(record) if isinstance(content, flwr().RecordDict) else None
    if rec is None:
        raise ReplyError(f"the reply has no {record!r} record")
    a = record_arrays(rec)
    missing = [f for f in fields if f not in a]
    if missing:
        raise ReplyError(f"the {record!r} record lacks {missing}")
    extra = sorted(set(a) - set(fields))
    if extra:
        raise ReplyError(f"the {record!r} record has unexpected fields {extra}")
    return {f: a[f] for f in fields}


def client_params(est) -> str:
    """The JSON of the estimator (its registered name, ``model``) and of the parameters its
    clients need."""
    model = registry.name_of("estimator", type(est))
    if model is None:
        raise ValueError(f"{type(est).__name__} is not registered: register it (fedcf.registry."
                         "register('estimator', name, cls)) on the server and the nodes")
    params = est.get_params(deep=False)
    out = {k: registry.encode(params[k]) for k in flower_estimator(model)._client_params}
    out["model"] = model
    out["dtype"] = np.dtype(out["dtype"]).name
    out["random_state"] = run_seed(est.random_state)
    return json.dumps(out, sort_keys=True)


def client_estimator(params_json: str):
    """The estimator a node computes with, from ``client_params``' JSON (phase objects as saved
    specs, or as the run config's ``{"name": ...}`` specs): a registered estimator a Flower run
    trains (``flower_estimator``); a parameter it does not take is refused, naming it."""
    kinds = registry.phase_kinds()
    try:
        params = {k: registry.decode(v, k) for k, v in json.loads(params_json).items()}
        cls = flower_estimator(params.pop("model", "fedrecon"))
        return cls(**{k: registry.from_spec(k, v) if k in kinds else v
                      for k, v in params.items()}).check_params()
    except (TypeError, ValueError) as e:  # a device checks what it is asked to compute with
        raise ValueError(f"the message's estimator parameters are refused: {e}") from e


def encode_upload(out: ClientOutputs) -> object:
    """The upload record; item ids travel as int32 (a catalog below 2³¹ items)."""
    fields = dict(zip(UPLOAD_FIELDS, attrgetter(*UPLOAD_FIELDS)(out)))
    if len(out.items) and int(out.items.max()) < 2**31:
        fields["items"] = out.items.astype(np.int32)
    return arrays(**fields)


def decode_upload(content, *, clients: np.ndarray, slots: np.ndarray | None,
                  weights: np.ndarray | None, n_items: int, K: int, dtype,
                  program=None) -> ClientOutputs:
    """The ClientOutputs of one node's reply, after checking it is what the server asked for:
    the same clients in the same order, the layout the client program gives for their rating
    counts (slots and query sizes), item ids in the catalog, K columns. Non-finite deltas pass
    (the aggregator leaves such clients out and counts them, as in a simulation).

    ``slots=None, weights=None`` (a run under DP, where the server knows no rating count): the
    layout is the reply's own, checked against the client ``program``'s rule for the slots of
    a weight (``slots_of``: FedRecon's slots are its query size) where it has one."""
    a = read_arrays(content, "upload", UPLOAD_FIELDS)
    got = np.asarray(a["clients"])
    if got.shape != clients.shape or not np.array_equal(got, clients):
        raise ReplyError(f"it answers for clients {got[:5].tolist()}…, not the "
                         f"{len(clients)} asked for")
    if slots is None:
        slots, weights = _reply_layout(a, len(clients), program)
    offsets = np.asarray(a["offsets"])
    expect = np.zeros(len(clients) + 1, np.int64)
    np.cumsum(slots, out=expect[1:])
    if offsets.shape != expect.shape or not np.array_equal(offsets, expect):
        raise ReplyError("its delta slots do not match the clients' query sizes (offsets)")
    total = int(expect[-1])
    shapes = {"items": (total,), "d_Q": (total, K), "d_b": (total,),
              "weights": (len(clients),), "losses": (len(clients),)}
    for f, shape in shapes.items():
        if a[f].shape != shape:
            raise ReplyError(f"{f} has shape {a[f].shape}, expected {shape} (model with "
                             f"{n_items} items and K={K})")
    items = a["items"]
    if not np.issubdtype(items.dtype, np.integer) or (total and (
            items.min() < -1 or items.max() >= n_items)):
        raise ReplyError(f"items must be integer ids in [-1, {n_items}) (the catalog)")
    owner = np.repeat(np.arange(len(clients)), slots)
    pairs = np.stack([owner, items.astype(np.int64)], axis=1)[items >= 0]
    if len(np.unique(pairs, axis=0)) < len(pairs):
        raise ReplyError("a client names one item in two delta slots (each item's row once per "
                         "client: the clip is taken per row)")
    if not np.array_equal(np.asarray(a["weights"], np.float64), weights):
        raise ReplyError("its weights are not the query sizes of the clients' data")
    for f in ("d_Q", "d_b", "losses"):
        if not np.issubdtype(a[f].dtype, np.floating):
            raise ReplyError(f"{f} must be floating point, got {a[f].dtype}")
    return ClientOutputs(expect, items.astype(np.int64), a["d_Q"].astype(dtype, copy=False),
                         a["d_b"].astype(dtype, copy=False), weights,
                         a["losses"].astype(np.float64), None, clients)


REPORT_FIELDS = ("clients", "losses", "jvp")


def decode_reports(content, *, clients: np.ndarray, H: int) -> tuple[np.ndarray, np.ndarray]:
    """(losses (m,), jvp (m, H)) of one node's hypergradient reply, after checking it answers
    for the ``clients`` asked, in order, with one loss and H derivatives each, floating point.
    Non-finite values pass (such a client's report does not count, as in a simulation)."""
    a = read_arrays(content, "reports", REPORT_FIELDS)
    got = np.asarray(a["clients"])
    if got.shape != clients.shape or not np.array_equal(got, clients):
        raise ReplyError(f"its reports answer for clients {got[:5].tolist()}…, not the "
                         f"{len(clients)} asked for")
    for f, shape in (("losses", (len(clients),)), ("jvp", (len(clients), H))):
        if a[f].shape != shape or not np.issubdtype(a[f].dtype, np.floating):
            raise ReplyError(f"reports {f} must be floating point of shape {shape}, got "
                             f"{a[f].dtype} {a[f].shape}")
    return a["losses"].astype(np.float64), a["jvp"].astype(np.float64)


def encode_sums(parts: PartialSums) -> object:
    """The sums record of a node's clients (``group_sums``: a row per reduce group and item)."""
    if parts.rank is not None:
        raise ValueError("a node sends the rank map of its clients only under secure "
                         "aggregation")
    sums = parts.arrays()
    return arrays(**{f: sums[f] for f in SUM_FIELDS})


def decode_sums(content, *, clients: np.ndarray, n_items: int, K: int,
                recipe: dict, weights: np.ndarray | None) -> PartialSums:
    """A node's sums over the ``clients`` it was asked to run, after checking they can be sums
    of those clients' uploads under ``recipe``: rows only for their reduce groups and the
    catalog, each (group, item) once, finite; per group the number of clients asked, at most
    their weight (``weights``, when the server knows the query sizes), and, with a clip C, a
    norm of at most C times the factors' bound (w_k clipped to C each, or ≤ 1 each under DP)
    — so a node moves the model no more than its clients could one by one."""
    a = read_arrays(content, "sums", SUM_FIELDS)
    asked = np.unique(reduce_group(clients))
    rows, g = len(a["items"]), len(a["stat_groups"])
    shapes = {"groups": (rows,), "s_Q": (rows, K), "s_b": (rows,), "stats": (g, len(STATS)),
              "worst_client": (g,), "worst_loss": (g,)}
    for f, shape in shapes.items():
        if a[f].shape != shape:
            raise ReplyError(f"sums field {f} has shape {a[f].shape}, expected {shape}")
    for f in ("groups", "items", "stat_groups", "worst_client"):
        if not np.issubdtype(a[f].dtype, np.integer):
            raise ReplyError(f"sums field {f} must be integers, got {a[f].dtype}")
    groups, items = a["groups"].astype(np.int64), a["items"].astype(np.int64)
    if rows and (items.min() < 0 or items.max() >= n_items or not np.isin(groups, asked).all()):
        raise ReplyError(f"its sums name items outside [0, {n_items}) or reduce groups of no "
                         "client it was asked to run")
    if len(np.unique(groups * n_items + items)) < rows:
        raise ReplyError("its sums name one (group, item) twice")
    stat_groups = a["stat_groups"].astype(np.int64)
    if not np.array_equal(stat_groups, asked):
        raise ReplyError("its counters are not one per reduce group of the clients asked")
    for f in ("s_Q", "s_b", "stats"):
        if not np.issubdtype(a[f].dtype, np.floating) or not np.isfinite(a[f]).all():
            raise ReplyError(f"sums field {f} must be finite floating point")
    stats = a["stats"].astype(np.float64)
    where = np.searchsorted(asked, reduce_group(clients))
    per_group = np.bincount(where, minlength=len(asked)).astype(np.float64)
    if not np.array_equal(stats[:, STATS.index("n_clients")], per_group):
        raise ReplyError("its counters do not count the clients it was asked to run")
    worst = a["worst_client"].astype(np.int64)
    if not np.isin(worst[worst >= 0], clients).all():
        raise ReplyError("its worst client is not one of the clients it was asked to run")
    _check_sum_bounds(groups, a["s_Q"], a["s_b"], stats, asked, where, recipe, weights)
    return PartialSums(groups, items, a["s_Q"].astype(np.float64), a["s_b"].astype(np.float64),
                       stat_groups, stats, worst, a["worst_loss"].astype(np.float64))


def _check_sum_bounds(groups, s_Q, s_b, stats, asked, where, recipe, weights):
    """Each group's weight at most its clients' (known query sizes) and, with a clip, its
    sums' norm at most C × the largest factors its clients could have."""
    most = np.bincount(where, weights=weights, minlength=len(asked)) \
        if weights is not None else None
    if most is not None and (stats[:, STATS.index("weight")] > most * (1 + 1e-9) + 1e-12).any():
        raise ReplyError("its weights exceed its clients' query sizes")
    if recipe.get("clip") is None:
        return
    if recipe["weighted"] and most is None:
        raise ReplyError("a clipped weighted mean needs the clients' query sizes")
    bound = recipe["clip"] * (most if recipe["weighted"] else
                              np.bincount(where, minlength=len(asked)).astype(np.float64))
    sq = np.zeros(len(asked))
    np.add.at(sq, np.searchsorted(asked, groups),
              np.einsum("ij,ij->i", s_Q.astype(np.float64), s_Q.astype(np.float64)) +
              np.square(s_b.astype(np.float64)))
    if (np.sqrt(sq) > bound * (1 + 1e-6) + 1e-12).any():
        raise ReplyError(f"its sums are longer than {recipe['clip']:g} times its clients' "
                         "weights (the clip) allow")


def _reply_layout(a: dict, n: int, program=None) -> tuple[np.ndarray, np.ndarray]:
    """(slots, weights) a reply declares, when the server has no count to derive them from:
    whole weights ≥ 0, and slots the ``program``'s for those weights where it has a rule
    (``slots_of``; None: FedRecon's, one slot per query example)."""
    offsets, weights = np.asarray(a["offsets"]), np.asarray(a["weights"])
    if offsets.shape != (n + 1,) or not np.issubdtype(offsets.dtype, np.integer) or \
            (n and offsets[0] != 0):
        raise ReplyError("its offsets must be n_clients + 1 integers starting at 0")
    slots = np.diff(offsets).astype(np.int64)
    if (slots < 0).any():
        raise ReplyError("its offsets must not decrease")
    w = weights.astype(np.float64) if weights.shape == (n,) and \
        np.issubdtype(weights.dtype, np.number) else None
    if w is None or not (np.isfinite(w).all() and (w >= 0).all() and (w == np.round(w)).all()):
        raise ReplyError("its weights must be one whole number >= 0 per client")
    want = w.astype(np.int64) if program is None else program.slots_of(w.astype(np.int64))
    if want is not None and not np.array_equal(want, slots):
        raise ReplyError("its weights are not the clients' query sizes (the client program "
                         "gives other slot counts for them)")
    return slots, w


def content_bytes(content, sizes: dict | None = None) -> int:
    """Bytes of a message's content as Flower ships it (its serialized objects), or, where that
    internal API is missing, the records' own byte counts. ``sizes`` caches object sizes by
    object id across the messages of a round (their global record is the same object)."""
    sizes = {} if sizes is None else sizes
    try:
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    except ImportError:  # pragma: no cover - another Flower version
        return sum(r.count_bytes() for r in content.values())
    total = 0
    for oid, obj in get_all_nested_objects(content).items():
        if oid not in sizes:
            sizes[oid] = len(obj.deflate())
        total += sizes[oid]
    return total


ROW_FIELDS = ("P", "c")


def decode_rows(content, *, n: int, K: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A FedAvg node's new user rows (P (n, K), c (n,)) for the ``n`` clients asked, in their
    order, after checking shape, type and finiteness (a client whose update turned non-finite
    keeps its old row, so an honest node never sends a non-finite one)."""
    a = read_arrays(content, "rows", ROW_FIELDS)
    for f, shape in (("P", (n, K)), ("c", (n,))):
        if a[f].shape != shape or a[f].dtype != np.dtype(dtype) or not np.isfinite(a[f]).all():
            raise ReplyError(f"rows {f} must be finite {np.dtype(dtype)} of shape {shape}, got "
                             f"{a[f].dtype} {a[f].shape}")
    return a["P"], a["c"]
