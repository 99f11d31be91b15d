"""Leave-one-out protocols (fedcf.eval.loo): the split, the evaluation negatives, what training
may sample, ranks with ties against the model, and the measured leak of the papers' sampler."""

import numpy as np
import pytest

from fedcf.datasets import DataValidationError, Interactions, make_synthetic_ratings
from fedcf.eval.loo import (
    leave_one_out,
    loo_metrics,
    loo_ranks,
    rank_metrics,
    rank_of_target,
    sample_negatives,
    training_exclusions,
)
from fedcf.federated import PFedRec, SampledUpdate


def _tiny():
    # user a: items 1,2,3,4 at times 4,3,2,1 -> test 1 (newest), validation 2
    users = ["a"] * 4 + ["b"] * 3
    items = [1, 2, 3, 4, 5, 6, 1]
    ts = [4, 3, 2, 1, 1, 2, 3]
    return Interactions.from_arrays(users, items, timestamps=ts, item_catalog=np.arange(10))


def test_split_holds_out_newest_then_second_newest():
    inter = _tiny()
    sp = leave_one_out(inter)
    a, b = 0, 1
    assert inter.item_ids[sp.test[a]] == 1 and inter.item_ids[sp.validation[a]] == 2
    assert inter.item_ids[sp.test[b]] == 1 and inter.item_ids[sp.validation[b]] == 6
    train = sp.train.to_csr()
    assert sorted(inter.item_ids[train[[a]].indices]) == [3, 4]
    assert sorted(inter.item_ids[train[[b]].indices]) == [5]
    assert sp.train.n_items == 10 and sp.train.nnz == inter.nnz - 4
    no_val = leave_one_out(inter, validation=False)
    assert np.all(no_val.validation == -1) and no_val.train.nnz == inter.nnz - 2
    with pytest.raises(ValueError, match="no validation item"):
        no_val.held_out("validation")


def test_random_order_is_seeded_and_holds_out_own_items():
    inter = make_synthetic_ratings(50, 30, 600, random_state=0)
    inter = inter.subset_users(np.flatnonzero(inter.counts() >= 3))
    a = leave_one_out(inter, order="random", random_state=1)
    b = leave_one_out(inter, order="random", random_state=1)
    c = leave_one_out(inter, order="random", random_state=2)
    assert np.array_equal(a.test, b.test) and not np.array_equal(a.test, c.test)
    csr = inter.to_csr()
    for u in range(inter.n_users):
        own = set(csr[[u]].indices)
        assert a.test[u] in own and a.validation[u] in own and a.test[u] != a.validation[u]


def test_split_refuses_what_it_cannot_do():
    inter = _tiny()
    with pytest.raises(DataValidationError, match=r"fewer than 3 interactions.*'b'"):
        leave_one_out(inter.subset_users(np.array([0, 1])).take(
            np.array([True] * 4 + [True, False, False])))
    untimed = Interactions.from_arrays(["a"] * 3, [1, 2, 3])
    with pytest.raises(ValueError, match="order='random'"):
        leave_one_out(untimed)
    with pytest.raises(ValueError, match="order must be"):
        leave_one_out(inter, order="newest")
    with pytest.raises(TypeError, match="Interactions"):
        leave_one_out([(1, 2)])


def test_negatives_are_unseen_distinct_and_uniform():
    inter = make_synthetic_ratings(40, 25, 300, random_state=3)
    inter = inter.subset_users(np.flatnonzero(inter.counts() >= 3))
    sp = leave_one_out(inter, order="random", random_state=0)
    csr = inter.to_csr()
    counts = np.zeros(inter.n_items)
    for seed in range(200):
        neg = sample_negatives(sp, 5, random_state=seed)
        for u in range(inter.n_users):
            assert len(set(neg[u])) == 5 and not set(neg[u]) & set(csr[[u]].indices)
        counts += np.bincount(neg[0], minlength=inter.n_items)
    free = np.setdiff1d(np.arange(inter.n_items), csr[[0]].indices)
    expected = 200 * 5 / len(free)
    assert counts[csr[[0]].indices].sum() == 0
    assert np.all(np.abs(counts[free] - expected) < 5 * np.sqrt(expected))  # uniform


def test_negative_counts_are_checked():
    sp = leave_one_out(_tiny())
    with pytest.raises(ValueError, match="larger than the catalog"):
        sample_negatives(sp, 10)
    with pytest.raises(ValueError, match="n_negatives must be a whole number"):
        sample_negatives(sp, 0)
    with pytest.raises(ValueError, match=r"user 'a' interacted with 4 of 10 items, leaving 6"):
        sample_negatives(sp, 7)
    neg = sample_negatives(sp, 7, short_users="drop")
    assert np.all(neg[0] == -1) and np.all(neg[1] >= 0)
    ranks = loo_ranks(lambda u: np.zeros((len(u), 10)), sp, negatives=neg)
    assert ranks[0] == -1 and ranks[1] == 7  # all tied: the held-out item ranks last


def test_training_exclusions_by_mode():
    sp = leave_one_out(_tiny())
    neg = sample_negatives(sp, 3, random_state=0)
    train_rows = sp.train.to_csr()
    for mode in ("full", "paper-compat", "clean"):
        ex = training_exclusions(sp, mode, neg).to_csr()
        for u in range(2):
            got = set(ex[[u]].indices)
            held = {sp.test[u], sp.validation[u]}
            assert set(train_rows[[u]].indices) <= got
            assert (held <= got) == (mode != "full") and not (held & got and mode == "full")
            assert (set(neg[u]) <= got) == (mode == "clean")
    with pytest.raises(ValueError, match="needs the sampled evaluation negatives"):
        training_exclusions(sp, "clean")
    with pytest.raises(ValueError, match="mode must be one of"):
        training_exclusions(sp, "leaky")


