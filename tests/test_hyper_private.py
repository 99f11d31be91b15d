"""Hypergradients that stay sums: the reports' mean under secure aggregation (the server's
transcript holds masked vectors only) and under differential privacy (clipped, noised from the
OS, divided by the expected cohort, and composed into ε), against exactly what the docs say."""

import warnings

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    SGD,
    DifferentialPrivacy,
    DPGaussianMean,
    Hypergradients,
    RunContext,
    SecureAggregation,
    TrimmedMean,
)
from fedcf.federated.aggregators.accounting import RdpAccountant
from fedcf.federated.aggregators.secagg_protocol import SecAggServer
from fedcf.federated.round import reports as rep


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(240, 40, 6000, n_factors=3, random_state=5)


def _reports(m=12, H=3, seed=0):
    rng = np.random.default_rng(seed)
    jvp = rng.normal(0, 1.0, (m, H))
    jvp[0] *= 50.0  # far above the clip
    w = rng.integers(1, 40, m).astype(float)
    losses = rng.random(m)
    w[1] = 0.0  # no query set
    losses[2] = np.nan  # a non-finite report
    return rep.Reports(np.arange(100, 100 + m), losses, jvp, w)


def _context(**kw):
    base = dict(n_eligible=200, clients_per_round=12, n_rounds=5, n_items=30, n_factors=3,
                seed=7)
    return RunContext(**{**base, **kw})


def test_secure_report_mean_is_the_clipped_capped_weighted_mean_and_the_server_sees_masks(
        monkeypatch):
    """The server half learns only the masked vectors and their sum; the sum it unmasks is the
    mean of the clients' clipped reports weighted by min(n, W)/W, the unusable ones left out.
    A report mean computed in the clear would leave the transcript empty and fail here."""
    r, clip, W = _reports(), 0.8, 20.0
    seen = []
    real = SecAggServer.collect_inputs

    def spy(self, inputs):
        seen.append({i.client: np.asarray(i.y, np.uint32).copy() for i in inputs})
        return real(self, inputs)

    monkeypatch.setattr(SecAggServer, "collect_inputs", spy)
    agg = SecureAggregation(min_cohort=5, max_weight=W).bind(_context())
    got = agg.report_mean(r, clip, 3)
    ok = r.usable()
    weight = np.minimum(r.weights[ok], W) / W
    want = weight @ rep.clipped(r.jvp[ok], clip) / weight.sum()
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert not np.allclose(got, rep.weighted_mean(r), atol=1e-3)  # the clip did bind
    enc = agg.report_encoding(len(r.clients), 3, clip, 3)
    plain = enc.encode(r)
    assert len(seen) == 1 and set(seen[0]) == set(int(c) for c in r.clients)
    for k, c in enumerate(r.clients):  # what reached the server is not the client's row
        assert not np.array_equal(seen[0][int(c)], plain[k])
    assert agg.report_stats == {"hyper_secagg_lost_round": False,
                                "hyper_secagg_survivors": len(r.clients),
                                "hyper_rounding_error": pytest.approx(0.0, abs=1e-6)}


def test_a_reporting_cohort_below_min_cohort_releases_nothing():
    r = _reports(m=4)
    agg = SecureAggregation(min_cohort=5).bind(_context())
    assert agg.report_mean(r, 1.0, 0) is None
    assert agg.report_stats["hyper_secagg_lost_round"]


@pytest.mark.parametrize("secure", [False, True], ids=["clear", "secagg"])
def test_dp_report_is_the_clipped_equal_weight_sum_over_the_expected_cohort_plus_noise(secure):
    """With seeded noise (so the test can regenerate it): report − noise = Σ clip(g_k) / (q·N),
    every usable client weighing 1, whatever its query size. Skipping the clip, weighing by
    query size or dividing by the cohort's actual size fails here."""
    r, clip = _reports(), 0.7
    inner = SecureAggregation(min_cohort=5) if secure else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        agg = DifferentialPrivacy(inner, 0.5, 1.3, insecure_seeded_noise=True).bind(
            _context(reports="cohort"))
    got = agg.report_mean(r, clip, 4)
    expected_cohort = 12 / 200 * 200
    assert agg.report_denominator_ == pytest.approx(expected_cohort)
    noise = rep.dp_noise(3, 1.3 * clip / expected_cohort, False, (7, 4))
    want = rep.clipped(r.jvp[r.usable()], clip).sum(axis=0) / expected_cohort
    np.testing.assert_allclose(got - noise, want, atol=1e-6)


