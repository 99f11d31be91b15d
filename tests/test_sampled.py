"""The sampled-negative baselines (FedMF, FedNCF, PFedRec, centralized NCF): gradients against
finite differences, the round kernels against their NumPy twins, the sampler against its
exclusions, scoring independent of who shares a call, the round's phases (DP, secure
aggregation) applied to all three federated ones, and bad input."""

import json

import numpy as np
import pytest

from fedcf._kernels import sampled as kern
from fedcf._reference import sampled as ref
from fedcf.datasets import DataValidationError, Interactions
from fedcf.eval.loo import leave_one_out, loo_metrics, sample_negatives, training_exclusions
from fedcf.federated import DPGaussianMean, LocalExecutor, SampledUpdate, SecureAggregation
from fedcf.federated.algorithms.fedncf import FedNCF, NeuMFProgram
from fedcf.federated.algorithms.sampled_mf import FedMF, PFedRec
from fedcf.federated.round.phases import Cohort
from fedcf.models.ncf import NCF
from fedcf.models.sampled_nets import DotNet, NeuMFNet

NETS = [DotNet(4), NeuMFNet(3, (5, 4)), NeuMFNet(2, (3,))]


def _problem(net, seed=0, n=7):
    rng = np.random.default_rng(seed)
    user = {k: v[0] for k, v in net.init_user(rng, 1).items()}
    for k in user:
        user[k] = user[k] + rng.normal(0, 0.5, user[k].shape)
    glob = net.init_global(rng, 6)
    for k in glob:
        glob[k] = glob[k] + rng.normal(0, 0.5, glob[k].shape)
    items = rng.integers(0, 6, n)
    rows = {k: glob[k][items] for k in net.item_keys}
    dense = {k: glob[k] for k in net.dense_keys}
    return user, rows, dense, rng.integers(0, 2, n).astype(float)


@pytest.mark.parametrize("net", NETS, ids=["dot", "neumf-2", "neumf-1"])
def test_gradients_match_finite_differences(net):
    user, rows, dense, y = _problem(net)
    loss, gu, gr, gd = net.grads(user, rows, dense, y)
    groups = {"user": (user, gu), "rows": (rows, gr), "dense": (dense, gd)}
    h = 1e-6
    for name, (params, grads) in groups.items():
        assert set(grads) == set(params), name
        for k, p in params.items():
            num = np.zeros_like(p, dtype=float)
            for j in np.ndindex(p.shape):
                old = p[j]
                p[j] = old + h
                up = net.grads(user, rows, dense, y)[0]
                p[j] = old - h
                down = net.grads(user, rows, dense, y)[0]
                p[j] = old
                num[j] = (up - down) / (2 * h)
            np.testing.assert_allclose(grads[k], num, atol=1e-7, rtol=1e-5, err_msg=f"{name}.{k}")


@pytest.mark.parametrize("net", NETS, ids=["dot", "neumf-2", "neumf-1"])
def test_scores_of_every_item_equal_the_logits(net):
    rng = np.random.default_rng(1)
    users = net.init_user(rng, 3)
    glob = net.init_global(rng, 9)
    items = {k: glob[k] for k in net.item_keys}
    s = net.all_scores(users, items, glob)
    for u in range(3):
        one = {k: v[u] for k, v in users.items()}
        np.testing.assert_allclose(s[u], net.logits(one, items, glob), rtol=1e-10, atol=1e-12)


def _data(n_users=48):
    """Users in 4 taste groups, each user with 10 of their group's 15 items."""
    rng = np.random.default_rng(2)
    users = np.repeat(np.arange(n_users), 10)
    items = np.concatenate([15 * (u % 4) + rng.choice(15, 10, replace=False)
                            for u in range(n_users)])
    return Interactions.from_arrays(users, items, item_catalog=np.arange(60))


def _params(m):
    """The fitted parameters of any of the three, as one dict."""
    out = {"Q": m.item_factors_, "b": m.item_biases_, "P": m.user_factors_}
    return {**out, "dense": m.dense_params_} if isinstance(m, FedNCF) else out


def test_ncf_negatives_avoid_own_items_and_exclusions(monkeypatch):
    """Every negative fit draws for a user avoids the user's items and ``exclude``'s."""
    sp = leave_one_out(_data(), order="random", random_state=0)
    neg = sample_negatives(sp, 10, random_state=0)
    ex = training_exclusions(sp, "clean", neg)
    ex_csr, draws = ex.to_csr(), []
    real = NCF._draw

    def spy(self, positives, excluded, n_items, rng):
        items, y = real(self, positives, excluded, n_items, rng)
        draws.append((positives.copy(), items[y == 0]))
        return items, y

    monkeypatch.setattr(NCF, "_draw", spy)
    NCF(4, n_epochs=1, random_state=0).fit(sp.train, exclude=ex)
    assert len(draws) == sp.n_users
    for u, (pos, drawn) in enumerate(draws):
        assert np.array_equal(pos, sp.train.items[sp.train.indptr[u]:sp.train.indptr[u + 1]])
        assert len(drawn) == 4 * len(pos)
        assert not set(drawn) & (set(ex_csr[[u]].indices) | set(pos))


