"""Secure aggregation: the protocol's halves (exact sums with dropouts, secrets from the OS, a
server that lies about who dropped, forged keys), the aggregator around it (weights, clipping
counted, rounds not aggregated), and fits under it with and without DP."""

import dataclasses
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy import stats

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    ClientOutputs,
    Device,
    DevicePolicy,
    DifferentialPrivacy,
    DPGaussianMean,
    RoundHyperparams,
    RunContext,
    SecureAggregation,
    TrimmedMean,
    WeightedMean,
)
from fedcf.federated.aggregators import secagg_audit, secagg_protocol, shamir
from fedcf.federated.aggregators.secagg_client import simulate
from fedcf.federated.aggregators.secagg_protocol import (
    Advert,
    EncryptedShares,
    Identities,
    MaskedInput,
    ProtocolAbort,
    SecAggClient,
    SecAggServer,
)

HP = RoundHyperparams(1.0, {}, 1.0)
N_ITEMS, K = 30, 3


def cohort(m=12, per=4, seed=0):
    rng = np.random.default_rng(seed)
    items = np.concatenate([rng.choice(N_ITEMS, per, replace=False) for _ in range(m)])
    return ClientOutputs(np.arange(0, m * per + 1, per), items,
                         rng.normal(0, 0.05, (m * per, K)), rng.normal(0, 0.05, m * per),
                         rng.integers(1, 9, m).astype(float), np.zeros(m))


def dense(delta):
    Q, b = np.zeros((N_ITEMS, K)), np.zeros(N_ITEMS)
    Q[delta.items], b[delta.items] = delta.d_Q, delta.d_b
    return Q, b


def bound(**kw):
    return SecureAggregation(**kw).bind(RunContext(n_eligible=1000, clients_per_round=12,
                                                   n_rounds=3, n_items=N_ITEMS, n_factors=K,
                                                   seed=1))


def _vectors(m, d=200, seed=0):
    return np.random.default_rng(seed).integers(0, 2**32, (m, d), dtype=np.uint64).astype(
        np.uint32)


def _sum(X, rows):
    return X[list(rows)].sum(axis=0, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("m, dropped", [(3, ()), (7, (2, 5)), (12, (0, 4, 11))])
def test_the_protocol_sums_exactly_the_survivors(m, dropped):
    X = _vectors(m)
    t = 2 * m // 3 + 1
    total, u3, server = simulate(X, range(m), t, drop_after_shares=dropped)
    assert u3 == [c for c in range(m) if c not in dropped]
    np.testing.assert_array_equal(total, _sum(X, u3))
    # the server saw masked vectors, each far from its client's input
    for msg in server.transcript:
        if isinstance(msg, MaskedInput):
            assert np.mean(msg.y == X[msg.client]) < 0.01


@pytest.mark.parametrize("threads", [1, 2])
def test_the_masking_clients_run_side_by_side_each_with_its_own_result(threads, monkeypatch):
    """The mask step runs a device's clients on fedcf's threads: the sum is exact whatever
    the thread count, the masked vectors come back in the clients' order, and a client its
    device's policy refuses falls silent alone."""
    import numba

    from fedcf.federated.aggregators import secagg_client
    from fedcf.federated.round.device import DeviceRefusal

    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    X = _vectors(9)
    total, u3, server = simulate(X, range(9), 7)
    np.testing.assert_array_equal(total, _sum(X, u3))
    halves = secagg_client.ClientHalves(range(4), X[:4], 3, os.urandom(16), None)
    halves.halves = {c: c for c in range(4)}

    def step(h):
        if h == 2:
            raise DeviceRefusal("policy")
        return h * 10

    assert halves._each([3, 2, 1, 0], step, parallel=True) == [30, 10, 0]
    assert sorted(halves.halves) == [0, 1, 3]


@pytest.mark.parametrize("dropped", [(), (1, 7)])  # t = 3 of 5: never short
def test_secagg_plus_masks_and_shares_with_neighbours_only_and_sums_exactly(dropped):
    """SecAgg+ (neighbours=k): each client's shares go to itself and its k ring neighbours, the
    graph is symmetric, and the survivors' sum is still exact with dropouts."""
    m, k = 20, 4
    X = _vectors(m)
    total, u3, server = simulate(X, range(m), 3, drop_after_shares=dropped, neighbours=k)
    np.testing.assert_array_equal(total, _sum(X, u3))
    assert all(len(h) == k + 1 and u in h for u, h in server.graph.items())
    assert all(u in server.graph[v] for u, h in server.graph.items() for v in h)
    bundles = [msg for msg in server.transcript if isinstance(msg, EncryptedShares)]
    assert all(sorted(b.ciphertexts) == server.graph[b.client] for b in bundles)
    agg = SecureAggregation(neighbours=k, min_cohort=5)
    assert agg.holders(m) == k + 1 and agg.threshold_for(m) == 4
    assert SecureAggregation(neighbours=k).holders(5) == 5  # small cohorts: every pair


def test_client_halves_in_worker_processes_sum_exactly_and_a_dead_worker_is_named():
    """The cost script's cohort on two processes: the same exact sum with dropouts, the
    clients' own seconds and the round's wall time on the clock; a protocol error in a worker
    is raised here, a worker that dies mid-round is a named error (never a hang), and the
    workers end with the block; a count of processes that is not one is refused."""
    from fedcf.federated.aggregators.secagg_client import ProcessHalves
    from fedcf.federated.aggregators.secagg_protocol import run_round

    m, clock = 9, {}
    X = _vectors(m)
    total, u3, _ = simulate(X, range(m), 6, drop_after_shares=(4,), clock=clock, processes=2)
    np.testing.assert_array_equal(total, _sum(X, u3))
    assert u3 == [c for c in range(m) if c != 4]
    assert clock["clients"] > 0 and clock["server"] > 0 and clock["round"] > clock["server"]
    session = os.urandom(16)
    with ProcessHalves(range(m), X, 6, session, None, 2) as halves:
        server = SecAggServer(6, X.shape[1], session)
        run_round(halves, server, lambda u2: ())
        with pytest.raises(ProtocolAbort, match="already answered"):  # raised in a worker
            halves.unmask(list(range(m)), [])
        halves.procs[1].kill()
        halves.procs[1].join()
        with pytest.raises(RuntimeError, match="ended during the step 'consistency'"):
            halves.consistency(u3)
    assert not any(p.is_alive() for p in halves.procs)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="processes must be a count"):
            simulate(X, range(m), 6, processes=bad)


