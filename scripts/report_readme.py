"""The generated blocks of README.md and of the site's pages (docs/)."""

from __future__ import annotations

import functools

import numpy as np
from report_common import ms, pct, provenance, rmse_acc, signed_pct, table
from report_results import cold_sentence, random_table


def tune_block(tuned) -> str:
    grid = [r for r in tuned if r["protocol"] == "paper-recon-val"]
    best = next(r for r in grid if r.get("selected"))
    chosen = next(r for r in tuned if "tuned on validation" in r["name"])
    n_div = sum(not np.isfinite(r["rmse"]) for r in grid)
    return (provenance(tuned[0]["meta"], "movielens_tuned.json") + "\n\n" +
            f"Selected from {len(grid)} settings ({n_div} diverged): " +
            ", ".join(f"{k} = {v}" for k, v in best["params"].items()) +
            f" (validation ReconEval RMSE {best['rmse']:.4f}); on the test users "
            f"{rmse_acc(chosen)}. The whole grid is in the MovieLens results (`eval/RESULTS.md`).")


def grid_block(doc) -> str:
    """The private GridSearchCV over phase parameters (scripts/grid_search.py)."""
    names = list(dict.fromkeys(n for r in doc["rows"] for n in r["params"]))

    def cell(r, n):
        if n not in r["params"]:
            return "fixed"
        return f"{r['params'][n]:g}"
    rows = sorted(doc["rows"], key=lambda r: tuple(r["params"].get(n, -1) for n in names))
    s = doc["settings"]
    data = {"100k": "MovieLens-100K"}.get(doc["dataset"], doc["dataset"])
    return (provenance(doc["meta"], "grid_search.json") + "\n\n" +
            f"{data}, {doc['n_users']} users; K = {s['n_factors']}, {s['rounds']} "
            f"rounds × {s['clients_per_round']} clients (Poisson-sampled), DP noise multiplier "
            f"{doc['noise_multiplier']}; ε = {doc['epsilon']:.2f} at δ = {doc['delta']:g} for the "
            f"refit on all {doc['n_users']} users (a fold's run trains on fewer users, so its ε is "
            "larger, and the search as a whole, which composes all its runs, is not accounted); "
            f"{s['splits']} held-out user draws per setting; the whole search took "
            f"{doc['search_seconds']:.0f} s.\n\n" + table(
                [*(f"`{n}`" for n in names), "ReconEval RMSE (± SD over draws)", "selected"],
                [(*(cell(r, n) for n in names), f"{r['rmse']:.4f} ± {r['rmse_sd']:.4f}",
                  "✓" if r["params"] == doc["best"] else "") for r in rows]))


def cli_block(session) -> str:
    lines = [f"Recorded {session['meta']['date'][:10]} on "
             f"{session['meta']['machine'].split(',')[0]} by `{session['meta']['command']}` "
             "(`eval/results/cli_session.json`).", "", "```console"]
    for step in session["steps"]:
        lines += [f"$ {step['command']}", *step["output"].splitlines()]
    return "\n".join([*lines, "```"])


def readme_blocks(paper, cold, random_rows, impl, ctr, bench) -> dict:
    by = {r["name"]: r for r in paper}
    keep = ["centralized + StandardEval", "centralized + ReconEval", "FedAvg + ReconEval",
            "FedRecon (ALS reconstruction, biases)", "FedRecon (paper config, SGD reconstruction)"]
    blocks = {
        "timing": (f"The main job took {paper[0]['meta']['total_seconds']:.0f} s with warm Numba "
                   f"caches and {cold_sentence(paper, cold)}, {paper[0]['meta']['date'][:10]}, "
                   f"{paper[0]['meta']['machine'].split(',')[0]}, "
                   f"{paper[0]['meta']['machine'].split(',')[1].strip()}." + "".join(
                       f" Peak memory {r['peak_rss_mib']:,.0f} MiB (scripts/bench.py, "
                       f"{r['meta']['date'][:10]})." for r in bench
                       if r["name"].startswith("peak memory, main job"))),
        "movielens": provenance(paper[0]["meta"], "movielens_paper.json") + "\n\n" + table(
            ["row (unseen users unless noted)", "RMSE", "accuracy"],
            [(n, f"{by[n]['rmse']:.3f}", pct(by[n]["accuracy"])) for n in keep]),
        "centralized": provenance(random_rows[0]["meta"], "movielens_random.json") + "\n\n" +
        random_table(random_rows)}
    pick = [r for r in bench if r.get("speedup") is not None]
    blocks["speed"] = provenance(bench[0]["meta"], "bench.json") + "\n\n" + table(
        ["row", "fedcf", "peer", "speedup"],
        [(r["name"], ms(r["fedcf_seconds"]), r.get("peer") or "", f"{r['speedup']:.3g}×")
         for r in pick])
    ib = {(r["name"], r["protocol"]): r for r in impl}
    blocks["ctr"] = "\n".join([
        provenance(impl[0]["meta"], "implicit.json"), "",
        *(f"- {n} ({p} users): precision@10 {r['precision']:.3f}" for (n, p), r in ib.items()),
        "", provenance(ctr["meta"], "ctr.json"), "",
        ctr_headline(ctr)])
    return blocks


