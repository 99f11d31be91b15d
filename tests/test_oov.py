"""OOV expansion on the device (the seed's form): the adapter's gradient, uploads that do not
depend on a device's out-of-catalog items, an extractor fitted on catalog rows alone, and the
target — the on-device adapter beats OOV-as-UNK on out-of-catalog entries."""

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import DataValidationError, Interactions
from fedcf.eval import support_query_split
from fedcf.federated import OOVExpansion, OOVLocalParams, OpenCatalog
from fedcf.federated.algorithms.oov import adapter_init, adapter_loss_grad


def _population(n_users=400, n_items=80, seed=0):
    """Ratings 3 + u·v + noise, popularity falling with the item id; item features are the
    items' true vectors plus noise (so they predict an item's row)."""
    rng = np.random.default_rng(seed)
    U, V = rng.normal(0, 0.8, (n_users, 3)), rng.normal(0, 0.8, (n_items, 3))
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.6
    users, items = [], []
    for u in range(n_users):
        chosen = rng.choice(n_items, 25, replace=False, p=pop / pop.sum())
        users += [u] * 25
        items += list(chosen)
    users, items = np.array(users), np.array(items)
    r = np.clip(np.round(3 + np.sum(U[users] * V[items], 1) + rng.normal(0, 0.3, len(users))),
                1, 5)
    inter = Interactions.from_arrays(users, items, r, item_catalog=np.arange(n_items))
    feats = (np.arange(n_items), V + rng.normal(0, 0.1, V.shape))
    return inter, feats


FIT = dict(n_factors=3, n_rounds=60, clients_per_round=40, random_state=0)


@pytest.fixture(scope="module")
def world():
    inter, feats = _population()
    train = inter.subset_users(np.arange(320))
    test = inter.subset_users(np.arange(320, 400))
    support, query = support_query_split(test, "random", 0.5, 0)
    catalog = list(range(40))  # the 40 most popular
    dropped = FedReconMF(**FIT, item_space=OpenCatalog(catalog, drop_out_of_catalog=True))
    return train, support, query, feats, catalog, dropped.fit(train)


@pytest.mark.parametrize("hidden", [(4,), (3, 5)])
def test_adapter_gradient_matches_finite_differences(hidden):
    rng = np.random.default_rng(1)
    theta = [w + rng.normal(0, 0.3, w.shape) for w in adapter_init(rng, 4, hidden, 0.5)]
    E, t, x = rng.normal(size=(7, 4)), rng.normal(size=7), rng.normal(size=4)
    _, grads = adapter_loss_grad(theta, E, t, x, 0.05)
    h = 1e-6
    for w, g in zip(theta, grads):
        num = np.zeros_like(w)
        for j in np.ndindex(w.shape):
            old = w[j]
            w[j] = old + h
            up = adapter_loss_grad(theta, E, t, x, 0.05)[0]
            w[j] = old - h
            down = adapter_loss_grad(theta, E, t, x, 0.05)[0]
            w[j] = old
            num[j] = (up - down) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8)


def test_uploads_do_not_depend_on_out_of_catalog_items(world):
    """With drop_out_of_catalog, training with and without the devices' out-of-catalog
    entries gives the same global model round for round: no upload depended on them. Without
    it, the two differ (the test can see a dependence)."""
    train, catalog = world[0], world[4]
    inside = train.take(np.isin(train.item_ids[train.items], catalog))
    kw = dict(FIT, n_rounds=5)
    for drop in (True, False):
        space = OpenCatalog(catalog, drop_out_of_catalog=drop)
        a = FedReconMF(**kw, item_space=space).fit(train)
        b = FedReconMF(**kw, item_space=space).fit(inside)
        same = np.array_equal(a.item_factors_, b.item_factors_) and \
            [h["values_up"] for h in a.history_] == [h["values_up"] for h in b.history_]
        assert same == drop, drop


def test_extractor_is_fitted_to_catalog_rows_only(world):
    model, feats = world[5], world[3]
    oov = OOVExpansion(encoder_regularization=0.5).fit(model, feats)
    ids, F = feats
    moved = F.copy()
    moved[40:] += 7.0  # out-of-catalog features play no part in the extractor
    np.testing.assert_array_equal(OOVExpansion(encoder_regularization=0.5).fit(
        model, (ids, moved)).encoder_, oov.encoder_)
    X = np.column_stack([F[:40], np.ones(40)])
    Y = np.column_stack([model.item_factors_, model.item_biases_])
    pen = np.diag([0.5, 0.5, 0.5, 0.0])
    np.testing.assert_allclose(oov.encoder_, np.linalg.solve(X.T @ X + pen, X.T @ Y),
                               rtol=1e-6, atol=1e-8)


