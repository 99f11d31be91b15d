"""Pinned device keys for secure aggregation over Flower: each node holds a long-term Ed25519
identity key of its own (node config ``identity-key``, a file only the node reads), and every
node holds the same list of the federation's identity public keys (node config
``pinned-keys``), handed out by whoever runs the devices, never by the server.

In a round's ``begin`` a node endorses each of its clients' fresh verifying keys with its
identity key (the session, the client id and the key, signed). In ``share`` a node that pins
keys accepts the cohort's key registry only when every client's key carries an endorsement by
a pinned identity: a server that substitutes a client's key (to sit in the middle of its key
agreement and read its masks) or invents clients of its own is refused by every pinned
device, and the round is lost instead of read. Without ``pinned-keys`` the registry is taken
as the server relays it (the honest-but-curious model). The pins stop a server alone, not one
that colludes with a pinned node: an endorsement binds a key to a client id and a session, but
which node holds which client is the server's word, so a pinned node can endorse a key of the
server's making for another node's client.

``make_identity(path)`` writes a new identity key and returns its public key (hex, one line of
a ``pinned-keys`` file).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..federated.round.device import refuse

ENDORSE = b"fedcf-endorse-v1"
ENDORSEMENT_BYTES = 32 + 64  # the node's identity public key ‖ its signature


def make_identity(path) -> str:
    """Write a new Ed25519 identity key (32 raw bytes, owner-only) to ``path``, which must not
    exist yet; return its public key as hex (a line of the ``pinned-keys`` file)."""
    p = Path(path)
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes_raw()
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ValueError(f"identity key {str(p)!r} exists already; a node keeps its identity "
                         "(remove the file first to make a new one)") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
    except BaseException:  # an interrupted write leaves no half key behind
        p.unlink(missing_ok=True)
        raise
    return key.public_key().public_bytes_raw().hex()


def load_identity(path) -> Ed25519PrivateKey:
    """The node's identity key from its ``identity-key`` file (32 raw bytes)."""
    try:
        raw = Path(str(path)).read_bytes()
    except OSError as e:
        raise ValueError(f"this node's identity-key {str(path)!r} cannot be read ({e})") from None
    if len(raw) != 32:
        raise ValueError(f"identity-key {str(path)!r} holds {len(raw)} bytes, not an Ed25519 "
                         "key's 32 (make one with fedcf.flower.keys.make_identity)")
    return Ed25519PrivateKey.from_private_bytes(raw)


def load_pinned(path) -> frozenset:
    """The pinned identity public keys: one hex key per line of the ``pinned-keys`` file
    ('#' starts a comment)."""
    try:
        text = Path(str(path)).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"this node's pinned-keys {str(path)!r} cannot be read ({e})") from None
    keys = set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            key = bytes.fromhex(line)
            Ed25519PublicKey.from_public_bytes(key)
        except ValueError:
            raise ValueError(f"pinned-keys {str(path)!r} line {n}: {line[:20]!r} is not a hex "
                             "Ed25519 public key") from None
        keys.add(key)
    if not keys:
        raise ValueError(f"pinned-keys {str(path)!r} lists no key")
    return frozenset(keys)


def _message(session: bytes, client: int, key: bytes) -> bytes:
    return ENDORSE + bytes(session) + struct.pack("<q", int(client)) + bytes(key)


def endorse(identity: Ed25519PrivateKey, session: bytes, client: int, key: bytes) -> bytes:
    """The node's endorsement of one client's verifying key for one session."""
    return identity.public_key().public_bytes_raw() + identity.sign(_message(session, client,
                                                                             key))


def check_endorsements(registry: dict, endorsements: dict, pinned: frozenset,
                       session: bytes) -> None:
    """Refuse (``DeviceRefusal``, rule ``pinned_keys``) a key registry in which some client's
    key is not endorsed, for this session, by a pinned identity."""
    for client, key in sorted(registry.items()):
        e = endorsements.get(client)
        if e is None or len(e) != ENDORSEMENT_BYTES or bytes(e[:32]) not in pinned:
            refuse("pinned_keys", f"client {client}'s key carries no endorsement by a pinned "
                                  "device key: the server may have substituted it")
        try:
            Ed25519PublicKey.from_public_bytes(bytes(e[:32])).verify(
                bytes(e[32:]), _message(session, client, key))
        except InvalidSignature:
            refuse("pinned_keys", f"client {client}'s key endorsement does not verify for this "
                                  "session and key: the server may have substituted it")
