"""Slate off-policy estimators: each against its paper's formula on logs enumerated by hand, the
reward structures under which each is (and is not) unbiased, diagnostics, and bad logs."""

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from fedcf.datasets import DataValidationError
from fedcf.eval import (
    OverlapWarning,
    check_propensity_sums,
    estimate_slate_ctr,
    target_support,
    weight_diagnostics,
)

MU = np.array([[0.6, 0.4], [0.3, 0.7]])  # logging: position k shows action a with MU[k, a]
PI = np.array([[0.2, 0.8], [0.9, 0.1]])  # target, factored the same way
Q_ROWS = np.array([[0.3, 0.1], [0.2, 0.5]])  # a reward model q̂(a, k)


def additive(s):  # position-based: each position's reward depends on its own action only
    return [0.1 + 0.3 * s[0], 0.05 + 0.4 * s[1]]


def cascade(s):  # position 2 depends on what position 1 showed
    return [0.1 + 0.3 * s[0], 0.05 + 0.4 * s[1] * (s[0] == 0)]


def interacting(s):  # position 1 depends on what position 2 shows (not a cascade)
    return [0.1 + 0.3 * s[0] * s[1], 0.05 + 0.4 * s[1]]


def exact_log(reward_fn, scale=1000):
    """Every 2-slot slate in proportion to its logging probability (weights as row counts) with
    its expected rewards: the estimators' expectations, not draws."""
    rows, sid = [], 0
    for s in itertools.product(range(2), repeat=2):
        count = int(round(scale * MU[0, s[0]] * MU[1, s[1]]))
        for _ in range(count):
            for k in range(2):
                rows.append({"slate_id": sid, "position": k, "action": s[k],
                             "reward": reward_fn(s)[k], "propensity": MU[k, s[k]]})
            sid += 1
    return pd.DataFrame(rows)


def truth(reward_fn):
    return sum(PI[0, s[0]] * PI[1, s[1]] * np.mean(reward_fn(s))
               for s in itertools.product(range(2), repeat=2))


def target_of(log):
    pe = PI[log["position"], log["action"]]
    q_log = Q_ROWS[log["action"], log["position"]]
    q_tgt = (PI * Q_ROWS.T).sum(axis=1)[log["position"]]
    return pe, q_log, q_tgt


def estimates(log, **kw):
    pe, q_log, q_tgt = target_of(log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverlapWarning)
        return estimate_slate_ctr(log, pe, q_logged=q_log, q_target=q_tgt, factored=True,
                                  factored_target=True, shrinkage=1e12, **kw)["estimate"]


@pytest.mark.parametrize("reward_fn,unbiased,biased", [
    (additive, ["iips", "rips", "sips", "pi", "cascade_dr", "dros"], []),
    (cascade, ["rips", "sips", "cascade_dr"], ["iips", "pi"]),
    (interacting, ["sips"], ["iips", "rips", "pi", "cascade_dr"]),
])
def test_each_estimator_is_unbiased_exactly_where_its_paper_says(reward_fn, unbiased, biased):
    est = estimates(exact_log(reward_fn))
    v = truth(reward_fn)
    for name in unbiased:
        assert est[name] == pytest.approx(v, abs=1e-12), name
    for name in biased:
        assert abs(est[name] - v) > 1e-3, name


def test_formulas_on_two_slates_by_hand():
    log = pd.DataFrame({"slate_id": ["a", "a", "b", "b"], "position": [0, 1, 0, 1],
                        "action": [1, 0, 0, 1], "reward": [1.0, 0.0, 0.0, 1.0],
                        "propensity": [0.4, 0.3, 0.6, 0.7]})
    pe = np.array([0.8, 0.9, 0.2, 0.1])
    w = pe / log["propensity"].to_numpy()  # 2, 3, 1/3, 1/7
    ql, qt = np.array([0.3, 0.2, 0.1, 0.5]), np.array([0.25, 0.4, 0.25, 0.4])
    est = estimate_slate_ctr(log, pe, q_logged=ql, q_target=qt, factored=True,
                             factored_target=True, shrinkage=0.5, min_ess=0)["estimate"]
    iips = ((w[0] * 1 + w[1] * 0) / 2 + (w[2] * 0 + w[3] * 1) / 2) / 2
    rips = ((w[0] * 1 + w[0] * w[1] * 0) / 2 + (w[2] * 0 + w[2] * w[3] * 1) / 2) / 2
    sips = (w[0] * w[1] * 1 / 2 + w[2] * w[3] * 1 / 2) / 2
    pi = ((w[0] + w[1] - 1) * 1 / 2 + (w[2] + w[3] - 1) * 1 / 2) / 2
    cdr = ((w[0] * (1 - ql[0]) + qt[0] + w[0] * w[1] * (0 - ql[1]) + w[0] * qt[1]) / 2
           + (w[2] * (0 - ql[2]) + qt[2] + w[2] * w[3] * (1 - ql[3]) + w[2] * qt[3]) / 2) / 2
    wh = 0.5 * w / (w * w + 0.5)
    r = log["reward"].to_numpy()
    dros = ((qt[0] + wh[0] * (r[0] - ql[0]) + qt[1] + wh[1] * (r[1] - ql[1])) / 2
            + (qt[2] + wh[2] * (r[2] - ql[2]) + qt[3] + wh[3] * (r[3] - ql[3])) / 2) / 2
    for name, want in [("iips", iips), ("rips", rips), ("sips", sips), ("pi", pi),
                       ("cascade_dr", cdr), ("dros", dros)]:
        assert est[name] == pytest.approx(want, abs=1e-12), name