def test_secrets_come_from_the_os_not_from_any_seed():
    """Two aggregations of the same vectors (same everything a server could know) give
    different masked vectors and keys: nothing to regenerate from random_state."""
    X = _vectors(4)
    views = [simulate(X, range(4), 3)[2].transcript for _ in range(2)]
    ys = [[m.y for m in v if isinstance(m, MaskedInput)] for v in views]
    keys = [[m.s_pk for m in v if isinstance(m, Advert)] for v in views]
    assert not any(np.array_equal(a, b) for a, b in zip(*ys))
    assert not set(keys[0]) & set(keys[1])
    assert len(set(keys[0])) == 4  # and no two clients of one round share a mask key


def test_the_mask_prg_is_the_aes_ctr_keystream():
    """AES-128 in counter mode from counter block 0: the keystream is the encryption of the
    blocks 0, 1, 2, ... (computed here with ECB); with the zero key, block 0 encrypts to the
    well-known 66e94bd4... (FIPS-197's AES-128 of the zero block under the zero key)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = bytes(range(32))
    ecb = Cipher(algorithms.AES(key[:16]), modes.ECB()).encryptor()
    blocks = b"".join(i.to_bytes(16, "big") for i in range(4))
    assert secagg_protocol.prg(key, 16).astype("<u4").tobytes() == ecb.update(blocks)
    assert secagg_protocol.prg(bytes(32), 4).astype("<u4").tobytes().hex() == \
        "66e94bd4ef8a2c3b884cfa59ca342b2e"
    scratch = secagg_protocol.prg_scratch(16)
    assert secagg_protocol.prg(key, 16, scratch).base is scratch  # written into the scratch
    assert np.array_equal(secagg_protocol.prg(key, 16, scratch), secagg_protocol.prg(key, 16))


def test_masks_added_on_threads_give_the_same_sum():
    """The server removes its masks on threads, each into its own sum: modulo 2^32 the order
    does not matter, so 1, 2 and 5 threads give the same words (and the serial formula)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)
    masks = [(os.urandom(32), int(s)) for s in rng.choice([-1, 1], 7)]
    want = base.copy()
    for key, sign in masks:
        want = (want + sign * secagg_protocol.prg(key, 1000).astype(np.int64)).astype(np.uint32)
    for threads in (1, 2, 5):
        got = base.copy()
        secagg_protocol.add_masks(got, masks, threads)
        assert np.array_equal(got, want), threads
    got = base.copy()
    secagg_protocol.add_masks(got, [], 2)
    assert np.array_equal(got, base)


