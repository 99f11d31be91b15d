"""Regression tests for the defects a hostile-input pass found (issue: "The round as composable
phases, and every defect a hostile user found"). Each failed before the fix."""

import multiprocessing as mp

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from fedcf import CentralizedMF, FedReconMF
from fedcf.datasets import DataValidationError, Interactions, make_synthetic_ratings
from fedcf.datasets.movielens import parse_ratings
from fedcf.eval import estimate_ctr
from fedcf.federated import (
    ClientUpdate,
    NoSplit,
    RandomSplit,
    RidgeReconstruction,
    SGDReconstruction,
    TimeSplit,
)

FAST = dict(n_factors=3, n_rounds=3, clients_per_round=30, random_state=0)


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(200, 50, 4000, n_factors=3, random_state=2)


@pytest.fixture(scope="module")
def sgd_model(pop):
    return FedReconMF(reconstruction=SGDReconstruction(steps=8), **FAST).fit(pop)


# ---------------------------------------------------------------- inference independent of the call
def test_sgd_reconstruction_does_not_depend_on_other_users(pop, sgd_model):
    a = pop.subset_users(np.arange(5))
    both = pop.subset_users(np.r_[np.arange(100, 150), np.arange(5)])
    Pa, ca = sgd_model.reconstruct_users(a)
    Pb, cb = sgd_model.reconstruct_users(both)
    np.testing.assert_array_equal(Pa, Pb[50:])
    np.testing.assert_array_equal(ca, cb[50:])
    df = pop.to_dataframe()
    one = df[df.user == 3]
    many = pd.concat([df[df.user.isin(range(100, 160))], one])
    np.testing.assert_array_equal(sgd_model.predict(one), sgd_model.predict(many)[-len(one):])


# ---------------------------------------------------------------- offline estimators
def test_replay_is_the_plain_mean_over_matching_rows_not_snips():
    reward = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    propensity = np.array([0.9, 0.1, 0.5, 0.2, 0.05])  # non-uniform
    target = np.array([1.0, 1.0, 0.0, 1.0, 1.0])  # deterministic: agrees on rows 0, 1, 3, 4
    est = estimate_ctr(reward, propensity, target, estimators=("replay", "snips"), n_bootstrap=0)
    assert est.loc["replay", "estimate"] == pytest.approx(np.mean([1.0, 0.0, 0.0, 1.0]))
    w = target / propensity
    assert est.loc["snips", "estimate"] == pytest.approx(np.sum(w * reward) / w.sum())
    assert est.loc["replay", "estimate"] != pytest.approx(est.loc["snips", "estimate"])


def test_estimate_ctr_refuses_bad_alpha_and_propensity():
    r, p, t = np.ones(3), np.full(3, 0.5), np.ones(3)
    for alpha in (2, 0, 1.0, -0.1, True):
        with pytest.raises(ValueError, match="alpha must be in"):
            estimate_ctr(r, p, t, alpha=alpha)
    with pytest.raises(ValueError, match=r"propensity is 5\.0 at row 1, outside \(0, 1\]"):
        estimate_ctr(r, np.array([0.5, 5.0, 0.5]), t)
    with pytest.raises(ValueError, match="n_bootstrap"):
        estimate_ctr(r, p, t, n_bootstrap=-1)


# ---------------------------------------------------------------- files
def test_save_names_with_dots_do_not_collide(pop, tmp_path):
    m = CentralizedMF(n_factors=2, n_epochs=1, random_state=0).fit(pop)
    a, b = m.save(tmp_path / "model_lr0.1"), m.save(tmp_path / "model_lr0.5")
    assert a != b and a.name == "model_lr0.1.npz" and b.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_lr0.1.npz", "model_lr0.5.npz"]


def _save_many(args):
    path, seed = args
    from fedcf import CentralizedMF as C
    from fedcf.datasets import make_synthetic_ratings as mk

    m = C(n_factors=2, n_epochs=1, random_state=seed).fit(mk(50, 20, 500, random_state=seed))
    for _ in range(15):
        m.save(path)


def test_concurrent_saves_leave_a_whole_file(tmp_path):
    path = tmp_path / "shared.npz"
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_save_many, [(path, 1), (path, 2)])
    m = CentralizedMF.load(path)
    assert m.item_factors_.shape[1] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["shared.npz"]  # no temporary files left


def test_interrupted_save_keeps_the_old_file_and_no_leftovers(pop, tmp_path, monkeypatch):
    m = CentralizedMF(n_factors=2, n_epochs=1, random_state=0).fit(pop)
    path = m.save(tmp_path / "m.npz")
    before = path.read_bytes()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        m.save(path)
    with pytest.raises(KeyboardInterrupt):
        FedReconMF(checkpoint_path=tmp_path / "ck.npz", **FAST).fit(pop)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]


