"""Secure aggregation in a Flower run: the protocol of ``federated.aggregators.secagg_protocol`` over Flower
messages, its client halves on the nodes (``node_step``), its server half in the ServerApp
(``FlowerHalves``, driven by the same ``run_round`` as a simulation).

A round is five messages to each node holding sampled clients (message type
``train.secagg``, group ``round-<t>/<step>``; the hypergradient reports of learned
hyperparameters run the same five steps in a session of their own, group
``round-<t>-hyper/<step>``, whose ``begin`` carries the tangents and a report encoding):

- ``begin``: the global model, the users, the round's public ``Encoding`` and the protocol's
  session, threshold and graph. The node runs its clients, encodes and quantizes their uploads,
  makes their protocol halves (fresh identity and mask keys from the OS) and answers with their
  verifying keys and signed key adverts. The upload never leaves the node.
- ``share``: the cohort's verifying keys and adverts; the answer is the encrypted shares.
- ``mask``: each client's inbox of shares; the answer is the masked vectors y_u.
- ``consistency``: the survivor list U3; the answer is the clients' signatures on it.
- ``unmask``: U3 and the signatures; the answer is the shares that remove the masks.

Between messages the node keeps its halves (keys, seeds, received shares, the encoded rows) in
the run's ``context.state`` on the SuperNode — the device — and drops them after ``unmask``.
A node that fails or does not answer loses its clients for the rest of the round; after
masking, the survivors' shares still unmask the sum (the protocol's dropout tolerance).

What the server learns: every message it relays (keys, ciphertexts, masked vectors,
signatures, shares) and the sum. The verifying keys travel through the server, as the keys of
an honest-but-curious server's PKI; against a server that substitutes keys the devices pin
their federation's identity keys (``keys.py``: node configs ``identity-key`` and
``pinned-keys``), and every client key must carry a pinned endorsement.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np

from ..federated.aggregators.secagg_client import ClientHalves, Encoding, SecureJob
from ..federated.aggregators.secagg_masks import pack_words, unpack_words
from ..federated.aggregators.secagg_protocol import (
    SHARE_BYTES,
    Advert,
    ConsistencySignature,
    EncryptedShares,
    MaskedInput,
    ProtocolAbort,
    UnmaskShares,
)
from ..federated.round.device import Device, DeviceRefusal
from ..federated.round.phases import RoundHyperparams
from ..federated.round.reports import ReportEncoding, Reports
from .keys import ENDORSEMENT_BYTES, check_endorsements, endorse, load_identity, load_pinned
from .ledger import keep_device, node_device
from .wire import ReplyError, arrays, flwr, record_arrays

STEPS = ("begin", "share", "mask", "consistency", "unmask")
STATE_KEY = "fedcf-secagg"
# nonce 12 ‖ AES-GCM of (sender 8, receiver 8, index 2, two shares) ‖ tag 16
CT_BYTES = 12 + 18 + 2 * SHARE_BYTES + 16
WIDTH = {"keys": 32, "adverts": 128, "shares": CT_BYTES, "sigs": 64, "unmask": SHARE_BYTES,
         "endorse": ENDORSEMENT_BYTES}
INTS = {"keys": ("client",), "adverts": ("client",), "shares": ("sender", "receiver"),
        "masked": ("client",), "sigs": ("client",), "unmask": ("sender", "secret", "about",
                                                               "index"),
        "endorse": ("client",)}


class NodeProtocolError(ValueError):
    """A node cannot take the protocol step it was asked for (the reason goes back)."""


# ------------------------------------------------------------------ the tables on the wire
def pack(kind: str, rows: list, blobs) -> dict:
    """A table of protocol messages as named arrays: integer columns ``INTS[kind]`` from
    ``rows`` (tuples), and the messages' bytes (uint8 rows: for ``masked``, packed vectors)."""
    ints = np.asarray(rows, np.int64).reshape(len(rows), len(INTS[kind]))
    out = {f"{kind}.{c}": ints[:, j] for j, c in enumerate(INTS[kind])}
    if kind == "masked":
        out[f"{kind}.data"] = np.asarray(blobs, np.uint8).reshape(len(rows), -1) if rows \
            else np.zeros((0, 0), np.uint8)
    else:
        data = b"".join(bytes(b) for b in blobs)
        out[f"{kind}.data"] = np.frombuffer(data, np.uint8).reshape(len(rows), WIDTH[kind])
    return out


