"""Documents are generated from committed JSON, and the main job keeps its digits."""

import json
import re
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_documents_regenerate_exactly_from_committed_json():
    report = load_script("report")
    for path, text in report.documents().items():
        assert path.read_text() == text, f"{path.name} is stale: run python scripts/report.py"


def test_documents_have_no_unfilled_placeholders_and_templates_no_typed_results():
    for name in ("RESULTS", "CTR", "PERFORMANCE", "PRIVACY", "HYPER", "SCALE", "CATALOG", "RANKING"):
        assert "{{" not in (ROOT / "eval" / f"{name}.md").read_text()
    # measured figures come from JSON: a template has no decimal number outside code blocks
    for tpl in (ROOT / "eval" / "templates").glob("*.md"):
        prose = re.sub(r"```.*?```", "", tpl.read_text(), flags=re.S)
        assert not re.findall(r"(?<![\w.=])\d+\.\d+(?![\w.])", prose), tpl.name


def test_render_refuses_a_placeholder_without_value():
    report = load_script("report")
    with pytest.raises(KeyError, match="no value"):
        report.render("a {{missing}} b", {})


def test_a_performance_target_without_a_measurement_says_so():
    """A target whose row is missing from bench.json is listed as not measured, not dropped."""
    report = load_script("report")
    bench = json.loads((ROOT / "eval" / "results" / "bench.json").read_text())
    kept = [r for r in bench if not r["name"].startswith("fold-in all users")]
    lines = report.perf_values(kept)["table_targets"].splitlines()
    assert len(lines) == 2 + len(report.TARGETS) + 2  # + busy.json's and round.json's: none
    missing = [ln for ln in lines if "not measured" in ln]
    assert len(missing) == 4 and sum("fold-in" in ln for ln in missing) == 2
    assert any("default wait" in ln for ln in missing)
    assert any("paper-settings round" in ln for ln in missing)
    busy = json.loads((ROOT / "eval" / "results" / "busy.json").read_text())
    round_doc = json.loads((ROOT / "eval" / "results" / "round.json").read_text())
    lines = report.perf_values(bench, busy, round_doc)["table_targets"].splitlines()
    assert len(lines) == 2 + len(report.TARGETS) + 3 and "not measured" not in "".join(lines)


@pytest.mark.network
def test_main_job_keeps_every_printed_digit(tmp_path):
    """The paper-protocol table of the main job, pinned to the committed JSON at the precision
    it prints (4 decimals)."""
    committed = json.loads((ROOT / "eval" / "results" / "movielens_paper.json").read_text())
    rows = load_script("movielens_benchmark").main(["--json", str(tmp_path / "r.json"),
                                                    "--no-progress", "--no-background-compile"])
    assert [r["name"] for r in rows] == [r["name"] for r in committed]
    for new, old in zip(rows, committed):
        for key in ("rmse", "mae", "accuracy", "rmse_boot_std", "accuracy_boot_std"):
            assert f"{new[key]:.4f}" == f"{old[key]:.4f}", (new["name"], key)


def test_a_comparison_the_prose_states_is_checked_against_the_json(monkeypatch, capsys):
    """HYPER.md says learned starts beat fixed ones; with the results swapped the check fails
    and names the sentence, even when the documents are regenerated."""
    report = load_script("report")
    real = report.load

    def swapped(name):
        doc = real(name)
        if name == "hyper.json":
            bo = doc["best_of_n"]
            bo["fixed"], bo["learned"] = bo["learned"], bo["fixed"]
        return doc

    monkeypatch.setattr(report, "load", swapped)
    assert report.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "HYPER.md: a single learned start beats a single fixed one on average" in out
    monkeypatch.setattr(report, "load", real)
    assert report.main(["--check"]) == 0


def _budget_row(seed, model, val, test, rounds=125):
    return {"dataset": "d", "seed": seed, "model": model, "rounds": rounds, "val_rmse": val,
            "test_rmse": test}


def test_the_budget_selection_reads_validation_only_per_seed_and_once_over_the_seeds():
    """Model "good" has the lower validation RMSE on average but not on seed 1, where "lucky"
    wins validation: per seed takes lucky there, once takes good on both. A test RMSE that
    would change the choice (lucky's are the lowest) must not."""
    report = load_script("report")
    rows = [_budget_row(0, None, 0.5, 0.90, rounds=None) | {"model": "central"},
            _budget_row(1, None, 0.5, 0.90, rounds=None) | {"model": "central"},
            _budget_row(0, "good", 0.80, 0.89), _budget_row(0, "lucky", 0.95, 0.10),
            _budget_row(1, "good", 0.81, 0.88), _budget_row(1, "lucky", 0.79, 0.95)]
    sel = report.budget_selections(rows, "d", 125)
    assert [(r["seed"], r["model"], c) for r, c in sel["per seed"]] == [(0, "good", 0.90),
                                                                       (1, "lucky", 0.90)]
    assert [(r["seed"], r["model"]) for r, _ in sel["once"]] == [(0, "good"), (1, "good")]
    meta = {"date": "2026-01-01", "machine": "m", "python": "3", "numpy": "2", "command": "c"}
    lines = report.budget_values({"meta": meta, "rows": rows})
    text = lines["budget_lines"]
    assert "selected per seed: " in text and "met in 1 of 2 seeds" in text
    assert "selected once: " in text and "met in 2 of 2 seeds" in text