def _killed_mid_save(path):
    import os

    def write(fh):
        fh.write(b"half a model")
        fh.flush()
        os._exit(9)  # killed: no cleanup runs

    from datasets._files import atomic_write

    atomic_write(path, write)


def test_a_killed_save_leaves_nothing_after_the_next_save(pop, tmp_path):
    """A writer killed mid-save leaves its temporary file (nothing can remove it then); the next
    write of the same target removes it, and leaves a live writer's temporary file alone."""
    import os

    from datasets._files import _temp_prefix

    path = tmp_path / "m.npz"
    proc = mp.get_context("spawn").Process(target=_killed_mid_save, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".m.npz.") and left[0].endswith(".tmp")
    live = tmp_path / (_temp_prefix(path, os.getppid()) + "x.tmp")  # a running process's
    live.write_bytes(b"in progress")
    other = tmp_path / (".m.npz.another-host.1." + "y.tmp")  # a writer on another host
    other.write_bytes(b"in progress")
    CentralizedMF(n_factors=2, n_epochs=1, random_state=0).fit(pop).save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.npz", live.name,
                                                                  other.name])


@pytest.mark.parametrize("content", [b"", b"garbage, not a zip", "truncated"])
def test_bad_model_and_checkpoint_files_name_the_path(pop, tmp_path, content):
    good = CentralizedMF(n_factors=2, n_epochs=1, random_state=0).fit(pop).save(tmp_path / "g")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(good.read_bytes()[:300] if content == "truncated" else content)
    with pytest.raises(ValueError, match="bad.npz.*not a readable fedcf model"):
        CentralizedMF.load(bad)
    with pytest.raises(ValueError, match="bad.npz.*not a readable fedcf checkpoint"):
        FedReconMF(checkpoint_path=bad, **FAST).fit(pop)
    assert bad.exists()  # left untouched
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CentralizedMF.load(tmp_path / "missing.npz")


def test_checkpoint_must_belong_to_this_run(pop, tmp_path):
    ck = tmp_path / "ck.npz"
    FedReconMF(checkpoint_path=ck, **FAST).fit(pop)
    df = pop.to_dataframe()
    swapped = df.copy()  # same counts, same rating sum: two ratings of one user swap items
    u0 = swapped.index[swapped.user == swapped.user.iloc[0]]
    swapped.loc[u0[:2], "rating"] = swapped.loc[u0[:2], "rating"].to_numpy()[::-1]
    if swapped.rating.equals(df.rating):
        swapped.loc[u0[0], "rating"] = swapped.loc[u0[0], "rating"] % 5 + 1
        swapped.loc[u0[1], "rating"] += df.loc[u0[0], "rating"] - swapped.loc[u0[0], "rating"]
    with pytest.raises(ValueError, match="written for other data"):
        FedReconMF(checkpoint_path=ck, **{**FAST, "n_rounds": 5}).fit(swapped)
    # a tampered K (arrays edited to another shape) is refused, not returned silently
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["Q"] = arrays["Q"][:, :2]
    np.savez(ck, **arrays)
    with pytest.raises(ValueError, match="array 'Q' is .* expected"):
        FedReconMF(checkpoint_path=ck, **{**FAST, "n_rounds": 5}).fit(pop)


def test_recommend_after_load_filters_seen_items_or_refuses(pop, tmp_path):
    m = CentralizedMF(n_factors=2, n_epochs=2, random_state=0).fit(pop)
    m2 = CentralizedMF.load(m.save(tmp_path / "c"))
    seen = set(pop.item_ids[pop.items[pop.indptr[0]:pop.indptr[1]]])
    rec = m2.recommend(user=pop.user_ids[0], n=50)
    assert not set(rec.item) & seen
    pd.testing.assert_frame_equal(rec, m.recommend(user=pop.user_ids[0], n=50))
    del m2.seen_indptr_
    with pytest.raises(ValueError, match="filter_seen=False"):
        m2.recommend(user=pop.user_ids[0])


# ---------------------------------------------------------------- data
def test_u_data_with_an_extra_column_is_refused(tmp_path):
    p = tmp_path / "u.data"
    p.write_text("1\t10\t4\t100\t9\n2\t10\t5\t70\t9\n")
    with pytest.raises(DataValidationError, match="found 5: remove the extra columns"):
        parse_ratings(p)


