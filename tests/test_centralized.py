import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from fedcf import CentralizedMF
from fedcf.datasets import DataValidationError
from fedcf.eval import random_split, rmse


@pytest.fixture(scope="module")
def split(small_population):
    inter, truth = small_population
    return random_split(inter, (0.9, 0.1), random_state=0), truth


def test_sklearn_api(small_population):
    inter, _ = small_population
    model = CentralizedMF(n_factors=4, n_epochs=2, random_state=0)
    assert model.get_params()["n_factors"] == 4
    c = clone(model).set_params(solver="sgd")
    assert c.solver == "sgd" and model.solver == "als"
    with pytest.raises(NotFittedError):
        model.predict(pd.DataFrame({"user": [0], "item": [0]}))
    assert model.fit(inter) is model
    assert model.item_factors_.shape == (inter.n_items, 4)
    assert model.item_factors_.dtype == np.float32
    assert not hasattr(CentralizedMF(), "item_factors_")  # __init__ does no work


@pytest.mark.parametrize("bad,match", [
    (dict(n_factors=0), "n_factors must be >= 1"),
    (dict(solver="adam"), "solver must be one of"),
    (dict(regularization=-1.0), "regularization must be >= 0"),
    (dict(learning_rate=0.0), "learning_rate must be > 0"),
    (dict(dtype="int8"), "dtype must be float32 or float64"),
    (dict(rating_scale=(5, 1)), "rating_scale"),
])
def test_bad_params_are_named(small_population, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CentralizedMF(**bad).fit(small_population[0])


@pytest.mark.parametrize("solver,kw", [("als", {}), ("sgd", dict(learning_rate=0.01, n_epochs=40))])
def test_recovers_low_rank_population(split, solver, kw):
    (train, test), _ = split
    df = test.to_dataframe()
    model = CentralizedMF(n_factors=8, solver=solver, regularization=0.05, random_state=0,
                          **kw).fit(train)
    err = rmse(df.rating, model.predict(df))
    baseline = rmse(df.rating, np.full(len(df), train.values.mean()))
    assert err < 0.75 * baseline, (err, baseline)


def test_cg_solver_matches_cholesky_accuracy(split):
    """als_solver='cg' (3 warm-started CG steps per row) reaches the exact solver's test RMSE
    within 2 %, and cg_steps is validated."""
    (train, test), _ = split
    df = test.to_dataframe()
    errs = {s: rmse(df.rating, CentralizedMF(n_factors=8, als_solver=s, random_state=0)
                    .fit(train).predict(df)) for s in ("cholesky", "cg")}
    assert errs["cg"] < 1.02 * errs["cholesky"], errs
    with pytest.raises(ValueError, match="cg_steps"):
        CentralizedMF(als_solver="cg", cg_steps=0).fit(train)
    with pytest.raises(ValueError, match="als_solver must be one of"):
        CentralizedMF(als_solver="lu").fit(train)


def test_same_seed_same_model(split):
    (train, _), _ = split
    a = CentralizedMF(n_factors=4, solver="sgd", n_epochs=3, random_state=5).fit(train)
    b = CentralizedMF(n_factors=4, solver="sgd", n_epochs=3, random_state=5).fit(train)
    assert np.array_equal(a.item_factors_, b.item_factors_)


def test_predict_fallbacks_never_index_error(split):
    (train, _), _ = split
    m = CentralizedMF(n_factors=4, n_epochs=3, random_state=0).fit(train)
    known_u, known_i = train.user_ids[0], train.item_ids[0]
    pred = m.predict(pd.DataFrame({"user": [known_u, "stranger", known_u, "stranger"],
                                   "item": [known_i, known_i, "new item", "new item"]}),
                     clip=False)
    mu = m.global_mean_
    assert pred[1] == pytest.approx(mu + m.item_biases_[0])
    assert pred[2] == pytest.approx(mu + m.user_biases_[0])
    assert pred[3] == pytest.approx(mu)
    with pytest.raises(DataValidationError, match="column 'item' not found"):
        m.predict(pd.DataFrame({"user": [1]}))
    assert m.predict(np.array([[known_u, known_i]])).shape == (1,)


def test_reconstruct_and_recommend(split):
    (train, _), truth = split
    m = CentralizedMF(n_factors=8, regularization=0.05, random_state=0).fit(train)
    u = 3
    s, e = train.indptr[u], train.indptr[u + 1]
    items, ratings = train.item_ids[train.items[s:e]], train.values[s:e]
    local = m.reconstruct(items, ratings)
    # the exact ridge fold-in of a seen user lands close to their ALS factors
    assert np.corrcoef(local.factors, m.user_factors_[u])[0, 1] > 0.95
    rec = m.recommend(items, ratings, n=7)
    assert len(rec) == 7 and not set(rec["item"]) & set(items)
    assert rec["score"].is_monotonic_decreasing
    rec2 = m.recommend(user=train.user_ids[u], n=7)
    assert not set(rec2["item"]) & set(items)
    with pytest.raises(KeyError, match="not seen in fit"):
        m.recommend(user="nobody")
    with pytest.raises(DataValidationError, match="mismatched lengths"):
        m.reconstruct([1, 2], [3.0])
    unknown_only = m.reconstruct(["x", "y"], [5.0, 1.0])
    assert np.all(unknown_only.factors == 0)


def test_save_load_roundtrip(tmp_path, split):
    (train, test), _ = split
    m = CentralizedMF(n_factors=4, n_epochs=3, random_state=0, dtype="float64").fit(train)
    path = m.save(tmp_path / "model")
    assert path.suffix == ".npz"
    with np.load(path, allow_pickle=False) as z:  # loadable without pickle
        assert "metadata" in z.files
    m2 = CentralizedMF.load(path)
    df = test.to_dataframe()
    np.testing.assert_array_equal(m.predict(df), m2.predict(df))
    assert m2.get_params() == m.get_params()
    from fedcf.models.base import MFEstimatorBase

    class Other(MFEstimatorBase):
        pass

    with pytest.raises(ValueError, match="holds a CentralizedMF"):
        Other.load(path)
