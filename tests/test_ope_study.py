"""The streaming evaluator study: its kernel's statistics equal the pandas estimators on the
same log, its draws follow the policies, and its intervals cover the exact value."""

import warnings

import numpy as np
import pytest

from fedcf.eval import OverlapWarning, estimate_ctr, estimate_slate_ctr
from fedcf.eval import ope_study as st
from fedcf.eval.simulation import make_expression_population


@pytest.fixture(scope="module")
def world():
    pop = make_expression_population(300, {"gif": 40, "sticker": 20}, position_bias=(1, .7, .4),
                                     click_bias=-2.0, random_state=4)
    w = st.SlateWorld.from_population(pop, np.arange(300))
    rng = np.random.default_rng(0)
    scores = rng.normal(0, 1, (300, 60)) + np.log(w.click)
    model = st.RewardModel(rng.normal(-2, 0.5, (300, 60)).astype(np.float32),
                           np.array([0.0, -0.3, -0.6]))
    return pop, w, scores, model


def policies(world_, scores):
    slates = np.argsort(-scores, axis=1)[:, :3]
    pop_scores = np.log(world_.click.mean(axis=0))
    return {"uniform": st.uniform_logging(60, 3),
            "epsilon": st.epsilon_greedy_logging(pop_scores, 0.4, 3)}, \
        {"softmax": st.softmax_target(scores, 0.7),
         "epsilon": st.epsilon_greedy_target(slates, 0.2, 60)}


@pytest.mark.parametrize("logging_name", ["uniform", "epsilon"])
@pytest.mark.parametrize("target_name", ["softmax", "epsilon"])
def test_kernel_statistics_equal_the_pandas_estimators(world, logging_name, target_name):
    _, w, scores, model = world
    logs, targets = policies(w, scores)
    target = targets[target_name]
    qt = model.expected(target)
    log, stats = st.draw_log(w, logs[logging_name], target, model, qt, 400, seed=3)
    got = st.estimates_from_stats(stats, 400, 3).set_index("estimator")
    flat = estimate_ctr(log["reward"], log["propensity"], log["target_probs"],
                        q_logged=log["q_logged"], q_target=log["q_target"],
                        estimators=("ips", "snips", "dm", "dr"), n_bootstrap=0)
    for name in ("ips", "snips", "dm", "dr"):
        assert got.loc[name, "estimate"] == pytest.approx(flat.loc[name, "estimate"], rel=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverlapWarning)
        slate = estimate_slate_ctr(log, log["target_probs"], q_logged=log["q_logged"],
                                   q_target=log["q_target"], factored=True, factored_target=True,
                                   shrinkage=got.loc["dros", "shrinkage"])
    for ours, theirs in [("ips", "iips"), ("rips", "rips"), ("sips", "sips"), ("pi", "pi"),
                         ("cascade_dr", "cascade_dr"), ("dros", "dros")]:
        assert got.loc[ours, "estimate"] == pytest.approx(slate.loc[theirs, "estimate"],
                                                          rel=1e-9, abs=1e-12), ours
        assert got.loc[ours, "se"] == pytest.approx(slate.loc[theirs, "std"], rel=1e-6), ours
    assert got.loc["ips", "ess"] == pytest.approx(slate.loc["iips", "ess"], rel=1e-9)
    assert got.loc["ips", "max_weight"] == pytest.approx(slate.loc["iips", "max_weight"])


def test_logged_propensities_and_clicks_follow_the_policies(world):
    _, w, scores, model = world
    logs, targets = policies(w, scores)
    lp = logs["epsilon"]
    log, _ = st.draw_log(w, lp, targets["softmax"], model, model.expected(targets["softmax"]),
                         20_000, seed=1)
    np.testing.assert_array_equal(log["propensity"], lp.probs[log["position"], log["action"]])
    np.testing.assert_allclose(log["target_probs"],
                               targets["softmax"].probs[log["context"], log["action"]], rtol=1e-6)
    greedy = log["action"].to_numpy() == np.argsort(-np.log(w.click.mean(axis=0)),
                                                    kind="stable")[log["position"]]
    assert greedy.mean() == pytest.approx(0.6 + 0.4 / 60, abs=0.01)
    p_click = w.pos_bias[log["position"]] * w.click[log["context"], log["action"]]
    assert log["reward"].mean() == pytest.approx(p_click.mean(), abs=4 * np.sqrt(
        p_click.mean() / len(log)))


