"""Out-of-catalog items (FedRecon §5.1.2, OOV expansion): the catalog kernel against its NumPy
twin, local rows that never leave the device, the estimator API, and bad input."""

import numba
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from conftest import load_script

from fedcf import FedReconMF
from fedcf import _reference as ref
from fedcf._kernels import catalog as kc
from fedcf._kernels.layout import catalog_cfg, client_cfg, sgd_hp
from fedcf._reference import catalog as ref_catalog
from fedcf.datasets import (
    DataValidationError,
    ItemFeatures,
    hash_buckets,
    hashed_item_features,
    movielens_item_features,
)
from fedcf.eval import recon_eval, support_query_split, user_split
from fedcf.federated import CatalogLocalParams, ClientUpdate, OpenCatalog, SGDReconstruction

FIT = dict(n_factors=4, n_rounds=6, clients_per_round=40, client_update=ClientUpdate(0.1),
           random_state=3)


# ---------------------------------------------------------------------- kernel vs twin
def item_map(rng, C, F, O, B):
    """Catalog items 0..C-1 (own row), then O items with 0..F random feature rows and a bucket."""
    rptr, rows, coef, bucket = [0], [], [], []
    for j in range(C):
        rows.append(j)
        coef.append(1.0)
        rptr.append(len(rows))
        bucket.append(-1)
    for _ in range(O):
        f = rng.choice(F, size=rng.integers(0, F + 1), replace=False)
        rows += list(C + f)
        coef += list(rng.uniform(0.5, 1.5, len(f)))
        rptr.append(len(rows))
        bucket.append(int(rng.integers(0, B)) if B else -1)
    return (np.array(rptr, np.int64), np.array(rows, np.int64), np.array(coef),
            np.array(bucket, np.int64))


def one_client(recon, default, biases, B=3, threads=None):
    rng = np.random.default_rng(0)
    K, C, F, O = 4, 6, 3, 5
    R = C + F + int(default)
    # the estimator's argument types (float32 model, int32 items), so the kernel compiles once
    G = rng.normal(0, 0.3, (R, K)).astype(np.float32)
    gb = rng.normal(0, 0.1, R).astype(np.float32)
    imap = item_map(rng, C, F, O, B)
    n = 9
    items, vals = rng.integers(0, C + O, n).astype(np.int32), rng.integers(1, 6, n).astype(float)
    cfg = client_cfg("random", 0.5, recon, "uniform", 0.05, 0.1, 1e-3)
    cc = catalog_cfg(B, R - 1 if default else -1, 3)
    rhp, uhp = sgd_hp(0.1, 0.01, 2, 5, 1, 3.0, biases), sgd_hp(0.2, 0.01, 2, 4, 1, 3.0, biases)
    slots = n * 3 + 1
    out = (np.array([0, slots], np.int64), np.empty(slots, np.int64),
           np.empty((slots, K), np.float32), np.empty(slots, np.float32), np.full(1, np.nan))
    kc.catalog_clients((np.array([0, n], np.int64), items, vals), np.array([0], np.int64),
                       (G, gb), imap, cfg, cc, rhp, uhp, np.array([7, 3], np.uint64), out)
    st = ref.Stream(ref.stream_key(7, 3, 0))
    perm = np.arange(n)
    st.shuffle(perm)
    ns = int(np.ceil(n * 0.5 - 1e-9))
    twin = ref.catalog_client(items[perm[:ns]], vals[perm[:ns]], items[perm[ns:]],
                              vals[perm[ns:]], G, gb, imap, cfg, cc, rhp, uhp, st)
    return out, twin, R


