"""Secure aggregation: Shamir recovery, masks that cancel modulo 2^32, dropout after setup,
what the server sees of one client, and a full fit under it."""

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    ClientOutputs,
    DifferentialPrivacy,
    DPGaussianMean,
    RoundHyperparams,
    RunContext,
    SecureAggregation,
    TrimmedMean,
    WeightedMean,
)
from fedcf.federated.secagg import P, masked, shamir_recover, shamir_shares

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


def test_shamir_any_t_shares_recover_the_secret_fewer_do_not():
    rng = np.random.default_rng(0)
    secret = 2**100 + 12345
    sh = shamir_shares(secret, 7, 4, rng)
    for pick in ([0, 1, 2, 3], [6, 2, 4, 0], [1, 3, 5, 6]):
        assert shamir_recover([(j + 1, sh[j]) for j in pick]) == secret
    assert shamir_recover([(j + 1, sh[j]) for j in [0, 1, 2]]) != secret
    assert all(0 <= s < P for s in sh)


def test_masks_cancel_and_the_sum_equals_the_weighted_mean():
    out = cohort()
    agg = bound()
    got = agg(out, HP, 0)
    want = dense(WeightedMean()(out, HP))
    np.testing.assert_allclose(got.d_Q, want[0], atol=1e-8)
    np.testing.assert_allclose(got.d_b, want[1], atol=1e-8)
    assert got.items.tolist() == list(range(N_ITEMS))  # dense: no row ids leak
    assert agg.round_stats["secagg_max_quantization_error"] < 1e-8


def test_clients_that_drop_after_setup_are_unmasked_from_the_survivors_shares():
    out = cohort(seed=3)
    agg = bound(drop_after_setup=0.3)
    got = agg(out, HP, 2)
    assert 0 < agg.round_stats["secagg_survivors"] < 12
    survivors = np.flatnonzero(got.client_weights > 0)
    kept = np.isin(np.repeat(np.arange(12), 4), survivors)
    sub = ClientOutputs(np.r_[0, np.cumsum(np.full(len(survivors), 4))], out.items[kept],
                        out.d_Q[kept], out.d_b[kept], out.weights[survivors],
                        np.zeros(len(survivors)))
    want = dense(WeightedMean()(sub, HP))
    np.testing.assert_allclose(got.d_Q, want[0], atol=1e-8)


def test_a_round_with_fewer_survivors_than_the_threshold_is_lost():
    agg = bound(threshold=12, drop_after_setup=0.5)
    got = agg(cohort(), HP, 0)
    assert agg.round_stats["secagg_lost_round"] and len(got.items) == 0


def test_one_masked_vector_looks_uniform_and_hides_the_touched_rows():
    rng = np.random.default_rng(0)
    q = np.zeros(20_000, np.uint32)
    q[:10] = 5  # a sparse upload: ten touched coordinates
    sk = [int(rng.integers(1, 2**62)) for _ in range(5)]
    pk = [pow(3, s, P) for s in sk]
    y = masked(q, 0, sk[0], pk, 5).astype(np.float64) / 2**32
    assert np.count_nonzero(y) == len(y)  # every coordinate moved, not only the touched ones
    hist, _ = np.histogram(y, bins=10, range=(0, 1))
    assert hist.min() > 0.9 * len(y) / 10 and abs(y.mean() - 0.5) < 0.01


@pytest.mark.parametrize("kw,err,match", [
    (dict(threshold=0), ValueError, "threshold must be"),
    (dict(threshold=1.5), ValueError, "threshold must be"),
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


def test_fit_under_secure_aggregation_matches_the_plain_fit():
    pop = make_synthetic_ratings(120, 25, 1800, n_factors=2, random_state=4)
    kw = dict(n_factors=2, n_rounds=3, clients_per_round=15, random_state=0, dtype="float64",
              client_weighting="uniform")
    plain = FedReconMF(**kw).fit(pop)
    sec = FedReconMF(**kw, aggregator=SecureAggregation(value_bound=5.0)).fit(pop)
    np.testing.assert_allclose(sec.item_factors_, plain.item_factors_, atol=1e-6)
    assert all(h["secagg_survivors"] == h["clients_used"] for h in sec.history_)


def test_secure_aggregation_with_server_noise_dp():
    pop = make_synthetic_ratings(300, 25, 4000, n_factors=2, random_state=4)
    agg = DifferentialPrivacy(SecureAggregation(value_bound=1.0), clip_norm=0.5,
                              target_epsilon=10.0, delta=1e-4)
    m = FedReconMF(n_factors=2, n_rounds=4, clients_per_round=20, random_state=0,
                   rating_scale=(1, 5), aggregator=agg).fit(pop)
    eps = [h["epsilon"] for h in m.history_]
    assert eps == sorted(eps) and m.epsilon_ <= 10.0 * 1.001 and m.noise_multiplier_ > 0
    assert len({h["clients_sampled"] for h in m.history_}) > 1  # Poisson sampling
    # the unmasked sum is the DP sum: same result as DPGaussianMean alone on the same cohort
    out = cohort()
    ctx = RunContext(n_items=N_ITEMS, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)
    a = DifferentialPrivacy(SecureAggregation(value_bound=1.0), 0.1, 1.0, delta=1e-4,
                            insecure_seeded_noise=True)
    b = DPGaussianMean(0.1, 1.0, delta=1e-4, insecure_seeded_noise=True)
    np.testing.assert_allclose(a.bind(ctx)(out, HP, 2).d_Q, b.bind(ctx)(out, HP, 2).d_Q, atol=1e-8)
    with pytest.raises(TypeError, match="aggregator must be None .* or a SecureAggregation"):
        DifferentialPrivacy(TrimmedMean(0.1), 1.0, 1.0)


@pytest.mark.parametrize("threshold", [12, 6])
def test_distributed_noise_comes_from_the_clients_and_covers_the_threshold(threshold):
    out = cohort()
    ctx = RunContext(n_items=2000, seed=1, clients_per_round=12, n_eligible=1000,
                     n_rounds=3, n_factors=K, biases=True)

    def run(sigma, noise):
        agg = DifferentialPrivacy(SecureAggregation(threshold, value_bound=1.0), 0.1, sigma,
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
