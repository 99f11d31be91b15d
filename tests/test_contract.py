"""One contract for all six estimators (after implicit's RecommenderBaseTestMixin): the
scikit-learn API, NotFittedError, fit returns self, save → load → identical predictions and
recommendations, predict fallbacks for unknown ids, reconstruction that depends only on the
user, and a fit that fails leaving the estimator as it was."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from fedcf import FURLMF, CentralizedMF, FedAvgMF, FedReconImplicitMF, FedReconMF, ImplicitMF
from fedcf.federated import SGDReconstruction

SMALL = dict(n_factors=3, random_state=0)
FED = dict(n_rounds=4, clients_per_round=40)
ESTIMATORS = [
    CentralizedMF(n_epochs=3, **SMALL),
    ImplicitMF(n_epochs=3, **SMALL),
    FedReconMF(**FED, **SMALL),
    FedReconMF(reconstruction=SGDReconstruction(steps=5), **FED, **SMALL),
    FedAvgMF(**FED, **SMALL),
    FURLMF(**FED, **SMALL),
    FedReconImplicitMF(**FED, **SMALL),
]
IDS = [type(e).__name__ + ("-sgd" if isinstance(getattr(e, "reconstruction", ""),
                                                  SGDReconstruction) else "")
       for e in ESTIMATORS]


@pytest.fixture(scope="module")
def data(small_population_module):
    inter = small_population_module
    df = inter.to_dataframe()
    df["user"] = "u" + df["user"].astype(str)  # string user ids
    return df


@pytest.fixture(scope="module")
def small_population_module():
    from fedcf.datasets import make_synthetic_ratings

    return make_synthetic_ratings(150, 60, 3000, n_factors=3, random_state=4)


@pytest.fixture(scope="module")
def fitted(data):
    return {i: clone(e).fit(data) for i, e in zip(IDS, ESTIMATORS)}


@pytest.mark.parametrize("est", ESTIMATORS, ids=IDS)
def test_params_roundtrip_and_not_fitted(est, data):
    e = clone(est)
    assert clone(e).get_params() == e.get_params()
    e.set_params(n_factors=4)
    assert e.get_params()["n_factors"] == 4
    assert not [k for k in vars(e) if k.endswith("_")]
    for call in (lambda: e.predict(data.head()), lambda: e.recommend(items=[1]),
                 lambda: e.reconstruct([1]), lambda: e.save("never.npz")):
        with pytest.raises(NotFittedError):
            call()


@pytest.mark.parametrize("name", IDS)
def test_save_load_identical(fitted, data, tmp_path, name):
    m = fitted[name]
    path = m.save(tmp_path / "m")
    m2 = type(m).load(path)
    hist = data[data.user == "u3"]
    r1 = m.recommend(items=hist.item, ratings=hist.rating, n=7)
    r2 = m2.recommend(items=hist.item, ratings=hist.rating, n=7)
    pd.testing.assert_frame_equal(r1, r2)
    new_pairs = pd.DataFrame({"user": ["nobody"] * 3, "item": [1, 2, 99999]})
    np.testing.assert_array_equal(m.predict(new_pairs), m2.predict(new_pairs))
    if getattr(m, "user_factors_", None) is not None:  # models that keep user rows
        np.testing.assert_array_equal(m.predict(data.head(50)), m2.predict(data.head(50)))
        pd.testing.assert_frame_equal(m.recommend(user="u3"), m2.recommend(user="u3"))
        assert not set(m2.recommend(user="u3", n=60).item) & set(hist.item)
    else:  # FedRecon keeps no user data and by default no user id: it says so
        with pytest.warns(UserWarning, match="saved without its training user ids"):
            m2.predict(data.head(5))
        with pytest.raises(ValueError, match="holds no user data"):
            type(m).load(m.save(tmp_path / "ids", user_ids=True)).predict(data.head(5))


@pytest.mark.parametrize("name", IDS)
def test_predict_fallbacks(fitted, name):
    m = fitted[name]
    mu, K = m.global_mean_, m.item_factors_.shape[1]
    pairs = pd.DataFrame({"user": ["ghost", "u3", "ghost"], "item": [1, "nope", "nope"]})
    pred = m.predict(pairs, clip=False)
    assert np.all(np.isfinite(pred)) and pred[2] == pytest.approx(mu)
    assert pred[0] == pytest.approx(mu + m.item_biases_[list(m.item_ids_).index(1)])
    assert K == 3


@pytest.mark.parametrize("name", IDS)
def test_reconstruction_depends_only_on_the_user(fitted, data, name):
    from fedcf.datasets import Interactions

    m = fitted[name]
    inter = Interactions.from_dataframe(data)
    a = inter.subset_users(np.arange(10))
    both = inter.subset_users(np.r_[np.arange(40, 60), np.arange(10)])
    Pa, ca = m.reconstruct_users(a)
    Pb, cb = m.reconstruct_users(both)
    np.testing.assert_array_equal(Pa, Pb[20:])
    np.testing.assert_array_equal(ca, cb[20:])
    hist = data[data.user == "u7"]
    l1, l2 = m.reconstruct(hist.item, hist.rating), m.reconstruct(hist.item, hist.rating)
    np.testing.assert_array_equal(l1.factors, l2.factors)
    np.testing.assert_allclose(m.predict_local(l1, hist.item[:3]),
                               m.predict_local(l2, hist.item[:3]))


@pytest.mark.parametrize("name", IDS)
def test_failed_refit_leaves_model_as_it_was(fitted, data, name):
    m = clone(fitted[name]).fit(data)
    before = {k: v for k, v in vars(m).items() if k.endswith("_")}
    pred = m.predict(data.head(20))
    other = data.copy()
    other["item"] = other["item"] + 10_000  # another catalog: a half-replaced model would mix
    if hasattr(m, "n_rounds"):  # fails mid-fit, after the new id maps were set for the callback
        def boom(model, done):
            raise RuntimeError("callback failed")

        m.set_params(eval_every=1)
        with pytest.raises(RuntimeError, match="callback failed"):
            m.fit(other, callback=boom)
    else:
        other.loc[other.index[3], "rating"] = np.nan
        with pytest.raises(ValueError, match="non-finite"):
            m.fit(other)
    assert {k for k in vars(m) if k.endswith("_")} == set(before)
    for k, v in before.items():
        assert getattr(m, k) is v
    np.testing.assert_array_equal(m.predict(data.head(20)), pred)


def test_phase_objects_survive_save_load_and_refit(data, tmp_path):
    from fedcf.federated import Adam, DifferentialPrivacy, SecureAggregation

    agg = DifferentialPrivacy(SecureAggregation(value_bound=10.0, neighbours=8), 0.5, 1.0,
                              delta=1e-4, insecure_seeded_noise=True)  # seeded: refits compare
    m = FedReconMF(**FED, **SMALL, server_optimizer=Adam(0.02, beta1=0.8), aggregator=agg,
                   rating_scale=(1, 5))
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        m.fit(data)
    back = FedReconMF.load(m.save(tmp_path / "m.npz"))
    assert repr(back.server_optimizer) == repr(m.server_optimizer)
    assert repr(back.aggregator) == repr(agg) and isinstance(back.aggregator.aggregator,
                                                              SecureAggregation)
    seed = {"random_state": m.random_state}  # a DP release does not carry the seed
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        np.testing.assert_array_equal(clone(back).set_params(**seed).fit(data).item_factors_,
                                      clone(m).fit(data).item_factors_)