def test_ties_count_against_the_model():
    s = np.array([[1.0, 1.0, 1.0, 0.0], [2.0, 1.0, 3.0, 2.0]])
    assert rank_of_target(s, np.array([0, 0])).tolist() == [2, 2]
    m = rank_metrics(np.array([0, 1, 9, 10, -1]), k=10)
    assert m["hr@10"] == 0.75 and m["n_users"] == 4
    assert m["ndcg@10"] == pytest.approx((1 + 1 / np.log2(3) + 1 / np.log2(11)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 10 + 1 / 11) / 4)
    with pytest.raises(ValueError, match="k must be"):
        rank_metrics(np.array([0]), k=0)
    with pytest.raises(ValueError, match="no user has a rank"):
        rank_metrics(np.array([-1]))


def test_full_ranking_masks_the_users_other_interactions():
    inter = _tiny()
    sp = leave_one_out(inter)
    own = inter.to_csr()

    def oracle(users):  # every interacted item scores above the held-out one, which beats the rest
        s = np.zeros((len(users), inter.n_items))
        for r, u in enumerate(users):
            s[r, own[[u]].indices] = 5.0
            s[r, sp.test[u]] = 1.0
        return s

    assert loo_ranks(oracle, sp).tolist() == [0, 0]
    assert loo_metrics(oracle, sp, k=1)["hr@1"] == 1.0


def test_broken_scores_are_named():
    sp = leave_one_out(_tiny())

    def nan_for_b(users):
        s = np.zeros((len(users), 10))
        s[users == 1] = np.nan
        return s

    with pytest.raises(ValueError, match="NaN scores for dense user 1"):
        loo_ranks(nan_for_b, sp)
    with pytest.raises(ValueError, match="shape"):
        loo_ranks(lambda u: np.zeros((len(u), 3)), sp)
    with pytest.raises(ValueError, match="negatives must be an integer array"):
        loo_ranks(lambda u: np.zeros((len(u), 10)), sp, negatives=np.zeros((2, 3)))


def _leak_data():
    inter = make_synthetic_ratings(60, 120, 2400, random_state=5)
    return inter.subset_users(np.flatnonzero(inter.counts() >= 8))


def test_the_papers_sampler_leaks_and_the_clean_one_does_not():
    """Federation off (the server never moves the item embedding; each device trains its own
    copy, here for 15 epochs, as the authors' code with the download switched off): with the
    papers' sampler the held-out item is the one candidate never pushed down, which alone wins;
    the clean sampler treats it like its negatives."""
    sp = leave_one_out(_leak_data(), order="random", random_state=0)
    neg = sample_negatives(sp, 30, random_state=0)
    hr = {}
    for mode in ("paper-compat", "clean"):
        m = PFedRec(8, n_rounds=1, client_update=SampledUpdate(epochs=15), upload_items=False,
                    random_state=0).fit(sp.train, exclude=training_exclusions(sp, mode, neg))
        hr[mode] = loo_metrics(m.user_scores, sp, negatives=neg, k=3)["hr@3"]
    assert hr["paper-compat"] > 0.9
    assert hr["clean"] < 0.5  # chance is 3/31


def _tied():
    # user a: items 1..4 at time 1 and item 9 at time 0 (four tied newest); user b untied
    users = ["a"] * 5 + ["b"] * 3
    items = [4, 2, 3, 1, 9, 5, 6, 7]
    ts = [1, 1, 1, 1, 0, 1, 2, 3]
    return Interactions.from_arrays(users, items, timestamps=ts, item_catalog=np.arange(10))


def test_tied_timestamps_are_broken_at_random_with_a_seed():
    inter = _tied()
    held = [inter.item_ids[leave_one_out(inter, random_state=s).test[0]] for s in range(40)]
    assert set(held) == {1, 2, 3, 4}  # any of the tied newest, never the older item 9
    assert held == [inter.item_ids[leave_one_out(inter, random_state=s).test[0]]
                    for s in range(40)]  # seeded
    for s in range(5):  # the untied user is split by time whatever the seed
        sp = leave_one_out(inter, random_state=s)
        assert inter.item_ids[sp.test[1]] == 7 and inter.item_ids[sp.validation[1]] == 6
        assert inter.item_ids[sp.validation[0]] in {1, 2, 3, 4} - {inter.item_ids[sp.test[0]]}


def test_item_tie_rule_holds_out_the_largest_id_among_equals():
    sp = leave_one_out(_tied(), ties="item", random_state=0)
    ids = _tied().item_ids
    assert ids[sp.test[0]] == 4 and ids[sp.validation[0]] == 3
    with pytest.raises(ValueError, match="ties must be one of"):
        leave_one_out(_tied(), ties="largest")


def test_clean_sampler_differs_from_paper_compat_in_the_negatives_alone():
    """What the ranking benchmark's clean-99 trains with: paper-compat's exclusions plus the 99
    evaluation negatives, and nothing else (so their difference is the leak alone)."""
    inter = make_synthetic_ratings(60, 200, 1500, random_state=2)
    sp = leave_one_out(inter.subset_users(np.flatnonzero(inter.counts() >= 3)),
                       order="random", random_state=0)
    neg = sample_negatives(sp, 9, random_state=1)

    def pairs(x):
        return set(zip(x.user_index().tolist(), x.items.tolist()))
    clean, paper = (pairs(training_exclusions(sp, m, neg)) for m in ("clean", "paper-compat"))
    u, j = np.nonzero(neg >= 0)
    assert clean - paper == set(zip(u.tolist(), neg[u, j].tolist())) and paper <= clean
