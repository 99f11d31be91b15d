"""Differential privacy (clipping, dense noise, Poisson sampling, accountant) and robust
aggregators, as phase-3 aggregators of a round."""

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from fedcf import FedAvgMF, FedReconMF
from fedcf import _reference as ref
from fedcf._kernels.server import robust_sorted_runs
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    ClientOutputs,
    CoordinateMedian,
    DPGaussianMean,
    NormClippedMean,
    RoundHyperparams,
    RunContext,
    TrimmedMean,
)
from fedcf.federated.aggregators.accounting import epsilon, noise_for_epsilon

dpa = pytest.importorskip("dp_accounting")
HP = RoundHyperparams(1.0, {}, 1.0)


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(600, 80, 9000, n_factors=3, random_state=7)


# ---------------------------------------------------------------- the accountant
# TensorFlow Privacy's MNIST tutorial table (tutorials/README.md): q = 256/60000, δ = 1e-5,
# (noise multiplier, epochs) → published ε, computed with the RDP accountant and the classic
# RDP→(ε, δ) conversion ε = min_α RDP(α) + log(1/δ)/(α − 1).
PUBLISHED = [(1.12, 60, 2.92), (0.6, 30, 9.74), (1.2, 10, 1.20)]


@pytest.mark.parametrize("sigma,epochs,published", PUBLISHED)
def test_epsilon_agrees_with_published_dp_sgd_figures(sigma, epochs, published):
    q, steps, delta = 256 / 60000, int(epochs * 60000 // 256), 1e-5
    ours = epsilon(q, sigma, steps, delta)
    # fedcf reports dp-accounting's tighter conversion: never above the published bound ...
    assert 0.75 * published <= ours <= published
    # ... and the same RDP curve with the published (classic) conversion gives the figure
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))
    acc = dpa.rdp.RdpAccountant(orders=orders)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    classic = min(r + np.log(1 / delta) / (a - 1) for r, a in zip(acc._rdp, orders))
    assert classic == pytest.approx(published, abs=0.03)


def test_noise_calibration_meets_the_target():
    sigma = noise_for_epsilon(2.0, 1e-3, 500, 1e-6)
    assert epsilon(1e-3, sigma, 500, 1e-6) == pytest.approx(2.0, rel=0.01)
    assert epsilon(1e-3, sigma * 0.95, 500, 1e-6) > 2.0
    for bad in [dict(q=0.0), dict(q=1.5), dict(delta=1.0), dict(rounds=-1)]:
        args = {"q": 0.01, "rounds": 10, "delta": 1e-6, **bad}
        with pytest.raises(ValueError):
            epsilon(args["q"], 1.0, args["rounds"], args["delta"])


# ---------------------------------------------------------------- the DP aggregator
def outputs(norm_scales=(10.0, 0.5), n_items=4000, K=2):
    """Two clients: client k uploads one row (item k) of norm norm_scales[k]."""
    d_Q = np.array([[norm_scales[0], 0.0], [0.0, norm_scales[1]]])
    return ClientOutputs(np.array([0, 1, 2]), np.array([0, 1]), d_Q, np.zeros(2),
                         np.array([3.0, 5.0]), np.zeros(2))


