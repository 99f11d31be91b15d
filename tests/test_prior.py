"""The popularity prior re-ranked by a personal model, and the choice of its weight on
validation users."""

import numpy as np
import pandas as pd
import pytest

from fedcf.datasets import Interactions
from fedcf.eval import PRIOR_WEIGHTS, choose_prior_weight, popularity_prior, top_k

COUNTS = np.array([5.0, 0.0, 3.0, 9.0, 1.0, 2.0])


def test_weight_zero_is_the_popularity_policy_for_every_user():
    S = np.random.default_rng(0).normal(size=(4, 6))
    out = popularity_prior(S, COUNTS, 0.0)
    np.testing.assert_array_equal(out, np.tile(np.log1p(COUNTS), (4, 1)))
    assert (top_k(out, 3) == np.argsort(-COUNTS, kind="stable")[:3]).all()


def test_a_users_scale_and_level_do_not_change_their_scores():
    """A heavy user's long vector must not outrank a light user's: each row is standardised."""
    rng = np.random.default_rng(1)
    S = rng.normal(size=(3, 6))
    moved = S * np.array([[1.0], [40.0], [0.01]]) + np.array([[0.0], [-7.0], [100.0]])
    np.testing.assert_allclose(popularity_prior(moved, COUNTS, 0.3),
                               popularity_prior(S, COUNTS, 0.3), atol=1e-12)