def test_twenty_digit_ids_stay_distinct(tmp_path):
    big = [12345678901234567890, 12345678901234567891]
    inter = Interactions.from_arrays(np.array(big, dtype=object), [1, 1], [3.0, 4.0])
    assert inter.n_users == 2 and set(inter.user_ids.tolist()) == set(big)
    p = tmp_path / "u.data"
    p.write_text(f"{big[0]}\t1\t3\t1\n{big[1]}\t1\t4\t2\n")
    df = parse_ratings(p)
    assert df.user.nunique() == 2 and (df.user.astype(str) == [str(b) for b in big]).all()
    with pytest.raises(DataValidationError, match="beyond 2\\*\\*53"):
        Interactions.from_arrays(np.array([2.0**60, 2.0**60 + 4096]), [1, 1], [3.0, 4.0])


def test_coo_duplicates_are_refused_not_summed():
    coo = sp.coo_matrix(([5.0, 4.0, 3.0], ([0, 0, 1], [2, 2, 0])), shape=(2, 3))
    with pytest.raises(DataValidationError, match=r"duplicate \(row, column\) pair \(0, 2\)"):
        Interactions.from_sparse(coo)
    inter = Interactions.from_sparse(coo, duplicates="mean")
    assert inter.values[inter.indptr[0]] == 4.5


def test_hand_built_interactions_are_checked():
    ok = dict(indptr=np.array([0, 2]), items=np.array([0, 1]), values=np.array([1.0, 2.0]),
              timestamps=None, user_ids=np.array(["a"]), item_ids=np.array([10, 20]))
    Interactions(**ok)
    with pytest.raises(DataValidationError, match=r"indices in \[0, 2\).*found 7"):
        Interactions(**{**ok, "items": np.array([0, 7])})
    with pytest.raises(DataValidationError, match="indptr"):
        Interactions(**{**ok, "indptr": np.array([0, 3])})
    with pytest.raises(DataValidationError, match="non-finite"):
        Interactions(**{**ok, "values": np.array([1.0, np.nan])})


# ---------------------------------------------------------------- parameters
def _edited(phase, **attrs):
    """A phase object with attributes changed behind its validation (as user code could)."""
    vars(phase).update(attrs)
    return phase


