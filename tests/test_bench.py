"""scripts/bench.py --quick produces every row and valid JSON (no timing assertions)."""

import json

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
