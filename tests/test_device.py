"""The device defends itself: a server that deviates from the protocol (its own server half,
driving the clients' halves directly) against the device's policy and ledger (``Device``,
``DevicePolicy``). Each attack's success criterion is what the server wanted: a sum it can
unmask of too few clients, a second answer to a round, or a noise share below the device's
σ. Each must fail, and the device must say why in its own log."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from fedcf.federated import Device, DevicePolicy, DeviceRefusal
from fedcf.federated.aggregators.secagg_client import ClientHalves, Encoding, SecureJob
from fedcf.federated.aggregators.secagg_protocol import (
    ProtocolAbort,
    SecAggClient,
    SecAggServer,
    pair_key,
    run_round,
    self_mask_key,
)

N_ITEMS, K = 20, 2


def _job(t, m=12, **enc):
    return SecureJob(Encoding(N_ITEMS, K, m, 1.0, 10.0, **enc), t, os.urandom(16))


def _rows(m, width=8, seed=0):
    return np.random.default_rng(seed).integers(0, 1000, (m, width)).astype(np.uint32)


def _attack(halves, t, width=8):
    """A deviating server's round against ``halves``: returns the unmasked sum, or None when
    the clients left it nothing to unmask."""
    server = SecAggServer(t, width, halves.session)
    try:
        total, _ = run_round(halves, server, lambda u2: [])
    except ProtocolAbort:
        return None
    return total


def _begin(device, job, clients, rows, round_idx=0, digest=b"model"):
    return device.begin(job, "update", round_idx, digest, np.asarray(clients), rows)


def test_an_honest_round_on_default_devices_sums_exactly():
    rows = _rows(12)
    halves = _begin(Device(), _job(9), range(12), rows)
    total = _attack(halves, 9)
    np.testing.assert_array_equal(total, rows.sum(axis=0, dtype=np.uint32))


@pytest.mark.parametrize("m, t, rule", [
    (1, 1, "min_cohort"),  # a cohort of one: its "sum" would be its upload
    (9, 7, "min_cohort"),  # below the device's ten
    (12, 7, "threshold"),  # t = 7 of 12 holders: below ⌈2·12/3⌉ = 8
])
def test_a_cohort_or_threshold_the_device_refuses_unmasks_nothing(m, t, rule, caplog):
    rows = _rows(m)
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        total = _attack(_begin(Device(), _job(t, m), range(m), rows), t)
    assert total is None
    assert f"device refused ({rule})" in caplog.text


def test_secagg_plus_needs_enough_holders_and_a_two_thirds_threshold(caplog):
    rows = _rows(12)
    job = SecureJob(Encoding(N_ITEMS, K, 12, 1.0, 10.0), 3, os.urandom(16), neighbours=4)
    halves = _begin(Device(), job, range(12), rows)  # h = 5, t = 3 < ⌈10/3⌉ = 4
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        assert _attack(halves, 3) is None
    assert "device refused (threshold)" in caplog.text
    job = SecureJob(Encoding(N_ITEMS, K, 12, 1.0, 10.0), 4, os.urandom(16), neighbours=4)
    server = SecAggServer(4, 8, job.session, 4)
    total, _ = run_round(_begin(Device(), job, range(12), rows), server, lambda u2: [])
    np.testing.assert_array_equal(total, rows.sum(axis=0, dtype=np.uint32))


def test_a_repeated_round_and_a_difference_pair_get_no_second_answer(caplog):
    """S then S − {v} on one model would give v's upload as the difference of the sums: the
    clients of the second job answered this model (and this round) already."""
    device, rows = Device(), _rows(12)
    first = _attack(_begin(device, _job(9), range(12), rows), 9)
    assert first is not None
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        again = _begin(device, _job(8, 11), range(11), rows[:11], round_idx=0)
        relabelled = _begin(device, _job(8, 11), range(11), rows[:11], round_idx=1)
    assert again.ids == [] and relabelled.ids == []
    assert _attack(relabelled, 8) is None
    assert "device refused (one_answer)" in caplog.text
    # a refused job left no mark: the next model in round 1 is answered
    assert len(_begin(device, _job(9), range(12), rows, 1, b"next model").ids) == 12


def test_a_participation_budget_sits_clients_out():
    device = Device(DevicePolicy(max_participations=2))
    for r in range(2):
        assert len(_begin(device, _job(9), range(12), _rows(12), r, bytes([r])).ids) == 12
    assert _begin(device, _job(9), range(12), _rows(12), 2, b"x").ids == []


@pytest.mark.parametrize("enc, rule", [
    (dict(clip=1.0, noise_std=0.0), "noise_multiplier"),  # no noise at all
    (dict(clip=1.0, noise_std=0.1), "noise_multiplier"),  # below σC/√t = 1/3
    (dict(clip=1e9, noise_std=1e9), "max_clip"),  # a clip that bounds nothing
    (dict(clip=1.0, noise_std=1.0, secret_noise=False), "noise_multiplier"),  # seeded
    (dict(), "noise_multiplier"),  # no DP at all
])
def test_a_dp_device_refuses_the_noise_and_clip_a_server_asks_for(enc, rule, caplog):
    device = Device(DevicePolicy(noise_multiplier=1.0, max_clip=10.0))
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        halves = _begin(device, _job(9, **enc), range(12), _rows(12))
    assert halves.ids == [] and f"device refused ({rule})" in caplog.text
    ok = _begin(Device(device.policy), _job(9, clip=1.0, noise_std=1 / 3), range(12), _rows(12))
    assert len(ok.ids) == 12


def test_a_survivor_list_below_the_device_minimum_is_not_unmasked(caplog):
    """The server collects 12 masked inputs, then claims only 9 survived — enough for t = 8,
    fewer than the device's ten: no client answers the unmasking round."""
    rows = _rows(12)
    halves = _begin(Device(), _job(8), range(12), rows)
    server = SecAggServer(8, 8, halves.session)
    adverts = server.collect_adverts(halves.advertise(halves.verifying()))
    inbox = server.route_shares(halves.share(adverts))
    server.collect_inputs(halves.mask(inbox, []))
    u3 = list(range(9))
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        answers = halves.unmask(u3, halves.consistency(u3))
    assert answers == [] and "device refused (min_cohort)" in caplog.text