def test_the_personal_term_has_unit_sd_and_decides_at_a_large_weight():
    rng = np.random.default_rng(2)
    S = rng.normal(size=(5, 6))
    w = 0.7
    z = (popularity_prior(S, COUNTS, w) - np.log1p(COUNTS)) / w
    np.testing.assert_allclose(z.mean(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(z.std(axis=1), 1.0, atol=1e-12)
    assert (top_k(popularity_prior(S, COUNTS, 1e6), 3) == top_k(S, 3)).all()


def test_a_constant_row_is_popularity():
    S = np.vstack([np.full(6, 3.0), np.arange(6.0)])
    out = popularity_prior(S, COUNTS, 0.5)
    np.testing.assert_array_equal(out[0], np.log1p(COUNTS))
    assert np.isfinite(out).all()


@pytest.mark.parametrize("scores, counts, weight, words", [
    (np.ones(6), COUNTS, 0.1, "scores must be 2-D"),
    (np.array([[0, 1, 2, np.nan, 4, 5.0]]), COUNTS, 0.1, "row 0, item 3"),
    (np.ones((2, 6)), COUNTS[:5], 0.1, "one count per item (6)"),
    (np.ones((2, 6)), np.r_[COUNTS[:5], -1.0], 0.1, "item 5 has -1.0"),
    (np.ones((2, 6)), np.r_[COUNTS[:5], np.inf], 0.1, "item 5 has inf"),
    (np.ones((2, 6)), COUNTS, float("nan"), "weight must be a finite real number >= 0"),
    (np.ones((2, 6)), COUNTS, -0.1, "weight must be a finite real number >= 0"),
    (np.ones((2, 6)), COUNTS, True, "weight must be a finite real number >= 0"),
    (np.ones((2, 6)), COUNTS, "0.2", "weight must be a finite real number >= 0"),
    ([["a"] * 6], COUNTS, 0.1, "scores must be numeric"),
    (np.ones((2, 6)), ["x"] * 6, 0.1, "item_counts must be numeric"),
])
def test_bad_input_is_named(scores, counts, weight, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        popularity_prior(scores, counts, weight)


class GroupOracle:
    """A fitted-model stand-in: users share from their group's half of the catalog; the
    'reconstruction' reads the group from the support items (``informative``) or returns noise."""

    def __init__(self, n_items, informative, seed=0):
        self.item_ids_ = np.arange(n_items)
        self.informative = informative
        self.rng = np.random.default_rng(seed)

    def reconstruct_users(self, inter):
        half = len(self.item_ids_) // 2
        group = np.array([inter.item_ids[inter.items[a:b]].mean() >= half if b > a else 0
                          for a, b in zip(inter.indptr[:-1], inter.indptr[1:])], float)
        return group, np.zeros(inter.n_users)

    def score_all_items(self, group, _c):
        half = len(self.item_ids_) // 2
        if not self.informative:
            return self.rng.normal(size=(len(group), len(self.item_ids_)))
        upper = (self.item_ids_ >= half).astype(float)
        return np.where(group[:, None] > 0, upper, 1.0 - upper)


def grouped_shares(n_users=300, n_items=40, seed=0):
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(n_users):
        lo = 0 if u % 2 == 0 else n_items // 2
        picks = rng.choice(np.arange(lo, lo + n_items // 2), size=rng.integers(1, 7), replace=False)
        users += [u] * len(picks)
        items += picks.tolist()
    inter = Interactions.from_arrays(users, items, item_catalog=np.arange(n_items))
    return inter, np.bincount(items, minlength=n_items).astype(float)


def test_an_informative_model_earns_a_weight_and_noise_does_not():
    val, counts = grouped_shares()
    w, table = choose_prior_weight(GroupOracle(40, True), val, counts, random_state=0)
    assert w > 0 and list(table.weight) == sorted(PRIOR_WEIGHTS)
    assert table.auc.iloc[-1] > table.auc.iloc[0]
    w0, table0 = choose_prior_weight(GroupOracle(40, False), val, counts, random_state=0)
    assert w0 == 0.0
    assert table0.auc.iloc[0] == table0.auc.max()


def test_the_choice_is_seeded_and_reads_only_held_out_shares():
    val, counts = grouped_shares(seed=3)
    a = choose_prior_weight(GroupOracle(40, True), val, counts, random_state=5)
    b = choose_prior_weight(GroupOracle(40, True), val, counts, random_state=5)
    assert a[0] == b[0]
    pd.testing.assert_frame_equal(a[1], b[1])


def test_bad_validation_input_is_named():
    val, counts = grouped_shares()
    model = GroupOracle(40, True)
    with pytest.raises(TypeError, match="validation must be an Interactions"):
        choose_prior_weight(model, val.to_dataframe() if hasattr(val, "to_dataframe") else None,
                            counts)
    with pytest.raises(ValueError, match="not fitted"):
        choose_prior_weight(object(), val, counts)
    with pytest.raises(ValueError, match="weights is empty"):
        choose_prior_weight(model, val, counts, weights=())
    with pytest.raises(ValueError, match="each of weights"):
        choose_prior_weight(model, val, counts, weights=(0.1, -1))
    with pytest.raises(ValueError, match="negatives must be an integer >= 1"):
        choose_prior_weight(model, val, counts, negatives=0)
    with pytest.raises(ValueError, match="one count per item"):
        choose_prior_weight(model, val, counts[:-1])
    single = Interactions.from_arrays(np.arange(10), np.arange(10), item_catalog=np.arange(40))
    with pytest.raises(ValueError, match="two or more interactions"):
        choose_prior_weight(model, single, counts)


def test_the_expected_click_auc_is_the_drawn_one_when_clicks_are_certain_and_its_mean_otherwise():
    from fedcf.eval.ctr import click_auc, expected_click_auc

    rng = np.random.default_rng(4)
    s = rng.integers(0, 5, size=400).astype(float)  # many ties
    y = (rng.random(400) < 0.3).astype(float)
    assert expected_click_auc(s, y) == pytest.approx(click_auc(s, y), abs=1e-12)
    p = 1 / (1 + np.exp(-(s - 2)))
    drawn = [click_auc(s, rng.random(400) < p) for _ in range(2000)]
    assert np.mean(drawn) == pytest.approx(expected_click_auc(s, p), abs=0.005)
    assert np.isnan(expected_click_auc(s, np.zeros(400)))
    with pytest.raises(ValueError, match="one length"):
        expected_click_auc(s, p[:-1])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        expected_click_auc(s, p * 2)
    with pytest.raises(ValueError, match="must be numeric"):
        expected_click_auc(["a"] * 400, p)
