"""One contract for every estimator (after implicit's RecommenderBaseTestMixin): the
scikit-learn API, NotFittedError, fit returns self, save → load → identical predictions and
recommendations, predict fallbacks for unknown ids, reconstruction that depends only on the
user, and a fit that fails leaving the estimator as it was."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from fedcf import (
    FURLMF,
    NCF,
    CentralizedMF,
    FedAvgMF,
    FedReconImplicitMF,
    FedReconMF,
    ImplicitMF,
)
from fedcf.federated import FedMF, FedNCF, SGDReconstruction
from fedcf.models.sampled_nets import NeuMFScoring

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
    ImplicitMF(n_epochs=3, biases=True, **SMALL),
    FedReconImplicitMF(biases=True, **FED, **SMALL),
    FedMF(**FED, **SMALL),
    FedNCF(layers=(4,), **FED, **SMALL),
    NCF(layers=(4,), n_epochs=3, **SMALL),
]
IDS = [type(e).__name__ + ("-sgd" if isinstance(getattr(e, "reconstruction", ""),
                                                  SGDReconstruction) else "")
       + ("-biases" if isinstance(e, (ImplicitMF, FedReconImplicitMF)) and e.biases else "")
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
    assert np.all(np.isfinite(pred))
    if isinstance(m, NeuMFScoring):  # no user / item term: that side's embeddings at zero
        zero = {"pg": np.zeros((1, 3)), "pm": np.zeros((1, 3))}
        net, dense = m._net(), m._net().unpack(m.dense_params_.astype(float))
        row = m.item_factors_[list(m.item_ids_).index(1)].astype(float)
        mu = net.logits(zero, {"qg": np.zeros((1, 3)), "qm": np.zeros((1, 3))}, dense)[0]
        item_only = net.logits(zero, {"qg": row[None, :3], "qm": row[None, 3:]}, dense)[0]
        K //= 2
    else:
        item_only = mu + m.item_biases_[list(m.item_ids_).index(1)]
    assert pred[2] == pytest.approx(mu) and pred[0] == pytest.approx(item_only)
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


# ---------------------------------------------------------------- every phase object, every model
def _taking(param):
    pairs = [(i, e) for i, e in zip(IDS, ESTIMATORS) if param in e.get_params()]
    return [e for _, e in pairs], [i for i, _ in pairs]


FEDERATED, FED_IDS = _taking("aggregator")  # FedRecon, FedAvg, FURL: aggregated by a server
EXECUTED, EXEC_IDS = _taking("executor")  # stateless clients run by an executor (FedRecon)


def aggregators():
    from fedcf.federated import (
        CoordinateMedian,
        DifferentialPrivacy,
        DPGaussianMean,
        FoolsGoldMean,
        NormClippedMean,
        SecureAggregation,
        TrimmedMean,
        WeightedMean,
    )

    seeded = dict(delta=1e-4, insecure_seeded_noise=True)  # seeded: two fits can be compared
    return {"mean": WeightedMean(), "norm-clipped": NormClippedMean(0.5),
            "trimmed-mean": TrimmedMean(0.1), "median": CoordinateMedian(),
            "foolsgold": FoolsGoldMean(), "dp": DPGaussianMean(0.5, 0.8, **seeded),
            "secure": SecureAggregation(value_bound=10.0, neighbours=6),
            "dp-secure": DifferentialPrivacy(SecureAggregation(value_bound=10.0, neighbours=6),
                                             0.5, 0.8, **seeded)}


def executors():
    from fedcf.federated import LocalExecutor
    from fedcf.federated.aggregators.attacks import AttackedExecutor

    return {"local": LocalExecutor(), "attacked": AttackedExecutor("noise", fraction=0.1,
                                                                    executor=LocalExecutor())}


def save_load_clone_fit(est, data, tmp_path):
    """Fit, save, load: the loaded model predicts the same and has the same parameters (phase
    objects as objects, not text); a clone of the loaded model refits to the same model as a
    clone of the original (a DP release does not carry the seed: it is given back)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "insecure_seeded_noise", UserWarning)
        m = clone(est).fit(data)
        back = type(m).load(m.save(tmp_path / "m.npz"))
        np.testing.assert_array_equal(back.item_factors_, m.item_factors_)
        for name in ("epsilon_", "epsilons_", "noise_multiplier_", "learned_hyperparams_"):
            assert getattr(back, name, None) == getattr(m, name, None), name
        pairs = data.head(30)
        if getattr(back, "user_factors_", None) is None:  # FedRecon: every user scores as new
            pairs = pairs.assign(user="nobody")
        np.testing.assert_array_equal(back.predict(pairs), m.predict(pairs))
        seed = {} if back.random_state is not None else {"random_state": m.random_state}
        for key, value in m.get_params(deep=False).items():
            if key not in seed:
                assert repr(back.get_params(deep=False)[key]) == repr(value), key
                assert type(back.get_params(deep=False)[key]) is type(value), key
        again = clone(back).set_params(**seed).fit(data)
        np.testing.assert_array_equal(again.item_factors_, clone(m).fit(data).item_factors_)
    return m