def _halves(m, t):
    session = os.urandom(16)
    ids = Identities(range(m))
    halves = [SecAggClient(c, t, session, ids.signing_key(c), ids.verifying) for c in range(m)]
    server = SecAggServer(t, 50, session)
    adverts = server.collect_adverts([h.advertise() for h in halves])
    inbox = server.route_shares([h.share_keys(adverts) for h in halves])
    X = _vectors(m, 50)
    inputs = [h.masked_input(X[h.id], inbox[h.id]) for h in halves]
    return halves, server, inputs, X


def test_a_server_lying_about_who_dropped_never_gets_both_secrets_of_a_client():
    m, t = 6, 5
    halves, server, inputs, X = _halves(m, t)
    server.collect_inputs(inputs)
    full, lie = list(range(m)), [c for c in range(m) if c != 0]  # "client 0 dropped"
    # told different survivor lists, no list gathers t signatures: nobody unmasks anything
    sigs_full = [h.consistency(full) for h in halves[:3]]
    sigs_lie = [h.consistency(lie) for h in halves[3:]]
    for h in halves[:3]:
        with pytest.raises(ProtocolAbort, match="signatures on the survivor list"):
            h.unmask(full, sigs_full)
    for h in halves[3:]:
        with pytest.raises(ProtocolAbort, match="signatures on the survivor list"):
            h.unmask(lie, sigs_lie)
    # one consistent lie: clients reveal client 0's mask-key share but not its self-mask
    # share, and refuse a second request that would add the other
    sigs = [h.consistency(lie) for h in halves[1:]]
    answers = [h.unmask(lie, sigs) for h in halves[1:]]
    assert all(0 in a.s_shares and 0 not in a.b_shares for a in answers)
    with pytest.raises(ProtocolAbort, match="already answered"):
        halves[1].unmask(full, [h.consistency(full) for h in halves])
    # what the server can do with client 0's input: strip its pair masks, not its self-mask
    server.u3 = lie
    total = server.unmasked_sum(answers)
    np.testing.assert_array_equal(total, _sum(X, lie))
    key = secagg_protocol._x25519_from_seed(
        shamir.combine([a.s_shares[0] for a in answers[:t]]), server.session)
    y0 = inputs[0].y.copy()
    for u in lie:
        mask = secagg_protocol.prg(secagg_protocol.pair_key(
            key, server.adverts[u].s_pk, 0, u, server.session), len(y0))
        y0 -= mask  # client 0 (the lowest id) added +mask for every u
    assert np.mean(y0 == X[0]) < 0.05  # still hidden by the self-mask


def test_a_forged_key_or_relabelled_share_aborts_the_client():
    m, t = 4, 3
    session = os.urandom(16)
    ids = Identities(range(m))
    halves = [SecAggClient(c, t, session, ids.signing_key(c), ids.verifying) for c in range(m)]
    adverts = [h.advertise() for h in halves]
    server_key = X25519PrivateKey.generate().public_key().public_bytes(*secagg_protocol.RAW)
    forged = [dataclasses.replace(adverts[0], s_pk=server_key)] + adverts[1:]
    with pytest.raises(ProtocolAbort, match="does not verify"):
        halves[1].share_keys(forged)
    bundles = [h.share_keys(adverts) for h in halves]
    swapped = {0: bundles[2].ciphertexts[1], 2: bundles[0].ciphertexts[1],
               3: bundles[3].ciphertexts[1]}
    with pytest.raises(ProtocolAbort, match="does not decrypt"):
        halves[1].masked_input(np.zeros(5, np.uint32), swapped)


def test_a_client_refuses_a_threshold_at_or_below_half_its_holders():
    """The server chooses t, so each client checks it: with t ≤ h/2 two disjoint groups of
    holders could rebuild both seeds of one client. The check is the client's own, whatever
    the server's settings; t > h/2 passes, also after a round trip through pickle (a Flower
    node keeps its halves in the run's state between messages)."""
    import pickle

    session = os.urandom(16)
    for t, ok in ((3, False), (4, True)):
        ids = Identities(range(6))
        halves = [pickle.loads(pickle.dumps(SecAggClient(c, t, session, ids.signing_key(c),
                                                         ids.verifying))) for c in range(6)]
        adverts = [h.advertise() for h in halves]
        if ok:
            assert len(halves[0].share_keys(adverts).ciphertexts) == 6
        else:
            with pytest.raises(ProtocolAbort, match="not above half of its 6 share holders"):
                halves[0].share_keys(adverts)