def bound_dp(sigma, n_items=4000, biases=True, seeded=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the seeded mode's warning
        return DPGaussianMean(1.0, sigma, insecure_seeded_noise=seeded).bind(RunContext(
            n_eligible=1000, clients_per_round=10, n_rounds=5, n_items=n_items, n_factors=2,
            seed=3, biases=biases))


def test_dp_clips_each_upload_sums_equally_and_divides_by_expected_cohort():
    agg = bound_dp(1e-9)
    d = agg(outputs(), HP, 0)
    assert d.items.tolist() == list(range(4000))  # dense over the catalog
    denom = 10.0  # q·N = 10/1000 · 1000
    np.testing.assert_allclose(d.d_Q[0], [1.0 / denom, 0.0], atol=1e-6)  # clipped 10 → 1
    np.testing.assert_allclose(d.d_Q[1], [0.0, 0.5 / denom], atol=1e-6)  # below C: unchanged


def test_the_clip_covers_bias_deltas_and_duplicate_rows():
    """C bounds a client's whole contribution: bias deltas count, and k slots naming one item
    are merged before the norm is taken (else they would escape the clip by √k)."""
    agg = bound_dp(1e-9)
    bias_only = ClientOutputs(np.array([0, 1]), np.array([5]), np.zeros((1, 2)),
                              np.array([30.0]), np.array([1.0]), np.zeros(1))
    d = agg(bias_only, HP, 0)
    assert d.d_b[5] == pytest.approx(1.0 / 10.0, rel=1e-6)  # clipped 30 → C = 1
    dup = ClientOutputs(np.array([0, 4]), np.array([7, 7, 7, 7]), np.full((4, 2), 0.4),
                        np.zeros(4), np.array([4.0]), np.zeros(1))
    merged_norm = np.linalg.norm([1.6, 1.6])
    d = agg(dup, HP, 0)
    np.testing.assert_allclose(d.d_Q[7] * 10.0, [1.6 / merged_norm] * 2, rtol=1e-6)
    assert np.linalg.norm(d.d_Q[7] * 10.0) == pytest.approx(1.0, rel=1e-6)


def test_epsilon_is_that_of_the_sampler_noise_and_rounds_actually_used(pop):
    """The accountant's (q, σ, T) are the sampler's rate, the σ the aggregator noised with and
    the rounds run: ε equals a fresh dp-accounting computation from those, and the cohorts'
    mean size matches q·n."""
    m = FedReconMF(n_factors=3, n_rounds=12, clients_per_round=60, random_state=0, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(0.5, target_epsilon=6.0, delta=1e-4)).fit(pop)
    q = 60 / pop.n_users
    assert m.epsilon_ == pytest.approx(epsilon(q, m.noise_multiplier_, 12, 1e-4), rel=1e-9)
    assert [h["epsilon"] for h in m.history_] == pytest.approx(
        [epsilon(q, m.noise_multiplier_, t, 1e-4) for t in range(1, 13)], rel=1e-9)
    sizes = [h["clients_sampled"] for h in m.history_]
    assert np.mean(sizes) == pytest.approx(q * pop.n_users, abs=4 * np.sqrt(60 / 12))


@pytest.mark.parametrize("seeded", [False, True])
def test_dp_noise_covers_every_row_with_the_right_scale(seeded):
    agg = bound_dp(2.0, n_items=20000, seeded=seeded)
    d = agg(outputs(), HP, 4)
    for noise in (d.d_Q[2:], d.d_b[2:]):  # untouched rows: noise only, factors and biases
        assert noise.std() == pytest.approx(2.0 * 1.0 / 10.0, rel=0.02)
        assert abs(noise.mean()) < 0.01 and np.all(noise != 0)
    # Gaussian, not merely of the right spread: the share beyond 2σ
    assert np.mean(np.abs(d.d_Q[2:]) > 2 * 0.2) == pytest.approx(0.0455, abs=0.005)
    again = agg(outputs(), HP, 4).d_Q
    assert np.array_equal(again, d.d_Q) == seeded  # secret noise is never drawn twice
    assert not np.array_equal(agg(outputs(), HP, 5).d_Q, d.d_Q)
    assert np.all(bound_dp(2.0, biases=False)(outputs(), HP, 0).d_b == 0)


def test_a_server_that_knows_the_seed_cannot_remove_the_noise():
    """The attack of the issue: regenerate the noise from random_state and subtract it. It
    recovers the noise-free aggregate exactly in the (loudly named) seeded mode, and does no
    better than the noised aggregate itself with the default, secret noise."""
    seeded, secret_agg = bound_dp(1.0, seeded=True), bound_dp(1.0)
    noised_seeded = seeded(outputs(), HP, 7).d_Q
    regenerated = np.random.default_rng([3, 7, 0xD9]).normal(0.0, 1.0 / 10.0, (4000, 2))
    truth = noised_seeded - regenerated
    assert np.abs(truth[2:]).max() < 1e-12  # the attack works on seeded noise ...
    noised = secret_agg(outputs(), HP, 7).d_Q
    attacked = noised - regenerated
    err_noised = np.sqrt(np.mean((noised - truth) ** 2))
    err_attacked = np.sqrt(np.mean((attacked - truth) ** 2))
    assert err_noised == pytest.approx(0.1, rel=0.05)
    assert err_attacked >= 0.95 * err_noised  # ... and gains nothing on secret noise


def test_a_large_delta_is_refused_or_warned(pop):
    ctx = RunContext(n_eligible=1000, clients_per_round=10, n_rounds=5, n_items=10, n_factors=2,
                     seed=0)
    with pytest.raises(ValueError, match="must be below 1/n"):
        DPGaussianMean(1.0, 1.0, delta=1e-3).bind(ctx)
    with pytest.warns(UserWarning, match=r"above 1/\(10·n\)"):
        DPGaussianMean(1.0, 1.0, delta=5e-4).bind(ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DPGaussianMean(1.0, 1.0, delta=1e-4).bind(ctx)


def test_seeded_noise_reports_no_epsilon(pop):
    agg = DPGaussianMean(0.5, 1.0, delta=1e-4, insecure_seeded_noise=True)
    with pytest.warns(UserWarning, match="anyone who knows it can remove the noise"):
        m = FedReconMF(n_factors=3, n_rounds=3, clients_per_round=60, random_state=0, rating_scale=(1, 5),
                       aggregator=agg).fit(pop)
    assert m.epsilon_ is None and all("epsilon" not in h for h in m.history_)
    with pytest.raises(ValueError, match="insecure_seeded_noise must be True or False"):
        DPGaussianMean(0.5, 1.0, insecure_seeded_noise="yes")


def test_secret_noise_and_cohorts_do_not_follow_random_state(pop):
    kw = dict(n_factors=3, n_rounds=3, clients_per_round=60, random_state=0, rating_scale=(1, 5))
    a, b = (FedReconMF(**kw, aggregator=DPGaussianMean(0.5, 1.0, delta=1e-4)).fit(pop)
            for _ in range(2))
    assert not np.array_equal(a.item_factors_, b.item_factors_)
    assert [h["clients_sampled"] for h in a.history_] != [h["clients_sampled"]
                                                          for h in b.history_]


@pytest.mark.parametrize("secret", [True, False])
def test_poisson_cohorts_have_the_binomial_size_distribution(secret):
    """Each eligible client is in a round's cohort independently with q: sizes ~ Binomial(n, q)
    (a fixed size with jitter, or sampling without replacement, fails the variance check) and
    every client's inclusion rate is q."""
    from fedcf.federated import Selector

    n, m, rounds = 400, 20, 3000
    select = Selector(0, np.arange(n), m, poisson=True, secret=secret)
    cohorts = [select(t).clients for t in range(rounds)]
    sizes = np.array([len(c) for c in cohorts])
    q = m / n
    assert sizes.mean() == pytest.approx(n * q, rel=0.02)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.12)
    rate = np.bincount(np.concatenate(cohorts), minlength=n) / rounds
    assert abs(rate.mean() - q) < 0.002 and rate.std() < 4 * np.sqrt(q * (1 - q) / rounds)
    if secret:  # not a function of (seed, round)
        assert not all(np.array_equal(select(t).clients, c) for t, c in enumerate(cohorts[:5]))


@pytest.mark.parametrize("n,q", [(30, 0.97), (2000, 0.004), (7, 0.5)])
def test_bernoulli_positions_include_each_position_independently_with_q(n, q):
    """The geometric-gap sampler is Bernoulli(q) per position: counts ~ Binomial(n, q), every
    position (the first and the last too) at rate q."""
    from fedcf.federated.round.phases import bernoulli_positions

    rng, rounds = np.random.default_rng(5), 4000
    hits = [bernoulli_positions(n, q, rng.random) for _ in range(rounds)]
    assert all(np.all(np.diff(h) > 0) and (len(h) == 0 or 0 <= h[0] <= h[-1] < n) for h in hits)
    sizes = np.array([len(h) for h in hits])
    assert sizes.mean() == pytest.approx(n * q, rel=0.03)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.15)
    rate = np.bincount(np.concatenate(hits), minlength=n) / rounds
    sd = np.sqrt(q * (1 - q) / rounds)
    assert np.all(np.abs(rate - q) < 5 * sd)