def test_unbiased_estimators_centre_on_the_exact_value_and_cover_it(world):
    _, w, scores, model = world
    logs, targets = policies(w, scores)
    target = targets["softmax"]
    truth = st.target_value(w, target)
    stats = st.study_stats(w, logs["uniform"], target, model, model.expected(target), 500, 200,
                           seed=5)
    est = st.estimates_from_stats(stats, 500, 3)
    for name in ("ips", "snips", "dr", "rips", "sips", "pi", "cascade_dr"):
        e = est[est.estimator == name]
        se_of_mean = e["estimate"].std() / np.sqrt(len(e))
        assert abs(e["estimate"].mean() - truth) < 4 * se_of_mean, name
        cover = np.mean((e["low"] <= truth) & (truth <= e["high"]))
        # per-position weights: normal intervals nearly hold at 500 slates (measured 0.88-0.92,
        # PI 0.84); the products of RIPS, SIPS and cascade DR are heavy-tailed and under-cover
        # there (0.4-0.7)
        if name in ("ips", "snips", "dr", "pi"):
            assert (0.8 if name == "pi" else 0.85) <= cover <= 0.99, (name, cover)
    dm = est[est.estimator == "dm"]["estimate"].mean()
    assert abs(dm - truth) > 0.05 * truth  # the random reward model is wrong, and DM with it


def test_study_is_the_same_with_one_or_two_threads(world):
    import numba

    _, w, scores, model = world
    logs, targets = policies(w, scores)
    t = targets["epsilon"]
    before = numba.get_num_threads()
    try:
        out = []
        for threads in (1, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            out.append(st.study_stats(w, logs["epsilon"], t, model, model.expected(t), 50, 6,
                                      seed=9, setting=2))
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(out[0], out[1])
    assert not np.array_equal(out[0][0], out[0][1])  # logs differ from each other


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="summing to 1"):
        st.context_free(np.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        st.softmax_target(np.zeros((2, 3)), 0.0)
    with pytest.raises(ValueError, match="epsilon must be in"):
        st.epsilon_greedy_target(np.zeros((2, 1), int), 0.0, 3)
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\]"):
        st.epsilon_greedy_logging(np.arange(5.0), 1.5, 2)
    with pytest.raises(ValueError, match="epsilon must be in"):
        st.epsilon_greedy_logging(np.arange(5.0), True, 2)
    with pytest.raises(ValueError, match="user row 1, item 2"):
        st.softmax_target(np.array([[0.0, 1, 2], [0, 1, np.nan]]), 1.0)
    with pytest.raises(ValueError, match="user row 0, item all"):
        st.softmax_target(np.full((2, 3), -np.inf), 1.0)


def test_candidate_logging_draws_only_candidates_and_exploration_follows_them(world):
    _, w, scores, model = world
    cand = np.array([3, 7, 11, 58])  # the catalog's last item (59) is not a candidate
    logging = st.uniform_logging(60, 3, support=cand)
    masked = np.where(np.isin(np.arange(60), cand), scores, -np.inf)
    slates = np.argsort(-masked, axis=1)[:, :3]
    target = st.epsilon_greedy_target(slates, 0.5, 60, support=cand)
    log, _ = st.draw_log(w, logging, target, model, model.expected(target), 5000, seed=2)
    assert set(np.unique(log["action"])) == set(cand.tolist())
    np.testing.assert_allclose(log["propensity"], 0.25)
    want = 0.5 * 0.25 + 0.5 * (slates[log["context"], log["position"]] == log["action"])
    np.testing.assert_allclose(log["target_probs"], want)
    assert st.softmax_target(masked, 1.0).probs[:, 59].max() == 0.0
    with pytest.raises(ValueError, match="support .* is empty"):
        st.uniform_logging(60, 3, support=[])


def test_a_sliced_slate_array_reaches_the_kernel_contiguous(world):
    """A target's slates cut from an argsort are strided; the kernel gets them contiguous, so
    it is compiled for one layout only (not again in each process that meets a slice)."""
    _, w, scores, _ = world
    slates = np.argsort(-scores, axis=1)[:, :3]
    assert not slates.flags.c_contiguous
    kind, _, got, eps, _ = st.epsilon_greedy_target(slates, 0.2, 60).kernel_target(60, 3)
    assert got.flags.c_contiguous and np.array_equal(got, slates) and (kind, eps) == (1, 0.2)
