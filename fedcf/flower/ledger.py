"""A Flower node's device: its policy from its own node config and its ledger (what each of its
clients answered in the run) kept in the run's ``context.state`` between messages. Used by the
secure-aggregation steps (``secure``) and by federated evaluation (``node.evaluate``)."""

from __future__ import annotations

import pickle

from ..federated.round.device import Device, DevicePolicy
from .wire import flwr

DEVICE_KEY = "fedcf-device"  # the device's ledger for the run (what it answered)


def node_device(state, node_config) -> Device:
    """This node's device: its policy from its own node config (``DevicePolicy.from_config``:
    ``min-cohort``, ``min-holders``, ``threshold``, ``noise-multiplier``, ``max-clip``,
    ``max-participations``), never from a message, and its ledger kept in the run's state."""
    policy = DevicePolicy.from_config(node_config or {})
    rec = state.get(DEVICE_KEY) if state is not None else None
    if rec is None:
        return Device(policy)
    answered, participations = pickle.loads(bytes(rec["ledger"]))  # the node's own state
    return Device(policy, answered, participations)


def keep_device(state, device: Device) -> None:
    """Write the device's ledger back into the run's state."""
    state[DEVICE_KEY] = flwr().ConfigRecord({"ledger": pickle.dumps(
        (device.answered, device.participations))})
