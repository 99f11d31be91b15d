"""scripts/bench.py --quick produces every row and valid JSON (no timing assertions)."""

import json

import pytest
from conftest import load_script


def test_bench_quick_produces_every_row(tmp_path):
    bench = load_script("bench")
    out = tmp_path / "bench.json"
    bench.main(["--quick", "--repeats", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    names = [r["name"] for r in rows]
    for prefix in ("kernel compile", "fold-in", "ALS epoch", "SGD epoch", "FedRecon",
                   "round time", "round, 100 clients", "GEMM", "memory copy", "peak memory, fit",
                   "kernels before the first row", "main job's kernels"):
        assert any(n.startswith(prefix) for n in names), prefix
    for r in rows:
        assert {"name", "fedcf_seconds", "peer", "peer_seconds", "speedup"} <= set(r)
        assert r["fedcf_seconds"] is None or r["fedcf_seconds"] > 0
        if r["peer_seconds"] is not None and r["fedcf_seconds"] is not None:
            assert abs(r["speedup"] - r["peer_seconds"] / r["fedcf_seconds"]) < 1e-9
    assert any(r["name"].startswith("fold-in") and r["peer"] for r in rows)
    assert any(r["name"].endswith("vs vectorized NumPy") and r["speedup"] for r in rows)


def test_busy_benchmark_times_a_wait_policy_and_fedcf_asks_for_passive(tmp_path):
    """The busy-machine rows: a policy idle on every core and on one thread, and beside a
    spinning neighbour, in fresh processes (one policy: each costs three fresh processes; the
    names are checked below); and a fresh process that imports fedcf has asked OpenMP for
    passive waiting unless the variable was set."""
    import os
    import subprocess
    import sys

    busy = load_script("busy_benchmark")
    doc = busy.main(["--quick", "--repeats", "1", "--neighbours", "1", "--policies",
                     "spin:1000", "--recons", "als", "--json", str(tmp_path / "busy.json")])
    cores = doc["cores"]
    got = sorted((r["policy"], r["neighbours"], r["threads"]) for r in doc["rows"])
    assert got == sorted({("spin:1000", n, t) for n, t in ((0, cores), (0, 1), (1, cores))})
    assert [busy.check_policy(p) for p in ("default", "PASSIVE", "unset", "ACTIVE")]
    assert "GOMP_SPINCOUNT\"] = \"1000\"" in busy.policy_code("spin:1000")
    assert all(r["seconds_min"] > 0 and r["recon"] == "als" for r in doc["rows"])
    for r in doc["rows"]:  # the figures are the ratios of the medians they name
        same = {(q["neighbours"], q["threads"]): q for q in doc["rows"]
                if q["policy"] == r["policy"]}
        idle = same[(0, cores)]["seconds_median"]
        if "speedup_from_1_thread" in r:
            assert r["speedup_from_1_thread"] == same[(0, 1)]["seconds_median"] / idle
            work = [same[(0, t)]["phases_median"]["work"] for t in (1, cores)]
            assert r["work_speedup_from_1_thread"] == work[0] / work[1]
        assert 0 < r["phases_median"]["work"] < r["seconds_median"]  # the kernel, inside the fit
        assert 0 < r["phases_median"]["server"] < r["seconds_median"]
        if "ratio_to_idle" in r:
            assert r["ratio_to_idle"] == r["seconds_median"] / idle
    assert sum("ratio_to_idle" in r for r in doc["rows"]) == 1
    with pytest.raises(SystemExit):
        busy.main(["--quick", "--policies", "spin:lots"])
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import os; from fedcf import FedReconMF; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "PASSIVE", out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True)
    assert out.stdout.strip() == "ACTIVE"


def test_scale_limits_quick_reports_selection_against_uniform_and_shard_bytes(tmp_path):
    out = load_script("scale_limits").main([
        "--users", "200000", "--clients-per-round", "100", "--rounds", "3",
        "--shard-users", "20000", "--ratings-per-user", "3", "--shards", "2", "8",
        "--reduce-shards",
        "--json", str(tmp_path / "limits.json")])
    sel = out["selection"]
    assert 50 < sel["poisson_secure"]["mean_cohort"] < 150
    assert sel["uniform"]["mean_cohort"] == 100 and sel["poisson_over_uniform"] > 0
    two, eight = out["shard_memory"]["rows"]
    assert abs(two["shard_users"] - 10000) < 64 and abs(eight["shard_users"] - 2500) < 64
    assert eight["held_mib"] < two["held_mib"] / 3 < two["index_over_all_users_mib"]


@pytest.mark.parametrize("argv, message", [
    (["--shards", "0"], "shard counts must be in [1, 64]"),
    (["--reduce-shards", "65"], "shard counts must be in [1, 64]"),
    (["--users", "0"], "--users must be >= 1"),
    (["--ratings-per-user", "nan"], "--ratings-per-user must be >= 1"),
])
def test_scale_limits_names_a_bad_argument(argv, message, capsys):
    with pytest.raises(SystemExit):
        load_script("scale_limits").main(argv)
    assert message in capsys.readouterr().err


def test_round_benchmark_counts_the_papers_round_and_reports_it(tmp_path):
    """The round's flop count by hand for one small user, and a short run whose JSON the
    performance report renders (marginal, roofline, their ratio, the phases)."""
    import numpy as np

    rb = load_script("round_benchmark")
    report = load_script("report_performance")

    class OneUser:  # 7 ratings: support 4 (one step of 4), query 3 (one step of 3)
        indptr = np.array([0, 7])

    K = rb.K
    by_hand = K * (4 * 4 + 2 * 3 + 6 * 3 + 5 * 3 + 3 * 2)  # recon, loss, update, rows, steps
    assert rb.round_flops(OneUser) == pytest.approx(rb.CLIENTS * by_hand)
    doc = rb.main(["--rounds", "2", "4", "--repeats", "1", "--json", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text())["rounds"] == [2, 4]
    assert doc["roofline_seconds"] == pytest.approx(doc["round_flops"] / doc["gemm_flops_per_second"])
    assert doc["ratio_to_roofline"] == pytest.approx(doc["marginal_seconds"] / doc["roofline_seconds"])
    assert set(doc["phases_median"]) == {"work", "reduce", "server", "python", "round"}
    text = report.round_values(doc)["round"]
    for row in ("marginal round", "compute roofline", "marginal ÷ roofline", "phase: whole round"):
        assert f"| {row} |" in text
    assert ("met" if doc["marginal_seconds"] <= 0.6e-3 else "**missed**") in text
    with pytest.raises(SystemExit):
        rb.main(["--rounds", "4", "2"])
