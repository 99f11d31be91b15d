"""scikit-learn conventions end to end: fit(X, y), score, cross_val_score / GridSearchCV (n_jobs 1
and 2), scikit-learn's own estimator checks that apply, and fedcf.model_selection's user splitters
and ReconEval scorer."""

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
from conftest import load_script
from sklearn.base import clone
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.utils import estimator_checks as ec

from fedcf import FURLMF, CentralizedMF, FedAvgMF, FedReconImplicitMF, FedReconMF, ImplicitMF
from fedcf.datasets import DataValidationError, Interactions, make_synthetic_ratings
from fedcf.eval import recon_eval
from fedcf.federated import SGD, NormClippedMean, SGDReconstruction
from fedcf.model_selection import PerUserSplit, UserKFold, UserShuffleSplit, recon_scorer

SMALL = dict(n_factors=3, random_state=0)
FED = dict(n_rounds=6, clients_per_round=40)
RATING = [CentralizedMF(n_epochs=3, **SMALL), FedReconMF(**FED, **SMALL), FedAvgMF(**FED, **SMALL),
          FURLMF(**FED, **SMALL), FedReconMF(reconstruction=SGDReconstruction(steps=5), **FED, **SMALL)]
IMPLICIT = [ImplicitMF(n_epochs=3, **SMALL), FedReconImplicitMF(**FED, **SMALL)]
ALL = RATING + IMPLICIT
IDS = [type(e).__name__ + ("-sgd" if isinstance(getattr(e, "reconstruction", ""),
                                                  SGDReconstruction) else "") for e in ALL]


@pytest.fixture(scope="module")
def df():
    inter = make_synthetic_ratings(160, 60, 4000, n_factors=3, random_state=4)
    out = inter.to_dataframe()
    out["user"] = "u" + out["user"].astype(str)
    return out


def xy(df):
    return df[["user", "item", "timestamp"]], df["rating"]


# ---------------------------------------------------------------------------- fit(X, y) and score
@pytest.mark.parametrize("est", RATING, ids=IDS[:len(RATING)])
def test_fit_pairs_and_y_equals_fit_dataframe(est, df):
    ref = clone(est).fit(df).predict(df)
    X, y = xy(df)
    np.testing.assert_array_equal(clone(est).fit(X, y).predict(df), ref)
    arr = df[["user", "item"]].to_numpy()
    no_time = clone(est).fit(df.drop(columns="timestamp"))
    np.testing.assert_array_equal(clone(est).fit(arr, y.to_numpy()).predict(arr),
                                  no_time.predict(arr))


@pytest.mark.parametrize("est", IMPLICIT, ids=IDS[len(RATING):])
def test_implicit_fit_takes_pairs_alone_or_with_strengths(est, df):
    pairs = df[["user", "item"]]
    ref = clone(est).fit(pairs).item_factors_
    np.testing.assert_array_equal(clone(est).fit(pairs.to_numpy()).item_factors_, ref)
    weighted = clone(est).fit(pairs, df["rating"]).item_factors_
    np.testing.assert_array_equal(weighted, clone(est).fit(df.drop(columns="timestamp"))
                                  .item_factors_)


@pytest.mark.parametrize("call, match", [
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item"]].to_numpy()),
     "requires y to be passed"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item"]], y[:-1]), "same length|length"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item"]], y.to_numpy()[:, None]),
     "one-dimensional"),
    (lambda X, y: FedReconMF(n_factors=2).fit(X.assign(rating=y), y), "ratings given twice"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item", "timestamp"]].to_numpy(), y),
     r"\(n, 2\)"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item"]], y.where(y > 1.5)),
     "non-finite.*row"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["item"]], y), "column 'user' not found"),
    (lambda X, y: CentralizedMF(n_factors=2).fit(X[["user", "item"]]),
     "column 'rating' not found.*as y"),
])
def test_fit_xy_bad_input_named(call, match, df):
    X, y = xy(df)
    with pytest.raises(DataValidationError, match=match):
        call(X, y)


def test_fit_sparse_with_y_refused(df):
    inter = Interactions.coerce(df)
    with pytest.raises(TypeError, match="carries its own values"):
        CentralizedMF(n_factors=2).fit(inter.to_csr(), np.ones(inter.nnz))


@pytest.mark.parametrize("est", RATING[:2], ids=IDS[:2])
def test_score_is_r2_of_predict(est, df):
    X, y = xy(df)
    model = clone(est).fit(X, y)
    assert model.score(X, y) == pytest.approx(r2_score(y, model.predict(X)))
    assert model.score(df) == pytest.approx(model.score(X, y))
    with pytest.raises(DataValidationError, match="true ratings"):
        model.score(X)