def unpack(kind: str, a: dict, dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(integer columns (n, c), data rows) of a table, checked: the fields, integer ids, one
    row per message, the byte width of each message (``dim`` bytes of a packed masked vector)."""
    names = [f"{kind}.{c}" for c in INTS[kind]] + [f"{kind}.data"]
    missing = [n for n in names if n not in a]
    if missing:
        raise ReplyError(f"the protocol record lacks {missing}")
    cols = [np.asarray(a[n]) for n in names[:-1]]
    data = np.asarray(a[names[-1]])
    n = len(data)
    if any(c.shape != (n,) or not np.issubdtype(c.dtype, np.integer) for c in cols):
        raise ReplyError(f"the {kind} table's id columns must be {n} integers each")
    width = dim if kind == "masked" else WIDTH[kind]
    if data.ndim != 2 or (n and data.shape[1] != width) or data.dtype != np.uint8:
        raise ReplyError(f"the {kind} table's data must be uint8 rows of {width} bytes, got "
                         f"{data.dtype} {data.shape}")
    return np.stack(cols, axis=1).astype(np.int64) if cols else np.zeros((n, 0)), data


def _registry(a) -> dict:
    ints, data = unpack("keys", a)
    return {int(c): data[k].tobytes() for k, c in enumerate(ints[:, 0])}


def _endorsements(a) -> dict:
    """Client -> its node's endorsement of its key (none when the table carries no column)."""
    if "endorse.data" not in a:
        return {}
    ints, data = unpack("endorse", a)
    return {int(c): data[k].tobytes() for k, c in enumerate(ints[:, 0])}


def _adverts(a) -> list[Advert]:
    ints, data = unpack("adverts", a)
    return [Advert(int(c), d[:32].tobytes(), d[32:64].tobytes(), d[64:].tobytes())
            for c, d in zip(ints[:, 0], data)]


def _share_rows(bundles: list[EncryptedShares]):
    rows = [(b.client, v) for b in bundles for v in b.ciphertexts]
    return rows, [b.ciphertexts[v] for b in bundles for v in b.ciphertexts]


def _bundles(a) -> list[EncryptedShares]:
    ints, data = unpack("shares", a)
    out: dict = {}
    for (u, v), ct in zip(ints, data):
        out.setdefault(int(u), {})[int(v)] = ct.tobytes()
    return [EncryptedShares(u, cts) for u, cts in out.items()]


def _inboxes(a) -> dict:
    """Receiver -> {sender: ciphertext} of a table of shares."""
    inbox: dict = {}
    for b in _bundles(a):
        for v, ct in b.ciphertexts.items():
            inbox.setdefault(v, {})[b.client] = ct
    return inbox


def _sigs(a) -> list[ConsistencySignature]:
    ints, data = unpack("sigs", a)
    return [ConsistencySignature(int(c), d.tobytes()) for c, d in zip(ints[:, 0], data)]


def _unmask_rows(answers: list[UnmaskShares]):
    rows, blobs = [], []
    for ans in answers:
        for secret, shares in ((0, ans.s_shares), (1, ans.b_shares)):
            for v, (idx, share) in shares.items():
                rows.append((ans.client, secret, v, idx))
                blobs.append(share)
    return rows, blobs


def _answers(a) -> list[UnmaskShares]:
    ints, data = unpack("unmask", a)
    if len(ints) and (not np.isin(ints[:, 1], (0, 1)).all() or ints[:, 3].min() < 1
                      or ints[:, 3].max() >= 2**16):
        raise ReplyError("unmask rows must name secret 0 (mask key) or 1 (self-mask) and a "
                         "share index in [1, 2^16)")
    out: dict = {}
    for (u, secret, v, idx), share in zip(ints, data):
        s, b = out.setdefault(int(u), ({}, {}))
        (s, b)[secret][int(v)] = (int(idx), share.tobytes())
    return [UnmaskShares(u, s, b) for u, (s, b) in out.items()]


def _masked(a, word_bytes) -> list[MaskedInput]:
    ints, data = unpack("masked", a, int(np.sum(word_bytes)))
    return [MaskedInput(int(c), unpack_words(y, word_bytes)) for c, y in zip(ints[:, 0], data)]


def _u3(config) -> list[int]:
    return [int(c) for c in config["u3"]]


# ------------------------------------------------------------------------- the node's side
def encoding_json(enc: Encoding | ReportEncoding) -> str:
    return json.dumps(dataclasses.asdict(enc))


def read_encoding(text: str, n_items: int, K: int) -> Encoding:
    """The round's Encoding from its JSON, checked against this node's catalog and model; a
    device draws its noise share from the OS, whatever the server asks."""
    try:
        enc = Encoding(**json.loads(text))
    except (TypeError, ValueError) as e:
        raise NodeProtocolError(f"the message's encoding is not an Encoding: {e}") from None
    if (enc.n_items, enc.K) != (n_items, K):
        raise NodeProtocolError(f"the encoding is for {enc.n_items} items and K={enc.K}; this "
                                f"node's catalog and model have {n_items} and K={K}")
    for name, v in (("value_bound", enc.value_bound), ("max_weight", enc.max_weight),
                    ("loss_bound", enc.loss_bound)):  # the fixed point rests on them
        if type(v) not in (int, float) or not 0 < v < np.inf:
            raise NodeProtocolError(f"the encoding's {name} must be a finite number > 0, got "
                                    f"{v!r}")
    if type(enc.m) is not int or enc.m < 1 or not 0 <= enc.noise_std < np.inf:
        raise NodeProtocolError(f"the encoding's cohort m must be a count >= 1 and its "
                                f"noise_std finite >= 0, got {enc.m!r} and {enc.noise_std!r}")
    p = enc.precision
    if p is not None and (type(p) is not int or not 1 <= p <= 30):
        raise NodeProtocolError(f"the encoding's precision must be null or bits in [1, 30], "
                                f"got {p!r}")
    if enc.noise_std > 0 and not enc.secret_noise:
        raise NodeProtocolError("the server asked for seeded noise shares; a device draws its "
                                "share of the DP noise from its own secure randomness")
    return dataclasses.replace(enc, secret_noise=True, seed=tuple(enc.seed))


def read_report_encoding(text: str, H: int) -> ReportEncoding:
    """The reporting cohort's ReportEncoding from its JSON, checked against the message's H
    tangents; a device draws its noise share from the OS, whatever the server asks."""
    try:
        enc = ReportEncoding(**json.loads(text))
        ok = enc.H == H and enc.m >= 1 and np.isfinite(enc.clip) and enc.clip > 0 and \
            (enc.max_weight is None or enc.max_weight > 0) and 0 <= enc.noise_std < np.inf
    except (TypeError, ValueError) as e:
        raise NodeProtocolError(f"the message's report encoding is not one: {e}") from None
    if not ok:
        raise NodeProtocolError(f"the report encoding {text} does not fit {H} tangents (H, "
                                "m >= 1, a finite clip > 0, max_weight > 0 or null, noise >= 0)")
    if enc.noise_std > 0 and not enc.secret_noise:
        raise NodeProtocolError("the server asked for seeded noise shares; a device draws its "
                                "share of the DP noise from its own secure randomness")
    return dataclasses.replace(enc, secret_noise=True, seed=tuple(enc.seed))


def _begin(own, config, content, session: bytes, device: Device, state=None) -> ClientHalves:
    """The asked users' protocol halves: they train (or compute their hypergradient reports)
    and begin the job the message's public fields describe — the encoding (clip, weigh, noise
    share, quantize) and the session — as any executor's clients do (``SecureJob``)."""
    from .node import (
        client_estimator,
        client_outputs,
        global_model,
        message_number,
        named,
        report_arrays,
    )
    from .rows import NodeRows

    k = int(config["neighbours"])
    t, neighbours = int(config["t"]), None if k < 0 else k
    glob = content["global"]
    est = client_estimator(config["params"])
    Q, b = global_model(own, est, glob)
    params = {"Q": Q, "b": b}
    if "report-encoding" in config:  # the hypergradient reports' own session
        clients, losses, jvp, weights = report_arrays(own, config, glob, content["tangents"],
                                                      NodeRows(content, state))
        ids = named(glob, "global", ("ids",))["ids"]  # checked by report_arrays
        enc = read_report_encoding(config["report-encoding"], jvp.shape[1])
        tangents = tuple(named(content["tangents"], "tangents")[k] for k in ("TQ", "Tb"))
        return device.begin_reports(SecureJob(enc, t, session, neighbours),
                                    Reports(clients, losses, jvp, weights), params, tangents, ids)
    job = SecureJob(read_encoding(config["encoding"], *Q.shape), t, session, neighbours)
    hp = RoundHyperparams(1.0, {}, weight_exponent=message_number(config, "weight-exponent"))
    rows = NodeRows(content, state)
    out = client_outputs(own, config, glob, rows)  # checks the message's ids too
    if rows.reply:
        raise NodeProtocolError("this model's user rows go back to the server in the clear "
                                "(FedAvg), which a masked round does not carry; train it "
                                "without secure aggregation, or use FURL")
    return device.begin_updates(job, out, hp, params, named(glob, "global", ("ids",))["ids"])


def node_step(own, content, state, node_config=None) -> dict:
    """This node's answer (named arrays) to one protocol message; ``state`` is the run's
    ``context.state``, where the clients' halves wait for the next message and the device's
    ledger stays for the run; ``node_config`` holds the device's policy."""
    config = content["config"]
    step, session = str(config.get("step")), bytes(config.get("session", b""))
    if step not in STEPS or len(session) != 16:
        raise NodeProtocolError(f"a secure-aggregation message needs step in {STEPS} and a "
                                f"16-byte session, got {step!r}")
    if step == "begin":
        state.pop(STATE_KEY, None)  # a new round: whatever was left of an old one goes
        device = node_device(state, node_config)
        halves = _begin(own, config, content, session, device, state)
        keep_device(state, device)
        adverts = halves.advertise(halves.verifying())
        reply = {**pack("keys", [(c,) for c in halves.verifying()],
                        list(halves.verifying().values())),
                 **pack("adverts", [(a.client,) for a in adverts],
                        [a.c_pk + a.s_pk + a.signature for a in adverts])}
        if (node_config or {}).get("identity-key"):  # the device vouches for its clients' keys
            me = load_identity(node_config["identity-key"])
            reply.update(pack("endorse", [(c,) for c in halves.verifying()],
                              [endorse(me, session, c, k) for c, k in halves.verifying().items()]))
        return _keep(state, session, halves, reply)
    halves = _restore(state, session)
    try:
        a = record_arrays(content["secagg"]) if "secagg" in content else {}
        if step == "share":
            if (node_config or {}).get("pinned-keys"):  # only keys its federation vouched for
                check_endorsements(_registry(a), _endorsements(a),
                                   load_pinned(node_config["pinned-keys"]), session)
            halves.trust(_registry(a))
            reply = pack("shares", *_share_rows(halves.share(_adverts(a))))
        elif step == "mask":
            got = halves.mask(_inboxes(a), [int(c) for c in config.get("dropped", [])])
            reply = pack("masked", [(m.client,) for m in got],
                         [pack_words(m.y, halves.word_bytes) for m in got])
        elif step == "consistency":
            sigs = halves.consistency(_u3(config))
            reply = pack("sigs", [(s.client,) for s in sigs], [s.signature for s in sigs])
        else:
            answers = halves.unmask(_u3(config), _sigs(a))
            state.pop(STATE_KEY, None)  # the round is over for this node: its secrets go
            return pack("unmask", *_unmask_rows(answers))
    except (ProtocolAbort, DeviceRefusal, ReplyError) as e:
        state.pop(STATE_KEY, None)
        raise NodeProtocolError(str(e)) from None
    return _keep(state, session, halves, reply)


def _keep(state, session, halves, reply) -> dict:
    state[STATE_KEY] = flwr().ConfigRecord({"session": session, "halves": pickle.dumps(halves)})
    return reply


def _restore(state, session) -> ClientHalves:
    rec = state.get(STATE_KEY)
    if rec is None or bytes(rec["session"]) != session:
        raise NodeProtocolError("this node holds no protocol state for this session (it did "
                                "not begin the round, or restarted since)")
    return pickle.loads(bytes(rec["halves"]))  # the node's own state, never a message


# ----------------------------------------------------------------------- the server's side
class FlowerHalves:
    """The client halves of a round's cohort as the server half talks to them: each protocol
    step is one message to every node still in the round; replies are checked (a node may
    speak only for its own clients, and must answer for each of them at ``begin``) and a node
    that fails or is silent drops out with its clients. ``received`` lists the records and
    fields of every reply (for the test that no upload arrives)."""

    def __init__(self, executor, cohort, params, ids, hp, job, tangents=None):
        enc, t, neighbours = job.enc, job.t, job.neighbours
        self.ex, self.session, self.words = executor, job.session, enc.word_bytes()
        self.group = f"round-{int(ids[1])}" + ("-hyper" if tangents is not None else "")
        self.asked = {n: {int(c) for c in cl} for n, cl in executor.node_clients(cohort).items()}
        self.live, self.received = set(self.asked), []
        extra = {"t": int(t), "neighbours": -1 if neighbours is None else int(neighbours),
                 **({"encoding": encoding_json(enc), "weight-exponent": float(
                     hp.weight_exponent)} if tangents is None else
                    {"report-encoding": encoding_json(enc)})}
        glob = arrays(Q=params["Q"], b=params["b"], ids=np.asarray(ids, np.uint64))
        more = {} if tangents is None else {"tangents": arrays(
            TQ=np.asarray(tangents[0], np.float64), Tb=np.asarray(tangents[1], np.float64))}
        contents = {n: {"global": glob, **more, **executor.row_record(sorted(cl)),
                        "config": {**executor.client_config(np.array(sorted(cl), np.int64)),
                                   **extra}} for n, cl in self.asked.items()}

        def read(node, a):
            reg, adv, ends = _registry(a), _adverts(a), _endorsements(a)
            if set(reg) != self.asked[node] or sorted(x.client for x in adv) != sorted(reg):
                raise ReplyError("its keys and adverts are not one per client asked")
            if not set(ends) <= set(reg):
                raise ReplyError("it endorses keys of clients it was not asked about")
            return reg, adv, ends

        self.registry, self.adverts, self.endorsements = {}, [], {}
        for reg, adv, ends in self._step("begin", contents, read):
            self.registry.update(reg)
            self.adverts += adv
            self.endorsements.update(ends)  # relayed as they came: only the devices check

    def verifying(self) -> dict:
        return dict(self.registry)

    def advertise(self, registry) -> list:
        return list(self.adverts)  # they came with the answers to ``begin``

    def share(self, adverts):
        ends = self.endorsements
        table = arrays(**pack("keys", [(c,) for c in self.registry],
                              list(self.registry.values())),
                       **pack("adverts", [(a.client,) for a in adverts],
                              [a.c_pk + a.s_pk + a.signature for a in adverts]),
                       **(pack("endorse", [(c,) for c in ends], list(ends.values()))
                          if ends else {}))
        return self._gather("share", {n: {"secagg": table} for n in self.live}, _bundles)

    def mask(self, inboxes, dropped):
        gone = [int(c) for c in dropped]
        contents = {n: {"secagg": arrays(**pack("shares", *_share_rows(
            [EncryptedShares(u, {v: ct}) for v, box in inboxes.items() if v in self.asked[n]
             for u, ct in box.items()]))), "config": {"dropped": gone}} for n in self.live}
        return self._gather("mask", contents, lambda a: _masked(a, self.words))

    def consistency(self, u3):
        return self._gather("consistency", {n: {"config": {"u3": list(u3)}}
                                            for n in self.live}, _sigs)

    def unmask(self, u3, sigs):
        table = arrays(**pack("sigs", [(s.client,) for s in sigs], [s.signature for s in sigs]))
        return self._gather("unmask", {n: {"secagg": table, "config": {"u3": list(u3)}}
                                       for n in self.live}, _answers)

    # ------------------------------------------------------------------------- helpers
    def _gather(self, step, contents, read) -> list:
        """The protocol messages of every accepted reply; each must be from the node's own
        clients."""
        def own(node, a):
            msgs = read(a)
            if not {m.client for m in msgs} <= self.asked[node]:
                raise ReplyError("it answers for clients it was not asked about")
            return msgs

        return [m for msgs in self._step(step, contents, own) for m in msgs]

    def _step(self, step, contents, read) -> list:
        """Send ``step`` to the nodes of ``contents``; the results of ``read(node, arrays)``
        for the replies it accepts. A refused or missing reply drops the node."""
        app = flwr()
        records = {n: {"config": app.ConfigRecord({"step": step, "session": self.session,
                                                   **c.get("config", {})}),
                       **{k: c[k] for k in ("global", "rows", "tangents", "secagg") if k in c}}
                   for n, c in contents.items()}
        out, answered = [], set()
        stage = f"{self.group} secagg {step}"
        for node, content in self.ex.send(records, "train.secagg", f"{self.group}/{step}",
                                          stage, {n: len(c) for n, c in self.asked.items()}):
            try:
                rec = content.array_records.get("secagg")
                if rec is None:
                    raise ReplyError("the reply has no 'secagg' record")
                a = record_arrays(rec)
                self.received.append((step, sorted(content.keys()), sorted(a)))
                out.append(read(node, a))
                answered.add(node)
            except ReplyError as e:
                self.ex.refusals.add(stage, node, str(e), len(self.asked.get(node, ())))
        self.live &= answered
        return out
