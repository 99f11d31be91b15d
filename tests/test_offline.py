"""Offline CTR estimators and the Open Bandit loader."""

import io
import tarfile

import numpy as np
import pandas as pd
import pytest

from fedcf.datasets import DataValidationError, context_free_action_probs, load_open_bandit
from fedcf.eval.offline import (
    PositionActionRewardModel,
    estimate_ctr,
    relative_errors,
    validate_log,
)

P0 = np.array([0.5, 0.3, 0.2])  # logging policy
PE = np.array([0.1, 0.2, 0.7])  # target policy
MU = np.array([0.1, 0.5, 0.3])  # true click probabilities
V = float(PE @ MU)  # the target's true CTR


def exact_log(n=1000):
    """A log whose empirical distribution equals the true one exactly (expectations, not draws)."""
    rows = []
    for a in range(3):
        shows = int(round(n * P0[a]))
        clicks = int(round(shows * MU[a]))
        rows += [(a, 1.0)] * clicks + [(a, 0.0)] * (shows - clicks)
    a, r = np.array(rows).T
    a = a.astype(int)
    return a, r


def test_estimators_are_unbiased_on_the_exact_distribution():
    a, r = exact_log()
    est = estimate_ctr(r, P0[a], PE[a], q_logged=np.full(len(a), 0.2),
                       q_target=np.full(len(a), 0.2), n_bootstrap=0)
    # IPS is exactly unbiased; SNIPS equals it when the weights average to one (they do here);
    # DR is unbiased whatever the reward model; DM is as wrong as its model
    assert est.loc["ips", "estimate"] == pytest.approx(V, abs=1e-12)
    assert est.loc["snips", "estimate"] == pytest.approx(V, abs=1e-12)
    assert est.loc["dr", "estimate"] == pytest.approx(V, abs=1e-12)
    assert est.loc["dm", "estimate"] == pytest.approx(0.2)


def test_estimators_converge_on_simulated_logs():
    rng = np.random.default_rng(0)
    n = 200_000
    a = rng.choice(3, size=n, p=P0)
    r = (rng.random(n) < MU[a]).astype(float)
    q = MU + np.array([0.05, -0.05, 0.02])  # a good but imperfect reward model
    est = estimate_ctr(r, P0[a], PE[a], q_logged=q[a], q_target=np.full(n, PE @ q),
                       n_bootstrap=100)
    for name in ("ips", "snips", "dr"):
        assert abs(est.loc[name, "estimate"] - V) < 0.01, name
        assert est.loc[name, "low"] <= V <= est.loc[name, "high"] or \
            abs(est.loc[name, "estimate"] - V) < 3 * est.loc[name, "std"]
    # with a good reward model DR has lower variance than IPS
    assert est.loc["dr", "std"] <= est.loc["ips", "std"]


def test_ips_with_target_equal_to_logging_returns_logged_ctr():
    rng = np.random.default_rng(1)
    a = rng.choice(3, size=5000, p=P0)
    r = (rng.random(5000) < MU[a]).astype(float)
    est = estimate_ctr(r, P0[a], P0[a], n_bootstrap=0, estimators=("ips", "snips", "replay"))
    assert est.loc["ips", "estimate"] == pytest.approx(r.mean())
    assert est.loc["snips", "estimate"] == pytest.approx(r.mean())


def test_replay_for_a_deterministic_target_is_the_matching_rows_mean():
    a = np.array([0, 1, 2, 1, 1, 0])
    r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    target = (a == 1).astype(float)  # always shows action 1
    est = estimate_ctr(r, np.full(6, 1 / 3), target, estimators=("replay",), n_bootstrap=0)
    assert est.loc["replay", "estimate"] == pytest.approx(1 / 3)
    assert relative_errors(est, 0.5).loc["replay"] == pytest.approx(1 / 3)


def make_log(**over):
    log = pd.DataFrame({"action": [1, 2, 3], "position": [1, 2, 1], "reward": [0, 1, 0],
                        "propensity": [0.5, 0.25, 0.25]})
    for k, v in over.items():
        log[k] = v
    return log