@pytest.mark.parametrize("est", IMPLICIT, ids=IDS[len(RATING):])
def test_implicit_score_is_ndcg_better_than_random_items(est, df):
    train_idx, test_idx = next(PerUserSplit(random_state=0).split(df))
    model = clone(est).set_params(n_factors=3).fit(df.iloc[train_idx][["user", "item"]])
    good = model.score(df.iloc[test_idx])
    assert 0 < good <= 1
    model.item_factors_ = np.random.default_rng(0).standard_normal(model.item_factors_.shape)
    assert good > model.score(df.iloc[test_idx])
    with pytest.raises(DataValidationError, match="no pair of X"):
        model.score(pd.DataFrame({"user": ["nobody"], "item": [0]}))


# ---------------------------------------------------------------------------- scikit-learn tools
@pytest.mark.parametrize("est", ALL, ids=IDS)
def test_cross_val_score_every_estimator(est, df):
    X, y = xy(df)
    if est in IMPLICIT:
        s = cross_val_score(est, X[["user", "item"]], cv=PerUserSplit(2, random_state=0))
        assert np.all((s > 0) & (s <= 1))
    else:
        s = cross_val_score(est, X, y, cv=PerUserSplit(2, random_state=0),
                            scoring="neg_root_mean_squared_error")
        assert np.all((s < -0.3) & (s > -2.0))


def test_grid_search_parallel_equals_serial(df):
    X, y = xy(df)
    grid = {"client_update__learning_rate": [0.1, 0.5],  # from the default "sgd" by name
            "server_optimizer__learning_rate": [0.5, 1.0]}
    kw = dict(cv=UserKFold(2, random_state=0), scoring=recon_scorer("rmse"))
    est = FedReconMF(**FED, **SMALL, server_optimizer=SGD(1.0))
    one = GridSearchCV(est, grid, n_jobs=1, **kw).fit(X, y)
    two = GridSearchCV(est, grid, n_jobs=2, **kw).fit(X, y)
    np.testing.assert_array_equal(one.cv_results_["mean_test_score"],
                                  two.cv_results_["mean_test_score"])
    assert one.best_params_ == two.best_params_
    np.testing.assert_array_equal(one.predict(X), two.predict(X))
    assert pickle.loads(pickle.dumps(one.best_estimator_)).score(X, y) == one.best_estimator_.score(X, y)


def test_grid_search_over_nested_phase_parameters(df):
    """Server optimizer and aggregator parameters by their nested names, with a user splitter:
    every setting is really used (the scores differ, the refitted model has the best values)
    and the estimator given to the search is left as it was."""
    X, y = xy(df)
    opt, agg = SGD(1.0), NormClippedMean(1.0)
    est = FedReconMF(**FED, **SMALL, server_optimizer=opt, aggregator=agg)
    grid = {"server_optimizer__learning_rate": [0.3, 1.0], "aggregator__clip_norm": [0.01, 1.0]}
    search = GridSearchCV(est, grid, cv=UserShuffleSplit(1, test_size=0.25, random_state=0),
                          scoring=recon_scorer("rmse")).fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert len(set(np.round(scores, 12))) == 4
    best = search.best_estimator_
    assert best.server_optimizer.learning_rate == search.best_params_[
        "server_optimizer__learning_rate"]
    assert best.aggregator.clip_norm == search.best_params_["aggregator__clip_norm"]
    assert (opt.learning_rate, agg.clip_norm) == (1.0, 1.0) and est.server_optimizer is opt
    with pytest.raises(ValueError, match="SGD: learning_rate must be a positive number"):
        clone(est).set_params(server_optimizer__learning_rate=-1.0)


def test_grid_search_selects_what_a_manual_validation_loop_selects(df):
    """The paper's procedure (fit on train users, ReconEval on validation users, keep the best)
    and GridSearchCV with a user splitter and the ReconEval scorer pick the same values."""
    X, y = xy(df)
    cv = UserShuffleSplit(1, test_size=0.25, random_state=3)
    train_idx, val_idx = next(cv.split(X))
    grid = {"reconstruction__learning_rate": [0.05, 0.5],
            "client_update__learning_rate": [0.05, 0.5]}
    base = FedReconMF(reconstruction=SGDReconstruction(steps=5), **FED, **SMALL)
    search = GridSearchCV(base, grid, cv=cv, scoring=recon_scorer("rmse", random_state=7),
                          refit=False).fit(X, y)
    val = Interactions.coerce(df.iloc[val_idx])
    manual = {}
    for lr_r in grid["reconstruction__learning_rate"]:
        for lr_u in grid["client_update__learning_rate"]:
            model = clone(base).set_params(reconstruction__learning_rate=lr_r,
                                           client_update__learning_rate=lr_u)
            model.fit(X.iloc[train_idx], y.iloc[train_idx])
            manual[(lr_r, lr_u)] = recon_eval(model, val, n_repeats=2, random_state=7)["rmse"]
    best = min(manual, key=manual.get)
    assert (search.best_params_["reconstruction__learning_rate"],
            search.best_params_["client_update__learning_rate"]) == best
    scores = -search.cv_results_["mean_test_score"]
    np.testing.assert_allclose(sorted(scores), sorted(manual.values()), rtol=1e-12)