def test_poisson_selection_draws_in_proportion_to_the_cohort_not_the_population(monkeypatch):
    """At 10⁷ eligible users and an expected cohort of 1,000, a round draws a few thousand
    uniforms (geometric gaps), not one per user."""
    from fedcf.federated import Selector
    from fedcf.federated.round import secret

    drawn = []
    real = secret.uniform
    monkeypatch.setattr(secret, "uniform", lambda size: drawn.append(size) or real(size))
    n = 10_000_000
    cohort = Selector(0, np.arange(n), 1000, poisson=True, secret=True)(0)
    assert 800 < len(cohort.clients) < 1200 and sum(drawn) < 2000


def test_fit_with_dp_records_epsilon_and_samples_by_poisson(pop):
    m = FedReconMF(n_factors=3, n_rounds=6, clients_per_round=60, random_state=0, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(0.5, target_epsilon=8.0, delta=1e-4)).fit(pop)
    eps = [h["epsilon"] for h in m.history_]
    assert all(b > a for a, b in zip(eps, eps[1:]))
    assert m.epsilon_ == pytest.approx(eps[-1]) and m.epsilon_ <= 8.0 * 1.001
    assert m.noise_multiplier_ > 0
    assert len({h["clients_sampled"] for h in m.history_}) > 1  # Poisson: the cohort size varies
    assert np.isfinite(m.item_factors_).all()


@pytest.mark.parametrize("make,match", [
    (lambda: DPGaussianMean(0.0, 1.0), "clip_norm must be a finite number > 0"),
    (lambda: DPGaussianMean(1.0, -1.0), "noise_multiplier must be a finite number > 0"),
    (lambda: DPGaussianMean(1.0), "exactly one of noise_multiplier and target_epsilon"),
    (lambda: DPGaussianMean(1.0, 1.0, delta=1.0), r"delta must be a finite number in \(0, 1\)"),
    (lambda: TrimmedMean(0.5), r"beta must be in \[0, 0.5\)"),
    (lambda: NormClippedMean(float("nan")), "clip_norm"),
])
def test_bad_aggregator_settings_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_combinations_are_refused(pop):
    with pytest.raises(ValueError, match=r"delta=0.01 must be below 1/n"):
        FedReconMF(n_rounds=1, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(1.0, 1.0, delta=0.01)).fit(pop)
    with pytest.raises(ValueError, match="oversample must be 0"):
        FedReconMF(n_rounds=1, rating_scale=(1, 5), oversample=0.2,
                   aggregator=DPGaussianMean(1.0, 1.0)).fit(pop)
    with pytest.raises(ValueError, match="'medain' is not a registered aggregator; use one of"):
        FedReconMF(n_rounds=1, aggregator="medain").fit(pop)
    with pytest.raises(TypeError, match="aggregator must be one of .* fedcf.federated.Aggregator"):
        FedReconMF(n_rounds=1, aggregator=3).fit(pop)


# ---------------------------------------------------------------- robust aggregators
def test_robust_kernel_matches_twin():
    rng = np.random.default_rng(0)
    n, K = 200, 3
    items = rng.integers(0, 12, n)
    d_Q, d_b = rng.normal(size=(n, K)), rng.normal(size=n)
    cover = np.where(rng.random(n) < 0.9, rng.random(n), 0.0)
    order = np.argsort(np.where(cover > 0, items, -1), kind="stable")
    for beta, med in [(0.0, False), (0.2, False), (0.0, True)]:
        out = (np.empty((n, K)), np.empty(n), np.empty(n, np.int64))
        m = robust_sorted_runs(order, items, d_Q, d_b, cover, beta, med, out)
        w_items, w_Q, w_b = ref.robust_rows(items, d_Q, d_b, cover, beta, med)
        assert out[2][:m].tolist() == w_items.tolist()
        np.testing.assert_allclose(out[0][:m], w_Q, rtol=1e-12)
        np.testing.assert_allclose(out[1][:m], w_b, rtol=1e-12)


