"""scripts/hypergradient_benchmark.py: its settings are checked before any data is loaded, and
the seeds section repeats the random starts over seeds."""

import json

import pytest
from conftest import load_script

hb = load_script("hypergradient_benchmark")


@pytest.mark.parametrize("argv, match", [
    (["--sections", "trials,nope"], "['nope'] not among"),
    (["--sections", "seeds", "--seeds", "1"], "--seeds must be at least 2"),
    (["--trials", "0"], "--trials must be at least 1"),
])
def test_bad_settings_are_named_before_anything_runs(argv, match, capsys, monkeypatch):
    monkeypatch.setattr(hb, "load", lambda *a: pytest.fail("loaded data before checking"))
    with pytest.raises(SystemExit):
        hb.main(argv)
    assert match in capsys.readouterr().err


def test_the_seeds_section_repeats_the_starts_on_new_splits(tmp_path, monkeypatch):
    from fedcf.datasets import make_synthetic_ratings

    loaded = []

    def small(name, seed):
        loaded.append(seed)
        return make_synthetic_ratings(120, 60, 2400, random_state=seed)
    monkeypatch.setattr(hb, "load", small)
    out = tmp_path / "h.json"
    hb.main(["--sections", "seeds", "--seeds", "2", "--seed", "3", "--trials", "2",
             "--rounds", "3", "--json", str(out)])
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert {r["section"] for r in rows} == {"seeds"} and doc["meta"]["seeds"] == 2
    assert sorted({r["seed"] for r in rows}) == [3, 4] and {3, 4} <= set(loaded)
    assert len(rows) == 2 * 2 * len(hb.MODES)
    starts = {(r["seed"], r["trial"]): r["lr0"] for r in rows}
    assert starts[(3, 0)] != starts[(4, 0)]  # each seed draws its own starts
    for (seed, trial), lr in starts.items():  # every mode of a start starts from the same value
        assert all(r["lr0"] == lr for r in rows if (r["seed"], r["trial"]) == (seed, trial))
    assert doc["best_of_n"] == {}


def test_the_expected_best_of_n_is_exact():
    import itertools

    import numpy as np

    load_script("report")  # puts scripts/ on the path of the report's modules
    import report_hyper as rh
    x = [0.93, 0.91, 0.97, 0.91, 1.2]
    for n in (1, 2, 3):
        brute = np.mean([min(c) for c in itertools.product(x, repeat=n)])
        assert rh.expected_best(x, n) == pytest.approx(brute, abs=1e-12)
    assert rh.expected_best([0.9, float("inf")], 3) == float("inf")  # all three may diverge
    assert rh.expected_best([0.9, float("inf")], 1) == float("inf")
    assert rh.expected_best([0.9], 4) == pytest.approx(0.9)