def test_trivial_adapter_scores_with_the_extractor_rows(world):
    model, feats = world[5], world[3]
    oov = OOVExpansion(adapter=False).fit(model, feats)
    local = oov.personalize([1, 50, 60], [4.0, 2.0, 5.0])
    assert local.adapter == ()
    E, has = oov.encode([55, 2])
    got = oov.predict_local(local, [55, 2], clip=False)
    p, c, mu = local.factors, local.bias, model.global_mean_
    assert got[0] == pytest.approx(mu + c + E[0] @ np.append(p, 1.0))
    assert got[1] == pytest.approx(mu + c + model.item_biases_[2] + model.item_factors_[2] @ p)
    np.testing.assert_array_equal(local.factors, model.reconstruct([1], [4.0]).factors)


def test_on_device_adapter_beats_oov_as_unk_on_out_of_catalog_entries(world):
    train, support, query, feats, catalog, dropped = world
    out = ~np.isin(query.item_ids[query.items], catalog)
    unk = FedReconMF(**FIT, item_space=OpenCatalog(catalog, unknown_item_row=True)).fit(train)

    def rmse(pred):
        return float(np.sqrt(np.mean((pred[out] - query.values[out]) ** 2)))

    base = rmse(unk.recon_predict(support, query))
    trivial = rmse(OOVExpansion(adapter=False).fit(dropped, feats).recon_predict(support, query))
    adapted = rmse(OOVExpansion(steps=200, random_state=0).fit(dropped, feats).recon_predict(
        support, query))
    assert adapted < trivial < base, (adapted, trivial, base)  # the adapter is needed too


def _adapter_move(oov, n, rng_seed=0, *, norm_of="move"):
    """‖θ − θ₀‖ (or ‖θ‖: how far from the identity) after training on n out-of-catalog
    entries whose residuals all ask for the same shift (so the data term is the same per rating
    whatever n is)."""
    rng = np.random.default_rng(rng_seed)
    E = np.tile(rng.normal(0, 0.5, (1, 4)), (n, 1))
    t, x = np.full(n, 1.5), np.array([0.3, -0.2, 0.1, 1.0])
    theta0 = adapter_init(np.random.default_rng(1), 4, (5,), 0.01)
    theta = oov._train(theta0, E, t, x)
    ref = [0.0 * w for w in theta0] if norm_of == "identity" else theta0
    return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(theta, ref))))


def test_the_adapters_prior_is_worth_a_number_of_ratings():
    """regularization/n: with the same per-rating evidence, a device with many out-of-catalog
    ratings moves its adapter further than one with two (a per-device L2 on the mean loss would
    move both alike)."""
    oov = OOVExpansion(regularization=10.0, steps=200)
    few, many = _adapter_move(oov, 2), _adapter_move(oov, 200)
    assert many > 2 * few, (few, many)


def test_no_regularization_makes_the_steps_diverge():
    """The L2 term's step is exact (proximal): a huge weight pins the adapter at the identity
    instead of overshooting (an explicit step of 2ηλ/n ≫ 2 would blow up)."""
    oov = OOVExpansion(regularization=1e9, learning_rate=0.5, steps=50)
    away = _adapter_move(oov, 3, norm_of="identity")
    assert np.isfinite(away) and away < 1e-6


def test_a_device_is_personalized_alone_or_in_company(world):
    _, support, query, feats, _, model = world
    oov = OOVExpansion(steps=20, random_state=3).fit(model, feats)
    both = oov.recon_predict(support, query)
    u = 5
    s, q = slice(support.indptr[u], support.indptr[u + 1]), slice(query.indptr[u],
                                                                   query.indptr[u + 1])
    local = oov.personalize(support.item_ids[support.items[s]], support.values[s])
    np.testing.assert_array_equal(oov.predict_local(local, query.item_ids[query.items[q]]),
                                  both[q])
    assert local.adapter and isinstance(local, OOVLocalParams)
    again = OOVExpansion(steps=20, random_state=3).fit(model, feats).recon_predict(support, query)
    np.testing.assert_array_equal(both, again)


