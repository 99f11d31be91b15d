"""Expression-population simulator, CTR tools and the CTR rehearsal script (tiny sizes)."""

import json

import numpy as np
import pytest
from scipy.stats import spearmanr

from fedcf.eval import PRIOR_WEIGHTS, top_k
from fedcf.eval.ctr import click_auc, online_ctr_test, simulate_log, slate_target_probs
from fedcf.eval.simulation import make_expression_population


@pytest.fixture(scope="module")
def pop():
    return make_expression_population(20_000, {"gif": 600, "sticker": 400}, mean_shares=6,
                                      random_state=3)


def test_activity_and_popularity_tails_follow_their_parameters(pop):
    sh = pop.shares(random_state=0)
    counts = pop.activity
    assert counts.min() >= 1 and abs(counts.mean() - 6) < 1.0
    assert np.mean(counts <= 2) > 0.35  # many users share once or twice
    assert counts.max() > 20 * np.median(counts)  # and a few share a lot
    # items are shared in the order of their popularity (heavy tail)
    freq = np.bincount(sh.items, weights=sh.values, minlength=pop.n_items)
    rho = spearmanr(freq, pop.log_popularity).statistic
    assert rho > 0.7
    top = np.sort(freq)[::-1]
    assert top[: pop.n_items // 100].sum() > 0.15 * top.sum()
    # the same seed gives the same population and shares
    again = make_expression_population(20_000, {"gif": 600, "sticker": 400}, mean_shares=6,
                                       random_state=3).shares(random_state=0)
    assert np.array_equal(again.items, sh.items)


def test_click_model_and_availability(pop):
    u = np.arange(100)
    items = np.zeros(100, int)
    p0 = pop.click_probability(u, items, np.zeros(100, int))
    p3 = pop.click_probability(u, items, np.full(100, 3))
    assert np.all((0 <= p3) & (p3 < p0) & (p0 <= 1))
    avail = [len(pop.available(t)) / pop.n_users for t in range(5)]
    assert abs(np.mean(avail) - 0.2) < 0.02
    assert not np.array_equal(pop.available(0), pop.available(1))


@pytest.mark.parametrize("policy", ["uniform", "epsilon", "softmax"])
def test_logged_propensities_are_exact(pop, policy):
    scores = np.log1p(np.arange(pop.n_items)[::-1].astype(float))
    log = simulate_log(pop, np.arange(500), 200_000, policy=policy, slate_size=3, scores=scores,
                       epsilon=0.3, random_state=1)
    # the empirical frequency of an action at a position matches its recorded propensity
    # (checked for the action with the largest propensity, chosen without looking at counts)
    row = log.loc[log["propensity"].idxmax()]
    at_k = log[log.position == row.position]
    freq = np.mean(at_k.action == row.action)
    assert freq == pytest.approx(row.propensity, rel=0.1, abs=3e-4)
    assert log["propensity"].between(0, 1).all() and set(log["position"]) == {0, 1, 2}
    with pytest.raises(ValueError, match="needs context-free scores"):
        simulate_log(pop, np.arange(5), 10, policy="softmax")


def test_online_test_ranks_policies_by_true_ctr(pop):
    users = np.arange(3000)
    A = pop.affinity(users, np.tile(np.arange(pop.n_items), (len(users), 1)))
    best = top_k(A, 3)
    worst = top_k(-A, 3)
    table, lifts = online_ctr_test(pop, {"best": best, "popularity": worst}, users,
                                   n_bootstrap=200)
    assert table.loc["best", "ctr_expected"] > table.loc["popularity", "ctr_expected"]
    assert lifts.loc["best", "lift_low"] > 0
    pe = slate_target_probs(simulate_log(pop, users, 1000, random_state=0), best,
                            np.arange(len(users)))
    assert set(np.unique(pe)) <= {0.0, 1.0}
    assert click_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)


def test_ctr_simulation_script_tiny(tmp_path):
    from conftest import load_script

    mod = load_script("ctr_simulation")
    out = tmp_path / "ctr.json"
    mod.main(["--users", "3000", "--items", "300", "--rounds", "20", "--clients", "50",
              "--eval-every", "10", "--bootstrap", "20", "--no-obd", "--seeds", "2",
              "--auc-impressions", "100000", "--plot-dir", str(tmp_path), "--json", str(out)])
    res = json.loads(out.read_text())
    first, second = res["seeds"]  # the headline over seeds: the first is the detailed run
    assert (first["seed"], second["seed"]) == (0, 1)
    assert first["lift"]["fedrecon"] == res["lift"]
    assert first["auc"] == {p: x["auc"] for p, x in res["ctr"].items()}
    assert second["auc"] != first["auc"] and set(second["lift"]) == set(first["lift"])
    assert all(0 < se < 0.5 for se in second["auc_se"].values()) and second["clicks"] > 0
    assert {"lift", "lift_low", "lift_high", "ctr", "ctr_by_activity", "ctr_by_round"} <= set(res)
    assert res["lift_low"] <= res["lift"] <= res["lift_high"]
    policies = {"fedrecon", "fedrecon_biases", "fedrecon_full_negatives", "popularity", "random",
                "centralized", "centralized_biases", "fedrecon_prior"}
    assert set(res["ctr"]) == policies
    # the prior's weight is chosen on validation users from the grid, per seed
    assert first["prior_weight"] in PRIOR_WEIGHTS and len(first["prior_validation"]) == \
        len(PRIOR_WEIGHTS)
    assert set(first["auc_expected"]) == policies and all(
        0 <= a <= 1 for a in first["auc_expected"].values())
    assert {r["policy"] for r in res["lifts"]} == policies - {"popularity"}
    assert len(res["ctr_by_activity"]) == 4 * len(policies) and len(res["ctr_by_round"]) == 2
    assert sum(r["users"] for r in res["ctr_by_activity"] if r["policy"] == "random") == \
        res["setup"]["test_users"]
    assert (tmp_path / "ctr_by_round.png").exists()


@pytest.mark.parametrize("flags,named", [(["--seeds", "0"], "--seeds"),
                                         (["--auc-impressions", "0"], "--auc-impressions")])
def test_ctr_simulation_names_a_bad_flag(flags, named, capsys):
    from conftest import load_script

    with pytest.raises(SystemExit):
        load_script("ctr_simulation").main(flags)
    assert named in capsys.readouterr().err


def test_ope_study_script_tiny(tmp_path):
    from conftest import load_script

    mod = load_script("ope_study")
    out = tmp_path / "ope.json"
    res = mod.main(["--users", "2000", "--items", "200", "--rounds", "10", "--clients", "40",
                    "--sizes", "500,5000", "--logs", "4", "--candidates", "30", "--pilot", "500",
                    "--peer-size", "5000", "--json", str(out)])
    assert json.loads(out.read_text())["values"] == res["values"]
    assert len(res["rows"]) == 4 * 2 * 2 * 9  # loggings × targets × sizes × estimators
    assert res["peer"]["max_abs_difference"] < 1e-12
    assert res["values"]["uniform_candidates"] < res["values"]["greedy"]
    with pytest.raises(SystemExit):
        mod.main(["--sizes", "1001", "--slate", "5"])


def test_population_only_mode(tmp_path):
    from conftest import load_script

    mod = load_script("ctr_simulation")
    res = mod.main(["--population-only", "--users", "5000", "--items", "400", "--json",
                    str(tmp_path / "p.json")])
    assert res["users"] == 5000 and res["items"] == 400 and res["share_pairs"] > 5000
    assert json.loads((tmp_path / "p.json").read_text())["share_pairs"] == res["share_pairs"]