def test_device_pass_draws_outside_the_exclusions_uniformly():
    Q, b = np.zeros((40, 3)), np.zeros(40)
    excluded = np.array([0, 3, 4, 9, 10, 11, 20, 39])
    pos = np.array([3, 9])
    cfg = np.array([50.0, 4, 8, 0.1, 0.1, 0.0, 1.0])  # 50 negatives per positive, 4 epochs
    seen = np.zeros(40)
    for seed in range(20):
        _, m, uniq, _, _ = kern.device_pass(pos, excluded, Q, b, np.zeros(3), np.zeros(1), cfg,
                                            np.array([3]), 4, np.array([np.uint64(seed)]))
        seen[uniq[:m]] += 1
    assert not seen[np.setdiff1d(excluded, pos)].any()
    assert (seen[np.setdiff1d(np.arange(40), excluded)] == 20).all()  # every free item drawn


@pytest.mark.parametrize("stages", [[3], [1, 2]])
@pytest.mark.parametrize("share", [1.0, 0.0])
def test_round_kernel_matches_its_twin_device_by_device(stages, share):
    inter = _data(12)
    rng = np.random.default_rng(5)
    Q, b = rng.normal(0, 0.3, (60, 4)), rng.normal(0, 0.1, 60)
    P, c = rng.normal(0, 0.3, (12, 4)), rng.normal(0, 0.1, 12)
    excl_ptr = np.arange(13, dtype=np.int64) * 2
    excl_items = np.sort(np.c_[np.arange(12) * 5 % 60, np.arange(12) * 5 % 60 + 1], axis=1)
    from fedcf.federated.algorithms.sampled_mf import SampledProgram
    from fedcf.models.negatives import exclusion_csr
    ex = Interactions.from_arrays(np.repeat(inter.user_ids, 2), excl_items.ravel(),
                                  user_catalog=inter.user_ids, item_catalog=inter.item_ids,
                                  duplicates="last")
    excl = exclusion_csr(inter, ex)
    assert excl_ptr[-1] == 24
    cfg = np.array([3.0, 2, 7, 0.2, 3.0, 0.01, share])
    program = SampledProgram(cfg, np.array(stages, np.int64), excl, 60)
    local = (P.copy(), c.copy())
    ex_run = LocalExecutor().bind(program, (inter.indptr, inter.items, inter.values), local)
    cohort = np.array([7, 2, 11, 0])
    ids = np.array([9, 4], np.uint64)
    out = ex_run.run(Cohort(cohort, 4, 0, 0), {"Q": Q, "b": b}, ids)
    for k, u in enumerate(cohort):
        pos = inter.items[inter.indptr[u]:inter.indptr[u + 1]]
        seed = ref_stream(9, 4, u)
        loss, items, dQ, db, p, cu = ref.sampled_client(
            pos, excl[1][excl[0][u]:excl[0][u + 1]], Q, b, P[u], c[u], cfg,
            np.array(stages), seed)
        lo, hi = out.offsets[k], out.offsets[k + 1]
        got = out.items[lo:hi]
        keep = got >= 0
        np.testing.assert_array_equal(got[keep], items)
        np.testing.assert_allclose(out.d_Q[lo:hi][keep], dQ, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out.d_b[lo:hi][keep], db, rtol=1e-9, atol=1e-12)
        assert out.losses[k] == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(local[0][u], p, rtol=1e-12)  # kept on the device
        assert local[1][u] == pytest.approx(cu, rel=1e-12)
        assert (len(items) > 0) == (share > 0)
    untouched = np.setdiff1d(np.arange(12), cohort)
    np.testing.assert_array_equal(local[0][untouched], P[untouched])


def ref_stream(seed, rnd, u):
    from fedcf._reference.rng import stream_key
    return stream_key(seed, rnd, int(u))


def test_fold_in_and_personal_scores_match_their_twins():
    rng = np.random.default_rng(6)
    Q, b = rng.normal(0, 0.3, (30, 3)), rng.normal(0, 0.1, 30)
    indptr = np.array([0, 3, 3, 7])
    items = np.array([1, 4, 8, 0, 2, 9, 29])
    excl = (np.array([0, 4, 4, 9]), np.array([1, 4, 8, 17, 0, 2, 9, 13, 29]))
    keys = np.array([11, 12, 13], np.uint64)
    cfg = np.array([4.0, 1, 3, 0.3, 2.0, 0.0, 1.0])
    P, c = np.zeros((3, 3)), np.zeros(3)
    kern.sampled_fold_in(indptr, items, excl, Q, b, cfg, 5, 77, keys, P, c)
    out = np.empty((3, 30))
    kern.personal_scores(indptr, items, excl, Q, b, P, c, cfg, np.array([1, 2]), 77, keys, out)
    from fedcf._reference.rng import stream_key
    for r in range(3):
        pos, ex = items[indptr[r]:indptr[r + 1]], excl[1][excl[0][r]:excl[0][r + 1]]
        p, cr = ref.fold_in_row(pos, ex, Q, b, cfg, 5, stream_key(77, 1, 11 + r))
        np.testing.assert_allclose(P[r], p, rtol=1e-12, atol=1e-15)
        s = ref.personal_scores_row(pos, ex, Q, b, p, cr, cfg, np.array([1, 2]),
                                    stream_key(77, 2, 11 + r))
        np.testing.assert_allclose(out[r], s, rtol=1e-10, atol=1e-12)
    assert not P[1].any() and P[0].any()  # a device without data keeps the zero start


