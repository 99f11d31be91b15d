"""Secure aggregation as a protocol between client halves and a server half (Bonawitz et al.
2017, "Practical Secure Aggregation for Privacy-Preserving Machine Learning", §4 and Fig. 4).

Every cryptographic step comes from a library: X25519 key agreement, HKDF-SHA256 key
derivation, AES-GCM share encryption, Ed25519 signatures and the AES-128-CTR keystream that
expands a mask seed (``cryptography``; ``secagg_masks``). Shamir secret sharing is field
arithmetic, vectorised here over GF(2³¹ − 1) (``shamir``: one NumPy pass per split, Lagrange
weights cached per holder set). Every secret (key seeds, self-mask seeds, share coefficients,
nonces) comes from the OS's secure randomness, never from ``random_state``.

A client's vector x_u (integers modulo 2³²) travels as

    y_u = x_u + PRG(b_u) + Σ_{v ∈ U2, u < v} PRG(s_uv) − Σ_{v ∈ U2, u > v} PRG(s_uv)   (mod 2³²)

with b_u a fresh self-mask seed and s_uv = HKDF(X25519(s_u, s_v^PK)) the pairwise seed. Five
message rounds per aggregation:

0. ``advertise``: two X25519 public keys (for share encryption and for masks), signed with
   the client's Ed25519 identity key (its verifying key comes from a PKI the server cannot
   forge; ``Identities``).
1. ``share_keys``: the seed of the mask key and b_u split into Shamir shares (threshold t)
   among U1 (those who advertised), each share encrypted to its holder with AES-GCM.
2. ``masked_input``: y_u, from clients who received shares (U2).
3. ``consistency``: each client signs the list U3 of clients whose y_u arrived.
4. ``unmask``: with at least t valid signatures on one U3, a client reveals, for each v in
   U2 \\ U3 (dropped), its share of v's mask-key seed, and for each v in U3 its share of b_v —
   never both for one v. The server rebuilds the dropped clients' pairwise masks and the
   survivors' self-masks from t shares each and removes them.

The server half (``SecAggServer``) sees only these messages, which it records (``transcript``)
for the leakage audit. Threat model: an honest-but-curious server, or a malicious one that
relays, drops and lies about who dropped, colluding with fewer than t − m/3 clients (the
paper's bounds hold for t > 2m/3, the default; t ≤ m/2 is refused); with a SecAgg+ ring the
bounds are ``secagg.plus_neighbours``'s; see eval/PRIVACY.md.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import time
from dataclasses import dataclass, field

import numba
import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import shamir
from .secagg_masks import add_mask, add_masks, prg, prg_scratch  # noqa: F401  (the mask PRG)

SEED_BYTES = shamir.SECRET_BYTES  # 16-byte seeds, shared; keys come from them by HKDF
SHARE_BYTES = shamir.SHARE_BYTES
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


class ProtocolAbort(RuntimeError):
    """A client or the server stops the protocol (too few clients, a bad signature, a request
    that would reveal both secrets of one client)."""


def _kdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"fedcf-secagg/" + info).derive(secret)


def self_mask_key(seed: bytes, session: bytes) -> bytes:
    """The PRG key of a client's self-mask PRG(b_u), from its seed b_u."""
    return _kdf(seed, b"self/" + session)