def test_dp_report_noise_is_secret_and_has_the_documented_scale():
    """σ·C / (q·N) per value, from the OS: two calls on the same reports differ, and the spread
    over many calls matches (dropping the noise or halving σ fails)."""
    r = rep.Reports(np.arange(5), np.zeros(5), np.zeros((5, 4)), np.ones(5))
    agg = DPGaussianMean(0.5, noise_multiplier=2.0).bind(_context(reports="cohort"))
    draws = np.array([agg.report_mean(r, 0.25, 0) for _ in range(1500)])
    assert not np.array_equal(draws[0], draws[1])
    std = 2.0 * 0.25 / agg.report_denominator_
    assert draws.std() == pytest.approx(std, rel=0.06)
    assert abs(draws.mean()) < 5.3 * std / np.sqrt(draws.size)


def _run(est, pop):
    est._check_params()
    return est._start(pop, None)


@pytest.mark.parametrize("holdout", [0.0, 0.25], ids=["cohort", "holdout"])
def test_epsilon_composes_the_reports_with_the_update(pop, holdout):
    """Reports from the round's own cohort: one Gaussian of multiplier σ/√2 per round at q;
    from held-out users: (q, σ) and (q_h, σ) per round. The run's ε is exactly that
    accountant's, and above the ε of the same run without learning (halving σ, or leaving
    the reports out of the accountant, fails here)."""
    kw = dict(n_factors=3, n_rounds=5, clients_per_round=20, random_state=0, rating_scale=(1, 5),
              aggregator=DPGaussianMean(0.5, noise_multiplier=1.5, delta=1e-5))
    m = FedReconMF(**kw, hypergradients=Hypergradients(holdout=holdout))
    run = _run(m, pop)
    m.fit(pop)
    plain = FedReconMF(**kw).fit(pop)
    q = 20 / len(run.select.eligible)
    acc = RdpAccountant(1e-5)
    if holdout:
        acc.compose(q, 1.5, 5)
        acc.compose(min(1.0, 20 / len(run.hyper_select.eligible)), 1.5, 5)
    else:
        acc.compose(q, 1.5 / np.sqrt(2), 5)
    assert m.epsilon_ == pytest.approx(acc.epsilon(), rel=1e-9)
    assert m.epsilon_ > plain.epsilon_


def test_target_epsilon_holds_with_the_reports(pop):
    for holdout in (0.0, 0.25):
        m = FedReconMF(n_factors=3, n_rounds=4, clients_per_round=20, random_state=0,
                       rating_scale=(1, 5), hypergradients=Hypergradients(holdout=holdout),
                       aggregator=DPGaussianMean(0.5, target_epsilon=3.0, delta=1e-5)).fit(pop)
        assert 2.9 < m.epsilon_ <= 3.0 + 1e-3


def test_under_dp_the_holdout_is_per_user_and_its_cohorts_poisson_and_secret(pop):
    """One user more or less leaves every other user's side as it was (a hash of its id); the
    held-out cohorts are Poisson from the OS's generator, as the accountant assumes."""
    agg = DPGaussianMean(0.5, noise_multiplier=1.0)
    est = FedReconMF(n_factors=3, n_rounds=3, clients_per_round=20, random_state=0,
                     rating_scale=(1, 5), aggregator=agg,
                     hypergradients=Hypergradients(holdout=0.3))
    run = _run(est, pop)
    assert run.hyper_select.poisson and run.hyper_select.secret
    held = set(pop.user_ids[run.hyper_select.eligible])
    assert 0.2 < len(held) / pop.n_users < 0.4
    fewer = pop.subset_users(np.arange(1, pop.n_users))
    run2 = _run(est, fewer)
    assert set(fewer.user_ids[run2.hyper_select.eligible]) == held - {pop.user_ids[0]}
    a, b = (set(run.hyper_select(3).clients) for _ in range(2))
    assert a != b or len(a) == 0


def test_dp_runs_with_learning_differ_unless_the_noise_is_seeded(pop):
    kw = dict(n_factors=3, n_rounds=4, clients_per_round=20, random_state=0, rating_scale=(1, 5),
              server_optimizer=SGD(1.0), hypergradients=Hypergradients(learning_rate=0.1))
    a, b = (FedReconMF(**kw, aggregator=DPGaussianMean(0.5, noise_multiplier=1.0)).fit(pop)
            for _ in range(2))
    assert a.learned_hyperparams_ != b.learned_hyperparams_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        c, d = (FedReconMF(**kw, aggregator=DPGaussianMean(
            0.5, noise_multiplier=1.0, insecure_seeded_noise=True)).fit(pop) for _ in range(2))
    assert c.learned_hyperparams_ == d.learned_hyperparams_
    assert all("hyper_values_up" not in h for h in a.history_)  # the cohort size stays out