def test_the_figure8_sentences_are_checked_against_the_json(monkeypatch, capsys):
    """HYPER.md says uniform weighting ends ahead of example weighting on the paper's task; with
    the two swapped in the JSON the check fails and names the sentence."""
    report = load_script("report")
    real = report.load

    def swapped(name):
        doc = real(name)
        if name == "learned_weighting.json":
            names = {"uniform": "example", "example": "uniform"}
            for r in doc["rows"]:
                r["mode"] = names.get(r["mode"], r["mode"])
        return doc

    monkeypatch.setattr(report, "load", swapped)
    assert report.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "HYPER.md: uniform weighting ends ahead of example weighting" in out
    assert "HYPER.md: example weighting is ahead of uniform weighting early" in out


def test_a_missing_result_file_fails_the_check(monkeypatch, capsys, tmp_path):
    """Deleting a JSON must not leave its document unchecked (HYPER.md once went unchecked
    with rc 0 when hyper.json was gone)."""
    import shutil

    report = load_script("report")
    copy = tmp_path / "results"
    shutil.copytree(report.RESULTS, copy)
    (copy / "hyper.json").unlink()
    monkeypatch.setattr(report, "RESULTS", copy)
    assert report.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "result files missing from eval/results" in out and "hyper.json" in out
    monkeypatch.setattr(report, "RESULTS", report.ROOT / "eval" / "results")
    assert report.main(["--check"]) == 0


def _check_with(tmp_path, monkeypatch, change):
    """``report.py --check`` against a copy of eval/results/ that ``change`` broke."""
    import shutil

    report = load_script("report")
    results = tmp_path / "results"
    shutil.copytree(ROOT / "eval" / "results", results)
    change(results)
    monkeypatch.setattr(report, "RESULTS", results)
    return report.main(["--check"])


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "eval" / "results").glob("*.json")))
def test_the_check_fails_when_any_result_file_is_missing(name, tmp_path, monkeypatch, capsys):
    """Every committed result is evidence of some document: deleting any one of them fails the
    check (a document can no longer be verified), never passes it silently."""
    assert _check_with(tmp_path, monkeypatch, lambda d: (d / name).unlink()) == 1
    assert name in capsys.readouterr().out


def test_the_check_fails_when_a_figure_or_a_stated_comparison_changes(tmp_path, monkeypatch, capsys):
    """A changed figure makes its document stale; a row that makes the prose false (a server
    optimizer that diverged, while RESULTS.md says all five finish) fails as a false claim even
    after the documents are regenerated."""
    def diverge_yogi(d):
        path = d / "sweep_server-optimizer.json"
        rows = json.loads(path.read_text())
        next(r for r in rows if r["value"] == "yogi")["rmse"] = float("nan")
        path.write_text(json.dumps(rows))
    assert _check_with(tmp_path, monkeypatch, diverge_yogi) == 1
    out = capsys.readouterr().out
    assert "all five server optimizers finish without diverging" in out and "RESULTS.md" in out


def test_a_catalog_target_is_met_only_on_the_interval_across_seeds():
    """A method better in every seed by a hair that varies is within noise unless the interval
    of the paired differences clears zero; worse on average is missed."""
    load_script("report")
    import report_catalog as rc

    def doc(a_vals, b_vals):
        rows = [{"dataset": "d", "catalog": 0.1, "method": m, "seed": s,
                 "out_of_catalog": {"rmse": v}}
                for m, vals in (("A", a_vals), ("B", b_vals)) for s, v in enumerate(vals)]
        return {"rows": rows}
    steady = doc([0.90, 0.91, 0.92, 0.93, 0.94], [0.95, 0.96, 0.97, 0.98, 0.99])
    assert rc._paired(steady, "d", 0.1, "A", "B", "out_of_catalog.rmse")[0] == "met"
    noisy = doc([0.90, 0.99, 0.90, 0.99, 0.90], [0.95, 0.95, 0.95, 0.95, 0.95])
    assert rc._paired(noisy, "d", 0.1, "A", "B", "out_of_catalog.rmse")[0] == "within noise"
    worse = doc([0.96, 0.97, 0.98, 0.99, 1.00], [0.95, 0.96, 0.97, 0.98, 0.99])
    assert rc._paired(worse, "d", 0.1, "A", "B", "out_of_catalog.rmse")[0] == "**missed**"
    assert rc._paired(worse, "d", 0.1, "A", "B", "out_of_catalog.rmse", strict=False)[0] == \
        "**missed**"
    same = doc([0.9] * 5, [0.9] * 5)
    assert rc._paired(same, "d", 0.1, "A", "B", "out_of_catalog.rmse", strict=False)[0] == \
        "identical (no effect)"
