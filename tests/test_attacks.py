"""Malicious clients (for robust aggregation) and the privacy benchmark script."""

import numpy as np
import pytest
from conftest import load_script

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated.attacks import AttackedExecutor, attacked, malicious


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
    ex = AttackedExecutor(run.executor.program, run.executor.data, kind=kind, fraction=0.3,
                          scale=4.0, target_item=7)
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
        AttackedExecutor(run.executor.program, run.executor.data, kind="bribe")


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
        "--factors", "3", "--leak-clients", "5", "--noise", "1.0", "2.0", "--json",
        str(tmp_path / "p.json"), "--plot", str(tmp_path / "pu.png")])
    names = [r["name"] for r in rows]
    assert any(n.startswith("secure aggregation") for n in names)
    assert any("embedding" in n for n in names) and any(n.startswith("promote") for n in names)
    plain = next(r for r in rows if r["name"] == "leakage: plain uploads (split='none')")
    assert plain["rated_set_recall"] == pytest.approx(1.0)
    assert (tmp_path / "p.json").exists()
    assert (tmp_path / "pu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
