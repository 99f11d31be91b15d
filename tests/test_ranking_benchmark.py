"""The ranking benchmark and the cold-start curve run end to end on small slices, and their
JSON is what the report reads."""

import json

import pytest
from conftest import load_script


def test_ranking_benchmark_small_slice(tmp_path):
    mod = load_script("ranking_benchmark")
    out = tmp_path / "ranking.json"
    res = mod.main(["--dataset", "synthetic-small", "--users", "120", "--rounds", "3", "--ncf-epochs", "2",
                    "--recon-rounds", "5", "--recon-clients", "30", "--seeds", "2",
                    "--large", "120", "--workers", "1", "--alpha", "1", "--regularization", "10",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["table"] == res["table"]
    assert {r["model"] for r in doc["selection"]} == {"FedReconImplicitMF"}  # WALS given
    protos = {(r["model"], r["protocol"]) for r in doc["table"]}
    for model in ("popularity", "ImplicitMF", "FedReconImplicitMF"):
        assert {(model, p) for p in ("clean-99", "clean-120", "full")} <= protos
    for model in ("FedMF", "FedNCF", "PFedRec", "NCF"):
        assert {(model, p) for p in ("clean-99", "clean-120", "full", "paper-compat-99")} <= protos
    assert ("PFedRec", "federation-off-paper") in protos
    assert all(r["runs"] == 2 for r in doc["table"])
    leaky = {r["protocol"] for r in doc["table"] if r["leaky"]}
    assert leaky == {"paper-compat-99", "paper-compat-99 unseen", "federation-off-paper"}
    assert ("FedMF", "clean-99 unseen") in protos and ("PFedRec", "full unseen") in protos
    report = load_script("report")
    published = json.loads((report.RESULTS / "ranking_published.json").read_text())
    text = report.render((report.TEMPLATES / "RANKING.md").read_text(),
                         {**report.ranking_values(doc, published),
                          **report.ranking_large_values(doc),
                          **report.cold_start_values(None)})
    assert "clean-120" in text and "{{" not in text
    assert doc["tie_effect"] is None and "no timestamps" in text  # the synthetic data
    with pytest.raises(SystemExit):
        mod.main(["--models", "FedMF,NoSuchModel"])


def test_cold_start_curve_small(tmp_path):
    mod = load_script("cold_start_curve")
    res = mod.main(["--dataset", "synthetic", "--rounds", "3", "--seeds", "1", "--factors", "4",
                    "--json", str(tmp_path / "c.json")])
    models = {r["model"] for r in res["rows"]}
    assert len(models) == 7 and "popularity" in models
    for r in res["rows"]:
        assert r["n"] in mod.SIZES and 0.0 <= r["hr@10"] <= 1.0 and r["rmse"] > 0