@pytest.mark.parametrize("agg", sorted(aggregators()))
@pytest.mark.parametrize("est", FEDERATED, ids=FED_IDS)
def test_save_load_clone_fit_with_every_aggregator(est, agg, data, tmp_path):
    est = clone(est).set_params(aggregator=aggregators()[agg], n_rounds=2, clients_per_round=20)
    if "rating_scale" in est.get_params():  # DP needs the public scale; the others take it too
        est.set_params(rating_scale=(1, 5))
    m = save_load_clone_fit(est, data, tmp_path)
    assert np.isfinite(m.item_factors_).all()


@pytest.mark.parametrize("ex", sorted(executors()))
@pytest.mark.parametrize("est", EXECUTED, ids=EXEC_IDS)
def test_save_load_clone_fit_with_every_executor(est, ex, data, tmp_path):
    save_load_clone_fit(clone(est).set_params(executor=executors()[ex], n_rounds=2), data,
                        tmp_path)


@pytest.mark.parametrize("est", [e for e in ESTIMATORS if e not in FEDERATED],
                         ids=[i for i, e in zip(IDS, ESTIMATORS) if e not in FEDERATED])
def test_save_load_clone_fit_centralized(est, data, tmp_path):
    save_load_clone_fit(est, data, tmp_path)


@pytest.mark.parametrize("name", IDS)
def test_ids_of_every_kind(fitted, data, name):
    """reconstruct / predict / predict_local / recommend with ids the model knows, ids it does
    not know, ids of the other kind (int for its text user ids, text for its int item ids) and
    missing ids: unknown ids are fallbacks, the other kind is named in a warning and never
    turns the known ids into unknown ones, a missing id (None, NaN) is an error naming it."""
    m = fitted[name]
    items, ratings = list(m.item_ids_[:3]), [5.0, 1.0, 4.0]
    ref = m.reconstruct(items, ratings)
    assert np.abs(ref.factors).sum() > 0
    unknown = m.reconstruct(items + [10**9], ratings + [3.0])
    np.testing.assert_array_equal(unknown.factors, ref.factors)
    with pytest.warns(UserWarning, match="item id 'new' is str but the model's item ids are"):
        mixed = m.reconstruct(items + ["new"], ratings + [3.0])
    np.testing.assert_array_equal(mixed.factors, ref.factors)
    for bad in (items + [None], items + [float("nan")], np.array(items + [np.nan])):
        with pytest.raises(ValueError, match="missing id .* at position 3"):
            m.reconstruct(bad, ratings + [3.0])
    with pytest.raises(TypeError, match="got None"):
        m.reconstruct(None)
    with pytest.warns(UserWarning, match="item id 'x'"):
        local = m.predict_local(ref, [items[0], "x", 10**9])
    np.testing.assert_array_equal(local[1], local[2])  # both unknown: the same fallback
    assert local[0] == m.predict_local(ref, [items[0]])[0]
    user = data["user"].iloc[0]
    pairs = pd.DataFrame({"user": [user, "nobody"], "item": [items[0], items[0]]})
    with pytest.warns(UserWarning, match="user id 7 is int but the model's user ids are text"):
        other = m.predict(pd.DataFrame({"user": [7], "item": [items[0]]}))
    assert other[0] == m.predict(pairs)[1]  # an int id for text ids is an unknown user
    with pytest.raises(ValueError, match="missing id"):
        m.predict(pd.DataFrame({"user": [user, None], "item": items[:2]}))
    with pytest.raises(ValueError, match="pass either items"):
        m.recommend(user=None)
    recs = m.recommend(items=items, ratings=ratings, n=4)
    assert len(recs) == 4 and not set(recs["item"]) & set(items)