@pytest.mark.parametrize("recon", ["als", "sgd"])
@pytest.mark.parametrize("default", [True, False])
@pytest.mark.parametrize("biases", [True, False])
def test_catalog_kernel_matches_twin(recon, default, biases):
    out, (loss, rows, dG, dgb), R = one_client(recon, default, biases)
    keep = out[1] >= 0
    assert out[4][0] == pytest.approx(loss, abs=1e-12)  # float64 arithmetic inside
    np.testing.assert_array_equal(out[1][keep], rows)
    np.testing.assert_allclose(out[2][keep], dG, rtol=1e-6, atol=1e-9)  # stored as float32
    np.testing.assert_allclose(out[3][keep], dgb, rtol=1e-6, atol=1e-9)
    assert out[1].max() < R  # only global rows: the local rows have no slot to go to
    if default:  # the learned default's delta comes last
        assert out[1][keep][-1] == R - 1


def test_default_step_is_the_query_loss_gradient():
    """The learned default's delta is −lr ∂(query loss)/∂(p₀, c₀) through the ridge solve
    (central finite differences of the twin's reconstruction + query loss)."""
    rng = np.random.default_rng(1)
    K, C = 3, 5
    G, gb = rng.normal(0, 0.4, (C + 1, K)), rng.normal(0, 0.1, C + 1)
    imap = item_map(rng, C, 1, 0, 0)
    cfg = client_cfg("random", 0.5, "als", "zeros", 0.0, 0.3, 1e-3)
    cc = catalog_cfg(0, C, 1)
    s_items, s_vals = np.array([0, 1, 2]), np.array([4.0, 2.0, 5.0])
    q_items, q_vals = np.array([3, 4]), np.array([3.0, 1.0])
    uhp = sgd_hp(0.2, 0.0, 5, 0, 1, 3.0, True)

    def query_loss(x0):
        G2, gb2 = G.copy(), gb.copy()
        G2[C], gb2[C] = x0[:K], x0[K]
        x, lb, V, dv, _ = ref.catalog_reconstruct(s_items, s_vals, G2, gb2, imap, cfg, cc, uhp,
                                                  None)
        return np.mean((q_vals - ref.catalog_predict(q_items, x, lb, V, dv, G2, gb2, imap,
                                                     3.0)) ** 2)

    _, rows, dG, dgb = ref.catalog_client(s_items, s_vals, q_items, q_vals, G, gb, imap, cfg,
                                          cc, uhp, uhp, None)
    x0, h = np.append(G[C], gb[C]), 1e-6
    num = [(query_loss(x0 + h * e) - query_loss(x0 - h * e)) / (2 * h) for e in np.eye(K + 1)]
    assert rows[-1] == C
    np.testing.assert_allclose(np.append(dG[-1], dgb[-1]), -0.2 * np.array(num), rtol=1e-5,
                               atol=1e-9)