def test_secure_learning_follows_the_plain_run_and_never_takes_a_report_in_the_clear(
        pop, monkeypatch):
    """Under secure aggregation the learned rate is the plain run's (quantization apart)
    while the weighted mean in the clear is never called."""
    kw = dict(n_factors=3, n_rounds=4, clients_per_round=12, random_state=0,
              server_optimizer=SGD(1.0),
              hypergradients=Hypergradients(learning_rate=0.1, holdout=0.0, clip_norm=10.0))
    plain = FedReconMF(**kw).fit(pop)

    def refuse(reports):
        raise AssertionError("a report mean was taken in the clear")

    monkeypatch.setattr("fedcf.federated.aggregators.weighted.weighted_mean", refuse)
    m = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5, max_weight=60.0)).fit(pop)
    got = [h["hypergrad_server_learning_rate"] for h in m.history_[1:]]
    want = [h["hypergrad_server_learning_rate"] for h in plain.history_[1:]]
    np.testing.assert_allclose(got, want, rtol=5e-3)  # the model's rounding apart
    assert min(abs(g) for g in got) > 1e-4
    assert all(not h["hyper_secagg_lost_round"] for h in m.history_[1:])


def test_secure_sums_carry_the_exponent_derivative():
    """Under secure aggregation learning α, the masked sums give ∂Δ̄/∂α: equal (to the
    fixed-point step) to the plain mean's derivative from every upload, when no weight
    reaches the cap W. Leaving s' out of the encoding fails here."""
    from fedcf.federated.algorithms.hyper import exponent_derivative
    from fedcf.federated.round.phases import ClientOutputs, RoundHyperparams

    rng = np.random.default_rng(3)
    m, n_items, K = 12, 30, 3
    per = rng.integers(1, 6, m)
    offsets = np.concatenate([[0], np.cumsum(per)])
    items = np.concatenate([rng.choice(n_items, k, replace=False) for k in per])
    out = ClientOutputs(offsets, items, rng.normal(0, 0.1, (len(items), K)),
                        rng.normal(0, 0.1, len(items)), rng.integers(1, 40, m).astype(float),
                        rng.random(m))
    hp = RoundHyperparams(1.0, {}, weight_exponent=0.7)
    agg = SecureAggregation(min_cohort=5, max_weight=100.0).bind(
        _context(n_items=n_items, n_factors=K, learns_exponent=True))
    delta = agg(out, hp, 0)
    got_items, got_q, got_b = delta.exponent_terms
    want_items, want_q, want_b = exponent_derivative(out, hp)
    dense_q, dense_b = np.zeros((n_items, K)), np.zeros(n_items)
    dense_q[want_items], dense_b[want_items] = want_q, want_b
    np.testing.assert_array_equal(got_items, np.arange(n_items))
    np.testing.assert_allclose(got_q, dense_q, atol=1e-5)
    np.testing.assert_allclose(got_b, dense_b, atol=1e-5)
    assert np.abs(dense_q).max() > 1e-3
    plain = SecureAggregation(min_cohort=5, max_weight=100.0).bind(
        _context(n_items=n_items, n_factors=K))
    assert plain(out, hp, 0).exponent_terms is None


def test_the_secure_exponent_derivative_respects_the_weight_cap():
    """With weights n^α above the public cap W, the secure mean weighs those clients by W, a
    constant in α: the masked sums' ∂Δ̄/∂α equals the derivative (central differences in float)
    of Σ min(n^α, W) Δ / Σ min(n^α, W). A derivative that ignores the cap fails here."""
    from fedcf.federated.round.phases import ClientOutputs, RoundHyperparams

    rng = np.random.default_rng(5)
    m, n_items, K, alpha, cap = 14, 20, 2, 0.7, 8.0
    per = rng.integers(1, 5, m)
    offsets = np.concatenate([[0], np.cumsum(per)])
    items = np.concatenate([rng.choice(n_items, k, replace=False) for k in per])
    n = rng.integers(1, 40, m).astype(float)
    assert (n ** alpha > cap).sum() >= 3 and (n ** alpha < cap).sum() >= 3
    out = ClientOutputs(offsets, items, rng.normal(0, 0.1, (len(items), K)),
                        rng.normal(0, 0.1, len(items)), n, rng.random(m))
    agg = SecureAggregation(min_cohort=5, max_weight=cap).bind(
        _context(n_items=n_items, n_factors=K, learns_exponent=True))
    got_items, got_q, got_b = agg(out, RoundHyperparams(1.0, {}, weight_exponent=alpha),
                                  0).exponent_terms

    def capped_mean(a):
        w = np.minimum(n ** a, cap)
        q, b = np.zeros((n_items, K)), np.zeros(n_items)
        for k in range(m):
            lo, hi = offsets[k], offsets[k + 1]
            q[items[lo:hi]] += w[k] * out.d_Q[lo:hi]
            b[items[lo:hi]] += w[k] * out.d_b[lo:hi]
        return q / w.sum(), b / w.sum()
    h = 1e-6
    (q1, b1), (q0, b0) = capped_mean(alpha + h), capped_mean(alpha - h)
    np.testing.assert_array_equal(got_items, np.arange(n_items))
    np.testing.assert_allclose(got_q, (q1 - q0) / (2 * h), atol=2e-5)
    np.testing.assert_allclose(got_b, (b1 - b0) / (2 * h), atol=2e-5)