@pytest.mark.parametrize("cls", [FedMF, FedNCF, PFedRec])
def test_fit_is_seeded_learns_and_scores_alone_or_in_company(cls):
    sp = leave_one_out(_data(), order="random", random_state=0)
    a = cls(4, n_rounds=4, random_state=3).fit(sp.train)
    b = cls(4, n_rounds=4, random_state=3).fit(sp.train)
    for k, v in _params(a).items():
        np.testing.assert_array_equal(v, _params(b)[k])
    together = a.user_scores(np.array([5, 0, 2]))
    np.testing.assert_allclose(a.user_scores(np.array([0])), together[[1]], rtol=1e-12)
    assert a.history_[-1]["loss"] < a.history_[0]["loss"]
    off = cls(4, n_rounds=3, random_state=3, upload_items=False).fit(sp.train)
    for k, v in _params(off).items():
        if k != "P":  # the global rows never moved; the devices' own parts did
            np.testing.assert_array_equal(v, _params(cls(4, n_rounds=1, upload_items=False,
                                                         random_state=3).fit(sp.train))[k])
    rec = list(a.recommend(user=sp.train.user_ids[0], n=5)["item"])
    own = set(sp.train.item_ids[sp.train.items[:sp.train.indptr[1]]])
    assert len(rec) == 5 and not own & set(rec)


def test_baselines_find_the_taste_groups():
    sp = leave_one_out(_data(), order="random", random_state=0)
    neg = sample_negatives(sp, 20, random_state=0)
    for cls, rounds in ((FedMF, 30), (FedNCF, 60)):  # NeuMF leaves its plateau later
        m = cls(4, n_rounds=rounds, random_state=0).fit(sp.train)
        assert loo_metrics(m.user_scores, sp, negatives=neg, k=5)["hr@5"] > 0.6, cls.__name__
    # PFedRec's item step (80 × n_items × lr) is rough at this size: above chance (5/21) on
    # average over seeds, as the authors' code is
    hr = [loo_metrics(PFedRec(4, n_rounds=30, random_state=s).fit(sp.train).user_scores, sp,
                      negatives=neg, k=5)["hr@5"] for s in range(3)]
    assert np.mean(hr) > 0.45, hr


def test_bad_input_is_named():
    inter = _data()
    with pytest.raises(ValueError, match="n_factors"):
        FedMF(0).fit(inter)
    with pytest.raises(ValueError, match="layers"):
        FedNCF(4, layers=()).fit(inter)
    with pytest.raises(ValueError, match="item_learning_rate"):
        PFedRec(4, client_update=SampledUpdate(item_learning_rate=-1.0)).fit(inter)
    with pytest.raises(TypeError, match="client_update=SampledUpdate\\(item_learning_rate"):
        PFedRec(4, item_learning_rate=1.0)
    with pytest.raises(TypeError, match="one of \\['sampled'\\].*got 'sgd' \\(a ClientUpdate\\)"):
        FedMF(4, client_update="sgd").fit(inter)
    with pytest.raises(DataValidationError, match="same 48 users"):
        FedMF(4).fit(inter, exclude=inter.subset_users(np.array([0, 1])))
    tiny = Interactions.from_arrays(["a", "b"], [1, 2])
    everything = Interactions.from_arrays(["a", "a", "b"], [1, 2, 1])
    with pytest.raises(DataValidationError, match="user 'a' has every item"):
        FedMF(2, n_rounds=1).fit(tiny, exclude=everything)
    m = FedMF(2, n_rounds=1, random_state=0).fit(inter)
    with pytest.raises(KeyError, match="not seen in fit"):
        m.recommend(user="nobody")
    with pytest.raises(ValueError, match="dense user ids in \\[0, 48\\)"):
        m.user_scores([48])
    with pytest.raises(ValueError, match="epochs"):
        m.score_new_users(inter, epochs=-1)
    with pytest.raises(TypeError, match="upload_items"):
        FedMF(2, upload_items="no").fit(inter)
    with pytest.raises(ValueError, match="negatives"):
        PFedRec(2, negatives=0).fit(inter)
    with pytest.raises(ValueError, match="client_weighting"):
        FedMF(2, client_weighting="by_size").fit(inter)
    assert m.item_factors_.shape == (60, 2)  # the failed fits above left the model as it was