@pytest.mark.parametrize("recon", ["als", "sgd"])
@pytest.mark.parametrize("B", [0, 3])
@pytest.mark.parametrize("fb", [True, False])
@pytest.mark.parametrize("F", [0, 2])
def test_learned_default_delta_follows_the_documented_gradient(recon, B, fb, F):
    """OpenCatalog's docstring, for every combination: the default's delta is −lr × the
    gradient of the query loss (a) through the ridge solve, exactly, without local rows; (b) with
    local rows, through the last solve with the local rows held at their values (before it, and
    reconstructed); (c) with SGD reconstruction, at the reconstructed user, first order
    (∂x/∂x₀ taken as the identity, local rows held). Central finite differences of exactly that
    function (the kernel's delta equals this twin's: test_catalog_kernel_matches_twin)."""
    rng = np.random.default_rng(2)
    K, C, O = 3, 5, 4
    R = C + F + 1  # catalog, feature rows, the default
    G, gb = rng.normal(0, 0.4, (R, K)), rng.normal(0, 0.1, R)
    imap = item_map(rng, C, F, O, B)
    cfg = client_cfg("random", 0.5, recon, "zeros", 0.0, 0.3, 1e-3)
    cc = catalog_cfg(B, R - 1, 3)
    rhp, uhp = sgd_hp(0.1, 0.0, 2, 6, 1, 3.0, fb), sgd_hp(0.2, 0.0, 5, 0, 1, 3.0, fb)
    s_items, s_vals = np.array([0, 1, 2, C, C + 1, C + 2]), np.array([4.0, 2, 5, 1, 3, 4])
    q_items, q_vals = np.array([3, 4, C, C + 3]), np.array([3.0, 1, 5, 2])

    def rebuild(x0, sweeps=3):
        G2, gb2 = G.copy(), gb.copy()
        G2[-1], gb2[-1] = x0[:K], x0[K]
        return ref.catalog_reconstruct(s_items, s_vals, G2, gb2, imap, cfg,
                                       catalog_cfg(B, R - 1, sweeps), rhp, ref.Stream(5))

    def loss_at(x, lb, V, dv):
        pred = ref.catalog_predict(q_items, x, lb, V, dv, G, gb, imap, 3.0)
        return np.mean((q_vals - pred) ** 2)

    x0 = np.append(G[-1], gb[-1])
    x, lb, V, dv, A = rebuild(x0)
    if recon_is_exact := (recon == "als" and B == 0):
        def f(z):
            return loss_at(*rebuild(z)[:4])
    elif recon == "als":  # the last solve from the previous sweep's local rows, then held
        _, _, Vp, dvp, _ = rebuild(x0, sweeps=2)
        d = K + 1 if fb else K
        Zb, bb = ref.catalog_base(s_items, G, gb, imap)
        Vz, dz = ref_catalog._local_part(np.where(imap[3][s_items] >= 0, np.searchsorted(
            lb, imap[3][s_items]), -1), Vp, dvp)
        Z = np.hstack([Zb + Vz, np.ones((len(s_items), 1))])[:, :d]

        def f(z):
            xz = np.zeros(K + 1)
            xz[:d] = z[:d] + np.linalg.solve(A, Z.T @ (s_vals - 3.0 - bb - dz - Z @ z[:d]))
            return loss_at(xz, lb, V, dv)
    else:  # first order: the reconstructed user moved as the default moves
        def f(z):
            xz = x + (z - x0)
            if not fb:
                xz[K] = 0.0
            return loss_at(xz, lb, V, dv)
    _, rows, dG, dgb = ref.catalog_client(s_items, s_vals, q_items, q_vals, G, gb, imap, cfg,
                                          cc, rhp, uhp, ref.Stream(5))
    assert rows[-1] == R - 1
    h = 1e-6
    num = np.array([(f(x0 + h * e) - f(x0 - h * e)) / (2 * h) for e in np.eye(K + 1)])
    np.testing.assert_allclose(np.append(dG[-1], dgb[-1]), -0.2 * num, rtol=1e-5, atol=1e-9)
    assert recon_is_exact or np.abs(num).sum() > 0


def test_catalog_kernel_is_thread_independent():
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = one_client("sgd", True, True)[0]
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = one_client("sgd", True, True)[0]
    finally:
        numba.set_num_threads(before)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------- estimator
@pytest.fixture(scope="module")
def data(small_population):
    inter, _ = small_population
    train, _, test = user_split(inter, (0.8, 0.1, 0.1), random_state=0)
    rng = np.random.default_rng(0)
    feats = ItemFeatures.coerce(pd.DataFrame(rng.integers(0, 2, (inter.n_items, 5)) * 1.0,
                                             index=inter.item_ids,
                                             columns=[f"tag{k}" for k in range(5)]))
    return train, test, feats