def test_secure_learning_of_the_exponent_follows_the_plain_run(pop):
    kw = dict(n_factors=3, n_rounds=4, clients_per_round=12, random_state=0,
              hypergradients=Hypergradients(["weight_exponent"], learning_rate=0.1,
                                            holdout=0.0, clip_norm=10.0))
    plain = FedReconMF(**kw).fit(pop)
    m = FedReconMF(**kw, aggregator=SecureAggregation(min_cohort=5, max_weight=200.0)).fit(pop)
    got = [h["hypergrad_weight_exponent"] for h in m.history_[1:]]
    want = [h["hypergrad_weight_exponent"] for h in plain.history_[1:]]
    np.testing.assert_allclose(got, want, rtol=2e-2)
    assert min(abs(g) for g in got) > 1e-5


@pytest.mark.parametrize("agg, match", [
    (TrimmedMean(0.1), "summing aggregator"),
    (DPGaussianMean(0.5, noise_multiplier=1.0), "weight_exponent needs the weighted mean"),
])
def test_what_cannot_learn_is_refused_with_the_reason(pop, agg, match):
    learn = ["weight_exponent"] if "exponent" in match else ["server_learning_rate"]
    with pytest.raises(ValueError, match=match):
        FedReconMF(n_factors=2, n_rounds=2, rating_scale=(1, 5), aggregator=agg,
                   hypergradients=Hypergradients(learn)).fit(pop)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True])
def test_a_bad_report_clip_is_named(bad):
    with pytest.raises(ValueError, match="clip_norm"):
        Hypergradients(clip_norm=bad)


def test_a_report_clip_too_large_for_the_fixed_point_sum_is_named():
    agg = SecureAggregation(min_cohort=5).bind(_context())
    with pytest.raises(ValueError, match=r"hypergradients__clip_norm=1e\+12 with 12 clients "
                                         r"does not fit a 32-bit sum; lower it"):
        agg.report_mean(_reports(), 1e12, 0)
    with pytest.raises(ValueError, match="value_bound=1e\\+12 with 12 clients does not fit"):
        SecureAggregation(min_cohort=5, value_bound=1e12).bind(_context()).encoding(12).scales()


@pytest.mark.parametrize("clip, max_weight, jvp_scale", [(1.0, 100.0, 1.0), (50.0, 1e4, 0.01)])
def test_the_reports_rounding_error_estimate_is_what_rounding_costs(clip, max_weight, jvp_scale):
    """``rounding_error`` (what the server records and warns above 5 %) tracks the relative
    error rounding really leaves in the decoded sum, over many draws."""
    rng = np.random.default_rng(0)
    m, H = 100, 2
    enc = rep.ReportEncoding(H, m, clip, max_weight)
    actual, estimated = [], []
    for _ in range(30):
        r = rep.Reports(np.arange(m), rng.random(m), rng.normal(0, jvp_scale, (m, H)),
                        rng.integers(5, 40, m).astype(float))
        exact = enc.rows(r)[:, :H].sum(axis=0)
        total = enc.encode(r).astype(np.uint64).sum(axis=0) % 2 ** rep.MOD_BITS
        got = enc.decode(total)[0]
        actual.append(np.linalg.norm(got - exact) / np.linalg.norm(exact))
        estimated.append(enc.rounding_error(got, m))
    ratio = np.mean(actual) / np.mean(estimated)
    assert 0.5 < ratio < 2.0, (np.mean(actual), np.mean(estimated))
    assert (np.mean(estimated) > 0.05) == (max_weight > 1e3)  # the tiny-weight case is flagged


def test_a_fit_whose_secure_reports_round_away_warns_and_records_it(pop):
    kw = dict(n_factors=3, n_rounds=4, clients_per_round=30, random_state=0)
    with pytest.warns(RuntimeWarning, match="hypergradient reports lose about .* rounding"):
        m = FedReconMF(hypergradients=Hypergradients(clip_norm=100.0),
                       aggregator=SecureAggregation(max_weight=1e5), **kw).fit(pop)
    assert max(h.get("hyper_rounding_error", 0) for h in m.history_) > 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        FedReconMF(hypergradients=Hypergradients(), aggregator=SecureAggregation(), **kw).fit(pop)