@pytest.mark.parametrize("stages,lam", [([3], 0.0), ([1, 2], 0.0), ([1], 0.1), ([1, 2], 0.05)])
def test_dot_kernel_matches_its_twin(stages, lam):
    from fedcf._kernels.sampled import dot_local
    from fedcf._reference import sampled as ref
    rng = np.random.default_rng(4)
    m, d, n, epochs = 9, 3, 23, 2
    args = (rng.normal(size=d), rng.normal(size=1), rng.normal(size=(m, d)),
            rng.normal(size=(m, 1)))
    idx = rng.integers(0, m, epochs * n)  # repeats within a batch on purpose
    y = (rng.random(n) < 0.3).astype(float)
    order = np.array([rng.permutation(n) for _ in range(epochs)])
    a = [x.copy() for x in args]
    b = [x.copy() for x in args]
    la = dot_local(*a, idx, y, order, 5, np.array(stages), 0.3, 2.0, lam)
    lb = ref.dot_local(*b, idx, y, order, 5, np.array(stages), 0.3, 2.0, lam)
    assert la == pytest.approx(lb, rel=1e-12)
    items_step = any(st & 2 for st in stages)
    for j, (x, z, start) in enumerate(zip(a, b, args)):
        np.testing.assert_allclose(x, z, rtol=1e-12, atol=1e-12)
        assert np.allclose(x, start) == (j >= 2 and not items_step)  # what moved, moved


@pytest.mark.parametrize("layers,lam,share", [((6, 3), 0.0, 1.0), ((5,), 0.01, 1.0),
                                              ((5,), 0.0, 0.0)])
