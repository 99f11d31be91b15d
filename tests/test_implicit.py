"""Implicit-feedback matrix factorization: anchored against the `implicit` library."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from fedcf import ImplicitMF
from fedcf.datasets import Interactions, make_synthetic_ratings
from fedcf.eval import random_split, ranking_metrics


@pytest.fixture(scope="module")
def clicks():
    # weak popularity skew and strong tastes, so that a personal model has something to find
    r = make_synthetic_ratings(800, 300, 30_000, n_factors=6, noise=0.3, popularity_exponent=0.2,
                               factor_scale=2.0, random_state=5)
    keep = r.values >= 4  # "liked" items become clicks
    pos = r.take(keep)
    inter = Interactions(pos.indptr, pos.items, np.ones(pos.nnz), pos.timestamps, pos.user_ids,
                         pos.item_ids)
    return random_split(inter, (0.8, 0.2), random_state=0)


def p_at_10(user_f, item_f, train, test):
    return ranking_metrics(lambda u: user_f[u].astype(float) @ item_f.T.astype(float), train,
                           test, k=10, with_auc=False)["precision"]


def test_matches_implicit_library_from_the_same_start(clicks):
    """From the same initial factors, 10 sweeps of fedcf's weighted ALS and of the `implicit`
    library's Cholesky ALS (its alpha is one more than ours) give the same model: scores agree
    to float32 rounding (measured 1.3e-6 on scores of order 1), so precision@10 is the same."""
    implicit_als = pytest.importorskip("implicit.cpu.als")
    from sklearn.utils import check_random_state
    from threadpoolctl import threadpool_limits

    train, test = clicks
    ours = ImplicitMF(16, regularization=0.05, alpha=1.0, n_epochs=10, init_scale=0.01,
                      random_state=0).fit(train)
    rng = check_random_state(0)  # ImplicitMF's initialization: users, then items
    P0 = (rng.standard_normal((train.n_users, 16)) * 0.01).astype(np.float32)
    Q0 = (rng.standard_normal((train.n_items, 16)) * 0.01).astype(np.float32)
    with threadpool_limits(1, "blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = implicit_als.AlternatingLeastSquares(factors=16, regularization=0.05, alpha=2.0,
                                                      iterations=10, use_cg=False,
                                                      random_state=0)
        theirs.user_factors, theirs.item_factors = P0, Q0
        theirs.fit(sp.csr_matrix(train.to_csr()), show_progress=False)
    S_ours = ours.user_factors_.astype(float) @ ours.item_factors_.T.astype(float)
    S_theirs = theirs.user_factors.astype(float) @ theirs.item_factors.T.astype(float)
    np.testing.assert_allclose(S_ours, S_theirs, atol=1e-4)
    a = p_at_10(ours.user_factors_, ours.item_factors_, train, test)
    b = p_at_10(theirs.user_factors, theirs.item_factors, train, test)
    assert a == pytest.approx(b, abs=0.005), (a, b)
    pop = np.bincount(train.items, minlength=train.n_items).astype(float)
    c = ranking_metrics(lambda u: np.tile(pop, (len(u), 1)), train, test, k=10,
                        with_auc=False)["precision"]
    assert a > 1.2 * c, (a, c)


def test_fold_in_equals_training_solve_and_recommend(clicks):
    train, _ = clicks
    m = ImplicitMF(8, regularization=0.1, n_epochs=5, random_state=0).fit(train)
    P, _ = m.reconstruct_users(train)
    # after the last sweep the items moved, so refold users against the final items: the
    # fold-in is exactly one more user half-step
    from fedcf._kernels.als import implicit_solve_rows
    from fedcf.models.implicit_mf import implicit_side

    want = np.zeros_like(m.user_factors_)
    implicit_solve_rows(train.indptr, train.items, train.values, m.item_factors_,
                        implicit_side(m.item_factors_), np.array([1.0, 0.1]), want,
                        np.zeros(0, want.dtype))
    np.testing.assert_allclose(P, want, rtol=1e-5, atol=1e-6)
    s, e = train.indptr[0], train.indptr[1]
    rec = m.recommend(items=train.item_ids[train.items[s:e]], n=5)
    assert len(rec) == 5 and not set(rec["item"]) & set(train.item_ids[train.items[s:e]])
    with pytest.raises(ValueError, match="strengths must be >= 0"):
        ImplicitMF().fit(Interactions.from_arrays([1, 2], [1, 2], [1.0, -1.0]))


@pytest.mark.parametrize("split,neg,ib,ub", [(0, 3, 0, 0), (1, 2, 0, 0), (2, 0, 0, 0),
                                             (0, 3, 1, 0), (1, 2, 0, 1), (1, 2, 1, 1)])
def test_implicit_client_kernel_matches_twin(clicks, split, neg, ib, ub):
    from fedcf import _reference as ref
    from fedcf._kernels import implicit_clients as kfed
    from fedcf._kernels.layout import sgd_hp
    from fedcf.models.implicit_mf import implicit_side

    train, _ = clicks
    rng = np.random.default_rng(0)
    K = 4
    Q = rng.normal(0, 0.3, (train.n_items, K))
    b = rng.normal(0, 0.2, train.n_items) if ib else np.zeros(train.n_items)
    cfg = np.array([split, 0.5, 1.5, 0.05, neg, 0.7, ib, ub])
    hp = sgd_hp(0.2, 0.01, 3, 4, 2, 0.0, False)
    clients = np.array([0, 5, 17, 40], np.int64)
    counts = train.counts()[clients]
    slots = kfed.implicit_slots(counts, cfg, hp)
    offsets = np.r_[0, np.cumsum(slots)].astype(np.int64)
    out = (offsets, np.empty(offsets[-1], np.int64), np.empty((offsets[-1], K)),
           np.full(4, np.nan), np.full(offsets[-1], np.nan))
    kfed.fedrecon_implicit_clients((train.indptr, train.items, train.values), clients,
                                   (Q, implicit_side(Q, ub, b if ib else None), b), cfg, hp,
                                   np.array([9, 3], np.uint64), train.n_items, out)
    for k, u in enumerate(clients):
        s0, e0 = train.indptr[u], train.indptr[u + 1]
        uniq, dq, loss, db = ref.fedrecon_implicit_client(
            train.items[s0:e0], train.values[s0:e0], Q, cfg, hp, ref.stream_key(9, 3, int(u)),
            train.n_items, b)
        sl = slice(offsets[k], offsets[k] + len(uniq))
        assert out[1][sl].tolist() == uniq.tolist()
        assert np.all(out[1][offsets[k] + len(uniq):offsets[k + 1]] == -1)
        np.testing.assert_allclose(out[2][sl], dq, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out[4][sl], db, rtol=1e-9, atol=1e-12)
        assert np.all(out[4][offsets[k] + len(uniq):offsets[k + 1]] == 0)
        assert (np.abs(db).max() > 0) == bool(ib)  # biases move only when the model has them
        assert out[3][k] == pytest.approx(loss)


def test_fedrecon_implicit_learns_for_unseen_users(clicks):
    from fedcf import FedReconImplicitMF
    from fedcf.eval import support_query_split, user_split

    train, _ = clicks
    tr_u, _, te_u = user_split(train, (0.8, 0.1, 0.1), random_state=0)
    m = FedReconImplicitMF(16, n_rounds=150, clients_per_round=50, random_state=0).fit(tr_u)
    losses = [h["loss"] for h in m.history_]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-20:]) < 0.75 * np.mean(losses[:5])  # measured: 1.34 -> 0.81
    sup, qry = support_query_split(te_u, "random", 0.5, random_state=0)
    P, _ = m.reconstruct_users(sup)
    ours = ranking_metrics(lambda u: P[u].astype(float) @ m.item_factors_.T.astype(float), sup,
                           qry, k=10, with_auc=False)["precision"]
    rng = np.random.default_rng(0)
    rand = ranking_metrics(lambda u: rng.random((len(u), tr_u.n_items)), sup, qry, k=10,
                           with_auc=False)["precision"]
    assert ours > 2 * rand, (ours, rand)


def test_full_negative_client_equals_dense_explicit_steps(clicks):
    """The closed-form (rank-1) full-catalog client equals stepping every catalog row."""
    from fedcf import _reference as ref
    from fedcf._kernels import clients as kcl
    from fedcf._kernels import implicit_clients as kfed
    from fedcf._kernels.layout import sgd_hp
    from fedcf.models.implicit_mf import implicit_side

    train, _ = clicks
    rng = np.random.default_rng(1)
    K = 4
    Q = rng.normal(0, 0.3, (train.n_items, K))
    cfg = np.array([1, 0.5, 1.5, 0.05, 0, 3.0, 0, 0])
    hp = sgd_hp(0.5, 0.01, 3, 5, 2, 0.0, False)
    clients = np.array([2, 9, 30], np.int64)
    qs = kcl.query_sizes(train.counts()[clients], 1, 0.5)
    offsets = np.r_[0, np.cumsum(qs)].astype(np.int64)
    W = np.zeros((3, K, K))
    out = (offsets, np.empty(offsets[-1], np.int64), np.empty((offsets[-1], K)),
           np.full(3, np.nan), W)
    kfed.fedrecon_implicit_full_clients((train.indptr, train.items, train.values), clients,
                                        (Q, implicit_side(Q), np.zeros(len(Q))), cfg, hp,
                                        np.array([4, 1], np.uint64), train.n_items, out)
    for k, u in enumerate(clients):
        s0, e0 = train.indptr[u], train.indptr[u + 1]
        dense, loss = ref.fedrecon_implicit_full_client(
            train.items[s0:e0], train.values[s0:e0], Q, cfg, hp, ref.stream_key(4, 1, int(u)),
            train.n_items)
        rebuilt = -(Q @ W[k])  # the server's rank-1 part, for every row
        rows = out[1][offsets[k]:offsets[k + 1]]
        rows = rows[rows >= 0]
        rebuilt[rows] += out[2][offsets[k]:offsets[k] + len(rows)]
        np.testing.assert_allclose(rebuilt, dense, rtol=1e-7, atol=1e-10)
        assert out[3][k] == pytest.approx(loss)


def test_full_negatives_estimator_trains(clicks):
    from fedcf import FedReconImplicitMF

    train, _ = clicks
    m = FedReconImplicitMF(8, n_rounds=30, clients_per_round=40, full_negatives=True,
                           random_state=0).fit(train)
    assert np.all(np.isfinite(m.item_factors_))
    assert m.history_[-1]["loss"] < m.history_[0]["loss"]


@pytest.mark.parametrize("full,biases", [(False, False), (True, False), (False, True)])
def test_federated_implicit_is_identical_with_one_and_two_threads(clicks, full, biases):
    import numba

    from fedcf import FedReconImplicitMF

    train = clicks[0]
    before, got = numba.get_num_threads(), []
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            m = FedReconImplicitMF(n_factors=4, n_rounds=3, clients_per_round=40,
                                   full_negatives=full, biases=biases,
                                   random_state=5).fit(train)
            got.append(np.c_[m.item_factors_, m.item_biases_])
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(got[0], got[1])


@pytest.mark.parametrize("biases,ib,ub", [("item", True, False), ("user", False, True),
                                          (True, True, True)])
def test_biased_sweeps_equal_the_dense_twin(clicks, biases, ib, ub):
    """Two ALS sweeps with biases equal alternating the dense weighted least squares of
    p_ui − b_i − c_u on [p, 1] / [q, 1]: the bias columns and offsets are the model's."""
    from sklearn.utils import check_random_state

    from fedcf import _reference as ref

    train, _ = clicks
    m = ImplicitMF(5, regularization=0.2, alpha=2.0, n_epochs=2, biases=biases,
                   init_scale=0.1, dtype="float64", random_state=3).fit(train)
    rng = check_random_state(3)
    P = rng.standard_normal((train.n_users, 5)) * 0.1
    Q = rng.standard_normal((train.n_items, 5)) * 0.1
    c, b = np.zeros(train.n_users), np.zeros(train.n_items)
    i_indptr, i_users, i_vals = train.to_item_csr()
    for _ in range(2):
        X = ref.implicit_solve_rows(train.indptr, train.items, train.values, Q, 2.0, 0.2,
                                    ones=ub, offset=b)
        P, c = X[:, :5], (X[:, 5] if ub else c)
        Y = ref.implicit_solve_rows(i_indptr, i_users, i_vals, P, 2.0, 0.2, ones=ib, offset=c)
        Q, b = Y[:, :5], (Y[:, 5] if ib else b)
    np.testing.assert_allclose(m.user_factors_, P, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(m.item_factors_, Q, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(m.user_biases_, c, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(m.item_biases_, b, rtol=1e-7, atol=1e-9)
    assert np.any(m.item_biases_ != 0) == ib and np.any(m.user_biases_ != 0) == ub
    # fold-in is one more user half-step against the final items and biases
    Pf, cf = m.reconstruct_users(train)
    X = ref.implicit_solve_rows(train.indptr, train.items, train.values, Q, 2.0, 0.2, ones=ub,
                                offset=b if ib else None)
    np.testing.assert_allclose(Pf, X[:, :5], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(cf, X[:, 5] if ub else 0.0, rtol=1e-7, atol=1e-9)
    scores = m.predict(np.column_stack([np.full(train.n_items, train.user_ids[0]),
                                        train.item_ids]), clip=False)
    np.testing.assert_allclose(scores, m.user_factors_[0] @ Q.T + b + m.user_biases_[0],
                               rtol=1e-6, atol=1e-9)


def test_item_bias_learns_popularity_that_factors_alone_miss():
    """On clicks driven mostly by popularity, the item bias ranks held-out clicks by popularity
    as well as counting does (the bias-free model at the same rank does worse)."""
    from fedcf.eval.ctr import click_auc

    r = make_synthetic_ratings(600, 200, 12_000, n_factors=4, popularity_exponent=1.2,
                               random_state=2)
    inter = Interactions(r.indptr, r.items, np.ones(r.nnz), r.timestamps, r.user_ids, r.item_ids)
    train, test = random_split(inter, (0.8, 0.2), random_state=0)
    pop = np.bincount(train.items, minlength=train.n_items).astype(float)
    held = np.zeros((train.n_users, train.n_items), bool)
    held[np.repeat(np.arange(test.n_users), np.diff(test.indptr)), test.items] = True
    seen = np.zeros_like(held)
    seen[np.repeat(np.arange(train.n_users), np.diff(train.indptr)), train.items] = True

    def auc(S):  # pooled over users, unseen items only
        return click_auc(S[~seen], held[~seen])
    aucs = {}
    for ib in (False, True):
        m = ImplicitMF(2, regularization=50.0, n_epochs=8, biases=ib,
                       random_state=0).fit(train)
        S = m.user_factors_.astype(float) @ m.item_factors_.T.astype(float) \
            + m.item_biases_ + m.user_biases_[:, None]
        aucs[ib] = auc(S)
    assert aucs[True] > aucs[False] + 0.01, aucs  # measured: 0.893 -> 0.910
    assert aucs[True] > auc(np.tile(pop, (train.n_users, 1))) - 0.01, aucs


def test_federated_item_bias_is_aggregated_and_user_bias_stays_local(clicks):
    from fedcf import FedReconImplicitMF

    train, _ = clicks
    kw = dict(n_rounds=20, clients_per_round=40, random_state=0)
    plain = FedReconImplicitMF(6, **kw).fit(train)
    assert np.all(plain.item_biases_ == 0)
    m = FedReconImplicitMF(6, biases=True, **kw).fit(train)
    assert np.abs(m.item_biases_).max() > 0 and m.global_mean_ == 0.0
    assert np.all(np.isfinite(m.item_biases_))
    P, c = m.reconstruct_users(train.subset_users(np.arange(5)))
    assert np.abs(c).max() > 0  # reconstructed on the device, not a model attribute
    with pytest.raises(ValueError, match="full_negatives=True has no bias terms"):
        FedReconImplicitMF(6, full_negatives=True, biases="item", **kw).fit(train)


def test_biased_models_round_trip_through_save(clicks, tmp_path):
    from fedcf import FedReconImplicitMF, load_model

    train, _ = clicks
    for m in (ImplicitMF(4, n_epochs=2, biases=True, random_state=0),
              FedReconImplicitMF(4, n_rounds=5, clients_per_round=20, biases=True,
                                 random_state=0)):
        m.fit(train)
        path = tmp_path / f"{type(m).__name__}.npz"
        m.save(path)
        back = load_model(path)
        assert back.get_params()["biases"] is True
        np.testing.assert_array_equal(back.item_biases_, m.item_biases_)
        a = m.recommend(items=[train.item_ids[0], train.item_ids[1]], n=5)
        b = back.recommend(items=[train.item_ids[0], train.item_ids[1]], n=5)
        assert a["item"].tolist() == b["item"].tolist()
        np.testing.assert_allclose(a["score"], b["score"])


def test_item_bias_deltas_are_noised_under_dp_and_absent_without_biases(clicks):
    """The DP release noises every item's bias when the model has item biases (an untouched
    item's bias is pure noise), and leaves them at zero when it has none (a user bias alone
    puts nothing in an upload)."""
    from fedcf import FedReconImplicitMF
    from fedcf.federated import DPGaussianMean

    train, _ = clicks
    got = {}
    for biases in (False, "item", "user"):
        m = FedReconImplicitMF(4, n_rounds=3, clients_per_round=50, biases=biases,
                               aggregator=DPGaussianMean(clip_norm=0.5, noise_multiplier=1.0),
                               random_state=0).fit(train)
        got[biases] = m.item_biases_
    assert np.all(got[False] == 0) and np.all(got["user"] == 0)
    assert np.mean(got["item"] != 0) > 0.99 and np.all(np.isfinite(got["item"]))


@pytest.mark.parametrize("cls", [ImplicitMF, "FedReconImplicitMF"])
def test_one_bias_vocabulary_and_the_old_names_say_where_it_moved(cls, clicks, tmp_path):
    """``biases`` (False, True, "item", "user") as on every model; the former
    ``item_bias``/``user_bias`` are refused with where the setting lives, and a model saved
    with them loads with them moved."""
    import json

    import fedcf
    from fedcf import load_model
    from fedcf._io import atomic_savez, load_npz

    cls = getattr(fedcf, cls) if isinstance(cls, str) else cls
    with pytest.raises(TypeError, match="no parameter 'item_bias'; set it with biases="):
        cls(item_bias=True)
    for bad in ("both", 1, None, [True]):
        with pytest.raises(ValueError, match="biases must be False, True .*'item' or 'user'"):
            cls(biases=bad).check_params()
    train, _ = clicks
    kw = {"n_epochs": 1} if cls is ImplicitMF else {"n_rounds": 2, "clients_per_round": 20}
    m = cls(3, biases="item", random_state=0, **kw).fit(train)
    arrays, meta = load_npz(m.save(tmp_path / "m.npz"), meta_key="metadata", what="model")
    meta["params"].pop("biases")
    meta["params"].update(item_bias=True, user_bias=False)
    back = load_model(atomic_savez(tmp_path / "old.npz", arrays, json.loads(json.dumps(meta)),
                                   meta_key="metadata"))
    assert back.biases == "item"
    np.testing.assert_array_equal(back.item_biases_, m.item_biases_)
