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
    ("≥ 1.6× from 1 to 2 threads on the paper-scale run (bench.json's run, under the wait "
     "policy of its date)", r"2 threads vs 1$", "speedup", 1.6, None),
    ("≥ 20× faster than the plain per-client NumPy loop", r"vs NumPy loop$", "speedup", 20.0,
     None),
    ("paper-scale FedRecon (500 × 100) ≤ 10 s", r"^FedRecon 500x100 \(\w+ recon\) \[",
     "fedcf_seconds", -10.0, None),
    ("compilation before the main job's first row ≤ 10 s (empty cache)",
     r"^kernels before the first row", "fedcf_seconds", -10.0, None),
]


def _share(r) -> float:
    """The clients' work's share of a fit's seconds (busy_benchmark.py's phases)."""
    return r["phases_median"]["work"] / r["seconds_median"]


def busy_values(doc) -> dict:
    """PERFORMANCE.md's thread and busy-machine rows (scripts/busy_benchmark.py): per wait
    policy and reconstruction, idle on all cores, idle on one thread, beside neighbours."""
    if not doc:
        return {"busy": "Not measured yet: run `python scripts/busy_benchmark.py --json "
                        "eval/results/busy.json`."}
    f, cores = doc["fit"], doc["cores"]
    by = {}
    for r in doc["rows"]:
        key = (r["policy"], r["recon"])
        by.setdefault(key, {})["busy" if r["neighbours"] else r["threads"]] = r
    rows = []
    for (policy, recon), g in by.items():
        idle, one, busy = g[cores], g[1], g["busy"]
        scale, ratio = idle["speedup_from_1_thread"], busy["ratio_to_idle"]
        work = idle.get("work_speedup_from_1_thread")
        rows.append(("fedcf's default (passive)" if policy == "default" else policy.lower(),
                     recon, f"{one['seconds_median']:.2f}", f"{idle['seconds_median']:.2f}",
                     f"{scale:.2f}× ({'met' if scale >= 1.6 else 'missed'})",
                     "" if work is None else f"{work:.2f}× ({_share(one):.0%} of the fit)",
                     f"{busy['seconds_median']:.2f} ({max(busy['runs']):.2f})",
                     f"{ratio:.2f} ({'met' if ratio <= 2.0 else 'missed'})"))
    neighbours = next(r["neighbours"] for r in doc["rows"] if r["neighbours"])
    return {"busy": provenance(doc["meta"], "busy.json") + "\n\n" +
            f"FedReconMF, K = {f['n_factors']}, {f['rounds']} rounds of "
            f"{f['clients_per_round']} clients on {f['users']:,} synthetic users and "
            f"{f['items']:,} items ({f['ratings']:,} ratings), on {cores} cores; median "
            f"seconds of `fit` in a fresh process, kernels cached, over "
            f"{len(doc['rows'][0]['runs'])} runs (max in brackets). Target: 1 → {cores} threads "
            f"≥ 1.6× idle, and beside {neighbours} CPU-bound neighbours ≤ 2× the idle time.\n\n" +
            table(["OpenMP wait", "reconstruction", "idle, 1 thread", f"idle, {cores} threads",
                   "1 → 2 threads (target)", "clients' work: 1 → 2 threads (its share of the 1-thread fit)",
                   f"beside {neighbours} neighbours",
                   "busy / idle (target)"], rows)}


def round_values(doc) -> dict:
    """PERFORMANCE.md's plain round against its roofline (scripts/round_benchmark.py)."""
    if not doc:
        return {"round": "Not measured yet: run `python scripts/round_benchmark.py --json "
                         "eval/results/round.json`."}
    ph, r1, r2 = doc["phases_median"], *doc["rounds"]
    us = lambda s: f"{s * 1e6:,.0f} µs"  # noqa: E731
    met = doc["marginal_seconds"] <= doc["target_seconds"]
    rows = [("marginal round", us(doc["marginal_seconds"]),
             f"(fit of {r2} rounds − fit of {r1}) / {r2 - r1}, minimum of "
             f"{len(doc['fit_seconds'][str(r1)])} alternated fits each; target "
             f"≤ {us(doc['target_seconds'])}: {'met' if met else '**missed**'}"),
            ("compute roofline", us(doc["roofline_seconds"]),
             f"{doc['round_flops'] / 1e6:.1f} MFLOP per round at "
             f"{doc['gemm_flops_per_second'] / 1e9:.0f} GFLOP/s (float64 GEMM, "
             f"{doc['threads']} threads, same run); working set "
             f"{doc['working_set_bytes'] / 2**20:.1f} MiB"),
            ("marginal ÷ roofline", f"{doc['ratio_to_roofline']:.0f}×", "")]
    rows += [(f"phase: {name}", us(ph[key]), "median over the rounds of the longer fit")
             for key, name in (("work", "clients' work (the client kernel)"),
                               ("reduce", "reduction (finite check, sums per item)"),
                               ("server", "server step"), ("python", "the rest (Python)"),
                               ("round", "whole round"))]
    return {"round": provenance(doc["meta"], "round.json") + "\n\n" +
            f"FedReconMF at the paper's settings on MovieLens-100K: {doc['clients']} clients "
            f"per round, K = {doc['K']}, {doc['threads']} threads, kernels warm.\n\n" +
            table(["row", "time", "note"], rows)}


def busy_targets(doc) -> list:
    """The thread targets at fedcf's default wait, from busy_benchmark.py's run."""
    rows = [r for r in (doc or {}).get("rows", []) if r["policy"] == "default"]
    if not rows:
        return [("threads at fedcf's default wait", "**not measured**",
                 "no default-policy rows in busy.json")]
    out = []
    for text, key, ok in (("≥ 1.6× from 1 to 2 threads idle, fedcf's default wait "
                           "(busy_benchmark.py)", "speedup_from_1_thread", lambda x: x >= 1.6),
                          ("≤ 2× the idle time beside two CPU-bound neighbours, fedcf's default "
                           "wait (busy_benchmark.py)", "ratio_to_idle", lambda x: x <= 2.0)):
        got = [r for r in rows if key in r]
        out.append((text, "met" if all(ok(r[key]) for r in got) else "**missed**",
                    "; ".join(f"{r['recon']} reconstruction: {r[key]:.2f}×" for r in got)))
    return out


def round_targets(doc) -> list:
    """The plain round's target, from round_benchmark.py's run."""
    if not doc:
        return [("ML-100K paper-settings round ≤ 0.6 ms marginal (round_benchmark.py)",
                 "**not measured**", "no eval/results/round.json")]
    got = doc["marginal_seconds"]
    return [(f"ML-100K paper-settings round ≤ {doc['target_seconds'] * 1e3:.1f} ms marginal "
             "(round_benchmark.py)", "met" if got <= doc["target_seconds"] else "**missed**",
             f"{got * 1e3:.2f} ms; roofline {doc['roofline_seconds'] * 1e3:.3f} ms, same run")]


def perf_values(bench, busy=None, round_doc=None) -> dict:
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
            "table_targets": table(["target", "result", "measured"],
                                   targets + busy_targets(busy) + round_targets(round_doc))}