def test_fedncf_round_kernel_matches_its_twin_device_by_device(layers, lam, share):
    """Each device's upload (item rows, then the dense rows), loss and kept user row equal
    the NumPy twin's, built on NeuMFNet's finite-difference-checked gradients."""
    from fedcf._reference import neumf as nref
    inter, d = _data(12), 3
    net = NeuMFNet(d, layers)
    R = -(-net.dense_size // (2 * d))
    rng = np.random.default_rng(8)
    Q = np.zeros((60 + R, 2 * d))
    Q[:60] = rng.normal(0, 0.3, (60, 2 * d))
    Q[60:].reshape(-1)[:net.dense_size] = net.pack(net.init_dense(rng))
    Q[60:].reshape(-1)[net.dense_size:] = 0.5  # padding (e.g. DP noise landed there)
    # float32, as FedNCF's default dtype: the kernel then compiles once for the whole suite
    Q, b = Q.astype(np.float32), np.zeros(60 + R, np.float32)
    P, c = rng.normal(0, 0.3, (12, 2 * d)).astype(np.float32), np.zeros(12, np.float32)
    from fedcf.models.negatives import exclusion_csr
    excl = exclusion_csr(inter)
    cfg = np.array([3.0, 2, 7, 0.2, 3.0, lam, share])
    program = NeuMFProgram(cfg, np.zeros(0, np.int64), excl, 60, np.array(layers), R)
    local = (P.copy(), c.copy())
    run = LocalExecutor().bind(program, (inter.indptr, inter.items, inter.values), local)
    cohort = np.array([7, 2, 11, 0])
    out = run.run(Cohort(cohort, 4, 0, 0), {"Q": Q, "b": b}, np.array([9, 4], np.uint64))
    for k, u in enumerate(cohort):
        pos = inter.items[inter.indptr[u]:inter.indptr[u + 1]]
        p = P[u].astype(np.float64)
        loss, uniq, rows = nref.neumf_device(net, pos, excl[1][excl[0][u]:excl[0][u + 1]], Q,
                                             60, p, cfg, [7], 2, ref_stream(9, 4, u))
        touched = np.r_[uniq, 60 + np.arange(R)] if share else np.zeros(0, int)
        lo, hi = out.offsets[k], out.offsets[k + 1]
        got = out.items[lo:hi]
        keep = got >= 0
        np.testing.assert_array_equal(got[keep], touched)
        if share:
            np.testing.assert_allclose(out.d_Q[lo:hi][keep], rows - Q[touched], rtol=1e-5,
                                       atol=1e-6)  # stored as float32
            dense = out.d_Q[lo:hi][keep][-R:].reshape(-1)
            assert np.abs(dense[:net.dense_size]).sum() > 0  # the dense rows moved
            assert not dense[net.dense_size:].any()  # the padding never does
        assert not out.d_b[lo:hi].any()
        assert out.losses[k] == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(local[0][u], p, rtol=1e-6)  # kept on the device
        assert not np.allclose(p, P[u])


def test_neumf_twin_steps_along_the_checked_gradient():
    """The twin's one-batch step is −rate × NeuMFNet's gradient (checked against finite
    differences above), so the kernel that matches the twin follows it too."""
    from fedcf._reference import neumf as nref
    net = NeuMFNet(3, (5, 4))
    user, rows, dense, y = _problem(net, seed=3, n=6)
    loss, gu, gr, gd = net.grads(user, rows, dense, y)
    u2, r2, d2 = ({k: v.copy() for k, v in x.items()} for x in (user, rows, dense))
    got = nref.neumf_local(net, u2, r2, d2, np.arange(6), y, np.arange(6)[None], 6, [7], 0.3,
                           2.0, 0.0)
    assert got == pytest.approx(loss, rel=1e-12)
    for params, new, g, rate in ((user, u2, gu, 0.3), (rows, r2, gr, 2.0), (dense, d2, gd, 0.3)):
        for k in params:
            np.testing.assert_allclose(new[k], params[k] - rate * g[k], rtol=1e-12, atol=1e-14)


def test_fedncf_fold_in_matches_its_twin_alone_or_in_company():
    from fedcf._reference import neumf as nref
    from fedcf._reference.rng import stream_key
    m = FedNCF(3, layers=(4,), n_rounds=2, random_state=0).fit(_data())
    Q = m._global_params()["Q"].astype(np.float64)
    indptr, items = np.array([0, 3, 3, 7]), np.array([1, 4, 8, 0, 2, 9, 29])
    excl = (np.array([0, 4, 4, 9]), np.array([1, 4, 8, 17, 0, 2, 9, 13, 29]))
    keys = np.array([11, 12, 13], np.uint64)
    P, _ = m._fold_in(indptr, items, excl, keys, epochs=3)
    for r in range(3):
        p = np.zeros(6)
        nref.neumf_device(m._net(), items[indptr[r]:indptr[r + 1]],
                          excl[1][excl[0][r]:excl[0][r + 1]], Q, 60, p, m._cfg(60, 3), [1], 3,
                          stream_key(m._seed(), 1, 11 + r))
        np.testing.assert_allclose(P[r], p, rtol=1e-12, atol=1e-15)
    alone, _ = m._fold_in(indptr[:2], items[:3], (excl[0][:2], excl[1][:4]), keys[:1], epochs=3)
    np.testing.assert_array_equal(alone[0], P[0])
    assert not P[1].any() and P[0].any()  # a device without data keeps the zero start


@pytest.mark.parametrize("lam", [0.0, 0.01])
def test_ncf_kernel_epoch_equals_its_numpy_twin(lam, monkeypatch):
    sp = leave_one_out(_data(), order="random", random_state=0)
    kw = dict(layers=(6, 3), n_epochs=3, batch_size=16, regularization=lam, random_state=1)
    fast = NCF(4, **kw).fit(sp.train)
    monkeypatch.setattr(NCF, "_kernel", False)
    slow = NCF(4, **kw).fit(sp.train)
    for k in ("item_factors_", "dense_params_", "user_factors_"):
        np.testing.assert_allclose(getattr(fast, k), getattr(slow, k), rtol=1e-9, atol=1e-12,
                                   err_msg=k)
    assert [h["loss"] for h in fast.history_] == pytest.approx(
        [h["loss"] for h in slow.history_], rel=1e-12)


def test_ncf_learns_the_taste_groups_and_folds_in_new_users():
    inter = _data(96)
    sp = leave_one_out(inter.subset_users(np.arange(64)), order="random", random_state=0)
    neg = sample_negatives(sp, 20, random_state=0)
    m = NCF(4, n_epochs=30, random_state=0).fit(sp.train)
    assert m.history_[-1]["loss"] < m.history_[0]["loss"]
    assert loo_metrics(m.user_scores, sp, negatives=neg, k=5)["hr@5"] > 0.6
    new = leave_one_out(inter.subset_users(np.arange(64, 96)), order="random", random_state=0)
    both = m.score_new_users(new.train)
    np.testing.assert_allclose(m.score_new_users(new.train.subset_users(np.array([3])))[0],
                               both[3], rtol=1e-12)
    hr = loo_metrics(lambda u: both[u], new, negatives=sample_negatives(new, 20, random_state=0),
                     k=5)["hr@5"]
    assert hr > 0.7, hr  # folded in at fit's embedding step (at learning_rate: about 0.4)
    with pytest.raises(FloatingPointError, match="lower learning_rate .* or "
                                                 "embedding_learning_rate"):
        NCF(4, n_epochs=5, learning_rate=1e6, embedding_learning_rate=1e9).fit(sp.train)
    with pytest.raises(ValueError, match="n_epochs"):
        NCF(4, n_epochs=-1).fit(sp.train)
    with pytest.raises(ValueError, match="embedding_learning_rate"):
        NCF(4, embedding_learning_rate=0.0).fit(sp.train)


@pytest.mark.parametrize("cls", [FedMF, FedNCF, PFedRec])
def test_new_users_are_trained_on_their_device_alone(cls):
    inter = _data(96)
    seen = inter.subset_users(np.arange(0, 64))
    new = inter.subset_users(np.arange(64, 96))
    sp = leave_one_out(new, order="random", random_state=0)
    m = cls(4, n_rounds=30, random_state=0).fit(seen)
    both = m.score_new_users(sp.train)
    alone = m.score_new_users(sp.train.subset_users(np.array([3])))
    np.testing.assert_allclose(alone[0], both[3], rtol=1e-12)
    neg = sample_negatives(sp, 20, random_state=0)
    hr = loo_metrics(lambda u: both[u], sp, negatives=neg, k=5)["hr@5"]
    assert hr > 0.4, hr  # chance is 5/21
    before = {k: v.copy() for k, v in _params(m).items()}
    m.score_new_users(sp.train)
    for k in before:
        np.testing.assert_array_equal(before[k], _params(m)[k])
    with pytest.raises(DataValidationError, match="item map"):
        m.score_new_users(Interactions.from_arrays(["x"], [1]))


@pytest.mark.parametrize("cls", [FedMF, FedNCF])
def test_divergence_is_named_and_keeps_the_previous_model(cls):
    inter = _data()
    m = cls(4, n_rounds=2, random_state=0).fit(inter)
    before = {k: v.copy() for k, v in _params(m).items()}
    with pytest.raises(FloatingPointError, match="lower client_update's learning_rate"):
        m.set_params(client_update=SampledUpdate(1e8, item_learning_rate=1e12),
                     n_rounds=40).fit(inter)
    for k in before:
        np.testing.assert_array_equal(before[k], _params(m)[k])
    pairs = cls(2, n_rounds=2, negatives=2, random_state=0).fit([[1, 2], [1, 3], [2, 3],
                                                                   [2, 4]])
    assert len(pairs.recommend(user=1, n=1)) == 1


@pytest.mark.parametrize("cls,private_cls", [(FedMF, PFedRec), (FedNCF, FedNCF)])
def test_the_federated_baselines_run_under_dp_and_secure_aggregation(cls, private_cls):
    """The phases apply: DP's accountant composes and its noise moves the rows (FedNCF's
    dense rows too); secure aggregation gives the plain mean's model (the masks cancel)."""
    inter = _data(96)
    kw = dict(n_rounds=2, clients_per_round=20, random_state=0)
    plain = cls(4, **kw).fit(inter)
    assert plain.history_[0]["clients_used"] == 20
    secure = cls(4, aggregator=SecureAggregation(), **kw).fit(inter)
    assert any(k.startswith("secagg") for k in secure.history_[0]), secure.history_[0]
    for k, v in _params(plain).items():
        np.testing.assert_allclose(_params(secure)[k], v, atol=1e-5, err_msg=k)
    dp = DPGaussianMean(clip_norm=0.5, noise_multiplier=1.0)
    private = private_cls(4, aggregator=dp, **kw).fit(inter)
    assert 0 < private.epsilon_ < np.inf
    for k, v in _params(private_cls(4, **kw).fit(inter)).items():
        if k in ("Q", "dense"):
            assert not np.allclose(_params(private)[k], v, atol=1e-3), k


def test_fedmf_serves_new_users_with_the_mixin_api_and_pfedrec_refuses_what_it_cannot():
    inter = _data()
    sp = leave_one_out(inter, order="random", random_state=0)
    held = np.c_[sp.train.user_ids, sp.train.item_ids[sp.test]]  # (user, held-out item)
    m = FedMF(4, n_rounds=30, random_state=0).fit(sp.train)
    items = inter.item_ids[inter.items[:inter.indptr[1]]]
    one = Interactions.from_arrays(np.zeros(len(items), int), items, user_catalog=[0],
                                   item_catalog=inter.item_ids)
    np.testing.assert_allclose(m.score_all_items(*m.reconstruct_users(one))[0],
                               m.score_new_users(one)[0], rtol=1e-5)
    local = m.reconstruct(items)  # keyed by the history itself: the same twice
    np.testing.assert_array_equal(local.factors, m.reconstruct(items).factors)
    assert local.factors.any()
    assert m.score(held, k=5) > 0.2  # NDCG@5 of the held-out items (chance about 0.06)
    p = PFedRec(4, n_rounds=3, random_state=0).fit(sp.train)
    with pytest.raises(ValueError, match="finetuned on each device"):
        p.predict([[inter.user_ids[0], inter.item_ids[0]]])
    with pytest.raises(ValueError, match="finetuned on each device"):
        p.reconstruct(items)
    assert len(p.recommend(items=items, n=4)) == 4
    assert p.score(held, k=5) == pytest.approx(  # scored with the personal embeddings
        loo_metrics(p.user_scores, sp, k=5)["ndcg@5"], rel=1e-9)


def test_results_do_not_depend_on_the_thread_count():
    import numba
    sp = leave_one_out(_data(), order="random", random_state=0)
    new = sp.train.subset_users(np.arange(6))
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            out = []
            for cls in (FedMF, PFedRec, FedNCF):
                m = cls(4, n_rounds=3, client_update=SampledUpdate(epochs=2),
                        random_state=0).fit(sp.train)
                out += [m.item_factors_, m.user_factors_, m.user_scores(np.arange(48)),
                        m.score_new_users(new)]
            results.append(out)
    finally:
        numba.set_num_threads(before)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_dot_twin_steps_along_the_checked_gradient():
    """The twin's one-batch step is −rate × DotNet's gradient (the one checked against finite
    differences above), so the kernel that matches the twin follows it too."""
    net = DotNet(3)
    user, rows, _, y = _problem(net, seed=3, n=6)
    loss, gu, gr, _ = net.grads(user, rows, {}, y)
    u, c = user["u"].copy(), user["c"].copy()
    e, b = rows["e"].copy(), rows["b"].copy()  # one local row per example
    idx = np.arange(6)
    got = ref.dot_local(u, c, e, b, idx, y, np.arange(6)[None], 6, np.array([3]), 0.3, 2.0, 0.0)
    assert got == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(u, user["u"] - 0.3 * gu["u"], rtol=1e-12)
    np.testing.assert_allclose(c, user["c"] - 0.3 * gu["c"], rtol=1e-12)
    np.testing.assert_allclose(e, rows["e"] - 2.0 * gr["e"], rtol=1e-12)
    np.testing.assert_allclose(b, rows["b"] - 2.0 * gr["b"], rtol=1e-12)


@pytest.mark.parametrize("cls", [PFedRec, FedNCF])
def test_resumes_from_a_checkpoint_as_if_uninterrupted(cls, tmp_path):
    sp = leave_one_out(_data(), order="random", random_state=0)
    ex = training_exclusions(sp, "clean", sample_negatives(sp, 10, random_state=0))
    kw = dict(clients_per_round=20, random_state=3)
    full = cls(4, n_rounds=6, **kw).fit(sp.train, exclude=ex)
    ck = tmp_path / "ck.npz"
    cls(4, n_rounds=3, checkpoint_path=str(ck), **kw).fit(sp.train, exclude=ex)
    resumed = cls(4, n_rounds=6, checkpoint_path=str(ck), **kw).fit(sp.train, exclude=ex)
    for k, v in _params(full).items():
        np.testing.assert_array_equal(v, _params(resumed)[k], err_msg=k)
    before = ck.read_bytes()
    with pytest.raises(ValueError, match="exclude"):  # other exclusions: another run
        cls(4, n_rounds=6, checkpoint_path=str(ck), **kw).fit(sp.train)
    assert ck.read_bytes() == before


def test_ncf_refuses_bad_users_and_n():
    inter = _data()
    m = NCF(4, random_state=0, n_epochs=1).fit(inter)
    for users in ([48], [-1], [0.5], [[0]]):  # out of range, negative (no wrap), float, 2-D
        with pytest.raises(ValueError, match=r"dense user ids in \[0, 48\)"):
            m.user_scores(users)
    for n in (-1, "3", 2.0, True):
        with pytest.raises(ValueError, match="n must be a non-negative integer"):
            m.recommend(user=inter.user_ids[0], n=n)
    with pytest.raises(KeyError, match="was not seen in fit"):
        m.recommend(user="nobody", n=3)
    assert len(m.recommend(user=inter.user_ids[0], n=0)) == 0


def test_pfedrec_recommends_for_an_empty_history_by_the_item_biases():
    p = PFedRec(4, n_rounds=2, random_state=0).fit(_data())
    rec = p.recommend(items=[], n=5)
    top = np.argsort(-p.item_biases_.astype(float), kind="stable")[:5]
    assert list(rec["item"]) == list(p.item_ids_[top])


def test_fedncf_refuses_bad_layers_and_a_damaged_file(tmp_path):
    inter = _data()
    for layers in ((4, 0), "4", (True,), (2.0,), []):
        with pytest.raises(ValueError, match="layers must be a non-empty tuple"):
            FedNCF(4, layers=layers, n_rounds=1).fit(inter)
    m = FedNCF(3, layers=(4,), n_rounds=1, random_state=0).fit(inter)
    path = m.save(tmp_path / "m")
    back = FedNCF.load(path)
    np.testing.assert_array_equal(back.user_scores([0, 5]), m.user_scores([0, 5]))
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["dense_params_"] = arrays["dense_params_"][:-1]  # one number short
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="dense parameters .* damaged or edited"):
        FedNCF.load(tmp_path / "bad.npz")
    refit = back.set_params(n_rounds=2).fit(inter)  # a loaded model refits from scratch
    assert refit.history_[-1]["round"] == 1 and refit.dense_params_.shape == m.dense_params_.shape


