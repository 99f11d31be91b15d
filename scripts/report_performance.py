"""eval/PERFORMANCE.md: speed against peers measured in the same run."""

from __future__ import annotations

import re

from report_common import ms, pct, provenance, table

TARGETS = [  # (text, row-name pattern, row field, bound: field >= low, or <= high if negative,
    #           peer pattern or None)
    ("fold-in ≥ 5× faster per user than implicit's batched `recalculate_user`",
     r"^fold-in all users", "speedup", 5.0, None),
    ("fold-in ≥ 30 % of the measured GEMM peak", r"^fold-in all users", "gemm_fraction", 0.3,
     None),
    ("ALS epoch no slower than implicit's CG solver (fedcf's CG solve)", r"^ALS epoch, CG",
     "speedup", 1.0, r"\(CG\)"),
    ("SGD epoch on 1M ratings no slower than cornac's (seeded: one thread, reproducible, as "
     "fedcf)", r"^SGD epoch.*synthetic-1m", "speedup", 1.0, r"seeded"),
    ("≥ 1.6× from 1 to 2 threads on the paper-scale run", r"2 threads vs 1$", "speedup", 1.6,
     None),
    ("≥ 20× faster than the plain per-client NumPy loop", r"vs NumPy loop$", "speedup", 20.0,
     None),
    ("paper-scale FedRecon (500 × 100) ≤ 10 s", r"^FedRecon 500x100 \(\w+ recon\) \[",
     "fedcf_seconds", -10.0, None),
    ("compilation before the main job's first row ≤ 10 s (empty cache)",
     r"^kernels before the first row", "fedcf_seconds", -10.0, None),
]


def busy_values(doc) -> dict:
    """PERFORMANCE.md's busy-machine rows (scripts/busy_benchmark.py)."""
    if not doc:
        return {"busy": "Not measured yet: run `python scripts/busy_benchmark.py --json "
                        "eval/results/busy.json`."}
    f = doc["fit"]
    rows = [(r["policy"].lower(), r["neighbours"], f"{r['seconds_min']:.1f}",
             f"{r['seconds_median']:.1f}", f"{max(r['runs']):.1f}",
             f"{r['ratio_to_idle']:.2f}" if "ratio_to_idle" in r else "")
            for r in doc["rows"]]
    return {"busy": provenance(doc["meta"], "busy.json") + "\n\n" +
            f"FedReconMF, K = {f['n_factors']}, {f['rounds']} rounds of "
            f"{f['clients_per_round']} clients on {f['users']:,} synthetic users and "
            f"{f['items']:,} items ({f['ratings']:,} ratings), on {doc['cores']} cores; "
            "seconds of `fit` in a fresh process, kernels cached.\n\n" +
            table(["OpenMP wait", "CPU-bound neighbours", "seconds (min)", "seconds (median)",
                   "seconds (max)", "median / idle"], rows)}


def perf_values(bench) -> dict:
    def note(r):
        return (r.get("note") or "").replace("|", "/")

    main = [r for r in bench if r.get("peer_seconds") is not None or r["name"].startswith(
        ("FedRecon", "kernel"))]
    scaling = [r for r in bench if r["name"].startswith("round")]
    ceiling = [r for r in bench if r["name"].startswith(("GEMM", "memory", "peak memory"))]
    targets = []
    for text, pattern, field, bound, peer in TARGETS:
        rows = [r for r in bench if re.search(pattern, r["name"]) and r.get(field) is not None
                and (peer is None or re.search(peer, r.get("peer") or ""))]
        if not rows:
            targets.append((text, "**not measured**", f"no row matches `{pattern}` in bench.json"))
            continue
        met = all(r[field] >= bound if bound >= 0 else r[field] <= -bound for r in rows)
        shown = {"speedup": lambda x: f"{x:.3f}×", "gemm_fraction": lambda x: pct(x, 1),
                 "fedcf_seconds": lambda x: f"{x:.2f} s"}[field]
        targets.append((text, "met" if met else "**missed**",
                        "; ".join(f"{r['name']}: {shown(r[field])}" for r in rows)))
    return {"bench_provenance": provenance(bench[0]["meta"], "bench.json"),
            "table_main": table(["row", "fedcf", "peer", "speedup", "peer is", "note"],
                                [(r["name"], ms(r["fedcf_seconds"]), ms(r["peer_seconds"]),
                                  f"{r['speedup']:.3g}×" if r.get("speedup") else "",
                                  r.get("peer") or "", note(r)) for r in main]),
            "table_scaling": table(["row", "time (clients + aggregation)", "server step", "note"],
                                   [(r["name"], ms(r["fedcf_seconds"]),
                                     ms(r.get("server_seconds")), note(r)) for r in scaling]),
            "table_ceiling": table(["row", "time", "note"],
                                   [(r["name"], ms(r["fedcf_seconds"]), note(r))
                                    for r in ceiling]),
            "table_targets": table(["target", "result", "measured"], targets)}