def test_bad_logs_give_clear_errors():
    with pytest.raises(DataValidationError, match="'propensity' not found"):
        validate_log(make_log().drop(columns="propensity"))
    with pytest.raises(DataValidationError, match=r"'propensity' is 0 at row 1 \(1 rows"):
        validate_log(make_log(propensity=[0.5, 0.0, 0.2]))
    with pytest.raises(DataValidationError, match=r"value 1.5 at row 2, outside \[0, 1\]"):
        validate_log(make_log(propensity=[0.5, 0.2, 1.5]))
    with pytest.raises(DataValidationError, match="unknown action 3 at row 2"):
        validate_log(make_log(), actions=[1, 2])
    with pytest.raises(DataValidationError, match="'reward' has non-numeric"):
        validate_log(make_log(reward=[0, "yes", 1]))
    kept = validate_log(make_log(propensity=[0.5, 0.0, 0.2]), zero_propensity="drop")
    assert len(kept) == 2 and kept.attrs["dropped_zero_propensity"] == 1
    with pytest.raises(ValueError, match="propensity is 0.0 at row 1"):
        estimate_ctr([0, 1, 0], [0.5, 0.0, 0.2], [0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match=r"need a reward model"):
        estimate_ctr([0, 1], [0.5, 0.5], [0.1, 0.1], estimators=("dr",))


def obd_csv(n=60, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"timestamp": np.arange(n), "item_id": rng.integers(0, 4, n),
                       "position": rng.integers(1, 4, n), "click": rng.integers(0, 2, n),
                       "propensity_score": np.full(n, 0.25), "user_feature_0": "x"})
    return df.to_csv().encode()


def test_open_bandit_loader_reads_archive_csv_and_folder(tmp_path):
    archive = tmp_path / "obp-0.5.7.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for pol in ("random", "bts"):
            data = obd_csv(seed=1 if pol == "bts" else 0)
            info = tarfile.TarInfo(f"obp-0.5.7/obp/dataset/obd/{pol}/all/all.csv")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    log = load_open_bandit("random", "all", path=archive)
    assert list(log.columns[:3]) == ["action", "reward", "propensity"] and len(log) == 60
    validate_log(log)
    csv = tmp_path / "obd" / "bts" / "all"
    csv.mkdir(parents=True)
    (csv / "all.csv").write_bytes(obd_csv(seed=1))
    assert load_open_bandit("bts", "all", path=tmp_path).equals(
        load_open_bandit("bts", "all", path=archive))
    with pytest.raises(Exception, match="has no member"):
        load_open_bandit("random", "men", path=archive)
    with pytest.raises(ValueError, match="policy must be one of"):
        load_open_bandit("greedy")
    probs = context_free_action_probs(log)
    assert np.allclose(probs.groupby("position")["prob"].sum(), 1.0)


def test_position_action_reward_model():
    log = make_log(reward=[1, 0, 0])
    m = PositionActionRewardModel(prior_strength=0.0).fit(log)
    assert m.predict([1, 9], [1, 2]).tolist() == [1.0, 0.0]  # unknown pair: position mean
    probs = pd.DataFrame({"position": [1, 1], "action": [1, 3], "prob": [0.5, 0.5]})
    assert m.expected(probs, [1]).tolist() == [0.5]


def test_off_policy_check_on_a_simulated_pair_of_logs():
    """Context-free logging (uniform) and target (skewed) policies over 5 actions, 2 positions."""
    from fedcf.eval import off_policy_check

    rng = np.random.default_rng(3)
    mu = np.array([[0.02, 0.05, 0.10, 0.01, 0.03], [0.01, 0.03, 0.06, 0.01, 0.02]])
    target_p = np.array([0.05, 0.15, 0.6, 0.05, 0.15])

    def log(n, probs, propensity):
        pos = rng.integers(0, 2, n)
        act = rng.choice(5, size=n, p=probs)
        return pd.DataFrame({"action": act, "position": pos,
                             "reward": (rng.random(n) < mu[pos, act]).astype(float),
                             "propensity": propensity[act]})

    logging = log(100_000, np.full(5, 0.2), np.full(5, 0.2))
    target = log(100_000, target_p, target_p)
    res = off_policy_check(logging, target, n_bootstrap=50, slate_estimators=True)
    true_v = float((mu @ target_p).mean())
    assert abs(res["truth"] - true_v) < 0.003
    est = res["estimates"]
    for name in ("ips", "snips", "dr", "dm", "dros"):
        assert est.loc[name, "relative_error"] < 0.1, name
    # one position per slate: the slate estimators reduce to IPS and DR
    for name in ("iips", "rips", "sips", "pi"):
        assert est.loc[name, "estimate"] == pytest.approx(est.loc["ips", "estimate"], rel=1e-12)
    assert est.loc["cascade_dr", "estimate"] == pytest.approx(est.loc["dr", "estimate"], rel=1e-12)