def test_row_order_does_not_matter_and_slates_are_not_independent_rows():
    log = exact_log(additive, scale=200)
    pe, ql, qt = target_of(log)
    perm = np.random.default_rng(0).permutation(len(log))
    a = estimate_slate_ctr(log, pe, q_logged=ql, q_target=qt, factored=True,
                           factored_target=True, min_ess=0)
    b = estimate_slate_ctr(log.iloc[perm], pe[perm], q_logged=ql[perm], q_target=qt[perm],
                           factored=True, factored_target=True, min_ess=0)
    pd.testing.assert_frame_equal(a, b)
    assert (a["n_slates"] == log["slate_id"].nunique()).all()


def test_given_joint_propensities_equal_the_factored_products():
    log = exact_log(cascade, scale=100)
    pe, ql, qt = target_of(log)
    sid = log["slate_id"].to_numpy()
    log2 = log.copy()
    log2["cascade_propensity"] = log.groupby("slate_id")["propensity"].cumprod()
    log2["slate_propensity"] = log2.groupby("slate_id")["cascade_propensity"].transform("last")
    tc = pd.Series(pe).groupby(sid).cumprod().to_numpy()
    ts = pd.Series(tc).groupby(sid).transform("last").to_numpy()
    kw = dict(q_logged=ql, q_target=qt, min_ess=0, estimators=("rips", "sips", "cascade_dr"))
    a = estimate_slate_ctr(log, pe, factored=True, factored_target=True, **kw)
    b = estimate_slate_ctr(log2, pe, target_cascade=tc, target_slate=ts, **kw)
    np.testing.assert_allclose(a["estimate"], b["estimate"], rtol=1e-12)


def test_slate_estimators_converge_on_sampled_logs_and_intervals_cover():
    rng = np.random.default_rng(1)
    n = 20_000
    acts = np.stack([rng.random(n) < MU[k, 1] for k in range(2)], axis=1).astype(int)
    r_exp = np.array([additive(s) for s in acts])
    r = (rng.random(r_exp.shape) < r_exp).astype(float)
    log = pd.DataFrame({"slate_id": np.repeat(np.arange(n), 2), "position": np.tile([0, 1], n),
                        "action": acts.ravel(), "reward": r.ravel(),
                        "propensity": MU[np.tile([0, 1], n), acts.ravel()]})
    pe, ql, qt = target_of(log)
    est = estimate_slate_ctr(log, pe, q_logged=ql, q_target=qt, factored=True,
                             factored_target=True)
    v = truth(additive)
    for name, row in est.iterrows():
        assert row["low"] <= v <= row["high"], (name, row["low"], v, row["high"])
    # the slate as one action has the widest interval (the reason slate estimators exist)
    assert est.loc["sips", "std"] > est.loc["iips", "std"]
    boot = estimate_slate_ctr(log, pe, q_logged=ql, q_target=qt, factored=True,
                              factored_target=True, interval="bootstrap", n_bootstrap=200)
    np.testing.assert_allclose(boot["std"], est["std"], rtol=0.25)


def test_shrinkage_is_chosen_and_recorded():
    log = exact_log(additive, scale=200)
    pe, ql, qt = target_of(log)
    est = estimate_slate_ctr(log, pe, q_logged=ql, q_target=qt, factored=True,
                             factored_target=True, min_ess=0)
    assert np.isfinite(est.loc["dros", "shrinkage"]) and est.loc["dros", "shrinkage"] > 0
    assert np.isnan(est.loc["iips", "shrinkage"])


def test_weight_diagnostics_and_overlap_warning():
    d = weight_diagnostics([0, 0, 0, 4.0])
    assert d == {"ess": 1.0, "ess_share": 0.25, "max_weight": 4.0, "matched_share": 0.25}
    assert weight_diagnostics(np.ones(10))["ess"] == pytest.approx(10)
    log = exact_log(additive, scale=20)
    pe = np.where(np.arange(len(log)) == 3, 1.0, 0.0)  # the target matches one row
    with pytest.warns(OverlapWarning, match="effective sample size 1.0"):
        est = estimate_slate_ctr(log, pe, factored=True, factored_target=True,
                                 estimators=("iips",))
    assert est.loc["iips", "matched_share"] == pytest.approx(1 / len(log))


