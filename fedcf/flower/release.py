"""A restarted device's first step: end the session its killed SuperNode left open.

A SuperNode that is killed never tells the SuperLink that it left. The SuperLink keeps its node
id online until the node has missed its heartbeats (Flower: two intervals of 30 s) and refuses
to activate the same key again until then, so a device that restarts at once cannot serve for
about a minute — a round or more. The device can end that stale session itself: a
``DeactivateNode`` request for its own node id, signed with its own node key (the SuperLink
checks that the key owns the id), which is the call a SuperNode makes when it exits cleanly.
``release_node`` sends it; ``python -m fedcf.flower.release`` does the same from a supervisor's
shell before it starts the SuperNode again. It needs nothing the device does not already hold:
its key, the SuperLink's CA certificate, and its node id, which its SuperNode logged when it
last started (``node_id_from_log``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_ID_LINE = re.compile(r"SuperNode ID: (\d+)")


def node_id_from_log(path) -> int | None:
    """The node id the last ``SuperNode ID: …`` line of a SuperNode's log names, or None."""
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    found = _ID_LINE.findall(text)
    return int(found[-1]) if found else None


def _node_key(path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    try:
        key = load_ssh_private_key(Path(path).expanduser().read_bytes(), None)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the node key {str(path)!r}: {exc}; pass the file the "
                         "SuperNode's --auth-supernode-private-key names") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"the node key {str(path)!r} is not an elliptic-curve key (Flower's "
                         "node authentication uses one)")
    return key


def release_node(superlink: str, private_key, node_id: int, *, root_certificates=None,
                 insecure: bool = False) -> bool:
    """End node ``node_id``'s session on the SuperLink at ``superlink`` (host:port of its Fleet
    API), signed with the node's key (``private_key``: the path of the SuperNode's
    ``--auth-supernode-private-key`` file). True if a session was ended; False if the SuperLink
    had none open (the node was already offline). Raises PermissionError if the SuperLink
    does not accept the key for that id, and ConnectionError if it cannot be reached."""
    import httpx
    from flwr.proto.fleet_pb2 import DeactivateNodeRequest  # pylint: disable=E0611
    from flwr.supercore.error.base import ApiErrorCode, FlowerError
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 2**64:
        raise ValueError(f"node_id must be a non-negative int below 2**64 (the SuperNode ID "
                         f"its log names), got {node_id!r}")
    if insecure == (root_certificates is not None):
        raise ValueError("pass either root_certificates (the SuperLink's CA file, for TLS) or "
                         "insecure=True, not both or neither")
    key = _node_key(private_key)
    ca = None
    if not insecure:
        try:
            ca = Path(root_certificates).expanduser().read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read the SuperLink's CA certificate "
                             f"{str(root_certificates)!r}: {exc}") from exc
    auth = NodeAuthHttpInterceptor(key, key.public_key())
    try:
        with FleetHttpClient.from_server_address(
                superlink, insecure, ca,
                interceptors=[auth]) as client:
            client.DeactivateNode(DeactivateNodeRequest(node_id=node_id))
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == httpx.codes.UNAUTHORIZED:
            raise PermissionError(f"the SuperLink at {superlink} refused this key for node id "
                                  f"{node_id}: it is not the key that node registered") from exc
        error = FlowerError.from_json(exc.response.text)
        if error is not None and error.code == ApiErrorCode.FLEET_NODE_DEACTIVATION_FAILED:
            return False  # no session open for that id
        raise
    except httpx.TransportError as exc:
        raise ConnectionError(f"cannot reach the SuperLink's Fleet API at {superlink}: "
                              f"{exc}") from exc
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedcf.flower.release",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--superlink", required=True, help="host:port of the SuperLink's Fleet API")
    ap.add_argument("--auth-supernode-private-key", required=True, dest="key",
                    help="the node's key file (as given to flower-supernode)")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--node-id", type=int, help="the node id to release")
    who.add_argument("--from-log", help="a SuperNode log whose last 'SuperNode ID' line names it")
    tls = ap.add_mutually_exclusive_group(required=True)
    tls.add_argument("--root-certificates", help="the SuperLink's CA certificate (PEM)")
    tls.add_argument("--insecure", action="store_true")
    args = ap.parse_args(argv)
    node_id = args.node_id if args.from_log is None else node_id_from_log(args.from_log)
    if node_id is None:
        print(f"no 'SuperNode ID' line in {args.from_log}: nothing to release", file=sys.stderr)
        return 0
    try:
        done = release_node(args.superlink, args.key, node_id, insecure=args.insecure,
                            root_certificates=args.root_certificates)
    except (ValueError, PermissionError, ConnectionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"node {node_id}: {'session ended' if done else 'no open session'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