def test_robust_aggregators_equal_the_mean_for_agreeing_clients_and_resist_an_outlier():
    base = np.array([[1.0, -1.0]])
    d_Q = np.repeat(base, 5, axis=0)
    out = ClientOutputs(np.arange(6), np.zeros(5, np.int64), d_Q, np.zeros(5), np.ones(5),
                        np.zeros(5))
    for agg in (TrimmedMean(0.2), CoordinateMedian()):
        np.testing.assert_allclose(agg(out, HP).d_Q, base)
    evil = dataclasses.replace(out, d_Q=np.vstack([d_Q[:4], [[-100.0, 100.0]]]))
    np.testing.assert_allclose(TrimmedMean(0.2)(evil, HP).d_Q, base)
    np.testing.assert_allclose(CoordinateMedian()(evil, HP).d_Q, base)
    clipped = NormClippedMean(np.sqrt(2))(evil, HP).d_Q[0]
    assert np.linalg.norm(clipped - base[0]) < 2 * np.sqrt(2) / 5 + 1e-9


def test_row_clip_bounds_each_clients_push_on_each_row():
    """A lone client on an item (the robust statistic is then its own value) moves that row by at
    most row_clip × its weight share; rows within the bound are untouched."""
    d_Q = np.array([[30.0, 40.0], [0.1, 0.0], [0.3, 0.0]])
    d_b = np.array([0.0, 0.0, 0.0])
    out = ClientOutputs(np.arange(4), np.array([5, 7, 7]), d_Q, d_b, np.ones(3), np.zeros(3))
    for agg in (TrimmedMean(0.2, row_clip=1.0), CoordinateMedian(row_clip=1.0)):
        delta = agg(out, HP)
        lone = delta.d_Q[delta.items.tolist().index(5)]
        np.testing.assert_allclose(lone, np.array([0.6, 0.8]) / 3)
    plain = CoordinateMedian()(out, HP)
    np.testing.assert_allclose(plain.d_Q[plain.items.tolist().index(5)], d_Q[0] / 3)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="row_clip"):
            TrimmedMean(0.1, row_clip=bad)
        with pytest.raises(ValueError, match="row_clip"):
            CoordinateMedian(row_clip=bad)


def test_accountant_composes_rounds_as_dp_accounting_does():
    import dp_accounting as dpa
    from dp_accounting import rdp

    from fedcf.federated.aggregators.accounting import RdpAccountant

    acc = RdpAccountant(1e-5)
    assert acc.epsilon() == 0.0
    for t in range(1, 301):
        acc.compose(0.05, 0.9)
        if t in (1, 7, 300):
            assert acc.epsilon() == pytest.approx(epsilon(0.05, 0.9, t, 1e-5), rel=1e-9)
    assert acc.state()["events"] == [[0.05, 0.9, 300]]
    # rounds at another sigma (a resumed run) compose as two mechanisms, not as 400 of the last
    acc.compose(0.05, 0.6, 100)
    ref = rdp.RdpAccountant()
    ref.compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(0.9)), 300)
    ref.compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(0.6)), 100)
    assert acc.epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    assert acc.epsilon() != pytest.approx(epsilon(0.05, 0.6, 400, 1e-5), rel=1e-3)
    assert RdpAccountant.from_state(acc.state()).epsilon() == acc.epsilon()
    with pytest.raises(ValueError, match="not the state of an RdpAccountant"):
        RdpAccountant.from_state({"events": []})


def test_a_resumed_dp_run_restores_the_privacy_spent(pop, tmp_path):
    kw = dict(n_factors=2, clients_per_round=20, random_state=0, rating_scale=(1, 5),
              aggregator=DPGaussianMean(1.0, 1.0))
    full = FedReconMF(n_rounds=6, **kw).fit(pop)
    ck = tmp_path / "dp.npz"
    FedReconMF(n_rounds=3, checkpoint_path=ck, **kw).fit(pop)
    resumed = FedReconMF(n_rounds=6, checkpoint_path=ck, **kw).fit(pop)
    assert resumed.epsilon_ == full.epsilon_
    assert [h["epsilon"] for h in resumed.history_] == [h["epsilon"] for h in full.history_]
    from fedcf._io import load_npz

    _, meta = load_npz(ck, meta_key="__meta__", what="checkpoint")
    assert meta["accountant"]["events"] == [[20 / pop.n_users, 1.0, 6]]