def test_full_catalog_is_fedrecon(data):
    """catalog=1.0 runs the catalog kernel with every item a global row: the same model as
    FedReconMF's own kernel (same streams, same steps), up to the float32 Gram rounding of the
    latter (it accumulates in the factors' dtype, the catalog kernel in float64)."""
    train = data[0]
    plain = FedReconMF(**FIT).fit(train)
    full = FedReconMF(**FIT, item_space=OpenCatalog(1.0)).fit(train)
    np.testing.assert_allclose(plain.item_factors_, full.item_factors_, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(plain.item_biases_, full.item_biases_, rtol=1e-5, atol=1e-7)


def test_out_of_catalog_options(data, tmp_path):
    train, test, feats = data
    space = OpenCatalog(0.3, unknown_item_row=True, local_item_buckets=7, learned_default=True)
    m = FedReconMF(**FIT, item_space=space).fit(train, item_features=feats)
    C = int(np.ceil(0.3 * train.n_items))
    assert m.item_factors_.shape == (C, 4) and m.adapter_factors_.shape == (6, 4)
    assert m.default_params_.shape == (5,) and np.abs(m.default_params_).max() > 0
    popular = np.argsort(-np.bincount(train.items, minlength=train.n_items), kind="stable")[:C]
    assert set(m.item_ids_) == set(train.item_ids[popular])
    # an out-of-catalog item gets an item term (UNK + adapter), not the fallback
    out_item = next(i for i in train.item_ids if i not in set(m.item_ids_))
    local = m.reconstruct([m.item_ids_[0], out_item], [5.0, 1.0])
    assert isinstance(local, CatalogLocalParams) and len(local.buckets) == 1
    assert local.buckets[0] == hash_buckets([out_item], 7)[0]
    plain_local = CatalogLocalParams(local.factors, local.bias)
    assert m.predict_local(local, [out_item])[0] != m.predict_local(plain_local, [out_item])[0]
    rec = m.recommend([m.item_ids_[0]], [5.0], n=5, extra_items=[out_item, "brand-new"])
    assert len(rec) == 5 and m.item_ids_[0] not in set(rec["item"])
    full = m.recommend([m.item_ids_[0]], [5.0], n=C + 2, extra_items=[out_item, "brand-new"])
    assert {out_item, "brand-new"} <= set(full["item"])
    # evaluation, finetuning, and a saved model that predicts the same
    r = recon_eval(m, test, n_repeats=2)
    assert np.isfinite(r["rmse"])
    sup, qry = support_query_split(test, "random", 0.5, 0)
    assert not np.array_equal(m.recon_predict(sup, qry), m.recon_predict(sup, qry, finetune="all"))
    pairs = pd.DataFrame({"user": [train.user_ids[0]] * 2, "item": [m.item_ids_[0], out_item]})
    back = FedReconMF.load(m.save(tmp_path / "m"))
    np.testing.assert_array_equal(back.predict_local(local, [out_item, m.item_ids_[1]]),
                                  m.predict_local(local, [out_item, m.item_ids_[1]]))
    assert np.isfinite(m.predict(pairs)).all()


def test_predict_for_seen_users_uses_their_local_rows(data):
    """A seen user's predictions are those of the user reconstructed, local rows included, from
    their training ratings; without the local rows the out-of-catalog entries change."""
    import dataclasses

    train = data[0]
    m = FedReconMF(**FIT, item_space=OpenCatalog(0.3, local_item_buckets=3)).fit(train)
    u = train.user_ids[0]
    items = train.item_ids[train.items[train.indptr[0]:train.indptr[1]]]
    ratings = train.values[train.indptr[0]:train.indptr[1]]
    local = m.reconstruct(items, ratings)
    pred = m.predict(pd.DataFrame({"user": [u] * len(items), "item": items}))
    np.testing.assert_allclose(pred, m.predict_local(local, items), atol=1e-6)
    assert len(local.buckets) > 0 and np.abs(local.bucket_factors).max() > 0
    bare = dataclasses.replace(local, bucket_factors=np.zeros_like(local.bucket_factors),
                               bucket_biases=np.zeros_like(local.bucket_biases))
    assert np.any(m.predict_local(bare, items) != pred)  # the local rows move predictions


def test_learned_default_starts_users_without_ratings(data):
    train, test, _ = data
    m = FedReconMF(**FIT, item_space=OpenCatalog(0.5, learned_default=True)).fit(train)
    K = m.n_factors
    p0, c0 = m.default_params_[:K], m.default_params_[K]
    local = m.reconstruct([], [])
    np.testing.assert_allclose(local.factors, p0, rtol=1e-5, atol=1e-7)
    assert local.bias == pytest.approx(c0, abs=1e-6)


@pytest.mark.parametrize("extra", [
    {"reconstruction": SGDReconstruction(steps=5)},
    {"aggregator": "trimmed"},
    {"aggregator": "dp"},
])
def test_catalog_runs_with_sgd_reconstruction_and_other_aggregators(data, extra):
    from fedcf.federated import DPGaussianMean, TrimmedMean

    agg = {"trimmed": TrimmedMean(0.1), "dp": DPGaussianMean(1.0, noise_multiplier=0.5,
                                                             delta=1e-5)}
    extra = {**extra, **({"aggregator": agg[extra["aggregator"]]} if "aggregator" in extra
                         else {})}
    if "aggregator" in extra:  # a DP release needs its public rating scale
        extra["rating_scale"] = (float(data[0].values.min()), float(data[0].values.max()))
    m = FedReconMF(**{**FIT, **extra}, item_space=OpenCatalog(
        0.4, unknown_item_row=True, local_item_buckets=5, learned_default=True)).fit(data[0])
    assert np.isfinite(recon_eval(m, data[1], n_repeats=2)["rmse"])
    assert all(h["values_up"] > 0 for h in m.history_)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("params, match", [
    ({"local_item_buckets": 0}, r"local_item_buckets must be None or an integer in \[1,"),
    ({"local_item_buckets": -3}, r"local_item_buckets must be None or an integer in \[1,"),
    ({"local_item_buckets": 2.5}, "local_item_buckets must be None or an integer"),
    ({"local_item_buckets": True}, "local_item_buckets must be None or an integer"),
    ({"catalog": 0.0}, r"catalog as a share .* \(0, 1\]"),
    ({"catalog": 1.5}, r"catalog as a share .* \(0, 1\]"),
    ({"catalog": [1, 2, 1]}, "appears twice"),
    ({"catalog": np.array([1, 2, 1])}, "appears twice"),
    ({"catalog": []}, "at least one raw item id"),
    ({"catalog": "abc"}, "catalog must be None"),
    ({"catalog": 3}, "catalog must be None"),
    ({"unknown_item_row": "yes"}, "unknown_item_row must be True or False"),
    ({"learned_default": 1}, "learned_default must be True or False"),
    ({"local_item_sweeps": 0}, r"local_item_sweeps must be an integer in \[1, 1000\]"),
])
def test_bad_item_space(params, match):
    with pytest.raises((ValueError, TypeError), match=match):
        OpenCatalog(**params)
    space = OpenCatalog()
    with pytest.raises((ValueError, TypeError), match=match):
        space.set_params(**params)


@pytest.mark.parametrize("params, match", [
    ({"item_space": OpenCatalog(["no-such-item", "nor-this"])}, "none of its 2 item ids"),
    ({"item_space": OpenCatalog(0.5), "joint": True}, "joint=True is not available"),
    ({"item_space": "closed"}, "'closed' is not a registered item_space"),
    ({"item_space": OpenCatalog}, "item_space must be one of"),
])
def test_bad_parameters(data, params, match):
    with pytest.raises((ValueError, TypeError), match=match):
        FedReconMF(**{**FIT, **params}).fit(data[0])


def test_item_features_need_an_open_item_space(data):
    train, _, feats = data
    m = FedReconMF(**FIT)
    with pytest.raises(ValueError, match=r"item_features need an open item space"):
        m.fit(train, item_features=feats)
    assert not hasattr(m, "item_factors_")


def test_item_space_by_name_and_nested_params(data):
    m = FedReconMF(**FIT, item_space="open")
    m.set_params(item_space__catalog=0.5, item_space__unknown_item_row=True)
    assert m.get_params()["item_space__catalog"] == 0.5
    m.fit(data[0])
    assert m.adapter_factors_.shape == (1, 4) and m.item_space == OpenCatalog(
        0.5, unknown_item_row=True)
    assert FedReconMF(**FIT, item_space="full").fit(data[0]).item_features_ is None


def test_bad_item_features(data):
    train, _, feats = data
    ids = feats.item_ids
    m = FedReconMF(**FIT, item_space=OpenCatalog(0.5))
    with pytest.raises(DataValidationError, match="rows but there are"):
        m.fit(train, item_features=(ids, np.ones((len(ids) - 1, 2))))
    bad = np.ones((len(ids), 2))
    bad[4, 1] = np.nan
    with pytest.raises(DataValidationError, match=f"item {ids[4]} has a non-finite"):
        m.fit(train, item_features=(ids, bad))
    with pytest.raises(DataValidationError, match="appears twice"):
        m.fit(train, item_features=(np.r_[ids[:-1], ids[0]], np.ones((len(ids), 2))))
    with pytest.raises(DataValidationError, match="column 'genre' is not numeric"):
        m.fit(train, item_features=pd.DataFrame({"genre": ["x"] * len(ids)}, index=ids))
    with pytest.raises(TypeError, match="item_features must be"):
        m.fit(train, item_features=[1, 2, 3])
    assert not hasattr(m, "item_factors_")  # nothing half-fitted was left behind


def test_bad_calls_on_a_fitted_model(data):
    train, test, _ = data
    m = FedReconMF(**FIT, item_space=OpenCatalog(0.5)).fit(train)
    sup, qry = support_query_split(test, "random", 0.5, 0)
    with pytest.raises(ValueError, match="finetune must be"):
        m.recon_predict(sup, qry, finetune="some")
    with pytest.raises(ValueError, match="same users"):
        m.recon_predict(sup.subset_users(np.arange(3)), qry)
    with pytest.raises(TypeError, match="two Interactions"):
        m.recon_predict(None, qry)
    with pytest.raises(TypeError, match="extra_items must be a list"):
        m.recommend([train.item_ids[0]], extra_items="abc")
    with pytest.raises(DataValidationError, match="mismatched lengths"):
        m.reconstruct([1, 2], [3.0])
    with pytest.raises(DataValidationError, match="non-finite"):
        m.reconstruct([1, 2], [3.0, np.inf])
    plain = FedReconMF(**FIT).fit(train)
    with pytest.raises(ValueError, match="extra_items needs"):
        plain.recommend([train.item_ids[0]], extra_items=[5])
    with pytest.raises(ValueError, match="finetune needs"):
        plain.recon_predict(sup, qry, finetune="all")


# ---------------------------------------------------------------------- features, benchmark
ITEM_FILE = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
             "1\tToy Story\t1995\tAnimation Children's Comedy\n"
             "2\tThe Story of Us\t1999\tComedy Drama\n"
             "3\tNo Year\t\tDrama\n")