def _two_slates(**extra):
    base = {"slate_id": [0, 0, 1, 1], "position": [0, 1, 0, 1], "action": [1, 2, 1, 3],
            "reward": [0.0, 1.0, 0.0, 0.0], "propensity": [0.5, 0.25, 0.5, 0.25]}
    base.update(extra)
    return pd.DataFrame(base)


@pytest.mark.parametrize("log,kw,match", [
    (_two_slates().drop(columns="slate_id"), {}, "need column 'slate_id'"),
    (_two_slates(slate_id=[0, 0, None, 1]), {}, "'slate_id' is missing at row 2"),
    (_two_slates(position=[0, np.nan, 0, 1]), {}, "'position' is missing at row 1"),
    (_two_slates(position=[0, 0, 0, 1]), {}, "two actions at one position: slates 0"),
    (_two_slates(), {"estimators": ("sips",)}, "needs column 'slate_propensity'"),
    (_two_slates(), {"estimators": ("rips",)}, "needs column 'cascade_propensity'"),
    (_two_slates(), {"estimators": ("pi",)}, "'pi' .* factored=True"),
    (_two_slates(slate_propensity=[0.1, 0.1, 0.125, 0.125]),
     {"estimators": ("sips",), "factored": True}, "not the product .* slates 0"),
    (_two_slates(slate_propensity=[0.1, 0.2, 0.1, 0.1]), {"estimators": ("sips",)},
     "one value per slate"),
    (_two_slates(cascade_propensity=[0.5, 0.4, 0.5, 0.125]), {"estimators": ("rips",)},
     "'cascade_propensity' is inconsistent .* at slates 0"),
    (_two_slates(propensity=[0.5, 0.25, 0.4, 0.25]), {}, "different propensities at rows 0, 2"),
    (_two_slates(action=[1, 2, 4, 3], propensity=[0.5, 0.25, 0.6, 0.25]), {},
     "summing to 1.1 > 1"),
    (_two_slates(), {"estimators": ("nope",)}, "unknown slate estimators"),
    (_two_slates(), {"estimators": ("dros",)}, "need a reward model"),
    (_two_slates(), {"estimators": ("sips",), "factored": True}, "target_slate is needed"),
    (_two_slates(), {"interval": "exact"}, "interval must be"),
    (_two_slates(), {"interval": "bootstrap", "n_bootstrap": 0}, "n_bootstrap must be"),
    (_two_slates(), {"shrinkage": 0.0}, "shrinkage .* must be a finite number > 0"),
    (_two_slates(), {"shrinkage": float("nan")}, "shrinkage .* must be a finite number > 0"),
    (_two_slates(), {"alpha": 1.5}, "alpha must be in"),
    (_two_slates(reward=[0.0, np.inf, 0.0, 0.0]), {}, "'reward' has non-numeric or non-finite"),
    (_two_slates(propensity=[0.5, 0.25, 0.5, 1.5]), {}, "outside \\[0, 1\\]"),
])
def test_bad_slate_logs_are_named(log, kw, match):
    with pytest.raises((DataValidationError, ValueError), match=match):
        estimate_slate_ctr(log, np.full(len(log), 0.5), min_ess=0, **kw)


def test_target_shape_and_values_are_checked():
    with pytest.raises(ValueError, match="one value per logged row"):
        estimate_slate_ctr(_two_slates(), [0.5], factored=True, factored_target=True)
    with pytest.raises(ValueError, match="row 2 has 1.5"):
        estimate_slate_ctr(_two_slates(), [0.5, 0.5, 1.5, 0.5], factored=True,
                           factored_target=True)
    with pytest.raises(ValueError, match="non-finite value at row 1"):
        estimate_slate_ctr(_two_slates(), [0.5, np.nan, 0.5, 0.5], factored=True,
                           factored_target=True)


def test_propensity_sums_are_checked_per_context():
    ok = _two_slates(context=["u", "u", "v", "v"], propensity=[0.5, 0.25, 0.7, 0.25])
    check_propensity_sums(ok)  # different users may be shown items with different chances
    with pytest.raises(DataValidationError, match="different propensities"):
        check_propensity_sums(ok.drop(columns="context"))


def test_target_mass_on_never_logged_actions_is_named():
    log = _two_slates()
    target = pd.DataFrame({"position": [0, 0, 1, 1], "action": [1, 9, 2, 3],
                           "prob": [0.6, 0.4, 0.5, 0.5]})
    with pytest.warns(OverlapWarning, match="9 at position 0"):
        lost = target_support(log, target)
    assert lost.to_dict("records") == [{"position": 0, "missing_mass": pytest.approx(0.4)}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target_support(log, target[target.action != 9]).empty
    with pytest.raises(DataValidationError, match="target column 'prob' not found"):
        target_support(log, target.drop(columns="prob"))