def test_resume_under_target_epsilon_with_other_rounds_is_refused(pop, tmp_path):
    """σ of a target_epsilon run is calibrated for its n_rounds: continuing a checkpoint with
    more rounds would put the target out of reach (the issue's 3.00 reported vs 3.72 true), so it
    is refused; with noise_multiplier the composed ε is that of the rounds as they ran."""
    from fedcf.federated.aggregators.accounting import RdpAccountant

    ck = tmp_path / "t.npz"
    kw = dict(n_factors=2, clients_per_round=20, random_state=0, rating_scale=(1, 5), checkpoint_path=ck)
    target = DPGaussianMean(1.0, target_epsilon=3.0, delta=1e-4)
    FedReconMF(n_rounds=3, **kw, aggregator=target).fit(pop)
    before = ck.read_bytes()
    with pytest.raises(ValueError, match="Resume with the original n_rounds"):
        FedReconMF(n_rounds=6, **kw, aggregator=target).fit(pop)
    assert ck.read_bytes() == before  # nothing lost
    m = FedReconMF(n_rounds=3, **kw, aggregator=target).fit(pop)  # same plan: accepted
    assert m.epsilon_ <= 3.0 * 1.001
    ck2 = tmp_path / "s.npz"
    kw2 = dict(kw, checkpoint_path=ck2)
    FedReconMF(n_rounds=3, **kw2, aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4)).fit(pop)
    m = FedReconMF(n_rounds=7, **kw2, aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4)).fit(pop)
    q = 20 / pop.n_users  # 3 rounds before the checkpoint, 4 after: composed as they ran
    assert m.epsilon_ == pytest.approx(RdpAccountant(1e-4, [[q, 1.0, 7]]).epsilon(), rel=1e-9)
    assert m.epsilon_ > RdpAccountant(1e-4, [[q, 1.0, 6]]).epsilon()


def test_weighted_dp_caps_weights_and_keeps_the_sensitivity():
    out = ClientOutputs(np.array([0, 1, 2]), np.array([0, 1]), np.array([[10.0, 0.0], [0.0, 0.3]]),
                        np.zeros(2), np.array([50.0, 5.0]), np.zeros(2))
    agg = DPGaussianMean(1.0, 1e-9, weight_cap=10).bind(RunContext(
        n_eligible=100, clients_per_round=10, n_rounds=1, n_items=3, n_factors=2, seed=0,
        biases=True, eligible_weights=np.full(100, 5.0)))
    d = agg(out, HP, 0)
    denom = 0.1 * 100 * 0.5  # q · Σ min(n, 10)/10 over the eligible users
    np.testing.assert_allclose(d.d_Q[0], [1.0 / denom, 0.0], atol=1e-6)  # weight capped at 1
    np.testing.assert_allclose(d.d_Q[1], [0.0, 0.5 * 0.3 / denom], atol=1e-6)  # weight 5/10


@pytest.mark.parametrize("cls", [FedReconMF, FedAvgMF])
def test_a_saved_dp_model_holds_no_user_id_seed_or_unnoised_statistic(pop, tmp_path, cls):
    """Read the file as an attacker would: a DP release carries no training user id, no user
    row, no seed and, of the history, only ε."""
    import json

    m = cls(n_factors=3, n_rounds=3, clients_per_round=60, random_state=987654321, rating_scale=(1, 5),
            aggregator=DPGaussianMean(0.5, 1.0, delta=1e-4)).fit(pop)
    path = m.save(tmp_path / "dp.npz")
    with np.load(path) as z:
        names = set(z.files)
        meta = json.loads(str(z["metadata"]))
        assert len(z["user_ids"]) == 0
    assert not names & {"user_factors_", "user_biases_", "seen_indptr", "seen_items"}
    assert meta["params"]["random_state"] is None and "987654321" not in json.dumps(meta)
    assert all(set(h) == {"epsilon"} for h in meta["history"]) and len(meta["history"]) == 3
    back = cls.load(path)
    pred = back.predict(pd.DataFrame({"user": [pop.user_ids[0]], "item": [pop.item_ids[0]]}))
    assert np.isfinite(pred).all()
    with pytest.raises(ValueError, match="outside ε"):
        m.save(tmp_path / "dp2.npz", user_ids=True)


@pytest.mark.parametrize("cls", [FedReconMF, FedAvgMF])
def test_without_dp_only_models_with_user_rows_carry_user_ids_unless_asked(pop, tmp_path, cls):
    """A FedRecon file names no training user by default (it keeps no user row); a model with
    user rows keeps them with their ids; user_ids=False drops both; a model loaded without ids
    warns that every user scores as a new user."""
    plain = cls(n_factors=3, n_rounds=2, clients_per_round=60, random_state=0).fit(pop)
    rows = cls is FedAvgMF
    default, kept, dropped = (plain.save(tmp_path / f"{k}.npz", user_ids=v) for k, v in
                              (("d", None), ("k", True), ("x", False)))
    for path, n in ((default, pop.n_users if rows else 0), (kept, pop.n_users), (dropped, 0)):
        with np.load(path) as z:
            assert len(z["user_ids"]) == n, path
            assert ("user_factors_" in z.files) == (rows and n > 0)
    pair = pd.DataFrame({"user": [pop.user_ids[0]], "item": [pop.item_ids[0]]})
    with pytest.warns(UserWarning, match="saved without its training user ids"):
        fallback = cls.load(dropped).predict(pair)
    assert fallback == pytest.approx(plain.global_mean_ + plain.item_biases_[0], abs=1e-5)
    with pytest.raises(KeyError, match="saved without its training user ids"):
        cls.load(dropped).recommend(user=pop.user_ids[0])
    if not rows:  # FedRecon with ids kept: a training user is known, their data is not
        with pytest.raises(ValueError, match="holds no user data"):
            cls.load(kept).predict(pair)
    with pytest.raises(TypeError, match="user_ids must be None, True or False"):
        plain.save(tmp_path / "bad.npz", user_ids="yes")