def _two_clients(t=2):
    session = os.urandom(16)
    halves = ClientHalves([0, 1, 2], _rows(3), t, session)
    adverts = halves.advertise(halves.verifying())
    return halves, adverts, session


def test_a_forged_consistency_signature_is_refused():
    halves, adverts, _ = _two_clients()
    inbox = SecAggServer(2, 8, halves.session).route_shares(halves.share(adverts))
    halves.mask(inbox, [])
    sigs = halves.consistency([0, 1, 2])
    forged = [type(s)(s.client, bytes(64)) for s in sigs]
    with pytest.raises(ProtocolAbort, match="does not verify"):
        halves.unmask([0, 1, 2], forged)


def test_a_share_reflected_to_its_sender_is_refused():
    halves, adverts, _ = _two_clients()
    bundles = halves.share(adverts)
    inbox = SecAggServer(2, 8, halves.session).route_shares(bundles)
    own = {b.client: b.ciphertexts for b in bundles}
    inbox[0][1] = own[0][1]  # client 0's share for 1, sent back to 0 as if from 1
    with pytest.raises(ProtocolAbort, match="relabelled"):
        halves.mask(inbox, [])


def test_the_masks_depend_on_the_clients_secrets():
    """The self-mask key depends on b_u and the pair key on the X25519 secret: a client with
    the same inputs and another b_u, or another mask key, sends another vector (a server that
    knows only the transcript cannot rebuild either)."""
    halves, adverts, session = _two_clients()
    inbox = SecAggServer(2, 8, session).route_shares(halves.share(adverts))
    c = halves.halves[0]
    y = c.masked_input(np.zeros(8, np.uint32), inbox[0]).y
    state = c.__getstate__()
    for change in ("b", "s"):
        other = SecAggClient.__new__(SecAggClient)
        s_seed, b_seed = state["seeds"]
        seeds = (s_seed, os.urandom(16)) if change == "b" else (os.urandom(16), b_seed)
        other.__setstate__({**state, "seeds": seeds,
                            "received": ({}, {}, None, False, c._holders)})
        other._adverts = c._adverts
        assert not np.array_equal(other.masked_input(np.zeros(8, np.uint32), inbox[0]).y, y)
    assert self_mask_key(b"a" * 16, session) != self_mask_key(b"b" * 16, session)