# scikit-learn's estimator checks that apply to a recommender whose X is (user, item) id pairs.
APPLICABLE = [ec.check_get_params_invariance, ec.check_set_params,
              ec.check_no_attributes_set_in_init, ec.check_estimators_overwrite_params,
              ec.check_parameters_default_constructible, ec.check_estimator_cloneable,
              ec.check_estimator_repr, ec.check_do_not_raise_errors_in_init_or_set_params,
              ec.check_estimators_fit_returns_self, ec.check_estimators_unfitted,
              ec.check_fit_check_is_fitted, ec.check_fit_idempotent, ec.check_fit1d,
              ec.check_mixin_order, ec.check_readonly_memmap_input,
              ec.check_supervised_y_no_nan, ec.check_requires_y_none]
# Not applicable (README, "scikit-learn"): checks that feed an (n, d) float feature matrix with
# d != 2 (check_dont_overwrite_parameters, dtypes, pickle, dict_unchanged, subset/sample-order
# invariance, n_features_in, pipeline_consistency, fit2d_*: X here is a user and an item id per
# row, so a 3-column X is refused — the invariants of the first three are tested below on pairs);
# sample_weight checks (a client's weight is the federated weighting, not a per-row weight);
# sparse-input checks (a sparse X is the user × item matrix itself and carries the ratings); and
# classifier, outlier, transformer and feature-name checks.


@pytest.mark.parametrize("est", [RATING[0], RATING[1], IMPLICIT[0], IMPLICIT[1]],
                         ids=[IDS[0], IDS[1], IDS[-2], IDS[-1]])
@pytest.mark.parametrize("check", APPLICABLE, ids=lambda c: c.__name__)
def test_sklearn_estimator_checks(check, est):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(type(est).__name__, clone(est).set_params(n_factors=2))


@pytest.mark.parametrize("est", ALL, ids=IDS)
def test_fit_keeps_params_and_pickles(est, df):
    """check_dont_overwrite_parameters and check_estimators_pickle, on (user, item) pairs."""
    X, y = xy(df)
    model = clone(est)
    before = model.get_params(deep=False)
    public = set(vars(model))
    model.fit(X, None if est in IMPLICIT else y)
    assert model.get_params(deep=False) == before
    added = set(vars(model)) - public
    assert all(k.endswith("_") or k.startswith("_") for k in added), added
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.predict(X), model.predict(X))


# ---------------------------------------------------------------------------- splitters
def test_user_kfold_holds_out_each_user_exactly_once(df):
    cv = UserKFold(4, random_state=0)
    seen = []
    for tr, te in cv.split(df):
        assert not set(df.user.iloc[tr]) & set(df.user.iloc[te])
        assert len(tr) + len(te) == len(df)
        seen += list(df.user.iloc[te].unique())
    assert sorted(seen) == sorted(df.user.unique())
    assert cv.get_n_splits() == 4
    first = [te for _, te in cv.split(df)]
    np.testing.assert_array_equal(first[0], next(iter(cv.split(df)))[1])  # deterministic


def test_user_shuffle_split_and_arrays(df):
    arr = df[["user", "item"]].to_numpy()
    folds = list(UserShuffleSplit(3, test_size=0.25, random_state=1).split(arr))
    assert len(folds) == 3
    n_users = df.user.nunique()
    for tr, te in folds:
        assert not set(arr[tr, 0]) & set(arr[te, 0])
        assert len(set(arr[te, 0])) == round(0.25 * n_users)
    assert not np.array_equal(folds[0][1], folds[1][1])


def test_per_user_split_random_and_time(df):
    counts = df.user.value_counts()
    tr, te = next(PerUserSplit(test_size=0.3, random_state=0).split(df))
    assert set(df.user.iloc[tr]) == set(df.user)  # every user keeps a training row
    n_te = df.iloc[te].user.value_counts().reindex(counts.index, fill_value=0)
    expect = np.minimum(np.floor(0.3 * counts + 0.5), counts - 1)
    np.testing.assert_array_equal(n_te.to_numpy(), expect.to_numpy())
    tr, te = next(PerUserSplit(test_size=0.3, order="time").split(df))
    last_train = df.iloc[tr].groupby("user").timestamp.max()
    first_test = df.iloc[te].groupby("user").timestamp.min()
    assert (first_test >= last_train.reindex(first_test.index)).all()