def test_pld_accounting_is_tighter_and_calibrates_to_the_target(pop):
    """accounting="pld": ε and the σ calibration come from dp-accounting's PLD accountant (ε
    equals a direct dp-accounting computation); the model reports both accountants' ε."""
    from fedcf.federated.aggregators.accounting import PLD_DISCRETIZATION, PldAccountant, epsilons

    q, rounds = 60 / pop.n_users, 8
    m = FedReconMF(n_factors=3, n_rounds=rounds, clients_per_round=60, random_state=0, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(0.5, target_epsilon=2.0, delta=1e-4,
                                             accounting="pld")).fit(pop)
    direct = dpa.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    direct.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(m.noise_multiplier_)), rounds)
    assert m.epsilon_ == pytest.approx(direct.get_epsilon(1e-4), rel=1e-9)
    assert 1.9 < m.epsilon_ <= 2.0 * 1.001  # calibrated by the PLD accountant, to the target
    assert m.epsilons_["pld"] == m.epsilon_ and m.epsilons_["rdp"] > m.epsilon_
    rdp = FedReconMF(n_factors=3, n_rounds=rounds, clients_per_round=60, random_state=0, rating_scale=(1, 5),
                     aggregator=DPGaussianMean(0.5, target_epsilon=2.0, delta=1e-4)).fit(pop)
    assert rdp.noise_multiplier_ > m.noise_multiplier_  # the tighter bound needs less noise
    acc = PldAccountant(1e-5)
    acc.compose(0.01, 1.0, 500)
    assert PldAccountant.from_state(acc.state()).epsilon() == acc.epsilon()
    assert epsilons(acc)["pld"] == acc.epsilon() < epsilons(acc)["rdp"]
    with pytest.raises(ValueError, match="accounting must be 'rdp' or 'pld'"):
        DPGaussianMean(0.5, 1.0, accounting="moments")


def test_every_mutant_of_the_mutation_script_still_applies():
    """scripts/mutants.py changes exact lines of the privacy code; when the code moves, the
    script must move with it (else it would test nothing)."""
    from pathlib import Path

    from conftest import load_script

    script = load_script("mutants")
    for name, rel, old, new, *tests in script.MUTANTS:
        text = (Path(script.ROOT) / rel).read_text()
        assert text.count(old) == 1 and old != new, name
        for t in tests[0] if tests else ():  # a mutant's own tests must exist
            assert (Path(script.ROOT) / t.split("::")[0]).exists(), (name, t)


def test_a_dp_release_takes_its_mean_scale_and_vocabulary_from_public_figures(pop):
    """μ, the rating scale and the item vocabulary of a DP model are public inputs, not
    statistics of the training data (which ε would not cover)."""
    kw = dict(n_factors=2, n_rounds=2, clients_per_round=60, random_state=0)
    with pytest.raises(ValueError, match="needs a public rating_scale"):
        FedReconMF(**kw, aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4)).fit(pop)
    with pytest.raises(ValueError, match=r"public_mean=7.0 is outside rating_scale=\(1.0, 5.0\)"):
        FedReconMF(**kw, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4, public_mean=7.0)).fit(pop)
    m = FedReconMF(**kw, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4)).fit(pop)
    assert m.global_mean_ == 3.0 != pytest.approx(pop.values.mean())
    assert tuple(m.rating_scale_) == (1, 5)
    m = FedReconMF(**kw, rating_scale=(1, 5),
                   aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4, public_mean=3.4)).fit(pop)
    assert m.global_mean_ == 3.4
    vocab = [*pop.item_ids.tolist(), 10**6]  # one public item no one rated
    m = FedReconMF(**kw, rating_scale=(1, 5), aggregator=DPGaussianMean(
        1.0, 1.0, delta=1e-4, public_items=vocab)).fit(pop)
    assert m.item_ids_.tolist() == vocab and m.item_factors_.shape[0] == len(vocab)
    with pytest.raises(ValueError, match=f"public_items misses a training item .*{vocab[3]}"):
        FedReconMF(**kw, rating_scale=(1, 5), aggregator=DPGaussianMean(
            1.0, 1.0, delta=1e-4, public_items=vocab[:3] + vocab[4:])).fit(pop)
    for bad, match in [(dict(public_items=[1, 1]), "appears twice"),
                       (dict(public_items=[]), "non-empty list"),
                       (dict(public_mean=float("nan")), "public_mean must be None or a finite")]:
        with pytest.raises(ValueError, match=match):
            DPGaussianMean(1.0, 1.0, **bad)


def _norm_cohort(norms):
    """One client per norm, each uploading one row of that norm (item k for client k)."""
    n = len(norms)
    return ClientOutputs(np.arange(n + 1), np.arange(n), np.c_[np.asarray(norms, float),
                                                              np.zeros(n)],
                         np.zeros(n), np.ones(n), np.zeros(n))


