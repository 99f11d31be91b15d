"""scripts/budget_benchmark.py: every candidate at every budget against centralized on one split,
and its settings checked before anything runs."""

import numpy as np
import pytest
from conftest import load_script

from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import Adam

bb = load_script("budget_benchmark")


@pytest.mark.parametrize("argv, match", [
    (["--datasets", "100k,nope"], "['nope'] not among"),
    (["--datasets", ","], "not among"),
    (["--seeds", "0"], "--seeds must be at least 1"),
])
def test_bad_settings_are_named_before_anything_runs(argv, match, capsys, monkeypatch):
    monkeypatch.setattr(bb, "load", lambda name: pytest.fail("loaded data before checking"))
    with pytest.raises(SystemExit):
        bb.main(argv)
    assert match in capsys.readouterr().err


def test_rows_cover_every_candidate_and_budget_on_the_same_split(monkeypatch):
    pop = make_synthetic_ratings(150, 40, 3000, random_state=0)
    monkeypatch.setattr(bb, "BUDGETS", {"tiny": (2, 4)})
    monkeypatch.setattr(bb, "CANDIDATES", {"SGD 1 (default)": {},
                                           "Adam 0.01": {"server_optimizer": Adam(0.01)}})
    monkeypatch.setattr(bb, "FEDRECON", {**bb.FEDRECON, "n_factors": 3, "clients_per_round": 10})
    monkeypatch.setattr(bb, "CENTRAL", {**bb.CENTRAL, "n_factors": 3, "n_epochs": 2})
    rows = bb.rows_for("tiny", pop, seed=1)
    assert [(r["model"], r["rounds"]) for r in rows] == [
        ("centralized + ReconEval", None), ("SGD 1 (default)", 2), ("Adam 0.01", 2),
        ("SGD 1 (default)", 4), ("Adam 0.01", 4)]
    assert all(np.isfinite(r["val_rmse"]) and np.isfinite(r["test_rmse"]) for r in rows)
    # the Adam row is a different model from the default's (the candidate reached the fit)
    assert rows[1]["val_rmse"] != rows[2]["val_rmse"]