@pytest.mark.parametrize("cv, X, match", [
    (UserKFold(1), None, "n_splits must be an integer >= 2"),
    (UserKFold(500), None, "more than the 160 users"),
    (UserKFold(2, user_col="uid"), None, "column 'uid' not found"),
    (UserShuffleSplit(test_size=1.0), None, "test_size must be a number in"),
    (PerUserSplit(2, order="time"), None, "one outcome"),
    (PerUserSplit(order="latest"), None, "order must be"),
    (PerUserSplit(order="time"), "array", "needs X as a DataFrame"),
    (UserKFold(2), "3d", "DataFrame or an"),
])
def test_splitter_bad_input(cv, X, match, df):
    data = {None: df, "array": df[["user", "item"]].to_numpy(),
            "3d": np.zeros((3, 2, 2))}[X]
    with pytest.raises(ValueError, match=match):
        list(cv.split(data))


# ---------------------------------------------------------------------------- ReconEval scorer
def test_recon_scorer_matches_recon_eval_and_is_deterministic(df):
    users = df.user.unique()
    held = df[df.user.isin(users[:40])]
    model = FedReconMF(**FED, **SMALL).fit(df[~df.user.isin(users[:40])])
    X, y = xy(held)
    ref = recon_eval(model, Interactions.coerce(held), n_repeats=2, random_state=5)
    assert recon_scorer("rmse", random_state=5)(model, X, y) == pytest.approx(-ref["rmse"])
    assert recon_scorer("mae", random_state=5)(model, X, y) == pytest.approx(-ref["mae"])
    assert recon_scorer("accuracy", random_state=5)(model, X, y) == pytest.approx(ref["accuracy"])
    assert recon_scorer(random_state=5)(model, X, y) == recon_scorer(random_state=5)(model, X, y)
    assert recon_scorer(random_state=5)(model, held) == recon_scorer(random_state=5)(model, X, y)


def test_recon_scorer_ranking_for_implicit(df):
    users = df.user.unique()
    held = df[df.user.isin(users[:40])][["user", "item"]]
    model = FedReconImplicitMF(**FED, **SMALL).fit(df[~df.user.isin(users[:40])][["user", "item"]])
    p = recon_scorer("precision@5")(model, held)
    n = recon_scorer("ndcg@5")(model, held)
    assert 0 < p <= 1 and 0 < n <= 1
    s = cross_val_score(FedReconImplicitMF(**FED, **SMALL), df[["user", "item"]],
                        cv=UserKFold(2, random_state=0), scoring=recon_scorer("ndcg@10"))
    assert np.all(s > 0)


@pytest.mark.parametrize("kw, match", [
    (dict(metric="rmse@3"), "metric must be"),
    (dict(metric="ndcg@x"), "positive integer"),
    (dict(metric="ndcg@0"), "positive integer"),
    (dict(metric="auc"), "metric must be"),
    (dict(support_fraction=1.0), "support_fraction"),
    (dict(split="none"), "split must be"),
])
def test_recon_scorer_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        recon_scorer(**kw)


def test_recon_scorer_needs_ratings_for_rating_metrics(df):
    model = CentralizedMF(n_factors=2, n_epochs=1).fit(df)
    with pytest.raises(DataValidationError, match="needs the held-out ratings"):
        recon_scorer("rmse")(model, df[["user", "item"]])


def test_grid_search_script_tunes_nested_phase_parameters(tmp_path):
    """scripts/grid_search.py (README's GridSearchCV over server_optimizer__learning_rate and
    aggregator__clip_norm) on offline synthetic data: every setting scored, the best selected."""
    import json

    script = load_script("grid_search")
    out = tmp_path / "grid.json"
    script.main(["--dataset", "synthetic", "--quick", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 12 and {tuple(sorted(r["params"])) for r in doc["rows"]} == {
        ("aggregator__clip_norm", "server_optimizer__learning_rate"),
        ("aggregator__clip_norm", "aggregator__target_quantile",
         "server_optimizer__learning_rate")}
    best = min(doc["rows"], key=lambda r: r["rmse"])
    assert doc["best"] == best["params"] and best["rank"] == 1
    assert np.isfinite(doc["epsilon"]) and doc["epsilon"] > 0
    by = {tuple(r["params"].values()): r["rmse"] for r in doc["rows"]}
    assert len(set(by.values())) > 1  # the settings reached the fits
