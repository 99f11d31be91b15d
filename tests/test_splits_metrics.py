import numpy as np
import pandas as pd
import pytest

from fedcf.datasets import Interactions
from fedcf.eval import (
    per_user_time_split,
    random_split,
    ranking_metrics,
    rmse,
    rounded_accuracy,
    support_query_split,
    user_split,
)


def user_rows(n, user="u"):
    return pd.DataFrame({"user": [user] * n, "item": range(n), "rating": [3.0] * n,
                         "timestamp": range(n, 0, -1)})  # item 0 is the newest


def test_per_user_time_split_takes_newest_for_test():
    inter = Interactions.from_dataframe(pd.concat([user_rows(10, "a"), user_rows(3, "b")]))
    train, val, test = per_user_time_split(inter, (0.8, 0.1, 0.1))
    assert list(train.counts()) == [8, 3] and list(val.counts()) == [1, 0]
    assert list(test.counts()) == [1, 0]
    assert inter.item_ids[test.items].tolist() == [0]  # the newest
    assert inter.item_ids[val.items].tolist() == [1]
    assert train.nnz + val.nnz + test.nnz == inter.nnz
    with pytest.raises(ValueError, match="timestamps"):
        per_user_time_split(Interactions.from_arrays([1], [2], [3.0]))
    with pytest.raises(ValueError, match="summing to 1"):
        per_user_time_split(inter, (0.5, 0.1))


def test_random_and_user_splits(small_population):
    inter, _ = small_population
    tr, te = random_split(inter, (0.9, 0.1), random_state=0)
    assert te.nnz == round(inter.nnz * 0.1) and tr.nnz + te.nnz == inter.nnz
    tr2, _ = random_split(inter, (0.9, 0.1), random_state=0)
    assert np.array_equal(tr.items, tr2.items)
    a, b, c = user_split(inter, (0.8, 0.1, 0.1), random_state=0)
    assert (a.n_users, b.n_users, c.n_users) == (320, 40, 40)
    ids = np.concatenate([a.user_ids, b.user_ids, c.user_ids])
    assert len(set(ids.tolist())) == inter.n_users
    assert a.item_ids is inter.item_ids


@pytest.mark.parametrize("mode", ["time", "random", "none"])
def test_support_query_split(small_population, mode):
    inter, _ = small_population
    s, q = support_query_split(inter, mode, 0.5, random_state=0)
    if mode == "none":
        assert s is inter and q is inter
        return
    assert s.nnz + q.nnz == inter.nnz
    assert np.all(s.counts() == np.ceil(inter.counts() / 2))
    if mode == "time":  # support strictly older or equal
        for u in range(20):
            ss, qs = s.timestamps[s.indptr[u]:s.indptr[u + 1]], q.timestamps[q.indptr[u]:q.indptr[u + 1]]
            if len(qs):
                assert ss.max() <= qs.min()


def test_rating_metrics_by_hand():
    y = np.array([1, 2, 3, 4, 5.0])
    p = np.array([1.4, 2.6, 3.5, 9.0, 4.49])
    assert rmse(y, p) == pytest.approx(np.sqrt(np.mean((y - p) ** 2)))
    # rounded, clipped: 1, 3, 4, 5, 4 -> hits at 1 and 4 (9 clipped to 5 != 4)
    assert rounded_accuracy(y, p, (1, 5)) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="shape"):
        rmse(y, p[:3])


def test_ranking_metrics_by_hand():
    # 1 user, 5 items; seen item 0 (score highest, must be filtered), relevant items 1 and 4
    seen = Interactions.from_arrays([0], [0], item_catalog=range(5), user_catalog=[0])
    rel = Interactions.from_arrays([0, 0], [1, 4], item_catalog=range(5), user_catalog=[0])
    scores = np.array([[10.0, 5.0, 4.0, 3.0, 1.0]])
    m = ranking_metrics(lambda users: scores[users], seen, rel, k=2)
    # top-2 after filtering: items 1 (hit), 2 (miss)
    assert m["precision"] == 0.5 and m["recall"] == 0.5 and m["hit_rate"] == 1.0
    assert m["ndcg"] == pytest.approx(1.0 / (1 + 1 / np.log2(3)))
    assert m["map"] == pytest.approx(1.0 / 2)
    # AUC over unseen items {1,2,3,4}: positives 1 (rank top), 4 (bottom) vs negatives 2, 3 -> 0.5
    assert m["auc"] == pytest.approx(0.5)
    assert m["n_users"] == 1


def test_top_k_one_implementation_for_rows_and_vectors():
    from fedcf.eval import top_k

    s = np.array([[0.1, 0.9, 0.9, -np.inf, 0.5], [3.0, 2.0, 1.0, 0.0, -1.0]])
    assert top_k(s, 3).tolist() == [[1, 2, 4], [0, 1, 2]]  # equal scores keep index order
    assert top_k(s[0], 2).tolist() == [1, 2]
    assert top_k(s, 0).shape == (2, 0) and top_k(s, 99).shape == (2, 5)


def test_known_user_eval_equals_standard_eval_and_reconstructs_from_history():
    from fedcf import CentralizedMF, FedReconMF
    from fedcf.datasets import make_synthetic_ratings
    from fedcf.eval import known_user_eval, per_user_time_split, standard_eval

    inter = make_synthetic_ratings(120, 40, 2400, n_factors=3, random_state=3)
    train, test = per_user_time_split(inter, (0.8, 0.2))
    central = CentralizedMF(n_factors=3, n_epochs=3, random_state=0).fit(train)
    got = known_user_eval(central, test.to_dataframe())
    assert got["rmse"] == pytest.approx(standard_eval(central, test, n_repeats=2)["rmse"],
                                        rel=1e-9)
    assert got["users"] == test.to_dataframe()["user"].nunique() and got["rows"] == test.nnz
    fed = FedReconMF(n_factors=3, n_rounds=3, clients_per_round=30, random_state=0).fit(train)
    via_history = known_user_eval(fed, test.to_dataframe(), history=train.to_dataframe())
    assert via_history["rmse"] == pytest.approx(standard_eval(fed, test, n_repeats=2)["rmse"],
                                                rel=1e-6)
    # fitted here, it holds its users' fit data: the documented default history=None uses it
    assert known_user_eval(fed, test.to_dataframe())["rmse"] == pytest.approx(
        via_history["rmse"], rel=1e-12)
    fed.interactions_ = None  # as loaded from a file: no user data, so history is needed
    with pytest.raises(ValueError, match="keeps no user data"):
        known_user_eval(fed, test.to_dataframe())