def test_adaptive_clipping_follows_the_target_quantile_of_upload_norms():
    """Andrew et al. 2021: C ← C·exp(−η(b̃ − γ)) reaches the γ-quantile of the norms; the
    update noise is σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)·C so that the round is accounted as σ."""
    rng = np.random.default_rng(0)
    ctx = RunContext(n_eligible=200, clients_per_round=200, n_rounds=300, n_items=200,
                     n_factors=2, seed=0)
    for gamma in (0.3, 0.7):
        agg = DPGaussianMean(0.01, 0.5, delta=1e-3, target_quantile=gamma,
                             clip_learning_rate=0.3).bind(ctx)
        clips = []
        for t in range(300):
            agg(_norm_cohort(rng.lognormal(0.0, 1.0, 200)), HP, t)
            clips.append(agg.round_stats["clip_norm"])
        want = float(np.exp(np.quantile(rng.standard_normal(200_000), gamma)))
        assert np.median(clips[-100:]) == pytest.approx(want, rel=0.15), gamma
    big = dataclasses.replace(ctx, n_items=20_000)  # enough noise draws for a 2 % check
    agg = DPGaussianMean(0.4, 1.0, delta=1e-3, target_quantile=0.5).bind(big)
    d = agg(_norm_cohort(np.full(3, 0.1)), HP, 0)
    sigma_b = 200 / 20
    sigma_update = (1.0 ** -2 - (2 * sigma_b) ** -2) ** -0.5
    assert d.d_Q[3:].std() == pytest.approx(sigma_update * 0.4 / 200, rel=0.02)
    assert agg.round_mechanism() == (1.0, 1.0) and not agg.linear


def test_adaptive_clipping_is_checked_recorded_and_survives_resume(pop, tmp_path):
    for bad, match in [(dict(target_quantile=1.5), r"target_quantile must be None or in \(0, 1\)"),
                       (dict(target_quantile=0.5, clip_learning_rate=0), "clip_learning_rate"),
                       (dict(target_quantile=0.5, clip_count_stddev=-1), "clip_count_stddev")]:
        with pytest.raises(ValueError, match=match):
            DPGaussianMean(1.0, 1.0, **bad)
    ctx = RunContext(n_eligible=100, clients_per_round=10, n_rounds=3, n_items=5, n_factors=2,
                     seed=0)
    with pytest.raises(ValueError, match="2·σ_b must exceed σ"):
        DPGaussianMean(1.0, 4.0, target_quantile=0.5, clip_count_stddev=1.0).bind(ctx)
    ck = tmp_path / "a.npz"
    kw = dict(n_factors=2, clients_per_round=60, random_state=0, rating_scale=(1, 5),
              checkpoint_path=ck, checkpoint_every=2,
              aggregator=DPGaussianMean(0.05, 1.0, delta=1e-4, target_quantile=0.5))
    first = FedReconMF(n_rounds=4, **kw).fit(pop)
    clips = [h["clip_norm"] for h in first.history_]
    assert len(set(clips)) == 4 and clips[0] == 0.05
    resumed = FedReconMF(n_rounds=6, **kw).fit(pop)
    assert [h["clip_norm"] for h in resumed.history_[:4]] == clips
    assert resumed.history_[4]["clip_norm"] != 0.05  # continued from the checkpoint's clip
    with np.load(resumed.save(tmp_path / "m.npz")) as z:
        import json

        hist = json.loads(str(z["metadata"]))["history"]
    assert all(set(h) == {"epsilon", "clip_norm"} for h in hist)


def test_under_dp_the_divergence_guard_stops_only_on_released_quantities(pop):
    """The clients' unnoised loss and their count of non-finite uploads are not covered by ε:
    under DP the guard does not stop on them (it still stops on a non-finite global model)."""
    from fedcf.federated.round.guard import STAGES, DivergenceGuard
    from fedcf.federated.round.phases import RoundSummary

    blame = dict.fromkeys(STAGES, "lower it")
    summary = RoundSummary(n_clients=5, n_used=0, n_nonfinite=5, n_nonfinite_recon=0, n_empty=0,
                           loss=1e12, worst_client=0, worst_loss=1e12)
    params = {"Q": np.zeros((2, 2))}
    loose = DivergenceGuard(1.0, blame)
    with pytest.raises(FloatingPointError, match="mean client query loss"):
        loose.check_clients(0, summary, params)
    private = DivergenceGuard(1.0, blame, released_only=True)
    for t in range(5):
        private.check_clients(t, summary, params)
    assert private.n_nonfinite == 25  # counted for the warning, never a stop
    with pytest.raises(FloatingPointError, match="non-finite after the server step"):
        private.check_server(5, False, params)
    m = FedReconMF(rating_scale=(1, 5), aggregator=DPGaussianMean(1.0, 1.0, delta=1e-4))
    assert m._guard(pop, 3.0, m._server_optimizer()).released_only
    assert not FedReconMF()._guard(pop, 3.0, m._server_optimizer()).released_only