def test_too_few_clients_at_any_step_abort_the_round():
    with pytest.raises(ProtocolAbort, match="fewer than the threshold"):
        simulate(_vectors(5), range(5), 4, drop_after_shares=(0, 1))
    with pytest.raises(ProtocolAbort, match="fewer than the threshold"):
        simulate(_vectors(3), range(3), 4)


def test_masks_cancel_and_the_sum_equals_the_weighted_mean():
    out = cohort()
    agg = bound(max_weight=8.0)  # weights are 1..8: none capped
    got = agg(out, HP, 0)
    want = dense(WeightedMean()(out, HP))
    np.testing.assert_allclose(got.d_Q, want[0], atol=1e-7)
    np.testing.assert_allclose(got.d_b, want[1], atol=1e-7)
    assert got.items.tolist() == list(range(N_ITEMS))  # dense: no row ids leak
    st = agg.round_stats
    assert st["secagg_error"] < 1e-7 and st["secagg_clipped"] == 0
    assert st["secagg_threshold"] == 10 and st["secagg_bytes_per_client"] > 4 * N_ITEMS * (K + 1)


def test_weights_above_the_public_maximum_are_capped():
    out = cohort()
    got = bound(max_weight=4.0)(out, HP, 0)
    capped = dataclasses.replace(out, weights=np.minimum(out.weights, 4.0))
    np.testing.assert_allclose(got.d_Q, dense(WeightedMean()(capped, HP))[0], atol=1e-7)


def test_clipping_is_counted_against_the_unclipped_sum_and_warned():
    out = cohort()
    out = dataclasses.replace(out, d_Q=out.d_Q * 40)  # values up to ~ ±1.6·w/W
    agg = bound(max_weight=8.0, value_bound=0.5)
    with pytest.warns(RuntimeWarning, match="clipped .* values"):
        agg(out, HP, 0)
    st = agg.round_stats
    enc = agg.encoding(12)
    rows = enc.encode(out, HP)[1][:, :enc.n_values]  # what the clients meant to send
    assert st["secagg_clipped"] == int((np.abs(rows) > 0.5).sum()) > 0
    assert st["secagg_error"] > 1e-3  # measured against what the clients meant to send


def test_clients_that_drop_after_setup_are_unmasked_from_the_survivors_shares():
    out = cohort(seed=3)
    agg = bound(drop_after_setup=0.2, max_weight=8.0, min_cohort=5, threshold=0.5)
    got = agg.masked_mean(out, HP, 2, device=Device(DevicePolicy(min_cohort=5, threshold=0.5)))
    assert 7 <= agg.round_stats["secagg_survivors"] < 12
    survivors = np.flatnonzero(got.client_weights > 0)
    kept = np.isin(np.repeat(np.arange(12), 4), survivors)
    sub = ClientOutputs(np.r_[0, np.cumsum(np.full(len(survivors), 4))], out.items[kept],
                        out.d_Q[kept], out.d_b[kept], out.weights[survivors],
                        np.zeros(len(survivors)))
    want = dense(WeightedMean()(sub, HP))
    np.testing.assert_allclose(got.d_Q, want[0], atol=1e-7)


def test_a_round_with_fewer_survivors_than_the_threshold_is_lost():
    agg = bound(threshold=12, drop_after_setup=0.5)
    got = agg(cohort(), HP, 0)
    assert agg.round_stats["secagg_lost_round"] and len(got.items) == 0
    assert "fewer than the threshold" in agg.round_stats["secagg_abort"]


@pytest.mark.parametrize("m, kw", [(5, {"min_cohort": 10}), (12, {"threshold": 6,
                                                                  "min_cohort": 2}),
                                   (8, {"min_cohort": 10, "neighbours": 4})])
