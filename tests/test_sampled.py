"""The sampled-negative baselines (FedMF, FedNCF, PFedRec): gradients against finite
differences, the sampler against its exclusions, scoring independent of who shares a call,
and bad input."""

import numpy as np
import pytest

from fedcf.datasets import DataValidationError, Interactions
from fedcf.eval.loo import leave_one_out, loo_metrics, sample_negatives, training_exclusions
from fedcf.federated.sampled import FedMF, FedNCF, PFedRec
from fedcf.federated.sampled_nets import DotNet, NeuMFNet

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


@pytest.mark.parametrize("cls", [FedMF, FedNCF, PFedRec])
def test_negatives_avoid_own_items_and_exclusions(cls):
    sp = leave_one_out(_data(), order="random", random_state=0)
    neg = sample_negatives(sp, 10, random_state=0)
    ex = training_exclusions(sp, "clean", neg)
    m = cls(4, n_rounds=1, random_state=0).fit(sp.train, exclude=ex)
    ex_csr = ex.to_csr()
    rng = np.random.default_rng(0)
    for u in range(sp.n_users):
        pos = sp.train.items[sp.train.indptr[u]:sp.train.indptr[u + 1]]
        items, y = m._draw(*m._device_data(u), rng)
        drawn = items[y == 0]
        assert len(drawn) == 4 * len(pos)
        assert not set(drawn) & set(ex_csr[[u]].indices)


@pytest.mark.parametrize("cls", [FedMF, FedNCF, PFedRec])
def test_fit_is_seeded_learns_and_scores_alone_or_in_company(cls):
    sp = leave_one_out(_data(), order="random", random_state=0)
    a = cls(4, n_rounds=4, random_state=3).fit(sp.train)
    b = cls(4, n_rounds=4, random_state=3).fit(sp.train)
    for k in a.global_params_:
        np.testing.assert_array_equal(a.global_params_[k], b.global_params_[k])
    together = a.user_scores(np.array([5, 0, 2]))
    np.testing.assert_allclose(a.user_scores(np.array([0])), together[[1]], rtol=1e-12)
    assert a.history_[-1]["loss"] < a.history_[0]["loss"]
    off = cls(4, n_rounds=3, server_learning_rate=0.0, random_state=3).fit(sp.train)
    init = cls(4, n_rounds=0, random_state=3).fit(sp.train)
    for k in off.global_params_:
        np.testing.assert_array_equal(off.global_params_[k], init.global_params_[k])
    rec = a.recommend(sp.train.user_ids[0], n=5)
    own = set(sp.train.item_ids[sp.train.items[:sp.train.indptr[1]]])
    assert len(rec) == 5 and not own & set(rec)


def test_baselines_find_the_taste_groups():
    sp = leave_one_out(_data(), order="random", random_state=0)
    neg = sample_negatives(sp, 20, random_state=0)
    for cls in (FedMF, FedNCF, PFedRec):
        m = cls(4, n_rounds=30, random_state=0).fit(sp.train)
        assert loo_metrics(m.user_scores, sp, negatives=neg, k=5)["hr@5"] > 0.6, cls.__name__


def test_bad_input_is_named():
    inter = _data()
    with pytest.raises(ValueError, match="n_factors"):
        FedMF(0).fit(inter)
    with pytest.raises(ValueError, match="layers"):
        FedNCF(4, layers=()).fit(inter)
    with pytest.raises(ValueError, match="item_learning_rate"):
        PFedRec(4, item_learning_rate=-1.0).fit(inter)
    with pytest.raises(DataValidationError, match="same 48 users"):
        FedMF(4).fit(inter, exclude=inter.subset_users(np.array([0, 1])))
    tiny = Interactions.from_arrays(["a", "b"], [1, 2])
    everything = Interactions.from_arrays(["a", "a", "b"], [1, 2, 1])
    with pytest.raises(DataValidationError, match="user 'a' has every item"):
        FedMF(2, n_rounds=1).fit(tiny, exclude=everything)
    with pytest.raises(KeyError, match="not seen in fit"):
        FedMF(2, n_rounds=1, random_state=0).fit(inter).recommend("nobody")


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


@pytest.mark.parametrize("cls", [FedMF, PFedRec])
def test_the_kernel_pass_equals_the_numpy_pass(cls, monkeypatch):
    sp = leave_one_out(_data(), order="random", random_state=0)
    fast = cls(4, n_rounds=3, regularization=0.01, local_epochs=2, random_state=1).fit(sp.train)
    monkeypatch.setattr(cls, "_kernel", False)
    slow = cls(4, n_rounds=3, regularization=0.01, local_epochs=2, random_state=1).fit(sp.train)
    for k in fast.global_params_:
        np.testing.assert_allclose(fast.global_params_[k], slow.global_params_[k], rtol=1e-9,
                                   atol=1e-12)
    np.testing.assert_allclose(fast.user_scores(np.arange(5)), slow.user_scores(np.arange(5)),
                               rtol=1e-9, atol=1e-12)


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
    before = {k: v.copy() for k, v in m.global_params_.items()}
    m.score_new_users(sp.train)
    for k in before:
        np.testing.assert_array_equal(before[k], m.global_params_[k])
    with pytest.raises(DataValidationError, match="item map"):
        m.score_new_users(Interactions.from_arrays(["x"], [1]))


def test_divergence_is_named_and_keeps_the_previous_model():
    inter = _data()
    m = FedMF(4, n_rounds=2, random_state=0).fit(inter)
    before = {k: v.copy() for k, v in m.global_params_.items()}
    with pytest.raises(FloatingPointError, match="lower learning_rate"):
        m.set_params(learning_rate=1e8, item_learning_rate=1e12, n_rounds=40).fit(inter)
    for k in before:
        np.testing.assert_array_equal(before[k], m.global_params_[k])
    pairs = FedMF(2, n_rounds=2, random_state=0).fit([[1, 2], [1, 3], [2, 3], [2, 4]])
    assert len(pairs.recommend(1, n=1)) == 1
