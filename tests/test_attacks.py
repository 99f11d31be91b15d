"""Malicious clients (for robust aggregation) and the privacy benchmark script."""

import numpy as np
import pytest
from conftest import load_script

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated.aggregators.attacks import AttackedExecutor, attacked, malicious


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(300, 40, 5000, n_factors=3, random_state=3)


def test_the_malicious_set_is_fixed_and_about_the_fraction():
    ids = np.arange(100_000)
    bad = malicious(ids, 0.1)
    assert abs(bad.mean() - 0.1) < 0.005
    assert np.array_equal(malicious(ids[::7], 0.1), bad[::7])  # depends on the id only


@pytest.mark.parametrize("kind", ["sign_flip", "noise", "promote"])
def test_attacks_rewrite_only_the_malicious_uploads(pop, kind):
    honest = FedReconMF(n_factors=3, n_rounds=1, clients_per_round=80, random_state=0)
    run = honest._start(pop, None)
    cohort = run.select(0)
    clean = run.executor.run(cohort, run.params, np.array([0, 0], np.uint64))
    ex = AttackedExecutor(kind=kind, fraction=0.3, scale=4.0, target_item=7).bind(
        run.executor.program, run.executor.data)
    out = ex.run(cohort, run.params, np.array([0, 0], np.uint64))
    bad = malicious(cohort.clients, 0.3)
    owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
    good = ~bad[owner]
    np.testing.assert_array_equal(out.d_Q[good], clean.d_Q[good])
    if kind == "sign_flip":
        np.testing.assert_allclose(out.d_Q[~good], -4.0 * clean.d_Q[~good], rtol=1e-6)
    if kind == "promote":
        sent = out.items[~good]
        assert set(sent[sent >= 0].tolist()) <= {7}
        assert np.all(out.d_b[~good][sent >= 0] == 4.0)
    with pytest.raises(ValueError, match="attack kind must be one of"):
        AttackedExecutor(kind="bribe")


def test_a_sign_flip_attack_hurts_the_mean_more_than_the_median(pop):
    from fedcf.eval import recon_eval, user_split
    from fedcf.federated import CoordinateMedian

    tr, _, te = user_split(pop, (0.8, 0.1, 0.1), random_state=0)
    kw = dict(n_factors=3, n_rounds=30, clients_per_round=60, random_state=0)
    rmse = {}
    for name, agg in (("mean", None), ("median", CoordinateMedian())):
        m = attacked(FedReconMF(**kw, aggregator=agg), kind="sign_flip", fraction=0.1).fit(tr)
        rmse[name] = recon_eval(m, te, n_repeats=5)["rmse"]
    assert rmse["median"] < rmse["mean"]