@pytest.mark.parametrize("cls", [FedMF, PFedRec, FedNCF])
def test_a_model_saved_with_the_flat_update_names_loads_with_them_moved(cls, tmp_path):
    """Before ``client_update``, these models took learning_rate, local_epochs, ... flat; a
    file saved then (its metadata rewritten here to that form) loads into client_update."""
    import json

    from fedcf import load_model
    from fedcf._io import atomic_savez, load_npz

    inter = _data()
    upd = SampledUpdate(0.05, item_learning_rate=3.0, epochs=2, batch_size=64,
                        regularization=0.01)
    m = cls(4, n_rounds=2, client_update=upd, random_state=0).fit(inter)
    path = m.save(tmp_path / "new.npz")
    arrays, meta = load_npz(path, meta_key="metadata", what="model")
    meta["params"].pop("client_update")
    meta["params"].update(learning_rate=0.05, item_learning_rate=3.0, local_epochs=2,
                          batch_size=64, regularization=0.01)
    old = atomic_savez(tmp_path / "old.npz", arrays, json.loads(json.dumps(meta)),
                       meta_key="metadata")
    back = load_model(old)
    assert back.client_update == upd
    np.testing.assert_array_equal(back.item_factors_, m.item_factors_)
    np.testing.assert_array_equal(back._cfg(50), m._cfg(50))  # the device trains as it did
    if cls is not PFedRec:  # (PFedRec scores from the fit data, which a loaded model lacks)
        np.testing.assert_array_equal(back.user_scores(np.arange(5)),
                                      m.user_scores(np.arange(5)))