def test_small_cohorts_and_thresholds_at_most_half_are_never_aggregated(m, kw):
    agg = bound(**kw)
    got = agg(cohort(m=m), HP, 0)
    assert len(got.items) == 0 and got.summary.n_used == 0
    assert agg.round_stats["secagg_lost_round"] and agg.round_stats["secagg_threshold"] is None
    assert agg.round_stats["secagg_below_min_cohort"] == (m < kw["min_cohort"])
    with pytest.raises(ValueError, match="min_cohort=13 is larger than the cohort"):
        bound(min_cohort=13)


@pytest.mark.parametrize("kw,err,match", [
    (dict(threshold=0), ValueError, "threshold must be"),
    (dict(threshold=1.5), ValueError, "threshold must be"),
    (dict(threshold=0.4), ValueError, "threshold must be"),
    (dict(threshold=1.0), ValueError, "threshold must be"),
    (dict(threshold=1), ValueError, "threshold must be"),
    (dict(min_cohort=1), ValueError, "min_cohort must be"),
    (dict(max_weight=0.0), ValueError, "max_weight must be"),
    (dict(neighbours=1), ValueError, "neighbours must be"),
    (dict(neighbours=3.0), ValueError, "neighbours must be"),
    (dict(value_bound=-1.0), ValueError, "value_bound must be"),
    (dict(drop_after_setup=1.0), ValueError, "drop_after_setup"),
])
def test_bad_settings_are_named(kw, err, match):
    with pytest.raises(err, match=match):
        SecureAggregation(**kw)


def test_threshold_larger_than_the_cohort_is_refused():
    pop = make_synthetic_ratings(60, 20, 600, random_state=0)
    with pytest.raises(ValueError, match="threshold=50 is larger than the cohort"):
        FedReconMF(n_factors=2, n_rounds=1, clients_per_round=10,
                   aggregator=SecureAggregation(threshold=50)).fit(pop)


def test_secagg_plus_gives_the_model_of_every_pair_masking():
    pop = make_synthetic_ratings(120, 25, 1800, n_factors=2, random_state=4)
    kw = dict(n_factors=2, n_rounds=2, clients_per_round=15, random_state=0)
    full = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5)).fit(pop)
    plus = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5, neighbours=4)).fit(pop)
    np.testing.assert_array_equal(plus.item_factors_, full.item_factors_)
    assert [h["secagg_threshold"] for h in plus.history_] == [4, 4]


def test_fit_under_secure_aggregation_matches_the_plain_fit():
    pop = make_synthetic_ratings(120, 25, 1800, n_factors=2, random_state=4)
    kw = dict(n_factors=2, n_rounds=3, clients_per_round=15, random_state=0, dtype="float64")
    plain = FedReconMF(**kw).fit(pop)
    sec = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5)).fit(pop)
    np.testing.assert_allclose(sec.item_factors_, plain.item_factors_, atol=1e-6)
    compact = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5, precision=16)).fit(pop)
    np.testing.assert_allclose(compact.item_factors_, plain.item_factors_, atol=1e-3)
    assert np.abs(compact.item_factors_ - plain.item_factors_).max() > 1e-6
    # every client asked takes part (an empty one sends zeros); the counts and the mean loss
    # come out of the masked sum and equal the plain run's
    for h, p in zip(sec.history_, plain.history_):
        assert h["secagg_survivors"] == h["clients_sampled"] == p["clients_sampled"]
        assert h["clients_used"] == p["clients_used"]
        assert h["loss"] == pytest.approx(p["loss"], rel=1e-3)  # a fixed-point sum (bound 1e3)