def _x25519_from_seed(seed: bytes, session: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(_kdf(seed, b"mask-key/" + session))


def _pub(key) -> bytes:
    return key.public_key().public_bytes(*RAW)


def _private_bytes(key) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def _ints(values) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


class Identities:
    """The PKI of a cohort: each client's Ed25519 identity key, the verifying keys public. In a
    deployment the device holds its key and a registry the server cannot write holds the
    verifying keys; in a simulation both are made here from the OS's randomness."""

    def __init__(self, clients):
        self._keys = {int(c): Ed25519PrivateKey.generate() for c in clients}
        self.verifying = {c: k.public_key() for c, k in self._keys.items()}

    def signing_key(self, client: int) -> Ed25519PrivateKey:
        return self._keys[int(client)]

    def __getstate__(self):  # kept by the device between messages (Flower's context.state)
        return {c: _private_bytes(k) for c, k in self._keys.items()}

    def __setstate__(self, state):
        self._keys = {c: Ed25519PrivateKey.from_private_bytes(b) for c, b in state.items()}
        self.verifying = {c: k.public_key() for c, k in self._keys.items()}

    def public_bytes(self) -> dict:
        """The verifying keys as raw bytes (what a PKI publishes)."""
        return {c: k.public_bytes(*RAW) for c, k in self.verifying.items()}

    @staticmethod
    def verifiers(registry: dict) -> dict:
        """Verifying keys from a registry of raw public keys."""
        return {int(c): Ed25519PublicKey.from_public_bytes(b) for c, b in registry.items()}


@dataclass(frozen=True)
class Advert:
    client: int
    c_pk: bytes  # X25519 key for share encryption
    s_pk: bytes  # X25519 key for pairwise masks
    signature: bytes


@dataclass(frozen=True)
class EncryptedShares:
    client: int
    ciphertexts: dict  # receiver -> nonce ‖ AES-GCM(sender, receiver, s-share, b-share)


@dataclass(frozen=True)
class MaskedInput:
    client: int
    y: np.ndarray  # uint32


@dataclass(frozen=True)
class ConsistencySignature:
    client: int
    signature: bytes


@dataclass(frozen=True)
class UnmaskShares:
    client: int
    s_shares: dict  # dropped v -> (index, share of v's mask-key seed)
    b_shares: dict  # surviving v -> (index, share of v's self-mask seed)


def run_round(clients, server: SecAggServer, dropped, *, min_survivors: int = 0,
              clock: dict | None = None):
    """The five message rounds between client halves (``ClientHalves``, or shards holding
    them) and the server half: returns (the survivors' sum mod 2³², U3). ``dropped(U2)``
    names the clients that vanish after sharing their keys; fewer than ``min_survivors``
    masked inputs end the round (ProtocolAbort)."""
    def timed(side, work):
        t0 = time.perf_counter()
        out = work()
        if clock is not None:
            clock[side] = clock.get(side, 0.0) + time.perf_counter() - t0
        return out

    own = timed("clients", lambda: clients.advertise(clients.verifying()))
    adverts = timed("server", lambda: server.collect_adverts(own))
    bundles = timed("clients", lambda: clients.share(adverts))
    inbox = timed("server", lambda: server.route_shares(bundles))
    inputs = timed("clients", lambda: clients.mask(inbox, dropped(server.u2)))
    u3 = timed("server", lambda: server.collect_inputs(inputs))
    if len(u3) < min_survivors:
        raise ProtocolAbort(f"{len(u3)} clients sent masked inputs, fewer than "
                            f"min_cohort={min_survivors}: the round is not aggregated")
    answers = timed("clients", lambda: clients.unmask(u3, clients.consistency(u3)))
    total = timed("server", lambda: server.unmasked_sum(answers))
    return total, u3


def share_graph(adverts: dict, session: bytes, neighbours: int | None, only=None) -> dict:
    """Each advertised client's share holders: itself and its neighbours (``only``: just that
    client's). ``neighbours`` None (or at least |U1| − 1): everyone (Bonawitz et al.). Else
    SecAgg+ (Bell et al. 2020): the clients on a ring ordered by a hash of the session and the
    whole roster of advertised keys — fixed by what every client saw — each with ⌈k/2⌉
    neighbours on either side. Symmetric: v holds u's shares iff u holds v's. Because every
    position depends on the whole roster, a server that leaves adverts out (or shows a client
    another roster) draws a fresh random ring; it cannot move a client's neighbours one at a
    time (``secagg.plus_neighbours`` states what a try can win)."""
    ids = sorted(adverts)
    who = ids if only is None else [only]
    if neighbours is None or neighbours >= len(ids) - 1:
        return {u: ids for u in who}
    ring, pos = _ring(session, tuple((c, adverts[c].s_pk, adverts[c].c_pk) for c in ids))
    half, n = (neighbours + 1) // 2, len(ring)
    return {u: sorted({ring[(pos[u] + d) % n] for d in range(-half, half + 1)}) for u in who}


@functools.lru_cache(maxsize=4)
def _ring(session: bytes, keys: tuple):
    """(the SecAgg+ ring of the advertised clients, each one's position): computed once for
    the clients of one device that saw the same adverts. A client's position is a hash of its
    id under a digest of the session and every advert (id and both keys)."""
    roster = hashlib.sha256(session)
    for c, s_pk, c_pk in keys:
        roster.update(_ints([c]) + s_pk + c_pk)
    digest = roster.digest()
    ring = sorted((c for c, _, _ in keys), key={c: hashlib.sha256(
        digest + _ints([c])).digest() for c, _, _ in keys}.__getitem__)
    return ring, {c: i for i, c in enumerate(ring)}


class SecAggClient:
    """One client's half: its keys, seeds and received shares stay in this object (in the
    process where the client runs). ``session`` binds every derived key and signature to one
    aggregation. ``policy`` (a ``DevicePolicy``, the device's own) adds its rules on the cohort,
    the share holders, t and the survivors to the protocol's."""

    def __init__(self, client: int, threshold: int, session: bytes, signing_key, verifying,
                 neighbours: int | None = None, policy=None, verified: dict | None = None):
        self.id, self.t, self.session = int(client), int(threshold), session
        self.neighbours, self.policy = neighbours, policy
        self._sign, self._verifying = signing_key, verifying
        self._c = X25519PrivateKey.generate()
        self._s_seed, self._b_seed = os.urandom(SEED_BYTES), os.urandom(SEED_BYTES)
        self._s = _x25519_from_seed(self._s_seed, session)
        self._adverts, self._held, self._u2, self._answered = {}, {}, None, False
        self._holders: list = []  # who holds this client's shares (set by ``share``)
        self._share_keys: dict = {}  # peer -> AES key of the shares (derived state, not kept)
        # signatures this device checked already, shared by the clients it runs: (client,
        # signature, message) -> the verifying key it held under (``_verify``)
        self._verified = {} if verified is None else verified

    def trust(self, verifying: dict) -> None:
        """Add verifying keys of other clients (never replace this client's own)."""
        self._verifying = {**verifying, **{k: v for k, v in self._verifying.items()
                                           if k == self.id}}

    def __getstate__(self):  # raw key bytes: kept by the device between messages
        return {"id": self.id, "t": self.t, "session": self.session,
                "neighbours": self.neighbours, "policy": self.policy, "seeds": (self._s_seed, self._b_seed),
                "sign": _private_bytes(self._sign), "c": _private_bytes(self._c),
                "verifying": {c: k.public_bytes(*RAW) for c, k in self._verifying.items()},
                "received": (self._adverts, self._held, self._u2, self._answered,
                             self._holders)}

    def __setstate__(self, state):
        self.id, self.t, self.session = state["id"], state["t"], state["session"]
        self.neighbours, self.policy = state["neighbours"], state["policy"]
        self._s_seed, self._b_seed = state["seeds"]
        self._sign = Ed25519PrivateKey.from_private_bytes(state["sign"])
        self._c = X25519PrivateKey.from_private_bytes(state["c"])
        self._verifying = Identities.verifiers(state["verifying"])
        self._adverts, self._held, self._u2, self._answered, self._holders = state["received"]
        self._s = _x25519_from_seed(self._s_seed, self.session)
        self._share_keys, self._verified = {}, {}

    def advertise(self) -> Advert:
        c_pk, s_pk = _pub(self._c), _pub(self._s)
        return Advert(self.id, c_pk, s_pk, self._sign.sign(self.session + c_pk + s_pk))

    def share_keys(self, adverts: list[Advert]) -> EncryptedShares:
        """Round 1: check every advertised key (the roster sizes the cohort its policy checks:
        an advert the PKI does not sign could pad it), split both seeds among its share
        holders and encrypt."""
        for a in adverts:
            self._verify(a.client, a.signature, self.session + a.c_pk + a.s_pk, "advert")
        self._adverts, self._share_keys = {a.client: a for a in adverts}, {}
        if self.id not in self._adverts:
            raise ProtocolAbort(f"client {self.id}: its own keys are not in the advert list")
        holders = share_graph(self._adverts, self.session, self.neighbours, self.id)[self.id]
        if self.policy is not None:
            self.policy.check_sharing(self.id, len(self._adverts), len(holders), self.t)
        if 2 * self.t <= len(holders):  # t ≤ h/2: two disjoint groups of holders could
            # rebuild both seeds of this client, one group each, and unmask its input
            raise ProtocolAbort(f"client {self.id}: threshold t={self.t} is not above half "
                                f"of its {len(holders)} share holders; it will not share")
        if len(holders) < self.t:
            raise ProtocolAbort(f"client {self.id}: {len(holders)} clients to share with, fewer "
                                f"than the threshold t={self.t}")
        self._holders = holders
        shares = shamir.split([self._s_seed, self._b_seed], self.t, len(holders))
        out = {}
        for pos, v in enumerate(holders):  # holder pos gets the shares at x = pos + 1
            plain = _ints([self.id, v]) + struct.pack("<H", pos + 1) + b"".join(shares[pos])
            nonce = os.urandom(12)
            out[v] = nonce + AESGCM(self._share_key(v)).encrypt(nonce, plain, self.session)
        return EncryptedShares(self.id, out)

    def masked_input(self, x: np.ndarray, received: dict) -> MaskedInput:
        """Round 2: keep the shares addressed to this client (senders = U2) and send y_u."""
        if len(received) < self.t:
            raise ProtocolAbort(f"client {self.id}: shares from {len(received)} clients, fewer "
                                f"than t={self.t}")
        for v, ct in received.items():
            if v not in self._holders:
                raise ProtocolAbort(f"client {self.id}: a share from {v}, which does not hold "
                                    "its shares")
            try:
                plain = AESGCM(self._share_key(v)).decrypt(ct[:12], ct[12:], self.session)
            except InvalidTag:
                raise ProtocolAbort(f"client {self.id}: the share from {v} does not decrypt"
                                    ) from None
            if plain[:16] != _ints([v, self.id]):
                raise ProtocolAbort(f"client {self.id}: a share relabelled by the server")
            idx = struct.unpack("<H", plain[16:18])[0]
            if len(plain) != 18 + 2 * SHARE_BYTES:
                raise ProtocolAbort(f"client {self.id}: the share from {v} has the wrong size")
            self._held[v] = (idx, plain[18:18 + SHARE_BYTES], plain[18 + SHARE_BYTES:])
        self._u2 = sorted(received)
        y, scratch = np.array(x, np.uint32), prg_scratch(len(x))
        add_mask(y, self_mask_key(self._b_seed, self.session), +1, scratch)
        for v in self._u2:
            if v != self.id:
                add_mask(y, self._pair_key(v), +1 if self.id < v else -1, scratch)
        return MaskedInput(self.id, y)

    def consistency(self, u3: list[int]) -> ConsistencySignature:
        """Round 3: sign the survivor list the server announced."""
        self._check_u3(u3)
        return ConsistencySignature(self.id, self._sign.sign(self.session + _ints(sorted(u3))))

    def unmask(self, u3: list[int], signatures: list[ConsistencySignature]) -> UnmaskShares:
        """Round 4: with t valid signatures on ``u3``, reveal s-shares of U2 \\ U3 and b-shares
        of U3 — once per aggregation, so the server never holds both secrets of one client."""
        self._check_u3(u3)
        if self.policy is not None:
            self.policy.check_survivors(self.id, len(u3))
        if self._answered:
            raise ProtocolAbort(f"client {self.id}: already answered the unmasking round")
        msg = self.session + _ints(sorted(u3))
        good, holders = set(), set(self._holders)
        for sig in (s for s in signatures if s.client in holders):  # only holders' count
            self._verify(sig.client, sig.signature, msg, "consistency signature")
            good.add(sig.client)
        if len(good & set(u3)) < self.t:
            raise ProtocolAbort(f"client {self.id}: {len(good & set(u3))} signatures on the "
                                f"survivor list, fewer than t={self.t}")
        self._answered = True
        dropped = sorted(set(self._u2) - set(u3))
        return UnmaskShares(self.id, {v: self._held[v][:2] for v in dropped},
                            {v: (self._held[v][0], self._held[v][2])
                             for v in sorted(set(u3) & set(self._held))})

    # -------------------------------------------------------------- helpers
    def _check_u3(self, u3):
        if self._u2 is None:
            raise ProtocolAbort(f"client {self.id}: asked about survivors before round 2")
        if not set(u3) <= set(self._adverts) or len(set(u3) & set(self._u2)) < self.t or \
                len(set(u3)) != len(u3) or (self.neighbours is None and
                                            not set(u3) <= set(self._u2)):
            raise ProtocolAbort(f"client {self.id}: the survivor list is not distinct clients "
                                f"with {self.t} or more that shared keys with it")

    def _verify(self, client, signature, message, what):
        """Check a signature against the client's verifying key, once per device: the cache
        maps (client, signature, message) to the key object it verified under, and a hit needs
        that very object (another key for the client, say after ``trust``, checks again)."""
        key = self._verifying.get(int(client))
        seen = (int(client), bytes(signature), bytes(message))
        if key is not None and self._verified.get(seen) is key:
            return
        try:
            if key is None:
                raise InvalidSignature
            key.verify(signature, message)
            self._verified[seen] = key
        except InvalidSignature:
            raise ProtocolAbort(f"client {self.id}: the {what} of client {client} does not "
                                "verify against its identity key") from None

    def _share_key(self, v: int) -> bytes:
        """The AES key shared with v (one key agreement per peer: it encrypts the shares to v
        and decrypts v's)."""
        if v not in self._share_keys:
            peer = X25519PublicKey.from_public_bytes(self._adverts[v].c_pk)
            lo, hi = sorted((self.id, v))
            self._share_keys[v] = _kdf(self._c.exchange(peer),
                                       b"share/" + _ints([lo, hi]) + self.session)
        return self._share_keys[v]

    def _pair_key(self, v: int) -> bytes:
        return pair_key(self._s, self._adverts[v].s_pk, self.id, v, self.session)


def pair_key(private: X25519PrivateKey, peer_pk: bytes, u: int, v: int, session: bytes) -> bytes:
    """The 32-byte PRG key of the pairwise mask of u and v (either end computes it)."""
    lo, hi = sorted((int(u), int(v)))
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return _kdf(shared, b"pair/" + _ints([lo, hi]) + session)


def message_bytes(msg, word_bytes=None) -> int:
    """Size of one protocol message on the wire (its payload; ids as 8 bytes; a masked vector
    packed to ``word_bytes`` per word, None: 4)."""
    if isinstance(msg, Advert):
        return 8 + len(msg.c_pk) + len(msg.s_pk) + len(msg.signature)
    if isinstance(msg, EncryptedShares):
        return 8 + sum(8 + len(c) for c in msg.ciphertexts.values())
    if isinstance(msg, MaskedInput):
        return 8 + (msg.y.nbytes if word_bytes is None else int(np.sum(word_bytes)))
    if isinstance(msg, ConsistencySignature):
        return 8 + len(msg.signature)
    return 8 + sum(8 + 2 + len(s) for d in (msg.s_shares, msg.b_shares) for _, s in d.values())


@dataclass
class SecAggServer:
    """The server half: relays messages, learns U1 ⊇ U2 ⊇ U3, and from t unmasking answers
    the sum of the survivors' vectors modulo 2³². ``transcript`` is everything it received."""

    threshold: int
    dim: int
    session: bytes
    neighbours: int | None = None
    word_bytes: np.ndarray | None = None  # bytes of each word on the wire (None: 4)
    transcript: list = field(default_factory=list)

    def collect_adverts(self, adverts: list[Advert]) -> list[Advert]:
        self.transcript += adverts
        self.adverts = {a.client: a for a in adverts}
        self._need(len(adverts), "advertised keys")
        self.graph = share_graph(self.adverts, self.session, self.neighbours)
        return adverts

    def route_shares(self, bundles: list[EncryptedShares]) -> dict:
        """Each U2 client's inbox: the ciphertexts addressed to it."""
        self.transcript += bundles
        self.u2 = sorted(b.client for b in bundles)
        self._need(len(self.u2), "shared their keys")
        inbox: dict = {v: {} for v in self.u2}
        for b in bundles:  # one pass over the ciphertexts: O(m·k), not O(m²)
            for v, ct in b.ciphertexts.items():
                if v in inbox:
                    inbox[v][b.client] = ct
        return inbox

    def collect_inputs(self, inputs: list[MaskedInput]) -> list[int]:
        self.transcript += inputs
        self.inputs = {i.client: np.asarray(i.y, np.uint32) for i in inputs}
        bad = [c for c, y in self.inputs.items() if y.shape != (self.dim,)]
        if bad:
            raise ProtocolAbort(f"client {bad[0]} sent a vector of the wrong length")
        self.u3 = sorted(set(self.inputs) & set(self.u2))
        self._need(len(self.u3), "sent masked inputs")
        return self.u3

    def unmasked_sum(self, answers: list[UnmaskShares]) -> np.ndarray:
        """Σ_{u ∈ U3} x_u mod 2³² from the masked inputs and the unmasking answers."""
        self.transcript += answers
        self._need(len(answers), "answered the unmasking round")
        total = np.zeros(self.dim, np.uint32)
        for u in self.u3:
            total += self.inputs[u]
        dropped = sorted(set(self.u2) - set(self.u3))
        b_shares, s_shares = {u: [] for u in self.u3}, {v: [] for v in dropped}
        for a in answers:  # each client's shares, in the answers' order
            for got, held in ((b_shares, a.b_shares), (s_shares, a.s_shares)):
                for c, share in held.items():
                    if c in got:
                        got[c].append(share)
        seeds = self._combine([(u, "self", b_shares[u]) for u in self.u3] +
                              [(v, "key", s_shares[v]) for v in dropped])
        masks = [(self_mask_key(b, self.session), -1) for b in seeds[:len(self.u3)]]
        for v, seed in zip(dropped, seeds[len(self.u3):]):  # the dropped clients' pair masks
            key = _x25519_from_seed(seed, self.session)
            for u in sorted(set(self.u3) & set(self.graph[v])):  # u masked with v
                masks.append((pair_key(key, self.adverts[u].s_pk, v, u, self.session),
                               -1 if u < v else +1))  # u added +mask iff u < v
        add_masks(total, masks, numba.get_num_threads())
        return total

    def bytes_received(self) -> int:
        """Bytes of every message the server received (ids as 8 bytes, shares with index)."""
        return sum(message_bytes(msg, self.word_bytes) for msg in self.transcript)

    def _combine(self, wanted) -> list[bytes]:
        """The seeds of ``wanted`` [(client, "self" or "key", its shares)], rebuilt together
        from t shares each (``shamir.combine_many``)."""
        for client, what, shares in wanted:
            if len(shares) < self.threshold:
                raise ProtocolAbort(f"only {len(shares)} shares of client {client}'s {what} "
                                    f"seed, fewer than t={self.threshold}")
        try:
            return shamir.combine_many([[(int(i), bytes(s)) for i, s in shares[:self.threshold]]
                                        for _, _, shares in wanted])
        except shamir.ShareError as e:
            client, what, _ = wanted[e.group]
            raise ProtocolAbort(f"the shares of client {client}'s {what} seed: {e}") from None

    def _need(self, n: int, what: str):
        if n < self.threshold:
            raise ProtocolAbort(f"{n} clients {what}, fewer than the threshold "
                                f"t={self.threshold}: the round is not aggregated")
