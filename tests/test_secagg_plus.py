"""SecAgg+ by default: the degree ``plus_neighbours`` chooses from the cohort, its bounds, and
the ring it builds (positions drawn from the whole roster of adverts)."""

import math
import os

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import SecureAggregation
from fedcf.federated.aggregators.secagg import plus_neighbours
from fedcf.federated.aggregators.secagg_protocol import Advert, share_graph


def _binom_sf(k, n, p):
    """P[Bin(n, p) >= k], summed term by term (independent of scipy)."""
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(max(k, 0), n + 1))


def _bounds_hold(m, k, share=2 / 3, corrupt=0.1, dropout=0.1, privacy=40, rounds=20):
    h, half = k + 1, k // 2
    t = math.floor(share * h) + 1
    collusion = m * _binom_sf(t, h - 1, corrupt)
    split = m * (corrupt + dropout) ** half
    lost = m * (1 - _binom_sf(t, h - 1, 1 - dropout))
    return collusion <= 2.0 ** -privacy and split <= 2.0 ** -privacy and lost <= 2.0 ** -rounds


@pytest.mark.parametrize("m", [100, 1000, 20000])
def test_the_degree_is_the_smallest_that_keeps_all_three_bounds(m):
    k = plus_neighbours(m)
    assert k is not None and k % 2 == 0 and k < m - 1
    assert _bounds_hold(m, k)
    assert not _bounds_hold(m, k - 2)  # the smallest even degree that does


def test_the_degree_grows_like_log_m_and_small_cohorts_keep_every_pair():
    ks = {m: plus_neighbours(m) for m in (20, 50, 1000, 100000)}
    assert ks[20] is None and ks[50] is None
    assert ks[100000] < 1.5 * ks[1000] < 200
    # more dropouts or more collusion need more neighbours
    assert plus_neighbours(1000, dropout=0.2) > ks[1000]
    assert plus_neighbours(1000, corrupt=0.3) > ks[1000]


def test_auto_resolves_per_cohort_and_a_count_threshold_keeps_every_pair():
    agg = SecureAggregation()
    assert agg.neighbours == "auto" and agg.degree(20) is None and agg.holders(20) == 20
    k = plus_neighbours(1000)
    assert agg.degree(1000) == k and agg.holders(1000) == k + 1
    assert agg.threshold_for(1000) == math.floor(2 / 3 * (k + 1)) + 1
    assert SecureAggregation(threshold=700).degree(1000) is None
    assert SecureAggregation(neighbours=None).degree(1000) is None
    assert SecureAggregation(neighbours=8).degree(1000) == 8
    # a simulation that drops more than the assumed 10 % gets the degree for its own rate
    assert SecureAggregation(drop_after_setup=0.2).degree(1000) == plus_neighbours(
        1000, dropout=0.2)
    with pytest.raises(ValueError, match="neighbours must be 'auto'"):
        SecureAggregation(neighbours="ring")


def test_rounds_complete_at_the_declared_dropout_rate():
    """The correctness bound, checked by drawing dropouts: with round_bits = 3 a ring loses a
    round (some client keeps fewer than t surviving holders besides itself) at most 1 time in
    8 — far less in practice, the bound being a union over the clients."""
    m, drop = 300, 0.15
    k = plus_neighbours(m, dropout=drop, corrupt=0.0, privacy_bits=1, round_bits=3)
    h, half = k + 1, k // 2
    t = math.floor(2 / 3 * h) + 1
    rng = np.random.default_rng(0)
    lost = 0
    for _ in range(400):
        alive = rng.random(m) >= drop
        window = sum(np.roll(alive, d) for d in range(-half, half + 1) if d != 0)
        lost += bool((window < t).any())
    assert lost / 400 <= 1 / 8


def _adverts(n, rng):
    return {c: Advert(c, rng.bytes(32), rng.bytes(32), b"") for c in range(n)}


def test_ring_positions_depend_on_the_whole_roster():
    """Leaving one advert out redraws the ring: a server cannot move a client's neighbours one
    at a time (with a position per client alone, dropping a far client changes nothing)."""
    rng = np.random.default_rng(1)
    session = os.urandom(16)
    changed = 0
    for _ in range(5):
        adverts = _adverts(60, rng)
        graph = share_graph(adverts, session, 4)
        near = set(graph[0]) | {w for v in graph[0] for w in graph[v]}
        far = next(c for c in adverts if c not in near)
        rest = {c: a for c, a in adverts.items() if c != far}
        changed += share_graph(rest, session, 4, only=0)[0] != graph[0]
    assert changed >= 4