def test_secure_aggregation_with_server_noise_dp():
    pop = make_synthetic_ratings(300, 25, 4000, n_factors=2, random_state=4)
    agg = DifferentialPrivacy(SecureAggregation(value_bound=1.0), clip_norm=0.5,
                              target_epsilon=10.0, delta=1e-4)
    m = FedReconMF(n_factors=2, n_rounds=4, clients_per_round=20, random_state=0,
                   rating_scale=(1, 5), aggregator=agg).fit(pop)
    eps = [h["epsilon"] for h in m.history_]
    assert eps == sorted(eps) and m.epsilon_ <= 10.0 * 1.001 and m.noise_multiplier_ > 0
    assert len({h["clients_sampled"] for h in m.history_}) > 1  # Poisson sampling
    # the clients' loss is outside ε: under DP it is not in the masked sum at all
    assert all(np.isnan(h["loss"]) for h in m.history_)
    from fedcf.federated.aggregators.secagg_client import STATS, Encoding

    col = N_ITEMS * (K + 1) + STATS.index("loss")  # then its weight r
    dp_rows = Encoding(N_ITEMS, K, 12, 1.0, 10.0, clip=0.5).encode(cohort(), HP)[1]
    plain_rows = Encoding(N_ITEMS, K, 12, 1.0, 10.0).encode(cohort(), HP)[1]
    assert not dp_rows[:, col:col + 2].any() and plain_rows[:, col:col + 2].any()
    # the unmasked sum is the DP sum: same result as DPGaussianMean alone on the same cohort
    out = cohort()
    ctx = RunContext(n_items=N_ITEMS, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)
    a = DifferentialPrivacy(SecureAggregation(value_bound=1.0), 0.1, 1.0,
                            delta=1e-4, insecure_seeded_noise=True)
    b = DPGaussianMean(0.1, 1.0, delta=1e-4, insecure_seeded_noise=True)
    np.testing.assert_allclose(a.bind(ctx)(out, HP, 2).d_Q, b.bind(ctx)(out, HP, 2).d_Q, atol=1e-8)
    with pytest.raises(TypeError, match="aggregator must be None .* or a SecureAggregation"):
        DifferentialPrivacy(TrimmedMean(0.1), 1.0, 1.0)


@pytest.mark.parametrize("threshold", [12, 8])
def test_distributed_noise_comes_from_the_clients_and_covers_the_threshold(threshold):
    out = cohort()
    ctx = RunContext(n_items=2000, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)

    def run(sigma, noise):
        agg = DifferentialPrivacy(SecureAggregation(threshold, value_bound=1.0, min_cohort=2),
                                  0.1, sigma,
                                  delta=1e-4, noise=noise).bind(ctx)
        return agg, agg(out, HP, 2)

    agg, noisy = run(1.0, "distributed")
    _, clean = run(1e-12, "distributed")
    denominator = agg.denominator_
    err = np.concatenate([(noisy.d_Q - clean.d_Q).ravel(), noisy.d_b - clean.d_b]) * denominator
    # 12 clients each add N(0, σ²C²/t): the sum has variance (12/t)·σ²C², never less than σ²C²
    assert np.std(err) == pytest.approx(0.1 * np.sqrt(12 / threshold), rel=0.05)
    # the server adds nothing of its own: the noise-free sum is the plain DP sum without noise
    _, central = run(1e-12, "server")
    np.testing.assert_allclose(clean.d_Q, central.d_Q, atol=1e-7)


def test_distributed_noise_needs_secure_aggregation_and_a_known_mode():
    with pytest.raises(ValueError, match="noise='distributed' needs aggregator=SecureAggregation"):
        DifferentialPrivacy(None, 1.0, 1.0, noise="distributed")
    with pytest.raises(ValueError, match="noise must be"):
        DifferentialPrivacy(SecureAggregation(), 1.0, 1.0, noise="local")


def _audit_cohort(m=6, n_items=60, K=2, per=8, seed=0):
    """Quantized dense uploads of m clients each touching ``per`` rows, and their rated sets."""
    rng = np.random.default_rng(seed)
    q = np.zeros((m, n_items * (K + 1) + 2), np.uint32)
    rated = []
    for u in range(m):
        rows = rng.choice(n_items, per, replace=False)
        block = q[u, :n_items * (K + 1)].reshape(n_items, K + 1)
        block[rows] = rng.integers(1, 2**20, (per, K + 1)).astype(np.uint32)
        rated.append(set(rows.tolist()))
    return q, rated, n_items, K


def test_the_transcript_attacks_recover_nothing_beyond_chance():
    q, rated, n_items, K = _audit_cohort()
    res = secagg_audit.transcript_attacks(q, rated, n_items, K, t=5, victims=6)
    assert res["plain"] == 1.0  # the attack works on what it can read
    for name in "abcd":
        assert abs(res[name] - res["chance"]) <= res["chance_halfwidth"] + 0.15, (name, res)