def test_a_saved_dropping_model_serves_the_same(world, tmp_path):
    model, feats = world[5], world[3]
    back = FedReconMF.load(model.save(tmp_path / "m"))
    assert back.item_space_.drop_out_of_catalog
    a = OOVExpansion(steps=5, random_state=0).fit(model, feats)
    b = OOVExpansion(steps=5, random_state=0).fit(back, feats)
    la, lb = a.personalize([1, 45, 70], [5.0, 1.0, 3.0]), b.personalize([1, 45, 70],
                                                                        [5.0, 1.0, 3.0])
    np.testing.assert_array_equal(a.predict_local(la, [3, 60]), b.predict_local(lb, [3, 60]))


def test_bad_input_is_named(world):
    train, _, _, feats, catalog, model = world
    with pytest.raises(ValueError, match="drop_out_of_catalog=True .* unknown_item_row=False"):
        OpenCatalog(catalog, unknown_item_row=True, drop_out_of_catalog=True)
    with pytest.raises(ValueError, match="drop_out_of_catalog must be True or False"):
        OpenCatalog(catalog, drop_out_of_catalog="yes")
    with pytest.raises(ValueError, match="OOVExpansion instead"):
        FedReconMF(**FIT, item_space=OpenCatalog(catalog, drop_out_of_catalog=True)).fit(
            train, item_features=feats)
    unk = FedReconMF(**dict(FIT, n_rounds=1),
                     item_space=OpenCatalog(catalog, unknown_item_row=True)).fit(train)
    with pytest.raises(ValueError, match="drop_out_of_catalog=True"):
        OOVExpansion().fit(unk, feats)
    with pytest.raises(TypeError, match="fitted FedReconMF"):
        OOVExpansion().fit(FedReconMF(), feats)
    with pytest.raises(DataValidationError, match="none of the model's catalog items"):
        OOVExpansion().fit(model, (np.arange(500, 510), np.eye(10)))
    for kw, name in (({"hidden": ()}, "hidden"), ({"learning_rate": 0.0}, "learning_rate"),
                     ({"steps": -1}, "steps"), ({"init_scale": -1.0}, "init_scale"),
                     ({"encoder_regularization": 0.0}, "encoder_regularization")):
        with pytest.raises((ValueError, TypeError), match=name):
            OOVExpansion(**kw).fit(model, feats)
    oov = OOVExpansion(steps=3).fit(model, feats)
    with pytest.raises(TypeError, match="OOVLocalParams"):
        oov.predict_local(model.reconstruct([1], [3.0]), [1])
    other = OOVLocalParams(np.zeros(5), 0.0, ())  # another model's width
    with pytest.raises(ValueError, match="do not fit this model"):
        oov.predict_local(other, [1])
    bad = oov.personalize([50], [3.0])
    with pytest.raises(ValueError, match="do not fit this model"):
        oov.predict_local(OOVLocalParams(bad.factors, bad.bias, bad.adapter[:-1]), [1])
    with pytest.raises(DataValidationError, match="mismatched lengths"):
        oov.personalize([1, 2], [3.0])
    with pytest.raises(FloatingPointError, match="lower learning_rate"):
        OOVExpansion(learning_rate=1e6, steps=50, init_scale=1.0, regularization=0.0).fit(
            model, feats).personalize(
            [50, 60, 70], [5.0, 1.0, 5.0])


def test_the_adapter_trains_on_out_of_catalog_entries_only(world):
    """A history of catalog items only leaves the adapter at its initial value (as with no
    steps at all), and an out-of-catalog entry moves it: the adapter never learns from the
    entries the global model already scores (a mutant that trains on every entry fails)."""
    model, feats, catalog = world[5], world[3], world[4]
    oov = OOVExpansion(hidden=(4,), random_state=0).fit(model, feats)
    frozen = OOVExpansion(hidden=(4,), steps=0, random_state=0).fit(model, feats)

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a.adapter, b.adapter))
    inside = ([1, 5, 9, 30], [5.0, 1.0, 4.0, 2.0])
    assert all(i in catalog for i in inside[0])
    assert same(oov.personalize(*inside), frozen.personalize(*inside))
    mixed = (inside[0] + [55, 60], inside[1] + [5.0, 1.0])
    assert not same(oov.personalize(*mixed), frozen.personalize(*mixed))