def test_movielens_item_features_from_a_local_file(tmp_path):
    path = tmp_path / "ml-100k.item"
    path.write_text(ITEM_FILE, encoding="latin-1")
    f = movielens_item_features(path=path, min_word_items=2)
    assert list(f.item_ids) == [1, 2, 3]
    names = list(f.names)
    assert {"genre:Comedy", "genre:Children's", "decade:1990", "word:story"} <= set(names)
    row = f.matrix[0].toarray()[0]
    genres = [names.index(g) for g in ("genre:Animation", "genre:Children's", "genre:Comedy")]
    np.testing.assert_allclose(row[genres], 1 / np.sqrt(3))
    assert f.matrix[2, names.index("genre:Drama")] == 1.0  # no year: no decade feature
    (tmp_path / "bad.item").write_text("user_id:token\n1\t2\n")
    with pytest.raises(DataValidationError, match="header should start"):
        movielens_item_features(path=tmp_path / "bad.item")
    (tmp_path / "short.item").write_text(ITEM_FILE + "4\tonly two\n")
    with pytest.raises(DataValidationError, match="line 5 has 2 fields"):
        movielens_item_features(path=tmp_path / "short.item")


def test_hashed_features_and_buckets():
    assert np.array_equal(hash_buckets([7, "7", 8], 1000)[:2], hash_buckets(["7", 7], 1000))
    f = hashed_item_features(np.arange(50), 8)
    assert f.matrix.shape == (50, 8) and np.all(f.matrix.sum(axis=1) == 1)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n_buckets must be a positive integer"):
            hash_buckets([1], bad)