def test_the_attacks_succeed_when_the_protocol_is_broken(monkeypatch):
    """Break what the docs promise and watch the audit read the uploads: seeds from a
    generator a server can replay (b), a client that reveals both secrets of one client (c)."""
    q, rated, n_items, K = _audit_cohort()
    counter = iter(range(10**6))

    def seeded(n):  # every run draws the same "random" bytes in the same order
        return np.random.default_rng(next(counter) % 64).bytes(n)

    real = secagg_protocol.os.urandom
    monkeypatch.setattr(secagg_protocol.os, "urandom", seeded)
    counter = iter(range(10**6))
    _, _, server = simulate(q, range(6), 5)
    counter = iter(range(10**6))
    _, _, replay = simulate(np.zeros_like(q), range(6), 5)
    y = {m.client: m.y for m in server.transcript if isinstance(m, MaskedInput)}
    z = {m.client: m.y for m in replay.transcript if isinstance(m, MaskedInput)}
    got = secagg_audit.recall(secagg_audit.guess_rows(y[0] - z[0], n_items, K, 8), rated[0])
    assert got == 1.0
    monkeypatch.setattr(secagg_protocol.os, "urandom", real)

    def leaky_unmask(self, u3, signatures):  # also hands over the b-share of a dropped client
        ans = SecAggClient.__dict__["_honest_unmask"](self, u3, signatures)
        return dataclasses.replace(ans, b_shares={v: (self._held[v][0], self._held[v][2])
                                                  for v in self._u2})

    monkeypatch.setattr(SecAggClient, "_honest_unmask", SecAggClient.unmask, raising=False)
    monkeypatch.setattr(SecAggClient, "unmask", leaky_unmask)
    server, answers, y0 = secagg_audit._run_to_unmask(q, 5, lie_dropped=0, late=None)
    view = secagg_audit.strip_masks(server, answers, 0, y0)
    np.testing.assert_array_equal(view, q[0])


def test_what_the_sum_reveals_shrinks_with_the_cohort():
    rng = np.random.default_rng(0)
    rated = [set(rng.choice(200, 20, replace=False).tolist()) for _ in range(300)]
    touched = [set(list(r)[:10]) for r in rated]
    small = secagg_audit.sum_leakage(touched, rated, 200, 2, 20, rng)
    large = secagg_audit.sum_leakage(touched, rated, 200, 100, 5, rng)
    assert small["lift"] > 3 * large["lift"] and large["lift"] < 1.5
    assert small["recall"] >= 0.5 and large["cohort"] == 100  # its own touched rows at least


def test_the_cost_script_reports_client_and_server_time_and_bytes():
    from conftest import load_script

    rows = load_script("secagg_cost").main(["--clients", "6", "12", "--items", "50", "200",
                                            "--factors", "2", "--drop", "0.1",
                                            "--neighbours", "0", "4", "--processes", "1",
                                            "--repeats", "2"])
    # one drop each: never short
    assert [(r["clients"], r["neighbours"], r["n_items"]) for r in rows] == [
        (m, k, n) for m in (6, 12) for k in (None, 4) for n in (50, 200)]
    for r in rows:
        assert r["threshold"] == (5 if r["holders"] == 6 else 9 if r["holders"] == 12 else 4)
        assert r["dropped"] == 1
        assert r["client_seconds"] > 0 and r["server_seconds"] > 0
        assert r["bytes_up_per_client"] > r["plain_bytes"]  # the vector plus keys and shares


def test_the_cost_script_runs_the_default_degree_of_a_cohort():
    from conftest import load_script

    from fedcf.federated.aggregators.secagg import plus_neighbours

    rows = load_script("secagg_cost").main(["--clients", "20", "100", "--items", "20",
                                            "--factors", "1", "--neighbours", "-1",
                                            "--processes", "1"])
    k = plus_neighbours(100)  # 20 clients: every pair, no row of its own
    assert [(r["clients"], r["neighbours"], r["holders"], r["auto"]) for r in rows] == [
        (100, k, k + 1, True)]


def test_the_fit_script_times_a_whole_dp_secure_fit_and_its_steady_round(tmp_path):
    import json

    from conftest import load_script

    rows = load_script("secagg_fit").main(["--dataset", "synthetic", "--rounds", "5",
                                           "--probe", "2", "--clients", "12", "--executors",
                                           "local", "--json", str(tmp_path / "f.json")])
    (r,) = rows
    assert (r["executor"], r["rounds"], r["clients"], r["shards"]) == ("local", 5, 12, None)
    assert r["seconds"] > 0 and r["probe_seconds"] > 0
    assert r["steady_seconds_per_round"] == pytest.approx(
        (r["seconds"] - r["probe_seconds"]) / 3)
    assert json.loads((tmp_path / "f.json").read_text())[0]["meta"]["command"].startswith(
        "scripts/secagg_fit.py")