def test_a_program_for_some_users_holds_their_exclusions_only():
    """What a Ray shard runs: FedMF's program cut to some users, renumbered in their order,
    holds exactly those users' exclusion rows (a shard indexing the whole population's rows
    with its own numbering drew other users' negatives)."""
    from fedcf.models.negatives import exclusion_csr

    inter = _data()
    m = FedMF(4, n_rounds=1, random_state=0)
    program = m.client_program(inter, 0.0)
    users = np.array([5, 0, 17, 3])
    cut = program.for_users(users)
    want = exclusion_csr(inter.subset_users(users))
    np.testing.assert_array_equal(cut.excl[0], want[0])
    np.testing.assert_array_equal(cut.excl[1], want[1])
    whole = program.for_users(np.arange(inter.n_users))
    np.testing.assert_array_equal(whole.excl[1], program.excl[1])


def test_ncf_saves_and_loads_to_the_same_scores_and_refuses_a_damaged_file(tmp_path):
    """Centralized NCF saves as every estimator of the family: one .npz (no pickle) → the same
    scores for seen and new users, the same recommendations (its fit items left out),
    load_model finds it; a short array, another class's file and a folder are refused by name;
    a loaded model refits from scratch; a file of the earlier layout (``global_*``/``user_*``
    arrays) loads to the same model."""
    from fedcf import load_model
    from fedcf._io import atomic_savez

    inter = _data()
    m = NCF(3, layers=(4,), n_epochs=2, random_state=0).fit(inter)
    path = m.save(tmp_path / "ncf")
    assert path.suffix == ".npz"
    back = load_model(path)
    assert type(back) is NCF and back.get_params() == m.get_params()
    np.testing.assert_array_equal(back.user_scores([0, 5]), m.user_scores([0, 5]))
    np.testing.assert_array_equal(back.score_new_users(inter.subset_users(np.arange(3))),
                                  m.score_new_users(inter.subset_users(np.arange(3))))
    u = inter.user_ids[2]
    assert back.recommend(user=u, n=4).equals(m.recommend(user=u, n=4))
    seen = inter.items[inter.indptr[2]:inter.indptr[3]]
    assert not set(m.recommend(user=u, n=4)["item"]) & set(inter.item_ids[seen])
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for name in ("item_factors_", "dense_params_"):
        np.savez(tmp_path / "bad.npz", **{**arrays, name: arrays[name][:-1]})
        with pytest.raises(ValueError, match="damaged or edited"):
            NCF.load(tmp_path / "bad.npz")
    other = FedNCF(3, layers=(4,), n_rounds=1, random_state=0).fit(inter).save(tmp_path / "f")
    with pytest.raises(ValueError, match="holds a FedNCF"):
        NCF.load(other)
    with pytest.raises(IsADirectoryError, match="folder"):
        m.save(tmp_path)
    refit = back.set_params(n_epochs=1).fit(inter)
    assert len(refit.history_) == 1 and refit.interactions_ is not None
    # the earlier layout: the network as global_*/user_* arrays, the fold-in seed in the meta
    d, net = 3, m._net()
    old = {"global_qg": m.item_factors_[:, :d], "global_qm": m.item_factors_[:, d:],
           **{f"global_{k}": v for k, v in net.unpack(m.dense_params_).items()},
           "user_pg": m.user_factors_[:, :d], "user_pm": m.user_factors_[:, d:],
           **{k: v for k, v in arrays.items() if k.startswith(("user_ids", "item_ids", "seen"))}}
    meta = {"format_version": 1, "class": "NCF", "score_seed": m.score_seed_,
            "params": json.loads(arrays["metadata"].item())["params"], "history": m.history_}
    atomic_savez(tmp_path / "old.npz", old, meta, meta_key="metadata")
    before = load_model(tmp_path / "old.npz")
    np.testing.assert_array_equal(before.user_scores([0, 5]), m.user_scores([0, 5]))
    np.testing.assert_array_equal(before.score_new_users(inter.subset_users(np.arange(3))),
                                  m.score_new_users(inter.subset_users(np.arange(3))))
    del old["global_h"]
    atomic_savez(tmp_path / "old.npz", old, meta, meta_key="metadata")
    with pytest.raises(ValueError, match="earlier format .* damaged or edited"):
        load_model(tmp_path / "old.npz")
