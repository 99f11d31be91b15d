"""Federated hypergradients: the tangent kernel against its NumPy twin and against finite
differences, the whole round's hypergradient against a finite difference of the next round's
loss (same clients, same seeds), learning off = today's results, and bad input."""

import copy
from dataclasses import replace

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf import _reference as ref
from fedcf._kernels.hypergrad import fedrecon_tangent_clients
from fedcf._kernels.layout import client_cfg, sgd_hp
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import SGD, Adam, Hypergradients, Momentum, SGDReconstruction
from fedcf.federated.round.phases import server_update


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(120, 50, 3000, n_factors=3, random_state=3)


@pytest.mark.parametrize("recon", ["als", "sgd"])
@pytest.mark.parametrize("bias", [True, False])
def test_tangent_kernel_matches_twin_and_finite_differences(pop, recon, bias):
    rng = np.random.default_rng(0)
    K, H = 4, 2
    Q = rng.normal(0, 0.3, (pop.n_items, K))
    b = rng.normal(0, 0.1, pop.n_items)
    TQ, Tb = rng.normal(size=(H, pop.n_items, K)), rng.normal(size=(H, pop.n_items))
    mu = float(pop.values.mean()) if bias else 0.0
    data = (pop.indptr, pop.items, pop.values)
    clients = np.arange(0, pop.n_users, 4, dtype=np.int64)
    ids = np.array([7, 3], np.uint64)
    cfg = client_cfg("random", 0.5, recon, "uniform", 0.1, 0.1, 1e-3)
    rhp = sgd_hp(0.1, 0.01, 5, 20, 1, mu, bias)

    def run(Qx, bx):
        losses, jvp = np.empty(len(clients)), np.empty((len(clients), H))
        fedrecon_tangent_clients(data, clients, (Qx, bx), (TQ, Tb), cfg, rhp, mu, ids, losses,
                                 jvp)
        return losses, jvp

    losses, jvp = run(Q, b)
    eps = 1e-6
    fd = np.stack([(run(Q + eps * TQ[h], b + eps * Tb[h])[0]
                    - run(Q - eps * TQ[h], b - eps * Tb[h])[0]) / (2 * eps) for h in range(H)], 1)
    np.testing.assert_allclose(jvp, fd, rtol=1e-6, atol=1e-7 * np.abs(jvp).max())
    for k, u in enumerate(clients):
        s, e = pop.indptr[u], pop.indptr[u + 1]
        loss, d = ref.fedrecon_tangent_client(
            pop.items[s:e], pop.values[s:e], Q, b, TQ, Tb, seed=7, round_idx=3, client=u,
            split="random", support_fraction=0.5, recon=recon, recon_hp=rhp, init_scale=0.1,
            ridge=(0.1, 1e-3), mu=mu)
        assert loss == pytest.approx(losses[k], rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(d, jvp[k], rtol=1e-9, atol=1e-12)


def _next_loss(run, cohort, params, ids):
    """The objective of the hypergradient: the next round's query loss weighted by query size."""
    zero = (np.zeros((1, *params["Q"].shape)), np.zeros((1, params["Q"].shape[0])))
    losses, _, w = run.executor.tangents(cohort, params, zero, ids)
    return float(w @ losses / w.sum())


CASES = [("sgd", "als", ("server_learning_rate",)), ("sgd", "sgd", ("server_learning_rate",)),
         ("momentum", "als", ("server_learning_rate", "momentum")),
         ("momentum", "sgd", ("momentum",)), ("sgd", "als", ("weight_exponent",)),
         ("momentum", "als", ("weight_exponent", "server_learning_rate"))]


@pytest.mark.parametrize("opt, recon, names", CASES)
def test_round_hypergradient_matches_finite_difference(pop, opt, recon, names):
    """d/dz of round t+1's loss at x_{t+1}(z), through round t's aggregate and server step."""
    est = FedReconMF(n_factors=3, n_rounds=10, clients_per_round=30, dtype="float64",
                     reconstruction=SGDReconstruction(steps=10) if recon == "sgd" else "als",
                     server_optimizer=SGD(0.5) if opt == "sgd" else Momentum(0.2),
                     hypergradients=Hypergradients(names), random_state=0)
    est._check_params()
    run = est._start(pop, None)
    for t in range(4):
        run.round(t)
    t = 4
    ids, ids_next = np.array([run.seed, t], np.uint64), np.array([run.seed, t + 1], np.uint64)
    cohort, cohort_next = run.select(t), run.select(t + 1)
    hp0 = run.hyper.hyperparams(run.hyperparams)
    out = run.executor.run(cohort, run.params, ids)

    def step(z):
        learner = copy.deepcopy(run.hyper)
        learner.z = z
        hp = learner.hyperparams(hp0)
        delta = run.aggregator(out, hp, t)
        state, params, _ = server_update(run.opt, copy.deepcopy(run.opt_state),
                                         copy.deepcopy(run.params), delta, hp)
        return learner, hp, delta, state, params

    learner, hp, delta, state, params = step(run.hyper.z.copy())
    learner.after_step(run.opt, run.opt_state, state, delta, out, hp, params["Q"].shape)
    _, jvp, w = run.executor.tangents(cohort_next, params, learner.tangents, ids_next)
    analytic = w @ jvp / w.sum()
    for h in range(len(names)):
        eps = 1e-5
        zp, zm = run.hyper.z.copy(), run.hyper.z.copy()
        zp[h] += eps
        zm[h] -= eps
        fd = (_next_loss(run, cohort_next, step(zp)[4], ids_next)
              - _next_loss(run, cohort_next, step(zm)[4], ids_next)) / (2 * eps)
        assert analytic[h] == pytest.approx(fd, rel=1e-4, abs=1e-8), names[h]


def test_fedavg_round_hypergradient_matches_finite_difference(pop):
    from fedcf import FedAvgMF

    est = FedAvgMF(n_factors=3, n_rounds=10, clients_per_round=30, dtype="float64",
                   server_optimizer=Momentum(0.3),
                   hypergradients=Hypergradients(["server_learning_rate", "momentum"]),
                   random_state=0)
    est._check_params()
    run = est._start(pop, None)
    for t in range(3):
        run.round(t)
    t = 3
    ids, ids_next = np.array([run.seed, t], np.uint64), np.array([run.seed, t + 1], np.uint64)
    cohort, cohort_next = run.select(t), run.select(t + 1)
    hp = run.hyper.hyperparams(run.hyperparams)
    local0 = copy.deepcopy(run.local)
    out = run.executor.run(cohort, run.params, ids)  # updates the cohort's stored rows
    delta = run.aggregator(out, hp, t)

    def params_at(z):
        learner = copy.deepcopy(run.hyper)
        learner.z = z
        h = learner.hyperparams(hp)
        return server_update(run.opt, copy.deepcopy(run.opt_state), copy.deepcopy(run.params),
                             run.aggregator(out, h, t), h)

    state, params, _ = params_at(run.hyper.z.copy())
    run.hyper.after_step(run.opt, run.opt_state, state, delta, out, hp, params["Q"].shape)
    _, jvp, w = run.executor.tangents(cohort_next, params, run.hyper.tangents, ids_next)
    analytic = w @ jvp / w.sum()
    for h in range(2):
        zp, zm = run.hyper.z.copy(), run.hyper.z.copy()
        zp[h] += 1e-5
        zm[h] -= 1e-5
        fd = (_next_loss(run, cohort_next, params_at(zp)[1], ids_next)
              - _next_loss(run, cohort_next, params_at(zm)[1], ids_next)) / 2e-5
        assert analytic[h] == pytest.approx(fd, rel=1e-4, abs=1e-8)
    assert not np.array_equal(local0[0], run.local[0])  # the stored rows did train


def test_holdout_users_never_train_and_report_the_derivatives(pop):
    est = FedReconMF(n_factors=3, n_rounds=4, clients_per_round=20, random_state=0,
                     hypergradients=Hypergradients(holdout=0.25))
    est._check_params()
    run = est._start(pop, None)
    train, held = run.select.eligible, run.hyper_select.eligible
    assert not np.intersect1d(train, held).size
    assert len(held) == round(0.25 * pop.n_users) and len(train) + len(held) == pop.n_users
    seen = np.concatenate([run.select(t).clients for t in range(20)])
    assert np.isin(seen, train).all()
    assert np.isin(run.hyper_select(3).clients, held).all()
    own = FedReconMF(n_factors=3, n_rounds=6, clients_per_round=20, random_state=0,
                     hypergradients=Hypergradients(holdout=0.0)).fit(pop)
    val = FedReconMF(n_factors=3, n_rounds=6, clients_per_round=20, random_state=0,
                     hypergradients=Hypergradients(holdout=0.25)).fit(pop)
    assert own.history_[-1]["server_learning_rate"] != val.history_[-1]["server_learning_rate"]


def test_learning_off_is_todays_run_bit_for_bit(pop):
    base = dict(n_factors=3, n_rounds=8, clients_per_round=30, random_state=0)
    a = FedReconMF(**base).fit(pop)
    b = FedReconMF(**base, hypergradients=None).fit(pop)
    for m in (b,):
        np.testing.assert_array_equal(a.item_factors_, m.item_factors_)
        assert [h["loss"] for h in a.history_] == [h["loss"] for h in m.history_]
        assert not hasattr(m, "learned_hyperparams_")


def test_learned_values_are_recorded_and_move(pop):
    m = FedReconMF(n_factors=3, n_rounds=12, clients_per_round=30, random_state=0,
                   server_optimizer=Momentum(0.3),
                   hypergradients=Hypergradients(
                       ("server_learning_rate", "momentum", "weight_exponent"),
                       learning_rate=0.05)).fit(pop)
    lrs = [h["server_learning_rate"] for h in m.history_]
    assert lrs[0] == pytest.approx(0.3) and len(set(lrs)) > 5
    assert all("hypergrad_momentum" in h for h in m.history_[1:])
    assert set(m.learned_hyperparams_) == {"server_learning_rate", "momentum", "weight_exponent"}
    assert 0 < m.learned_hyperparams_["momentum"] < 1


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_each_step_goes_against_the_recorded_hypergradient(pop, optimizer):
    """A hyper step descends: with SGD every round's change of the learning rate has the sign
    opposite to that round's hypergradient; with Adam the first step does (later ones follow
    its running mean). A sign-flipped step fails this."""
    m = FedReconMF(n_factors=3, n_rounds=10, clients_per_round=30, random_state=0,
                   server_optimizer=Momentum(0.3),
                   hypergradients=Hypergradients(("server_learning_rate",), learning_rate=0.05,
                                                 optimizer=optimizer)).fit(pop)
    h = m.history_
    steps = [(h[t]["server_learning_rate"] - h[t - 1]["server_learning_rate"],
              h[t]["hypergrad_server_learning_rate"]) for t in range(1, len(h))]
    checked = steps if optimizer == "sgd" else steps[:1]
    assert all(g != 0 for _, g in checked)
    assert all(d * g < 0 for d, g in checked), checked


@pytest.mark.parametrize("kw, match", [
    (dict(learn="server_learning_rate"), "learn must be a non-empty list"),
    (dict(learn=["lr"]), "learn must be a non-empty list"),
    (dict(learn=[]), "learn must be a non-empty list"),
    (dict(learn=["server_learning_rate"] * 2), "twice"),
    (dict(learning_rate=0), "learning_rate must be a number > 0"),
    (dict(learning_rate=-1), "learning_rate must be a number > 0"),
    (dict(learning_rate=float("nan")), "learning_rate must be a number > 0"),
    (dict(learning_rate=True), "learning_rate must be a number > 0"),
    (dict(optimizer="rmsprop"), "optimizer must be 'adam' or 'sgd'"),
    (dict(holdout=0.95), r"holdout must be None or a number in \[0, 0.9\]"),
    (dict(holdout=-0.1), r"holdout must be None or a number in \[0, 0.9\]"),
    (dict(holdout="0.1"), r"holdout must be None or a number in \[0, 0.9\]"),
])
def test_bad_hypergradient_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        Hypergradients(**kw)
    with pytest.raises(ValueError, match=match):  # also when set later (GridSearchCV)
        FedReconMF(hypergradients=Hypergradients()).set_params(
            **{f"hypergradients__{k}": v for k, v in kw.items()})


@pytest.mark.parametrize("kw, err, match", [
    (dict(hypergradients=Hypergradients(["momentum"])), ValueError,
     "'momentum' needs Momentum"),
    (dict(hypergradients=Hypergradients(), server_optimizer=Adam(0.01)), ValueError,
     r"server_optimizer=Adam\(learning_rate=0.01.*can learn none"),
    (dict(hypergradients=Hypergradients(["weight_exponent"]), checkpoint_path="x.ckpt"),
     ValueError, "checkpoint_path"),
    (dict(hypergradients=["server_learning_rate"]), TypeError, "hypergradients must be one of"),
    (dict(hypergradients="yes"), ValueError, "'yes' is not a registered hypergradients"),
    (dict(hypergradients=Hypergradients), TypeError, "hypergradients must be one of"),
])
def test_bad_hyper_settings_are_named(pop, kw, err, match):
    with pytest.raises(err, match=match):
        FedReconMF(n_factors=2, n_rounds=2, **kw).fit(pop)


def test_hypergradients_by_name_and_nested_params(pop):
    m = FedReconMF(n_factors=2, n_rounds=3, random_state=0, hypergradients="default")
    m.set_params(hypergradients__learning_rate=0.05)
    assert m.hypergradients == Hypergradients(learning_rate=0.05)
    assert m.fit(pop).learned_hyperparams_.keys() == {"server_learning_rate"}


def test_fedavg_refuses_a_holdout(pop):
    from fedcf import FedAvgMF

    with pytest.raises(ValueError, match="stored user rows"):
        FedAvgMF(n_factors=2, n_rounds=2, hypergradients=Hypergradients(holdout=0.1)).fit(pop)
    FedAvgMF(n_factors=2, n_rounds=3, hypergradients=Hypergradients()).fit(pop)


def test_aggregators_refuse_learning(pop):
    from fedcf.federated import TrimmedMean

    with pytest.raises(ValueError, match="aggregator=None"):
        FedReconMF(n_factors=2, n_rounds=2, aggregator=TrimmedMean(0.1),
                   hypergradients=Hypergradients()).fit(pop)


def test_hyperparams_of_a_round_follow_the_learner():
    from fedcf.federated.algorithms.hyper import HyperLearner
    from fedcf.federated.round.phases import RoundHyperparams
    from fedcf.federated.round.reports import Reports, weighted_mean

    hp = RoundHyperparams(0.5, {"momentum": 0.9}, 1.0)
    h = HyperLearner.start(("server_learning_rate", "momentum", "weight_exponent"), hp, 0.1, "sgd")
    assert h.hyperparams(hp) == hp
    reports = Reports(np.arange(2), np.zeros(2), np.array([[1.0, -1.0, 2.0]] * 2), np.ones(2))
    h.update(weighted_mean(reports))
    new = h.hyperparams(hp)
    assert new.server_learning_rate == pytest.approx(0.5 * np.exp(-0.1))
    assert new.server_options["momentum"] > 0.9 and new.weight_exponent == pytest.approx(0.8)
    assert replace(new, server_learning_rate=0.5) != hp


def test_the_learnable_ranges_are_parameters_and_a_start_outside_is_refused(pop):
    """The ranges were fixed and undocumented: a start at 1e5 silently ran at 1e3 from round 0,
    and a huge hyper step pinned the rate at a bound with no record of it."""
    kw = dict(n_factors=3, n_rounds=3, clients_per_round=20, random_state=0)
    with pytest.raises(ValueError, match=r"server_learning_rate=100000 starts outside its "
                                         r"learnable range \[0.0001, 1000\]"):
        FedReconMF(**kw, server_optimizer=SGD(1e5),
                   hypergradients=Hypergradients()).fit(pop)
    m = FedReconMF(**kw, server_optimizer=SGD(0.5), hypergradients=Hypergradients(
        learning_rate=1e6, bounds={"server_learning_rate": (0.1, 2.0)})).fit(pop)
    rates = [h["server_learning_rate"] for h in m.history_]
    assert all(0.1 - 1e-12 <= r <= 2.0 + 1e-12 for r in rates)
    assert any(h.get("hyper_at_bound") == ["server_learning_rate"] for h in m.history_)
    for bad in ({"momentum": (0.5, 1.0)}, {"server_learning_rate": (0.0, 1.0)},
                {"lr": (1, 2)}, {"weight_exponent": (2, 1)}):
        with pytest.raises(ValueError, match="bounds"):
            Hypergradients(bounds=bad)