def test_privacy_benchmark_runs_end_to_end(tmp_path):
    rows = load_script("privacy_benchmark").main([
        "--dataset", "synthetic", "--rounds", "5", "--clients", "20", "--secagg-clients", "6",
        "--factors", "3", "--leak-clients", "5", "--noise", "1.0", "2.0", "--min-cohort", "3",
        "--sum-cohorts", "2", "50", "--json",
        str(tmp_path / "p.json"), "--plot", str(tmp_path / "pu.png")])
    names = [r["name"] for r in rows]
    assert any(n.startswith("secure aggregation") for n in names)
    assert any("embedding" in n for n in names) and any(n.startswith("promote") for n in names)
    assert any("adaptive clip" in n for n in names) and any("clip 2" in n for n in names)
    plain = next(r for r in rows if r["name"] == "leakage: plain uploads (split='none')")
    assert plain["rated_set_recall"] == pytest.approx(1.0)
    attacks = [r for r in rows if "(a)" in r["name"] or "(d)" in r["name"]]
    assert len(attacks) == 2 and all(r["rated_set_recall"] < 0.5 for r in attacks)
    sums = [r for r in rows if "the sum of a cohort" in r["name"]]
    assert [r["cohort"] for r in sums] == [2, 50] and sums[0]["lift"] > sums[1]["lift"]
    assert (tmp_path / "p.json").exists()
    assert (tmp_path / "pu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _round_outputs(pop, **attack):
    run = FedReconMF(n_factors=3, n_rounds=1, clients_per_round=80, random_state=0)._start(pop,
                                                                                         None)
    cohort = run.select(0)
    ids = np.array([0, 0], np.uint64)
    clean = run.executor.run(cohort, run.params, ids)
    if not attack:
        return clean, cohort, None
    ex = AttackedExecutor(**attack).bind(run.executor.program, run.executor.data)
    return clean, cohort, ex.run(cohort, run.params, ids)


def test_hidden_promotion_adds_a_bounded_push_to_honest_uploads(pop):
    from fedcf.federated.aggregators.weighted import upload_norms

    clean, cohort, out = _round_outputs(pop, kind="promote_hidden", fraction=0.3, scale=0.5,
                                        target_item=7)
    bad = malicious(cohort.clients, 0.3)
    for k in range(out.n_clients):
        a, b = slice(clean.offsets[k], clean.offsets[k + 1]), \
            slice(out.offsets[k], out.offsets[k + 1])
        if not bad[k]:
            np.testing.assert_array_equal(out.items[b], clean.items[a])
            np.testing.assert_array_equal(out.d_Q[b], clean.d_Q[a])
            continue
        assert 7 in out.items[b]
        rows = dict(zip(out.items[b].tolist(), range(b.start, b.stop)))
        for i, j in zip(clean.items[a].tolist(), range(a.start, a.stop)):
            if i != 7:
                np.testing.assert_array_equal(out.d_Q[rows[i]], clean.d_Q[j])
        old = clean.items[a] == 7
        t = rows[7]
        push_b = out.d_b[t] - (clean.d_b[a][old].sum() if old.any() else 0.0)
        push_q = out.d_Q[t] - (clean.d_Q[a][old].sum(axis=0) if old.any() else 0.0)
        norm = np.sqrt(push_b ** 2 + push_q @ push_q)
        assert norm == pytest.approx(0.5 * upload_norms(clean)[k], rel=1e-4)


def test_foolsgold_weights_follow_the_papers_mapping():
    from fedcf.federated import ClientOutputs
    from fedcf.federated.aggregators.robust import sybil_scores

    # A, B: nothing in common; C, D: identical; E, F: cosine 0.5 (E = (1, √3)/2 on items 3, 5)
    items = np.array([0, 1, 2, 2, 3, 5, 3])
    d_Q = np.array([[1.0], [1.0], [2.0], [2.0], [1.0], [np.sqrt(3.0)], [1.0]])
    out = ClientOutputs(np.array([0, 1, 2, 3, 4, 6, 7]), items, d_Q, np.zeros(7), np.ones(6),
                        np.zeros(6))
    np.testing.assert_allclose(sybil_scores(out, np.ones(6)), [1, 1, 0, 0, 0.5, 0.5],
                               atol=1e-12)
    np.testing.assert_allclose(sybil_scores(out, np.ones(6), kappa=0.5)[4:], 0.25, atol=1e-12)
    w = np.array([1.0, 1, 1, 0, 1, 1])  # D left out (weight 0): C has no twin any more
    assert sybil_scores(out, w)[2] == 1.0


def test_foolsgold_stops_a_promotion_the_mean_lets_through():
    from fedcf.federated import FoolsGoldMean, RoundHyperparams, WeightedMean
    from fedcf.federated.aggregators.robust import sybil_scores

    pop = make_synthetic_ratings(300, 400, 6000, n_factors=3, random_state=3)
    _, cohort, out = _round_outputs(pop, kind="promote", fraction=0.2, scale=5.0, target_item=7)
    bad = malicious(cohort.clients, 0.2) & (out.weights > 0)  # an empty upload pushes nothing
    assert bad.sum() >= 2
    alpha = sybil_scores(out, np.ones(out.n_clients))
    assert np.all(alpha[bad] == 0.0) and np.mean(alpha[~bad]) > 0.5
    hp = RoundHyperparams(1.0, {}, 1.0)
    fg, mean = FoolsGoldMean()(out, hp), WeightedMean()(out, hp)
    at = lambda d: d.d_b[np.searchsorted(d.items, 7)]  # noqa: E731
    assert at(mean) > 0.5 and abs(at(fg)) < 0.1 * at(mean)
    with pytest.raises(ValueError, match="kappa"):
        FoolsGoldMean(kappa=0)


def test_foolsgold_pardons_an_honest_client_that_resembles_a_sybil():
    """FoolsGold's pardoning (cs_kj × v_k / v_j when v_j > v_k): client 2 is as similar to the
    sybil pair (0, 1) as 0.6, but its own largest similarity is below theirs, so it is pardoned
    to full weight; without the pardon it would lose a quarter of it."""
    from fedcf.federated import ClientOutputs
    from fedcf.federated.aggregators.robust import sybil_scores

    V = np.array([[1, 0, 0], [0.99, 0.141, 0], [0.6, 0.8, 0], [0, 0.6, 0.8]])
    out = ClientOutputs(np.arange(5), np.zeros(4, np.int64), V[:, :2].copy(), V[:, 2].copy(),
                        np.ones(4), np.zeros(4))

    def foolsgold(pardon):  # the paper's Algorithm 1 on the cosine similarities, by hand
        U = V / np.linalg.norm(V, axis=1)[:, None]
        cs = U @ U.T
        np.fill_diagonal(cs, 0.0)
        v = cs.max(axis=1)
        if pardon:
            cs = np.where(v[None, :] > v[:, None], cs * v[:, None] / v[None, :], cs)
        a = np.clip(1 - cs.max(axis=1), 0, 1)
        a = np.minimum(a / a.max(), 0.99)
        with np.errstate(divide="ignore"):
            return np.clip(np.log(a / (1 - a)) + 0.5, 0, 1)

    np.testing.assert_allclose(sybil_scores(out, np.ones(4)), foolsgold(True), atol=1e-12)
    assert foolsgold(False)[2] < 0.8 and sybil_scores(out, np.ones(4))[2] == 1.0