def suite_block(rows) -> str:
    """The sentence on how long the test command takes (scripts/suite_time.py): wall time,
    which with an empty Numba cache includes the session's warm-up compiling every kernel."""
    if not rows:
        return ("Not measured yet: run `python scripts/suite_time.py --json "
                "eval/results/suite.json`.")
    by = {r["hogs"]: r for r in rows}
    idle, busy = by.get(0), next((r for h, r in sorted(by.items()) if h), None)
    parts = [f"{idle['wall_seconds'] / 60:.1f} minutes on two idle cores"] if idle else []
    if busy:
        parts.append(f"{busy['wall_seconds'] / 60:.1f} minutes beside {busy['hogs']} "
                     "CPU-bound processes")
    first = rows[0]
    own = first.get("pytest_seconds")
    cache = ("starting from an empty Numba cache, as a fresh clone does (the session's warm-up "
             "first compiles every code path's kernels, on both cores, and is included" +
             ("" if own is None else f"; the tests themselves took {own:.0f} s by pytest's "
              "clock") + ")" if first.get("cold") else "with the kernels in Numba's cache")
    ref = first.get("reference_fit_seconds")
    speed = "" if ref is None else (
        f"; the machine's reference fit (`busy_benchmark.py`'s idle ALS fit, "
        f"{first['meta']['settings']['reference_rounds']} rounds) took {ref:.2f} s in the same run")
    return (f"The test command took {' and '.join(parts)} {cache} "
            f"({first['passed']:,} passed; {first['compiled'].removeprefix('fedcf: ')}{speed}), "
            f"measured {first['meta']['date'][:10]} by `scripts/suite_time.py` "
            "(`eval/results/suite.json`).")


def install_block(doc) -> str:
    """The sentence on what the two commands install (scripts/install_footprint.py)."""
    base, test = doc["rows"]
    top = ", ".join(f"{n} {m:,.0f} MiB" for n, m in test["largest"][:3])
    return (f"The first command installs {base['distributions']} packages besides fedcf "
            f"({base['mib']:,.0f} MiB on disk); the test extras bring the environment to "
            f"{test['distributions']} packages and {test['mib']:,.0f} MiB (largest: {top}), "
            f"measured {doc['meta']['date'][:10]}, Python {doc['meta']['python']}, "
            f"{doc['meta']['machine'].split(',')[0]} (scripts/install_footprint.py).")


def deploy_lines(dep) -> list[str]:
    """A real deployment's bullet points (scripts/flower_deploy.py)."""
    d, dl = dep["recon_eval"], dep["local_recon_eval"]
    where = ("each SuperNode holding its own users' ratings file, the run config naming no "
             "dataset" if dep.get("device_data") else "each SuperNode keeping a partition")
    lines = [f"- SuperLink and {dep['nodes']} SuperNodes as separate processes on "
             f"{dep['dataset']} ({where}), {len(dep['round_seconds'])} rounds via `flwr run`: "
             f"item factors {'identical' if dep['identical_item_factors'] else 'different'} "
             f"to the in-process fit; ReconEval RMSE {d['rmse']:.4f} (in process "
             f"{dl['rmse']:.4f}); rounds took "
             f"{min(dep['round_seconds']):.1f}–{max(dep['round_seconds']):.1f} s; "
             f"{len(dep['listening'])} listening sockets, all on 127.0.0.1: "
             f"{all(a.startswith('127.0.0.1:') for a in dep['listening'])}; processes "
             f"left after shutdown: {len(dep['left_running'])}; whole deployment "
             f"{dep['deploy_seconds']:.0f} s."]
    if dep.get("device_data"):
        msgs = np.mean(dep["messages_per_round"])
        down = np.mean(dep["bytes_down_per_round"]) / msgs / 1024
        up = np.mean(dep["bytes_up_per_round"]) / msgs / 1024
        users = (dep["n_train_users"] + dep["n_eval_users"]) / dep["nodes"]
        lines.append(f"- What a node paid per training round (means over the rounds; a node "
                     f"here holds about {users:,.0f} users): {down:,.0f} KiB down (the global "
                     f"model) and {up:,.0f} KiB up, one message each way.")
    cost = (dep.get("device_cost") or {}).get("train")
    if cost and cost.get("task_seconds") is not None:
        lines.append(warm_line(cost))
    elif cost:
        lines.append(
            f"- What a training message cost a node, as the node logged it on its own machine "
            f"(medians over {cost['messages']} messages): {cost['startup_seconds']:.2f} s of "
            f"start-up (a fresh `flwr-clientapp` process under Flower's subprocess isolation: "
            f"Python, NumPy, fedcf and Numba's cached kernels), then "
            f"{cost['handler_seconds'] * 1e3:,.0f} ms to load its ratings and run its users; "
            f"peak memory {cost['peak_rss_mib']:,.0f} MiB. The same users' work in a warm "
            f"process (no isolation, measured in the same run): "
            f"{cost['warm_process_seconds'] * 1e3:,.1f} ms.")
    if "tls_and_node_auth" in dep:
        lines.append(f"- TLS and SuperNode authentication: "
                     f"{'on' if dep['tls_and_node_auth'] else 'off'}; SuperNodes started "
                     f"with unregistered keys: {dep['intruders']} (turned away by the "
                     f"SuperLink: {dep.get('intruders_turned_away', 'not recorded')}); "
                     f"nodes the server saw: {dep['n_nodes']}.")
    return lines