def test_a_refusal_is_a_device_refusal_named_by_its_rule():
    with pytest.raises(DeviceRefusal, match="min_cohort"):
        DevicePolicy().check_sharing(0, 3, 3, 3)
    with pytest.raises(ValueError, match="threshold must be a share"):
        DevicePolicy(threshold=0.4)
    with pytest.raises(ValueError, match="min_cohort must be an integer >= 2"):
        DevicePolicy(min_cohort=1)
    with pytest.raises(ValueError, match="node config's device policy: .*max_clip"):
        DevicePolicy.from_config({"max-clip": -1.0})
    assert pair_key  # the pair key is exercised through masked_input above


def test_a_dp_device_refuses_an_adaptive_clip_count_without_its_noise(caplog):
    """Adaptive clipping's count and the update are one Gaussian mechanism: a job whose
    count carries no device noise (the server would see the clients' bits in the clear) is
    refused; with shares that give σ together, it is answered."""
    policy = DevicePolicy(noise_multiplier=1.0)
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        bare = _begin(Device(policy), _job(9, clip=1.0, noise_std=1.0, adaptive=True),
                      range(12), _rows(12))
    assert bare.ids == [] and "clip-count noise" in caplog.text
    ok = _job(9, clip=1.0, noise_std=2 / 3, adaptive=True, count_noise_std=1.0)
    assert len(_begin(Device(policy), ok, range(12), _rows(12)).ids) == 12


def test_a_device_budget_caps_participations_at_its_epsilon_against_the_server():
    """``device_budget``: the most rounds k whose ε at q = 1 stays within the budget — k
    rounds fit, k + 1 do not — and the device then lets each client take part k times."""
    pytest.importorskip("dp_accounting")
    from fedcf.federated import device_budget
    from fedcf.federated.aggregators.accounting import RdpAccountant

    def eps(k):
        acc = RdpAccountant(1e-6)
        acc.compose(1.0, 1.5, k)
        return acc.epsilon()

    policy = device_budget(6.0, 1e-6, 1.5, min_cohort=12)
    k = policy.max_participations
    assert eps(k) <= 6.0 < eps(k + 1) and policy.min_cohort == 12
    assert policy.noise_multiplier == 1.5
    device = Device(policy)
    taken = [bool(device.admit("update", r, bytes([r]), [7])[0]) for r in range(k + 2)]
    assert device.participations[7] == k and sum(taken) == k
    with pytest.raises(ValueError, match="one round at noise multiplier 0.1 already spends"):
        device_budget(0.5, 1e-6, 0.1)


def test_the_device_cost_script_measures_its_checks_and_the_report_reads_it(tmp_path):
    import json

    from conftest import load_script

    out = tmp_path / "device_cost.json"
    rows, books = load_script("device_cost").main(["--quick", "--json", str(out)])
    assert rows[0]["device_seconds_per_round"] > 0 and 0 < rows[0]["share"] < 1
    assert books[0]["bytes"] > 0 and books[0]["seconds_per_message"] > 0
    load_script("report")  # puts scripts/ on the path of its sections
    import report_privacy

    report = report_privacy.device_cost_values(json.loads(out.read_text()))
    assert "device's checks" in report["device_cost"] and "ledger, KiB" in report["device_cost"]