def test_rounds_released_before_a_crash_are_composed_again_on_resume(pop, tmp_path,
                                                                       monkeypatch):
    """A crash after round 5's release and before the next checkpoint (every 3 rounds): the
    resumed run re-releases rounds 3, 4 and 5 with fresh noise, so the reported ε is that of
    a fresh accountant fed every round released — 3 + 3 + 5 = 11, not the 8 of the model."""
    from fedcf.federated.aggregators.accounting import RdpAccountant
    from fedcf.federated.round.loop import Run

    ck = tmp_path / "dp.npz"
    kw = dict(n_factors=2, clients_per_round=20, random_state=0, rating_scale=(1, 5),
              checkpoint_path=ck, checkpoint_every=3, n_rounds=8,
              aggregator=DPGaussianMean(1.0, 1.0))
    real = Run.client_work

    def crash(self, cohort, ids, hp, t):
        if t == 5:
            raise KeyboardInterrupt("the machine went down")
        return real(self, cohort, ids, hp, t)

    monkeypatch.setattr(Run, "client_work", crash)
    with pytest.raises(KeyboardInterrupt):
        FedReconMF(**kw).fit(pop)
    monkeypatch.setattr(Run, "client_work", real)
    with pytest.warns(UserWarning, match="3 rounds were released before a crash"):
        resumed = FedReconMF(**kw).fit(pop)
    fresh = RdpAccountant(1e-6)  # DPGaussianMean's δ
    fresh.compose(20 / pop.n_users, 1.0, 11)
    assert resumed.epsilon_ == pytest.approx(fresh.epsilon(), rel=1e-12)
    eight = RdpAccountant(1e-6)
    eight.compose(20 / pop.n_users, 1.0, 8)
    assert resumed.epsilon_ > eight.epsilon() * 1.01


def test_epsilon_against_the_server_is_reported_without_amplification(pop):
    """ε against a server that knows each cohort: the rounds the most-sampled user took part
    in, each at q = 1. With every user in every round it is the public ε; with q < 1 it is the
    ε of k full-participation rounds for an integer k between 1 and n_rounds, and larger than
    the amplified public ε."""
    from fedcf.federated.aggregators.accounting import RdpAccountant

    def eps(q, k):
        acc = RdpAccountant(1e-6)  # DPGaussianMean's δ
        acc.compose(q, 1.0, k)
        return acc.epsilon()

    kw = dict(n_factors=2, random_state=0, rating_scale=(1, 5), n_rounds=6,
              aggregator=DPGaussianMean(1.0, 1.0))
    everyone = FedReconMF(clients_per_round=pop.n_users, **kw).fit(pop)
    assert everyone.epsilon_server_ == pytest.approx(everyone.epsilon_, rel=1e-12)
    m = FedReconMF(clients_per_round=20, **kw).fit(pop)
    ks = [k for k in range(1, 7) if m.epsilon_server_ == pytest.approx(eps(1.0, k), rel=1e-12)]
    assert len(ks) == 1 and m.epsilon_server_ > 2 * m.epsilon_
    assert m.history_[-1]["epsilon_server"] == m.epsilon_server_
    assert all(h["epsilon_server"] >= h["epsilon"] for h in m.history_)


def test_dp_is_a_mechanism_around_a_summing_aggregator():
    """DifferentialPrivacy is not itself a mean: in the clear it wraps a ``ClippedSum`` (the
    clip rule and the fixed denominator, linear), and its release is that sum's delta plus the
    noise — from one call, or from partial sums reduced where the clients ran."""
    import warnings

    from fedcf.federated import DifferentialPrivacy, SecureAggregation, WeightedMean
    from fedcf.federated.aggregators.weighted import ClippedSum
    from fedcf.testing import CONTEXT, uploads

    agg = DPGaussianMean(0.05, 1.0, weight_cap=3.0, insecure_seeded_noise=True)
    assert not isinstance(agg, WeightedMean) and isinstance(agg.inner, ClippedSum)
    assert DifferentialPrivacy(SecureAggregation(), 0.5, 1.0).inner.secure
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bound = agg.bind(CONTEXT)
    clear = bound.inner
    assert clear.fixed_denominator == bound.denominator_ and clear.weight_cap == 3.0
    out, hp = uploads(), RoundHyperparams(1.0, {})
    got = bound(out, hp, 2)
    plain = ClippedSum(0.05, 3.0, bound.denominator_)(out, hp, 2)
    noise_only = bound.finish(dataclasses.replace(plain, items=plain.items[:0],
                                                  d_Q=plain.d_Q[:0], d_b=plain.d_b[:0]), 2)
    np.testing.assert_allclose(got.d_Q - noise_only.d_Q, _dense(plain, len(got.items)),
                               atol=1e-12)
    again = bound.reduce(bound.partials(out, hp), 2)
    np.testing.assert_array_equal(again.d_Q, got.d_Q)


def _dense(delta, n_items):
    full = np.zeros((n_items, delta.d_Q.shape[1]))
    full[delta.items] = delta.d_Q
    return full


def test_a_rounds_rdp_curve_is_computed_once_per_process(monkeypatch):
    """The round loop makes a fresh accountant every round (the server-side ε of its record);
    dp-accounting computes a (q, σ) curve once per process, not once per round (it cost
    ~0.1-0.2 s a round under DP), and ε is the same as a single composition gives."""
    from dp_accounting import rdp

    from fedcf.federated.aggregators import accounting

    monkeypatch.setattr(accounting, "_CURVES", {})
    calls, real = [], rdp.RdpAccountant.compose
    monkeypatch.setattr(rdp.RdpAccountant, "compose",
                        lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    eps = []
    for _ in range(5):
        acc = accounting.RdpAccountant(1e-5)
        acc.compose(1.0, 1.3, 7)
        eps.append(acc.epsilon())
    assert len(calls) == 1 and len(set(eps)) == 1
    monkeypatch.setattr(rdp.RdpAccountant, "compose", real)
    assert eps[0] == pytest.approx(accounting.epsilon(1.0, 1.3, 7, 1e-5), rel=1e-12)
    with pytest.raises(ValueError):  # the cached curve is shared: nobody may change it
        accounting.rdp_curve(1.0, 1.3)[1][0] = 0.0