def warm_line(cost) -> str:
    """A training message's cost on a node answered by its warm process (fedcf.flower.warm):
    its CPU against the CPU of the same handler work in a plain process (results written
    before that was measured compare against the handler's wall time, and say so)."""
    cpu = cost.get("warm_process_cpu_seconds")
    ratio = cost["task_cpu_seconds"] / (cpu or cost["warm_process_seconds"])
    same = (f"{cpu * 1e3:,.1f} ms of CPU ({cost['warm_process_seconds'] * 1e3:,.1f} ms wall), so "
            f"a message's CPU is {ratio:,.1f}× the handler's" if cpu else
            f"{cost['warm_process_seconds'] * 1e3:,.1f} ms, so a message's CPU is {ratio:,.0f}× "
            f"that")
    return (f"- What a training message cost a node answered by one warm process "
            f"(`python -m fedcf.flower.warm`, the SuperNode started with `--isolation "
            f"process`), as the node logged it (medians over {cost['messages']} messages): "
            f"{cost['handler_seconds'] * 1e3:,.1f} ms in fedcf's handler; the whole task "
            f"(pull the message and its arrays through the SuperNode's runtime API, run, push "
            f"the reply: {cost['task_requests']:,.0f} HTTP requests, one per object and step, "
            f"kept-alive, from the task's own thread) "
            f"{cost['task_cpu_seconds'] * 1e3:,.0f} ms of CPU and "
            f"{cost['task_seconds'] * 1e3:,.0f} ms of wall time (waiting for the arrays to "
            f"reach the SuperNode included); peak memory {cost['peak_rss_mib']:,.0f} MiB, one "
            f"process for the whole run. The same users' train handler with no Flower around "
            f"it, in the script's process: {same} (target ≤ 10×: "
            f"{'met' if ratio <= 10 else 'missed'}).")


def _refused(sim) -> str:
    """The simulation's refused replies, the evaluation ones explained by the devices' rule."""
    ev = [r for r in sim["refusals"] if r["stage"].startswith("recon eval")]
    text = f"{len(sim['refusals'])} replies refused"
    if ev and "device_min_cohort" in sim:
        text += (f" ({len(ev)} of them ReconEval replies of nodes holding fewer than "
                 f"{sim['device_min_cohort']} evaluation users, whose devices do not report "
                 "sums over fewer than their min-cohort; the in-process figure leaves out the "
                 "same users)")
    return text