@pytest.mark.network
def test_real_open_bandit_random_log_estimates_bts(tmp_path, monkeypatch):
    """The real OBD sample through the offline PyPI source (sdist, sha256 pinned)."""
    from fedcf.eval import off_policy_check

    monkeypatch.setenv("FEDCF_DATA", str(tmp_path))
    rnd = load_open_bandit("random", "all")
    bts = load_open_bandit("bts", "all")
    assert len(rnd) == 10_000 and rnd["action"].nunique() == 80
    assert np.allclose(rnd["propensity"], 1 / 80)
    res = off_policy_check(rnd, bts, n_bootstrap=100)
    assert res["truth"] == pytest.approx(0.0042, abs=5e-4)
    est = res["estimates"]
    for name in ("ips", "snips", "dr"):
        assert est.loc[name, "low"] <= res["truth"] <= est.loc[name, "high"]
    # measured: the smallest BTS propensity in the women campaign is 1e-06 (DATA_SOURCES.md says
    # 0.0, a rounded display); such a row weighs up to 1/80 / 1e-06 = 12,500 in IPS
    women = load_open_bandit("bts", "women")
    assert women["propensity"].min() == pytest.approx(1e-6)


def test_normal_intervals_agree_with_the_bootstrap_and_diagnostics_are_reported():
    rng = np.random.default_rng(3)
    n = 50_000
    a = rng.choice(3, size=n, p=P0)
    r = (rng.random(n) < MU[a]).astype(float)
    q = MU + np.array([0.05, -0.05, 0.02])
    kw = dict(q_logged=q[a], q_target=np.full(n, PE @ q))
    boot = estimate_ctr(r, P0[a], PE[a], n_bootstrap=300, **kw)
    normal = estimate_ctr(r, P0[a], PE[a], interval="normal", **kw)
    pd.testing.assert_series_equal(boot["estimate"], normal["estimate"])
    np.testing.assert_allclose(normal["std"], boot["std"], rtol=0.2, atol=1e-12)
    for name in ("ips", "snips", "dr"):
        assert normal.loc[name, "low"] <= V <= normal.loc[name, "high"], name
    w = PE[a] / P0[a]
    assert normal.loc["ips", "ess"] == pytest.approx(w.sum() ** 2 / (w * w).sum())
    assert normal.loc["ips", "max_weight"] == pytest.approx(w.max())
    assert normal.loc["ips", "matched_share"] == 1.0
    with pytest.raises(ValueError, match="interval must be"):
        estimate_ctr(r, P0[a], PE[a], interval="exact")


def test_poor_overlap_warns_with_the_numbers():
    from fedcf.eval import OverlapWarning

    pe = np.zeros(1000)
    pe[:3] = 1.0
    with pytest.warns(OverlapWarning, match=r"effective sample size 3.0 of 1000 rows .* 0.3%"):
        est = estimate_ctr(np.ones(1000), np.full(1000, 0.01), pe, n_bootstrap=0,
                           estimators=("ips", "snips"))
    assert est.loc["ips", "matched_share"] == pytest.approx(0.003)


def test_replay_warns_when_the_logging_policy_is_not_uniform():
    """replay ignores propensities: unbiased under uniform logging only (Li et al. 2011). Under
    a skewed logger its estimate moves toward what the logger favoured, and it says so."""
    import warnings

    from fedcf.eval import ReplayBiasWarning, estimate_ctr

    rng = np.random.default_rng(0)
    n, ctr = 40000, np.array([0.1, 0.5])  # action 1 clicks more; the target plays each half
    target = np.full(n, 0.5)
    for p1 in (0.5, 0.9):  # uniform, then a logger that shows action 1 nine times in ten
        a = (rng.random(n) < p1).astype(int)
        reward = (rng.random(n) < ctr[a]).astype(float)
        prop = np.where(a == 1, p1, 1 - p1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est = estimate_ctr(reward, prop, target, estimators=["replay", "snips"], n_bootstrap=0)
        warned = [w for w in caught if issubclass(w.category, ReplayBiasWarning)]
        assert bool(warned) == (p1 != 0.5)
        assert est.loc["snips", "estimate"] == pytest.approx(0.3, abs=0.01)
        biased = abs(est.loc["replay", "estimate"] - 0.3) > 0.1
        assert biased == (p1 != 0.5)  # the warning is about a real bias
