"""What crosses the wire between the fedcf ServerApp and ClientApp, and the checks every reply
passes before the server uses it.

Down (server → node), every message: record ``"global"`` (ArrayRecord: the item factors ``Q``,
the item biases ``b`` and ``ids`` = [seed, round]) and record ``"config"`` (ConfigRecord: the raw
ids of the node's users asked to work, their dense ids in the run, the FedReconMF parameters a
client needs as JSON, μ, and for evaluation the rating scale and the split seed).

Up (node → server) after training: record ``"upload"`` (ArrayRecord) with exactly the fields of
``phases.ClientOutputs`` for the node's clients — sparse item-row deltas (``offsets``, ``items``,
``d_Q``, ``d_b``), query sizes ``weights``, query losses ``losses`` and the dense ``clients``.
After evaluation: record ``"recon"`` (MetricRecord) with sums over the query ratings. After the
directory query: record ``"users"`` (ArrayRecord) — raw user ids, rating counts, per-user rating
sums — and the item catalog; under DP only the ids of the users with at least ``private-floor``
ratings and the catalog. No message ever carries a user embedding or a user bias.
"""

from __future__ import annotations

import json
from operator import attrgetter

import numpy as np

from .. import registry
from ..federated.base import run_seed
from ..federated.phases import ClientOutputs

UPLOAD_FIELDS = ("offsets", "items", "d_Q", "d_b", "weights", "losses", "clients")
DIRECTORY_FIELDS = ("users", "counts", "sums", "catalog")
RECON_FIELDS = ("sse", "sae", "hits", "n", "users")
# FedReconMF parameters that decide what a client computes (everything else is the server's)
CLIENT_PARAMS = ("n_factors", "biases", "client_update", "init_scale", "split", "reconstruction",
                 "joint", "dtype", "random_state")


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


def arrays(**named) -> object:
    """An ArrayRecord of NumPy arrays (C-contiguous copies)."""
    app = flwr()
    return app.ArrayRecord({k: app.Array(np.ascontiguousarray(v)) for k, v in named.items()})


def read_arrays(content, record: str, fields) -> dict:
    """The arrays ``fields`` of ``content[record]``; a missing record or field is a ReplyError."""
    rec = content.array_records.get(record) if isinstance(content, flwr().RecordDict) else None
    if rec is None:
        raise ReplyError(f"the reply has no {record!r} record")
    missing = [f for f in fields if f not in rec]
    if missing:
        raise ReplyError(f"the {record!r} record lacks {missing}")
    extra = sorted(set(rec) - set(fields))
    if extra:
        raise ReplyError(f"the {record!r} record has unexpected fields {extra}")
    return {f: rec[f].numpy() for f in fields}


def client_params(est) -> str:
    """The JSON of the FedReconMF parameters a client needs."""
    params = est.get_params(deep=False)
    out = {k: registry.encode(params[k]) for k in CLIENT_PARAMS}  # phase objects as specs
    out["dtype"] = np.dtype(out["dtype"]).name
    out["random_state"] = run_seed(est.random_state)
    return json.dumps(out, sort_keys=True)


def client_estimator(params_json: str):
    """The FedReconMF a node computes with, from ``client_params``' JSON (phase objects as saved
    specs, or as the run config's ``{"name": ...}`` specs)."""
    from ..federated.fedrecon import FedReconMF

    kinds = registry.phase_kinds()
    try:
        params = {k: registry.decode(v, k) for k, v in json.loads(params_json).items()}
        return FedReconMF(**{k: registry.from_spec(k, v) if k in kinds else v
                             for k, v in params.items()}).check_params()
    except (TypeError, ValueError) as e:  # a device checks what it is asked to compute with
        raise ValueError(f"the message's FedReconMF parameters are refused: {e}") from e


def encode_upload(out: ClientOutputs) -> object:
    """The upload record; item ids travel as int32 (a catalog below 2³¹ items)."""
    fields = dict(zip(UPLOAD_FIELDS, attrgetter(*UPLOAD_FIELDS)(out)))
    if len(out.items) and int(out.items.max()) < 2**31:
        fields["items"] = out.items.astype(np.int32)
    return arrays(**fields)


def decode_upload(content, *, clients: np.ndarray, slots: np.ndarray | None,
                  weights: np.ndarray | None, n_items: int, K: int, dtype) -> ClientOutputs:
    """The ClientOutputs of one node's reply, after checking it is what the server asked for:
    the same clients in the same order, the layout the client program gives for their rating
    counts (slots and query sizes), item ids in the catalog, K columns. Non-finite deltas pass
    (the aggregator leaves such clients out and counts them, as in a simulation).

    ``slots=None, weights=None`` (a run under DP, where the server knows no rating count): the
    layout is the reply's own, checked to be FedRecon's — each client's weight is its query
    size, the number of its delta slots."""
    a = read_arrays(content, "upload", UPLOAD_FIELDS)
    got = np.asarray(a["clients"])
    if got.shape != clients.shape or not np.array_equal(got, clients):
        raise ReplyError(f"it answers for clients {got[:5].tolist()}…, not the "
                         f"{len(clients)} asked for")
    if slots is None:
        slots, weights = _reply_layout(a, len(clients))
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


def _reply_layout(a: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(slots, weights) a reply declares, when the server has no count to derive them from."""
    offsets, weights = np.asarray(a["offsets"]), np.asarray(a["weights"])
    if offsets.shape != (n + 1,) or not np.issubdtype(offsets.dtype, np.integer) or \
            (n and offsets[0] != 0):
        raise ReplyError("its offsets must be n_clients + 1 integers starting at 0")
    slots = np.diff(offsets).astype(np.int64)
    if (slots < 0).any():
        raise ReplyError("its offsets must not decrease")
    if weights.shape != (n,) or not np.array_equal(weights.astype(np.float64), slots):
        raise ReplyError("its weights are not the clients' query sizes (their slot counts)")
    return slots, slots.astype(np.float64)


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