def test_item_features_accepts_sparse_and_refuses_2d_ids():
    f = ItemFeatures.coerce((np.array(["a", "b"]), sp.eye(2, format="coo")))
    assert f.n_features == 2 and list(f.rows_of(["b", "z"])) == [1, -1]
    with pytest.raises(DataValidationError, match="must be 1-D"):
        ItemFeatures.coerce((np.array([["a"], ["b"]]), np.eye(2)))


def test_benchmark_script_runs_small(tmp_path):
    bench = load_script("out_of_catalog_benchmark")
    bench.SEED_GRID = bench.SEED_GRID[:2]  # the adapter's σ and H: two of the seed's settings
    out = tmp_path / "oc.json"
    bench.main(["--json", str(out), "--datasets", "expression", "--catalogs", "0.25",
                "--seeds", "1", "--rounds", "3", "--expression-users", "300"])
    import json

    doc = json.loads(out.read_text())
    names = {r["method"] for r in doc["rows"]}
    assert len(names) == len(bench.methods()) + 1
    row = next(r for r in doc["rows"] if r["method"] == "FedRecon, 500 local rows")
    assert row["values_up_per_client"] > 0 and 0 <= row["coverage"] <= 1
    assert row["out_of_catalog"]["n"] + row["in_catalog"]["n"] == row["all"]["n"]
    dev = next(r for r in doc["rows"] if r["method"] == bench.ON_DEVICE)
    chosen = dev["on_device_settings"]
    assert {k: chosen[k] for k in ("learning_rate", "regularization")} in bench.OOV_GRID
    shape = {k: (tuple(v) if k == "hidden" else v) for k, v in chosen.items()
             if k in ("init_scale", "hidden")}
    assert not shape or shape in bench.SEED_GRID[:2]
    assert next(r for r in doc["rows"] if r["method"] == bench.BIAS_ONLY)[
        "on_device_settings"] in bench.OOV_GRID
    assert next(r for r in doc["rows"] if r["method"] == bench.TRIVIAL)[
        "on_device_settings"] == {}
    unk = next(r for r in doc["rows"] if r["method"] == "UNK (one global row)")
    for r in (dev, next(r for r in doc["rows"] if r["method"] == bench.ORACLE_N)):
        assert r["out_of_catalog"]["n"] == unk["out_of_catalog"]["n"]  # the named catalog's