@pytest.mark.parametrize("bad,match", [
    (dict(split={"name": "random"}), "split must be one of .*SupportQuerySplit subclass"),
    (dict(init_scale=0.0), "init_scale must be > 0"),
    (dict(rating_scale=(5, 1)), "rating_scale must be"),
    (dict(rating_scale="abc"), "rating_scale must be a pair"),
    (dict(server_optimizer="adamw"), "server_optimizer='adamw': 'adamw' is not a registered"),
    (dict(server_optimizer={"name": "adam"}), "server_optimizer must be one of .*ServerOptimizer subclass"),
    (dict(biases="yes"), "biases must be True or False"),
    (dict(dtype="int8"), "dtype must be float32 or float64"),
    (dict(random_state=-1), "random_state must be in"),
    (dict(client_update=_edited(ClientUpdate(), learning_rate=float("nan"))),
     "learning_rate must be a number > 0"),
    (dict(client_update=_edited(ClientUpdate(), steps=10**12)), "steps must be an integer"),
    (dict(client_update=_edited(ClientUpdate(), batch_size=2.5)), "batch_size must be an integer"),
    (dict(client_update="adam"), "'adam' is not a registered client_update"),
    (dict(client_update={"name": "sgd"}), "client_update must be one of"),
])
def test_bad_parameters_are_named(pop, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        FedReconMF(**{**FAST, **bad}).fit(pop)


@pytest.mark.parametrize("K", [10**5, 10**6])
def test_huge_n_factors_is_refused_up_front_with_the_figure(pop, K):
    for est in (FedReconMF(n_factors=K, n_rounds=1), CentralizedMF(n_factors=K)):
        with pytest.raises(MemoryError, match=r"n_factors=\d+ needs about [\d.]+ GiB"):
            est.fit(pop)


def test_availability_takes_raw_ids_and_refuses_the_rest(pop):
    df = pop.to_dataframe()
    df["user"] = "user" + df["user"].astype(str)
    reachable = np.array(["user1", "user2", "user3", "user5"])
    m = FedReconMF(**{**FAST, "n_rounds": 2}).fit(df, availability=lambda t: reachable)
    assert all(h["clients_used"] <= 4 for h in m.history_)
    assert m.history_[0]["clients_used"] > 0
    with pytest.raises(TypeError, match="boolean mask"):
        FedReconMF(**FAST).fit(df, availability=lambda t: np.ones(pop.n_users, bool))
    with pytest.raises(ValueError, match="user id 'ghost'"):
        FedReconMF(**FAST).fit(df, availability=lambda t: np.array(["user1", "ghost"]))


def test_predict_local_with_wrong_length_is_refused(pop):
    from fedcf import LocalParams

    m = CentralizedMF(n_factors=3, n_epochs=1, random_state=0).fit(pop)
    with pytest.raises(ValueError, match="must be 3 finite numbers"):
        m.predict_local(LocalParams(np.ones(7), 0.0), [1, 2])


# ---------------------------------------------------------------- divergence
def test_partial_divergence_warns_with_counts_and_blames_the_data(pop):
    df = pop.to_dataframe()
    wild = df.user.isin(range(0, 200, 10))  # a few clients whose ratings overflow float32 steps
    df.loc[wild, "rating"] = df.loc[wild, "rating"] * 1e30
    with pytest.warns(RuntimeWarning, match=r"\d+ client uploads in \d+ rounds were non-finite.*"
                                            r"ratings are too large.*measured: .*5e\+30"):
        m = FedReconMF(**{**FAST, "n_rounds": 6, "clients_per_round": 100,
                          "biases": False, "rating_scale": (0, 5e30)}).fit(df)
    assert sum(h["clients_nonfinite"] for h in m.history_) > 0
    assert np.isfinite(m.item_factors_).all()


def test_wide_rating_scale_stops_and_names_the_parameter(pop):
    df = pop.to_dataframe()
    df["rating"] = df["rating"] * 200.0  # ratings on a 0-1000 scale, default settings
    with pytest.raises(FloatingPointError, match=r"training diverged at round \d+.*lower the "
                                                 r"client step size \(client_update__"
                                                 r"learning_rate, now 0.5\)"):
        FedReconMF(n_factors=3, n_rounds=50, clients_per_round=50, random_state=0).fit(df)
    with pytest.raises(FloatingPointError, match=r"client_update__learning_rate, now 8.0"):
        FedReconMF(client_update=ClientUpdate(8.0, batch_size=1),
                   **{**FAST, "n_rounds": 20}).fit(pop)


def test_diverging_sgd_reconstruction_blames_its_learning_rate(pop):
    with pytest.raises(FloatingPointError, match=r"SGDReconstruction\(steps=50, epochs=1, "
                                                 r"learning_rate=1000000.0.*reconstruction__"):
        FedReconMF(reconstruction=SGDReconstruction(learning_rate=1e6), **{**FAST, "n_rounds": 6}
                   ).fit(pop)


def _blame_cases():
    from fedcf import FedAvgMF
    from fedcf.federated import SGD, Adam, DPGaussianMean, FedReconImplicitMF, OpenCatalog

    slow = dict(n_factors=3, n_rounds=20, clients_per_round=60, random_state=0)
    client, server = "lower the client step size", "lower the server optimizer's learning rate"
    return {
        "implicit client step": (FedReconImplicitMF(client_update=ClientUpdate(1e4), **slow),
                                 None, client + r".*now 10000.0.*measured: at round \d+, rerun"),
        "FedRecon client step": (FedReconMF(client_update=ClientUpdate(1e3), **slow), None,
                                 client + r".*measured: at round \d+, rerunning"),
        "open catalog client step": (FedReconMF(client_update=ClientUpdate(1e3),
                                                item_space=OpenCatalog(), **slow), None,
                                     client + ".*measured"),
        "FedAvg client step": (FedAvgMF(client_update=ClientUpdate(1e3), **slow), None,
                               client + ".*measured"),
        "Adam server step": (FedReconMF(server_optimizer=Adam(1e6), **slow), None,
                             server + r".*Adam.*measured: at round \d+, the server step"),
        "SGD server step": (FedReconMF(server_optimizer=SGD(1e3), **slow), None,
                            server + ".*measured: .*the server step"),
        "the data": (FedReconMF(**slow), 1e36, r"ratings are too large.*measured: .*largest "
                                               r"\|rating\| is"),
        "the DP noise": (FedReconMF(**{**slow, "n_rounds": 5}, rating_scale=(1, 5),
                                    aggregator=DPGaussianMean(0.5, 1e40, delta=1e-4)), None,
                         "noise outweighs the model.*measured: the noise alone"),
    }


@pytest.mark.parametrize("case", list(_blame_cases()))
def test_divergence_blames_the_measured_cause(pop, case):
    """The setting a divergence error names is the one a replay measured (blame.py): the
    client step for an implicit, open-catalog or FedAvg model with a huge client rate (each
    used to blame the server or skipped the diagnosis), the server for Adam at 1e6 (it blamed
    the client), the data for ratings near 1e36 (it blamed the learning rate), the noise for
    a DP run drowned in it (it blamed the client step)."""
    import re
    import warnings

    est, scale, match = _blame_cases()[case]
    df = pop.to_dataframe()
    if scale is not None:
        df["rating"] = df["rating"] * scale
    with warnings.catch_warnings(record=True) as caught:  # a run that went on warns instead
        warnings.simplefilter("always")
        try:
            est.fit(df)
            said = [str(w.message) for w in caught if "non-finite" in str(w.message)]
        except FloatingPointError as e:
            said = [str(e)]
    assert said and re.search(match, said[0]), said


# ---------------------------------------------------------------- more hostile calls
@pytest.mark.parametrize("call,err,match", [
    (lambda m, df: FedReconMF(**FAST).fit(df, df.rating), ValueError, "ratings given twice"),
    (lambda m, df: CentralizedMF(n_factors=2).fit(df, df.rating), ValueError, "ratings given twice"),
    (lambda m, df: FedReconMF(**{**FAST, "eval_every": 1}).fit(df, callback=5), TypeError,
     "callback must be a function"),
    (lambda m, df: m.save("/"), IsADirectoryError, "it is a folder"),
    (lambda m, df: m.recommend(items=[1], n=-1), ValueError, "n must be a non-negative integer"),
    (lambda m, df: m.reconstruct([1, 2], ["a", "b"]), DataValidationError, "ratings must be numbers"),
    (lambda m, df: m.reconstruct([1, 2], [3.0, float("inf")]), DataValidationError, "non-finite"),
    (lambda m, df: m.predict(np.zeros((3, 3))), ValueError, r"\(n, 2\) array"),
    (lambda m, df: CentralizedMF(n_factors=2, n_epochs=1).fit(df.assign(rating=df.rating * 1e300)),
     FloatingPointError, "rescale them"),
    (lambda m, df: FedReconMF(**FAST).fit([[1, 2, 3]]), ValueError, r"an \(n, 2\) array"),
    (lambda m, df: FedReconMF(**FAST).fit("ratings.csv"), TypeError, "expected an Interactions"),
])
def test_more_hostile_calls_are_named(pop, call, err, match):
    m = FedReconMF(**FAST).fit(pop)
    with pytest.raises(err, match=match):
        call(m, pop.to_dataframe())


def test_round_with_nobody_reachable_is_recorded_not_fatal(pop):
    m = FedReconMF(**FAST).fit(pop, availability=lambda t: np.array([], dtype=int))
    assert all(h["clients_used"] == 0 and np.isnan(h["loss"]) for h in m.history_)


@pytest.mark.parametrize("make,match", [
    (lambda: SGDReconstruction(steps=-1), "steps must be an integer >= 0"),
    (lambda: SGDReconstruction(steps=True), "steps must be an integer"),
    (lambda: SGDReconstruction(epochs=0), "epochs must be an integer >= 1"),
    (lambda: SGDReconstruction(learning_rate=float("nan")), "learning_rate must be a number > 0"),
    (lambda: SGDReconstruction(init="Uniform"), "init must be 'uniform' or 'zeros'"),
    (lambda: RidgeReconstruction(regularization=-0.1), "regularization must be a number >= 0"),
    (lambda: RidgeReconstruction(regularization="0.1"), "regularization must be a number"),
    (lambda: SGDReconstruction().set_params(steps=2.5), "steps must be an integer"),
    (lambda: SGDReconstruction().set_params(step=3), "has no parameter 'step'"),
    (lambda: FedReconMF(reconstruction=SGDReconstruction).check_params(),
     "reconstruction must be one of .*Reconstruction subclass"),
    (lambda: FedReconMF(reconstruction="ridge").check_params(),
     "'ridge' is not a registered reconstruction"),
    (lambda: RandomSplit(1.0), r"support_fraction must be a number in \(0, 1\).*NoSplit"),
    (lambda: TimeSplit(float("nan")), "support_fraction must be a number in"),
    (lambda: NoSplit(0.5), "NoSplit\\(\\) takes no arguments"),
    (lambda: FedReconMF(split="halves").check_params(), "'halves' is not a registered split"),
])
def test_bad_phase_objects_are_named(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        make()


def test_a_tampered_phase_spec_in_a_model_file_is_named(tmp_path, pop):
    import json

    from fedcf import registry

    spec = json.loads(json.dumps(registry.encode(SGDReconstruction(steps=3))))
    spec["name"] = "lbfgs"
    with pytest.raises(ValueError, match="reconstruction: cannot rebuild the reconstruction "
                                         "'lbfgs'.*not a registered reconstruction"):
        registry.decode(spec, "reconstruction")
    spec.update(name="sgd", params={"steps": -4})
    with pytest.raises(ValueError, match="cannot rebuild the reconstruction 'sgd': steps must be"):
        registry.decode(spec, "reconstruction")


def _numpy_scalar_cases():
    from fedcf.federated import (
        CoordinateMedian,
        DifferentialPrivacy,
        DPGaussianMean,
        NormClippedMean,
        RayExecutor,
        SecureAggregation,
        TrimmedMean,
    )
    from fedcf.federated.algorithms.items import OpenCatalog

    f32, f64, i64, i32 = np.float32, np.float64, np.int64, np.int32
    return [
        (TrimmedMean, dict(beta=f32(0.1), row_clip=f64(2.0))),
        (CoordinateMedian, dict(row_clip=f32(1.5))),
        (NormClippedMean, dict(clip_norm=f32(0.5))),
        (SecureAggregation, dict(threshold=i64(3), value_bound=f32(2.0), max_weight=i32(50),
                                 min_cohort=i64(3), drop_after_setup=f32(0.1),
                                 neighbours=i32(4))),
        (SecureAggregation, dict(threshold=f32(0.75))),
        (DPGaussianMean, dict(clip_norm=f32(0.5), noise_multiplier=f64(1.0), delta=f32(1e-5),
                              target_quantile=f32(0.5))),
        (lambda **kw: DifferentialPrivacy(SecureAggregation(), **kw),
         dict(clip_norm=f32(0.5), noise_multiplier=i64(1))),
        (RayExecutor, dict(n_shards=i64(2), num_cpus=f32(1.0), max_restarts=i32(1),
                           resources={"worker": f32(1.0)})),
        (OpenCatalog, dict(catalog=f32(0.5))),
    ]


@pytest.mark.parametrize("make,kw", _numpy_scalar_cases(),
                         ids=lambda v: getattr(v, "__name__", "") if callable(v) else "")
def test_numpy_scalars_are_numbers(make, kw):
    """Every real-number or integer type NumPy has is a number to every phase object; the
    object is the one the Python numbers give (its parameters compare equal)."""
    import warnings

    plain = {k: (v.item() if isinstance(v, np.generic) else
                 {a: b.item() for a, b in v.items()} if isinstance(v, dict) else v)
             for k, v in kw.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, ref = make(**kw), make(**plain)
    assert got.get_params(deep=False).keys() == ref.get_params(deep=False).keys()
    assert all(np.all(np.asarray(got.get_params(deep=False)[k] == v))
               for k, v in ref.get_params(deep=False).items() if not hasattr(v, "get_params"))


def _frame(pop):
    return pd.DataFrame({"user": pop.user_ids[pop.user_index()], "item": pop.item_ids[pop.items],
                         "rating": pop.values})


def test_mixed_str_and_int_ids_survive_save_and_load(pop, tmp_path):
    """Ids that mix str and int (as a DataFrame of object ids can) are saved without pickle and
    load back with their types: 5 stays an int, "u5" a str."""
    df = _frame(pop)
    df["user"] = df["user"].astype(object)
    df.loc[df["user"] < 20, "user"] = "u" + df.loc[df["user"] < 20, "user"].astype(str)
    m = FedReconMF(**FAST).fit(df)
    back = FedReconMF.load(m.save(tmp_path / "m.npz", user_ids=True))
    assert [(type(a), a) for a in back.user_ids_] == [(type(a), a) for a in m.user_ids_]
    assert {type(a) for a in back.user_ids_} == {str, int}


@pytest.mark.parametrize("call,err,match", [
    (lambda df, m: FedReconMF(**FAST).fit(df.set_axis(["user", "item", "rating"], axis=1)
                                          .assign(r2=1.0).set_axis(
        ["user", "item", "rating", "rating"], axis=1)), ValueError,
     "column 'rating' appears 2 times"),
    (lambda df, m: __import__("fedcf.eval", fromlist=["x"]).recon_eval(m, df,
                                                                       support_fraction=1.0),
     ValueError, "support_fraction=1.0 leaves no query ratings"),
    (lambda df, m: __import__("fedcf").FedAvgMF(**FAST).fit(df, item_features=np.zeros((3, 2))),
     TypeError, "unexpected data argument 'item_features' .item features are FedReconMF's"),
    (lambda df, m: FedReconMF(**FAST).fit(df, user_column="user"), TypeError,
     "unexpected data argument 'user_column'"),
])
def test_data_arguments_are_named(pop, call, err, match):
    df = _frame(pop)
    m = FedReconMF(**FAST).fit(pop)
    with pytest.raises(err, match=match):
        call(df, m)


def test_recon_eval_takes_a_dataframe(pop):
    from fedcf.eval import recon_eval

    m = FedReconMF(**FAST).fit(pop)
    from fedcf.datasets import Interactions

    got, ref = recon_eval(m, _frame(pop)), recon_eval(m, Interactions.coerce(_frame(pop)))
    assert {k: v for k, v in got.items() if np.isscalar(v)} == \
        {k: v for k, v in ref.items() if np.isscalar(v)}
    assert got["rmse"] > 0


def test_a_callback_keeps_what_it_was_shown(pop):
    """The arrays a callback sees are its own: later rounds do not change them."""
    kept = []
    m = FedReconMF(**FAST, eval_every=1).fit(
        pop, callback=lambda model, t: kept.append((model.item_factors_,
                                                    model.item_factors_.copy(),
                                                    len(model.history_))))
    assert [n for _, _, n in kept] == [1, 2, 3]
    assert all(np.array_equal(a, b) for a, b, _ in kept)
    assert not np.array_equal(kept[0][0], m.item_factors_)


def test_set_params_after_fit_changes_the_next_fit_not_the_predictions(pop, tmp_path):
    """Scoring reads the item space the model was fitted with (also after save and load)."""
    from fedcf.federated import OpenCatalog

    m = FedReconMF(**FAST, item_space=OpenCatalog(0.5, unknown_item_row=True,
                                                   learned_default=True)).fit(pop)
    items = pop.item_ids[:12]
    local = m.reconstruct(items[:5], [4, 3, 5, 2, 4])
    before = m.predict_local(local, items)
    m.set_params(item_space__unknown_item_row=False, item_space__learned_default=False)
    np.testing.assert_array_equal(m.predict_local(local, items), before)
    back = FedReconMF.load(m.save(tmp_path / "m.npz"))
    np.testing.assert_array_equal(back.predict_local(back.reconstruct(items[:5],
                                                                      [4, 3, 5, 2, 4]), items),
                                  before)
    m.set_params(item_space=None)
    np.testing.assert_array_equal(m.predict_local(local, items), before)


def test_ids_of_mixed_type_keep_their_types(pop):
    """A list mixing the model's int ids with a str id: the ints are still known (before, the
    whole list became text and the user reconstructed from nothing); the str id, which can
    never match int ids, is named in a warning. None is not a list of ids."""
    m = FedReconMF(**FAST).fit(pop)
    known = list(pop.item_ids[:3])
    with pytest.warns(UserWarning, match="item id 'new' is str but the model's item ids are "
                                         "numbers"):
        mixed = m.reconstruct(known + ["new"], [5, 1, 4, 5])
    ref = m.reconstruct(known, [5, 1, 4])
    np.testing.assert_array_equal(mixed.factors, ref.factors)
    assert np.abs(ref.factors).sum() > 0
    with pytest.warns(UserWarning, match="item id 'x'"):
        got = m.predict_local(ref, [known[0], "x"])
    assert got[0] == m.predict_local(ref, [known[0]])[0]
    with pytest.raises(TypeError, match="items must be raw ids .*got None"):
        m.reconstruct(None)
    with pytest.warns(UserWarning, match="user id '3' is str"):
        m.predict(pd.DataFrame({"user": ["3"], "item": [known[0]]}))


def test_wrong_answers_on_edge_inputs_become_errors_or_warnings(pop):
    """Each of these returned a number (NaN factors, an empty list, a NaN RMSE, an RMSE for an
    implicit model) or a model trained on nothing, without a word."""
    from fedcf.eval import rating_metrics
    from fedcf.federated import FedReconImplicitMF, SecureAggregation
    from fedcf.model_selection import recon_scorer

    m = FedReconMF(**FAST, rating_scale=(1, 5)).fit(pop)
    items = list(pop.item_ids[:3])
    with pytest.raises(DataValidationError, match="largest .rating. is 1e\\+200, far outside"):
        m.reconstruct(items, [1e200, 3, 4])
    with pytest.raises(DataValidationError, match="not finite"):
        m.recommend(items, [1e308, 3, 4], n=3)
    with pytest.raises(ValueError, match="y_pred has 1 non-finite value"):
        rating_metrics(np.array([3.0, 4.0]), np.array([np.nan, 4.0]))
    im = FedReconImplicitMF(**FAST).fit(pop)
    with pytest.raises(ValueError, match="implicit-feedback model whose scores are not ratings"):
        recon_scorer("rmse")(im, _frame(pop))
    two = pop.subset_users(np.arange(2))
    with pytest.warns(RuntimeWarning, match="none of the 2 rounds of this fit aggregated a "
                                            "client"):
        FedReconMF(**{**FAST, "n_rounds": 2, "clients_per_round": 3},
                   aggregator=SecureAggregation(threshold=3, min_cohort=3)).fit(two)


def test_resume_compares_every_value_of_a_setting_and_the_item_features(pop, tmp_path):
    """A catalog list that differs from the checkpoint's in one middle element, or item
    features that differ, refuse to resume (numpy's shortened repr once hid the first, and the
    features were checked by nothing); the same ones resume."""
    from fedcf.federated import OpenCatalog

    ids = np.asarray(pop.item_ids[:40])
    feats = (ids, np.random.default_rng(0).random((len(ids), 3)))
    kw = dict(FAST, n_rounds=2)
    ck = tmp_path / "ck.npz"

    def fit(catalog, features, rounds=2):
        return FedReconMF(**{**kw, "n_rounds": rounds}, checkpoint_path=str(ck),
                          item_space=OpenCatalog(catalog, unknown_item_row=True)
                          ).fit(pop, item_features=features)

    catalog = np.concatenate([ids[:30], 10_000 + np.arange(1200)])  # long: repr shortens it
    fit(catalog, feats, rounds=1)
    other = catalog.copy()
    other[600] += 5000
    with pytest.raises(ValueError, match="was written with item_space="):
        fit(other, feats)
    changed = (ids, feats[1] * 2)
    with pytest.raises(ValueError, match="was written with item_features="):
        fit(catalog, changed)
    assert len(fit(catalog, feats).history_) == 2


def test_a_catalog_id_absent_from_training_scores_as_outside_the_catalog(pop):
    """It used to get a global row no client ever trained (random init) and score as known."""
    from fedcf.federated import OpenCatalog

    ids = list(pop.item_ids[:20])
    with pytest.warns(UserWarning, match=r"1 of its 21 item ids \(e.g. 999999\) never appear"):
        m = FedReconMF(**FAST, item_space=OpenCatalog(ids + [999999], unknown_item_row=True)
                       ).fit(pop)
    local = m.reconstruct(ids[:5], [4, 3, 5, 2, 4])
    absent, unknown = m.predict_local(local, [999999, 888888])
    assert absent == unknown


def test_item_features_indexed_by_ids_of_another_type_are_refused(pop):
    from fedcf.federated import OpenCatalog

    ids = pop.item_ids[:30]
    feats = (np.array([str(i) for i in ids]), np.ones((len(ids), 2)))
    with pytest.raises(ValueError, match=r"item_features: none of its 30 item ids \(e.g. '"):
        FedReconMF(**FAST, item_space=OpenCatalog(0.5)).fit(pop, item_features=feats)


def test_recon_scorer_on_users_without_a_query_part_names_why(pop):
    """Folds whose users have one rating each cannot be scored at any support fraction: the
    error says so instead of advising a lower support_fraction; users with more ratings at a
    support fraction that keeps them all are told to lower it."""
    from fedcf.model_selection import recon_scorer

    m = FedReconMF(**FAST).fit(pop)
    single = pd.DataFrame({"user": np.arange(10) + 10_000, "item": pop.item_ids[:10],
                           "rating": 3.0})
    for sf in (0.1, 0.9):
        with pytest.raises(ValueError, match="all 10 have a single rating"):
            recon_scorer("rmse", support_fraction=sf)(m, single)
    pairs = pd.DataFrame({"user": np.repeat(np.arange(5) + 10_000, 2), "rating": 3.0,
                          "item": np.tile(pop.item_ids[:2], 5)})
    with pytest.raises(ValueError, match="support_fraction=0.99 every user's ratings all go "
                                         ".*lower support_fraction"):
        recon_scorer("rmse", support_fraction=0.99)(m, pairs)
    assert np.isfinite(recon_scorer("rmse", support_fraction=0.5)(m, pairs))


def test_learned_hyperparameters_survive_save_and_load(pop, tmp_path):
    from fedcf.federated import Hypergradients

    m = FedReconMF(**FAST, hypergradients=Hypergradients()).fit(pop)
    back = FedReconMF.load(m.save(tmp_path / "h.npz"))
    assert back.learned_hyperparams_ == m.learned_hyperparams_ != {}