def test_a_default_fit_of_a_large_cohort_uses_the_ring_and_gives_the_same_model():
    pop = make_synthetic_ratings(300, 12, 3000, n_factors=2, random_state=3)
    kw = dict(n_factors=2, n_rounds=1, clients_per_round=100, random_state=0)
    plus = FedReconMF(**kw, aggregator=SecureAggregation()).fit(pop)
    full = FedReconMF(**kw, aggregator=SecureAggregation(neighbours=None)).fit(pop)
    np.testing.assert_array_equal(plus.item_factors_, full.item_factors_)
    h = plus_neighbours(100) + 1
    assert plus.history_[0]["secagg_threshold"] == math.floor(2 / 3 * h) + 1
    assert full.history_[0]["secagg_threshold"] == math.floor(2 / 3 * 100) + 1


@pytest.mark.parametrize("kw, match", [
    (dict(m=0), "m must be a cohort size"),
    (dict(m=100.0), "m must be a cohort size"),
    (dict(m=True), "m must be a cohort size"),
    (dict(m=100, share=0.4), "share must be"),
    (dict(m=100, share=float("nan")), "share must be"),
    (dict(m=100, dropout=1.0), "dropout must be"),
    (dict(m=100, corrupt=-0.1), "corrupt must be"),
    (dict(m=100, corrupt="0.1"), "corrupt must be"),
    (dict(m=100, privacy_bits=0), "privacy_bits must be"),
    (dict(m=100, round_bits=float("inf")), "round_bits must be"),
])
def test_bad_assumptions_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        plus_neighbours(**kw)


def _ring_cohort(m=12, k=4):
    """Clients of one SecAgg+ ring, their adverts, and each one's share holders."""
    from fedcf.federated.aggregators.secagg_protocol import Identities, SecAggClient

    session, ids = os.urandom(16), Identities(range(m))
    t = math.floor(2 / 3 * (k + 1)) + 1
    halves = [SecAggClient(c, t, session, ids.signing_key(c), ids.verifying, neighbours=k)
              for c in range(m)]
    adverts = [h.advertise() for h in halves]
    return halves, adverts, session


def test_a_forged_advert_anywhere_on_the_ring_aborts_every_client_that_sees_it():
    """On a SecAgg+ ring a client uses only its neighbours' keys, but it still checks every
    advert: the roster is the cohort its device's policy sizes, so an advert the PKI never
    signed (a server padding a small cohort) must stop it, holder or not."""
    import dataclasses

    from fedcf.federated.aggregators.secagg_protocol import ProtocolAbort

    halves, adverts, session = _ring_cohort()
    forged = list(adverts)
    forged[5] = dataclasses.replace(adverts[5], s_pk=os.urandom(32))  # signature now wrong
    graph = share_graph({a.client: a for a in forged}, session, 4)
    assert any(5 not in graph[h.id] for h in halves)  # clients that never use its keys
    for h in halves:
        with pytest.raises(ProtocolAbort, match="advert of client 5 does not verify"):
            h.share_keys(forged)


def test_shares_and_signatures_count_only_from_the_clients_share_holders():
    """A share routed from a client outside the ring's neighbourhood is refused; at unmasking
    only the holders' consistency signatures count (a non-holder's, even a forged one, is not
    read), and a forged holder's signature aborts."""
    import dataclasses

    from fedcf.federated.aggregators.secagg_protocol import ConsistencySignature, ProtocolAbort

    halves, adverts, session = _ring_cohort()
    bundles = [h.share_keys(adverts) for h in halves]
    me = halves[0]
    inbox = {b.client: b.ciphertexts[0] for b in bundles if 0 in b.ciphertexts}
    stranger = next(c for c in range(12) if c not in me._holders)
    with pytest.raises(ProtocolAbort, match=f"a share from {stranger}, which does not hold"):
        me.masked_input(np.zeros(4, np.uint32), {**inbox, stranger: next(iter(inbox.values()))})
    me.masked_input(np.zeros(4, np.uint32), inbox)
    u3 = list(range(12))
    for h in halves[1:]:
        h._u2 = u3  # as if each had masked its input
    sigs = [h.consistency(u3) for h in halves]
    junk = ConsistencySignature(stranger, bytes(64))
    holders_only = [s for s in sigs if s.client in me._holders]
    assert me.unmask(u3, holders_only + [junk]).client == 0
    me._answered = False
    outsiders = [s for s in sigs if s.client not in me._holders]
    with pytest.raises(ProtocolAbort, match="fewer than t"):
        me.unmask(u3, outsiders)
    holder = next(c for c in me._holders if c != 0)
    forged = [dataclasses.replace(s, signature=bytes(64)) if s.client == holder else s
              for s in holders_only]
    with pytest.raises(ProtocolAbort, match=f"consistency signature of client {holder}"):
        me.unmask(u3, forged)