def test_finetune_moves_only_query_items_that_share_a_global_row_with_the_support():
    """FedRecon + finetune steps on the global rows the support set touches: with per-item
    rows only (local rows for the rest), a query of other items is scored exactly as without
    it; with one shared UNK row, the out-of-catalog query items move."""
    from fedcf.datasets import make_synthetic_ratings

    data = make_synthetic_ratings(600, 200, 20000, random_state=0)
    train, _, test = user_split(data, (0.8, 0.1, 0.1), random_state=0)
    support, query = support_query_split(test, "random", 0.5, 0)
    kw = dict(n_factors=5, n_rounds=30, clients_per_round=50, random_state=0)
    local = FedReconMF(**kw, item_space=OpenCatalog(0.25, local_item_buckets=50)).fit(train)
    np.testing.assert_array_equal(local.recon_predict(support, query, finetune="all"),
                                  local.recon_predict(support, query))
    unk = FedReconMF(**kw, item_space=OpenCatalog(0.25, unknown_item_row=True)).fit(train)
    moved = unk.recon_predict(support, query, finetune="all") != unk.recon_predict(support, query)
    outside = ~np.isin(query.to_dataframe()["item"].to_numpy(), unk.item_ids_)
    assert moved[outside].mean() > 0.5 and not moved[~outside].any()
