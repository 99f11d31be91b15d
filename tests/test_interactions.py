import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from fedcf.datasets import DataValidationError, Interactions


def test_from_dataframe_groups_by_user_in_time_order(tiny_df):
    inter = Interactions.from_dataframe(tiny_df)
    assert (inter.n_users, inter.n_items, inter.nnz) == (3, 3, 6)
    assert list(inter.user_ids) == ["a", "b", "c"]
    assert list(inter.item_ids) == [10, 20, 30]
    # user "b": timestamps 2 (item 10), 2 (item 30), 1 (item 20) -> time order, tie broken by item
    b = slice(inter.indptr[1], inter.indptr[2])
    assert list(inter.item_ids[inter.items[b]]) == [20, 10, 30]
    assert list(inter.values[b]) == [2.0, 5.0, 1.0]
    back = inter.to_dataframe().sort_values(["user", "item"]).reset_index(drop=True)
    want = tiny_df.sort_values(["user", "item"]).reset_index(drop=True)
    assert back["rating"].tolist() == want["rating"].tolist()


def test_hashable_ids_of_any_kind():
    big = 2**62 + 7
    df = pd.DataFrame({"user": [big, big, 3], "item": ["x", ("t", 1), "x"], "rating": [1, 2, 3]})
    inter = Interactions.from_dataframe(df)
    assert set(inter.user_ids.tolist()) == {big, 3}
    assert inter.n_items == 2


@pytest.mark.parametrize("col", ["user", "item", "rating", "timestamp"])
def test_missing_column_is_named(tiny_df, col):
    with pytest.raises(DataValidationError, match=f"column '{col}' not found"):
        Interactions.from_dataframe(tiny_df.drop(columns=col),
                                    timestamp_col="timestamp")


def test_nan_and_inf_ratings_are_named(tiny_df):
    bad = tiny_df.copy()
    bad.loc[4, "rating"] = np.nan
    with pytest.raises(DataValidationError, match=r"'rating'.*non-finite.*nan.*row 4"):
        Interactions.from_dataframe(bad)
    bad.loc[4, "rating"] = np.inf
    with pytest.raises(DataValidationError, match=r"non-finite.*inf.*row 4"):
        Interactions.from_dataframe(bad)


def test_non_numeric_rating_is_named(tiny_df):
    bad = tiny_df.astype({"rating": object})
    bad.loc[2, "rating"] = "five"
    with pytest.raises(DataValidationError, match=r"'rating' is not numeric: row 2 has rating 'five'"):
        Interactions.from_dataframe(bad)


def test_rating_outside_scale(tiny_df):
    with pytest.raises(DataValidationError, match=r"value 5.0 at row 2, outside rating_scale \(1, 4\)"):
        Interactions.from_dataframe(tiny_df, rating_scale=(1, 4))


def test_missing_id(tiny_df):
    bad = tiny_df.astype({"item": object})
    bad.loc[3, "item"] = None
    with pytest.raises(DataValidationError, match=r"'item' has a missing id at row 3"):
        Interactions.from_dataframe(bad)


def test_duplicates_error_last_mean(tiny_df):
    dup = pd.concat([tiny_df, pd.DataFrame({"user": ["a"], "item": [10], "rating": [2.0],
                                            "timestamp": [7]})], ignore_index=True)
    with pytest.raises(DataValidationError,
                       match=r"duplicate \(user, item\) pair \('a', 10\) at rows 0 and 6"):
        Interactions.from_dataframe(dup)
    last = Interactions.from_dataframe(dup, duplicates="last").to_dataframe()
    assert last.query("user == 'a' and item == 10")["rating"].tolist() == [2.0]
    mean = Interactions.from_dataframe(dup, duplicates="mean").to_dataframe()
    row = mean.query("user == 'a' and item == 10")
    assert row["rating"].tolist() == [3.0] and row["timestamp"].tolist() == [7.0]
    assert len(mean) == len(tiny_df)


def test_empty_and_mismatched():
    with pytest.raises(DataValidationError, match="empty"):
        Interactions.from_dataframe(pd.DataFrame({"user": [], "item": [], "rating": []}))
    with pytest.raises(DataValidationError, match="user has 3 entries, item has 2 entries"):
        Interactions.from_arrays([1, 2, 3], [1, 2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="duplicates must be"):
        Interactions.from_arrays([1], [1], duplicates="first")


def test_catalog_refuses_strangers():
    with pytest.raises(DataValidationError,
                       match=r"'item' has id 99 at row 1 that is not in the given catalog"):
        Interactions.from_arrays([1, 1], [5, 99], item_catalog=[5, 6, 7])
    inter = Interactions.from_arrays([1, 1], [5, 7], item_catalog=[5, 6, 7])
    assert inter.n_items == 3 and list(inter.items) == [0, 2]


def test_from_sparse_and_back():
    m = sp.random(20, 15, density=0.3, random_state=0, format="csr")
    m.data = m.data * 4 + 1
    inter = Interactions.from_sparse(m)
    np.testing.assert_allclose(inter.to_csr().toarray(), m.toarray())
    with pytest.raises(TypeError, match="scipy sparse"):
        Interactions.from_sparse(np.eye(3))


def test_take_and_subset_users(tiny_df):
    inter = Interactions.from_dataframe(tiny_df)
    part = inter.take(inter.values >= 4)
    assert part.n_users == 3 and part.nnz == 3 and list(part.counts()) == [1, 1, 1]
    sub = inter.subset_users(np.array([2, 0]))
    assert list(sub.user_ids) == ["c", "a"] and list(sub.counts()) == [1, 2]
    assert sub.item_ids is inter.item_ids
    empty = inter.take(np.zeros(inter.nnz, bool))
    assert empty.nnz == 0 and empty.n_users == 3