@pytest.mark.parametrize("noise", ["server", "distributed"])
def test_adaptive_clipping_learns_only_the_cohorts_count_from_the_secure_sum(noise):
    """The server under secure aggregation cannot take each upload's norm: the clients' "not
    clipped" bits travel inside the masked sum, and the clip adapts in both noise modes."""
    out = cohort()
    ctx = RunContext(n_items=N_ITEMS, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)
    agg = DifferentialPrivacy(SecureAggregation(min_cohort=2), 0.2, 1.0, delta=1e-4,
                              noise=noise, target_quantile=0.5,
                              clip_count_stddev=1.0).bind(ctx)
    norms = np.sqrt(np.add.reduceat((out.d_Q ** 2).sum(axis=1) + out.d_b ** 2,
                                    out.offsets[:-1]))
    agg(out, HP, 0)
    centred = int((norms <= 0.2).sum()) - 12 / 2  # Σ (b − ½): one user moves it by ½
    assert 0 < (norms <= 0.2).sum() < 12
    assert agg.unclipped_ == pytest.approx(centred, abs=1e-6 if noise == "server" else 6.0)
    assert agg.aggregator.round_stats["secagg_indicator_sum"] == agg.unclipped_
    assert agg.clip_ != 0.2 and agg.used_clip_ == 0.2


@pytest.mark.parametrize("noise", ["server", "distributed"])
def test_the_adaptive_clip_count_carries_the_accounted_noise(noise):
    """The count the clip step reads is Σ (b − ½) plus noise of std σ_b (the accounted
    clip_count_stddev): added by the server, or in shares N(0, σ_b²/t) by the clients, so
    that any t survivors carry at least σ_b. Read back from the clip's step over 200 rounds.
    The noise comes from the OS, so the bounds are set for a false failure below 1e-7 (a
    chi-square interval on the std, 5.3 standard errors on the mean)."""
    out = cohort()
    ctx = RunContext(n_items=N_ITEMS, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)
    norms = np.sqrt(np.add.reduceat((out.d_Q ** 2).sum(axis=1) + out.d_b ** 2,
                                    out.offsets[:-1]))
    centred = int((norms <= 0.2).sum()) - 6
    noise_seen, rounds = [], 200
    for _ in range(rounds):
        agg = DifferentialPrivacy(SecureAggregation(min_cohort=2), 0.2, 1.0, delta=1e-4,
                                  noise=noise, target_quantile=0.5, clip_learning_rate=0.2,
                                  clip_count_stddev=2.0).bind(ctx)
        agg(out, HP, 0)
        share = -np.log(agg.clip_ / 0.2) / 0.2 + 0.5  # the share the step moved toward
        noise_seen.append((share - 0.5) * agg.q * ctx.n_eligible - centred)
    t = agg.aggregator.threshold_for(12)
    want = 2.0 * (np.sqrt(12 / t) if noise == "distributed" else 1.0)
    lo, hi = np.sqrt(stats.chi2.ppf([5e-8, 1 - 5e-8], rounds - 1) / (rounds - 1))
    assert lo * want < np.std(noise_seen, ddof=1) < hi * want
    assert abs(np.mean(noise_seen)) < stats.norm.isf(5e-8) * want / np.sqrt(rounds)


def test_a_devices_signature_checks_are_kept_per_verifying_key():
    """A device checks a signature once for the clients it runs, keyed by the signer's
    verifying key too: the same bytes under another registered key are checked again (and
    fail), and a forged signature is never taken from the cache."""
    ids, other = Identities([1, 2]), Identities([2])
    session, checked = os.urandom(16), {}
    a = SecAggClient(1, 2, session, ids.signing_key(1), dict(ids.verifying), verified=checked)
    b = SecAggClient(2, 2, session, ids.signing_key(2), dict(ids.verifying), verified=checked)
    msg = session + b"survivors"
    sig = ids.signing_key(2).sign(msg)
    a._verify(2, sig, msg, "test signature")
    b._verify(2, sig, msg, "test signature")  # from the device's cache
    assert len(checked) == 1
    with pytest.raises(ProtocolAbort, match="does not verify"):
        a._verify(2, bytes(64), msg, "test signature")
    a.trust({2: other.verifying[2]})  # the registry now names another key for client 2
    with pytest.raises(ProtocolAbort, match="does not verify"):
        a._verify(2, sig, msg, "test signature")