def flower_block(sim, dep, devices=None, warm=None) -> str:
    """"Deploying with Flower": the simulation on ML-100K and the real deployments."""
    f, loc = sim["flower_recon_eval"], sim["local_recon_eval"]
    same = "identical bit for bit" if sim["identical_item_factors"] and \
        sim["identical_item_biases"] else f"max |difference| {sim['max_abs_difference']:.3g}"
    vb = sim["value_bytes"]
    lines = [provenance(sim["meta"], "flower.json"), "",
             f"- Simulation engine, {sim['partitions']} nodes holding {sim['dataset']} partitions "
             f"({sim['n_train_users']} training users, {sim['n_eval_users']} held out), "
             f"{sim['params']['n_rounds']} rounds of {sim['params']['clients_per_round']} users: "
             f"item factors {same} with FedReconMF in process; federated ReconEval RMSE "
             f"{f['rmse']:.4f} vs {loc['rmse']:.4f} in process (accuracy {pct(f['accuracy'])} vs "
             f"{pct(loc['accuracy'])}); {_refused(sim)}; message fields "
             f"outside the wire format: {len(sim['unexpected_fields'])}.",
             f"- Bytes per message through Flower: down {sim['bytes_down_per_message']:,.0f} "
             f"(fedcf's accounting: {sim['values_down_per_client_round']:,.0f} values × {vb} B = "
             f"{sim['values_down_per_client_round'] * vb:,.0f} B per client), up "
             f"{sim['bytes_up_per_message']:,.0f} for {sim['clients_per_message']:.2f} users on "
             f"average ({sim['values_up_per_client_round']:,.0f} values × {vb} B = "
             f"{sim['values_up_per_client_round'] * vb:,.0f} B per user); per user asked: "
             f"{sim['bytes_down_per_client_round']:,.0f} B down, "
             f"{sim['bytes_up_per_client_round']:,.0f} B up.",
             f"- Simulation wall time {sim['flower_seconds']:.0f} s (the in-process fit: "
             f"{sim['local_seconds']:.1f} s)."]
    for name, d in (("flower_deploy.json", dep), ("flower_deploy_devices.json", devices),
                    ("flower_deploy_warm.json", warm)):
        if d is not None:
            lines += ["", provenance(d["meta"], name), "", *deploy_lines(d)]
    return "\n".join(lines)




def reproduce_block(results_dir) -> str:
    """Every committed result: the command that wrote it and when (from its own ``meta``);
    files of published figures, typed from their sources, say so."""
    import json
    from pathlib import Path

    rows = []
    for path in sorted(Path(results_dir).glob("*.json")):
        doc = json.loads(path.read_text())
        first = doc[0] if isinstance(doc, list) and doc else doc
        meta = first.get("meta") if isinstance(first, dict) else None
        if meta and meta.get("command"):
            rows.append((f"`{path.name}`", f"`python {meta['command']}`", meta["date"][:10]))
        else:
            rows.append((f"`{path.name}`", "published figures, typed from their sources "
                         "(not measured here)", ""))
    return table(["result", "written by", "measured"], rows)


@functools.lru_cache(maxsize=4)
def layout_block(root) -> str:
    """Every module of the package, the data and evaluation packages and the scripts, by folder,
    with the first sentence of its docstring: a map that cannot leave a module out."""
    import ast
    import re
    from pathlib import Path

    root = Path(root)
    homes = {"fedcf": "fedcf", "datasets": "fedcf.datasets", "eval": "fedcf.eval",
             "scripts": "fedcf.benchmarks"}
    lines = []
    for top, package in homes.items():
        folders = sorted({p.parent for p in (root / top).rglob("*.py")})
        for folder in folders:
            rel = folder.relative_to(root).as_posix()
            where = f" (installed as `{package}`)" if folder == root / top and top != "fedcf" else ""
            lines += ["", f"`{rel}/`{where}", ""]
            for path in sorted(folder.glob("*.py")):
                doc = ast.get_docstring(ast.parse(path.read_text())) or ""
                para = " ".join(doc.split("\n\n")[0].split())
                first = re.split(r"(?<=\.)\s", para, maxsplit=1)[0]
                if len(first) > 150:
                    first = first[:150].rsplit(" ", 1)[0] + " …"
                lines.append(f"- `{path.name}`: {first}")
    return "\n".join(lines).strip()


@functools.lru_cache(maxsize=1)
def architecture_block() -> str:
    """The architecture pictures, read from the code (once per process: the code does not
    change while the documents are built)."""
    from report_common import _script

    return _script("architecture").block()


def ctr_headline(ctr) -> str:
    """The CTR simulation's headline: FedRecon's lift over popularity, over seeds when the run
    has them (one seed's interval is over users only)."""
    seeds = ctr.get("seeds") or []
    if len(seeds) >= 2:
        from report_common import seed_interval

        lines = []
        for p, what in (("fedrecon", "FedRecon"),
                        ("fedrecon_prior", "FedRecon re-ranking the popularity prior")):
            if p in seeds[0]["lift"]:
                m, lo, hi = seed_interval([s["lift"][p] for s in seeds])
                lines.append(f"- online CTR lift of {what} over popularity on the simulated "
                             f"population, over {len(seeds)} seeds: {signed_pct(m)} (95 % "
                             f"interval over seeds {signed_pct(lo)} … {signed_pct(hi)}).")
        return "\n".join(lines)
    return (f"- online CTR lift of FedRecon over popularity on the simulated population, one "
            f"seed: {signed_pct(ctr['lift'])} (95 % interval over users "
            f"{signed_pct(ctr['lift_low'])} … {signed_pct(ctr['lift_high'])}).")
