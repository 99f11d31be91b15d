"""scripts/learned_weighting_benchmark.py: the paper's Synthetic(1, 1) task and its α
hypergradient (Federated AD, §6, Figures 8 and 13)."""

import numpy as np
import pytest
from conftest import load_script

lw = load_script("learned_weighting_benchmark")


@pytest.fixture(scope="module")
def clients():
    return lw.make_clients(8, seed=3)


def test_the_task_is_li_et_al_synthetic(clients):
    again = lw.make_clients(8, seed=3)
    for part, again_part in zip(clients, again):
        for a, b in zip(part, again_part):
            np.testing.assert_array_equal(a, b)
    sizes = np.array([len(c[1]) + len(c[3]) for c in clients])
    assert sizes.min() >= 50 and sizes.max() > 2 * sizes.min()  # unbalanced, at least 50 each
    X, y = clients[0][0], clients[0][1]
    assert X.shape[1] == lw.DIM + 1 and np.all(X[:, -1] == 1.0)
    assert y.min() >= 0 and y.max() < lw.CLASSES


def test_the_task_has_li_et_al_synthetic_statistics():
    """Beyond shapes: the sizes are ⌊lognormal(4, 2)⌋ + 50 (median e⁴ above 50), the
    features' within-client variance falls as j^-1.2 (Σ = diag(j^-1.2)), and the clients'
    feature means spread with variance 1 + β = 2 (v_k ~ N(B_k, 1), B_k ~ N(0, β)). A task
    that drops Σ's decay, the clients' shift or the size law fails here."""
    many = lw.make_clients(300, seed=1)
    rows = [np.vstack([c[0], c[2]])[:, :lw.DIM] for c in many]
    sizes = np.array([len(r) for r in rows]) - 50
    assert np.median(sizes) == pytest.approx(np.exp(4), rel=0.3)
    within = np.mean([r.var(axis=0) for r in rows if len(r) >= 100], axis=0)
    slope = np.polyfit(np.log(np.arange(1, lw.DIM + 1)), np.log(within), 1)[0]
    assert slope == pytest.approx(-1.2, abs=0.1)
    spread = np.array([r.mean(axis=0) for r in rows]).std(axis=0).mean()
    assert spread == pytest.approx(np.sqrt(2.0), rel=0.15)


def test_the_loss_gradient_matches_finite_differences(clients):
    X, y = clients[1][0][:30], clients[1][1][:30]
    x = np.random.default_rng(0).normal(0, 0.1, (lw.DIM + 1, lw.CLASSES))
    _, g = lw.loss_and_grad(x, X, y)
    e = np.zeros_like(x)
    for i, j in [(0, 0), (5, 3), (lw.DIM, 9)]:
        e[:] = 0
        e[i, j] = 1e-6
        fd = (lw.loss_and_grad(x + e, X, y)[0] - lw.loss_and_grad(x - e, X, y)[0]) / 2e-6
        assert fd == pytest.approx(g[i, j], rel=1e-5, abs=1e-7)


def test_the_hypergradient_is_the_derivative_of_the_next_loss_over_alpha(clients):
    """Σ_i ∇L_i(x') · η ∂ū/∂α over a cohort, divided by its examples, is d/dα of the cohort's
    mean loss at x' = x + η ū(α): the quantity the learned rows step α against."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 0.1, (lw.DIM + 1, lw.CLASSES))
    updates = np.stack([lw.local_update(x, c[0], c[1], 0.01, 1, 10, rng) for c in clients])
    sizes = np.array([len(c[1]) for c in clients], float)
    eta, alpha, h = 0.7, 0.6, 1e-5

    data = [c[:2] for c in clients]

    def cohort_loss(a):
        nxt = lw.server_step(x, updates, sizes, a, eta)[0]
        return sum(lw.loss_and_grad(nxt, X, y)[0] for X, y in data) / sizes.sum()
    nxt, tangent = lw.server_step(x, updates, sizes, alpha, eta)
    hyper = lw.hypergradient(nxt, data, tangent)
    fd = (cohort_loss(alpha + h) - cohort_loss(alpha - h)) / (2 * h)
    assert hyper == pytest.approx(fd, rel=1e-4)
    assert abs(hyper) > 1e-6  # not a vacuous agreement at zero


def test_weighting_ends_are_uniform_and_by_examples():
    updates = np.arange(6.0).reshape(3, 2)
    sizes = np.array([1.0, 2.0, 7.0])
    np.testing.assert_allclose(lw.weighted_step(updates, sizes, 0.0)[0], updates.mean(0))
    np.testing.assert_allclose(lw.weighted_step(updates, sizes, 1.0)[0], sizes @ updates / 10)


def test_a_short_run_records_every_mode_and_only_learned_alpha_moves(tmp_path):
    out = lw.main(["--seeds", "1", "--clients", "12", "--cohort", "6", "--rounds", "6",
                   "--every", "3", "--hyper-lr", "0.1", "--json", str(tmp_path / "w.json")])
    rows = out["rows"]
    assert {r["mode"] for r in rows} == set(lw.MODES)
    for mode, (start, learn) in lw.MODES.items():
        path = [r["alpha"] for r in rows if r["mode"] == mode]
        assert [r["round"] for r in rows if r["mode"] == mode] == [0, 3, 6]
        assert path[0] == start
        assert (path[-1] != start) == learn, mode
        assert all(np.isfinite(r["train_loss"]) and 0 <= r["test_accuracy"] <= 1
                   for r in rows if r["mode"] == mode)
    assert (tmp_path / "w.json").exists()


@pytest.mark.parametrize("argv, match", [
    (["--cohort", "20", "--clients", "10"], "--cohort 20 is larger than --clients 10"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--hyper-lr", "nan"], "--hyper-lr must be a positive finite number"),
    (["--client-lr", "-1"], "--client-lr must be a positive finite number"),
])
def test_bad_settings_are_named(argv, match, capsys):
    with pytest.raises(SystemExit):
        lw.main(argv)
    assert match in capsys.readouterr().err
