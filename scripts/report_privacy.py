"""eval/PRIVACY.md: privacy attacks, DP utility, secure aggregation cost, mutants."""

from __future__ import annotations

import math

from report_common import claim, pct, provenance, signed_pct, table


def population_values(rows) -> dict:
    st = rows[0]["meta"]["settings"]
    plain = next(r for r in rows if r.get("delta") is None)
    dp = next(r for r in rows if r.get("delta") is not None and not r.get("adaptive") and
              r.get("target_epsilon", st["target_epsilon"]) == st["target_epsilon"])
    rel = dp["rmse"] / plain["rmse"] - 1
    met = dp["epsilon"] <= st["target_epsilon"] * 1.001 and rel <= 0.03
    noised = [r for r in rows if r.get("epsilon")]
    claim("PRIVACY.md", "ε against the server is larger than ε in every population DP row",
          noised and all((r.get("epsilon_server") or 0) > r["epsilon"] for r in noised))
    return {
        "population_provenance": provenance(rows[0]["meta"], "privacy_population.json"),
        "population_data": f"{st['population']:,} users, {rows[0]['train_users']:,} in training",
        "population_test": f"{20_000:,}", "population_rounds": st["population_rounds"],
        "population_clip": st.get("population_clip"),
        "population_weight_cap": f"{st.get('population_weight_cap', st['weight_cap']):g}",
        "population_clients": f"{st['population_clients']:,}",
        "table_population": table(
            ["run", "RMSE", "accuracy", "ε", "ε by RDP", "ε against the server", "δ",
             "noise multiplier σ", "seconds"],
            [(r["name"], f"{r['rmse']:.4f}", pct(r["accuracy"]),
              "" if r["epsilon"] is None else f"{r['epsilon']:.3f}",
              "" if r.get("epsilon_rdp") is None else f"{r['epsilon_rdp']:.3f}",
              "" if r.get("epsilon_server") is None else f"{r['epsilon_server']:.3g}",
              "" if r.get("delta") is None else f"{r['delta']:g}",
              "" if r.get("noise_multiplier") is None else f"{r['noise_multiplier']:.3f}",
              f"{r['seconds']:.1f}") for r in rows]),
        "population_verdict": (f"{'met' if met else 'missed'}: ε = {dp['epsilon']:.3f}, RMSE "
                               f"{signed_pct(rel)} against the non-private run"),
    }


def privacy_values(rows) -> dict:
    def num(x, fmt=".4f"):
        return "" if x is None else format(x, fmt)

    dp = [r for r in rows if r.get("epsilon") and r.get("epsilon_server") is not None]
    claim("PRIVACY.md", "ε against the server is larger than ε against the public release in "
          "every DP row", dp and all(r["epsilon_server"] > r["epsilon"] for r in dp))

    st = rows[0]["meta"]["settings"]
    util = [r for r in rows if "rmse" in r and "attack" not in r]
    leak = [r for r in rows if r["name"].startswith("leakage")]
    att = [r for r in rows if "attack" in r]
    return {
        "provenance": provenance(rows[0]["meta"], "privacy.json"), "K": st["factors"],
        "rounds": st["rounds"], "clip": st["clip"], "delta": f"{st['delta']:g}",
        "weight_cap": f"{st['weight_cap']:g}",
        "attackers": pct(st["attackers"], 0), "row_clip": f"{st.get('row_clip', 0.3):g}",
        "target": next((r["target_item"] for r in att), ""),
        "table_utility": table(["row", "RMSE", "accuracy", "ε", "ε against the server",
                                "numbers up / round", "seconds"],
                               [(r["name"], f"{r['rmse']:.4f}", pct(r["accuracy"]),
                                 num(r.get("epsilon"), ".3g"), num(r.get("epsilon_server"), ".3g"),
                                 f"{r['values_up']:,.0f}", f"{r['seconds']:.1f}")
                                for r in util]),
        "table_leakage": table(["server's view", "rated-set recall", "rated-set precision",
                                "chance (95 % interval)", "embedding cosine (abs)"],
                               [(r["name"].removeprefix("leakage: "),
                                 num(r.get("rated_set_recall"), ".3f"),
                                 num(r.get("rated_set_precision"), ".3f"),
                                 _chance(r), num(r.get("embedding_abs_cosine"), ".3f"))
                                for r in leak if "lift" not in r]),
        "table_sum": table(["cohort", "rated-set precision of the sum's rows",
                            "rated-set recall", "× chance"],
                           [(f"{r['cohort']:,}", f"{r['rated_set_precision']:.3f}",
                             f"{r['rated_set_recall']:.3f}", f"{r['lift']:.2f}")
                            for r in leak if "lift" in r]),
        "secagg_verdict": secagg_verdict(rows),
        "table_attacks": table(["attack + aggregator", "RMSE", "accuracy", "target hit rate"],
                               [(r["name"], f"{r['rmse']:.4f}", pct(r["accuracy"]),
                                 pct(r["target_hit_rate"])) for r in att]),
        "promotion_verdict": promotion_verdict(att),
    }


def _chance(r) -> str:
    if r.get("chance") is None:
        return ""
    if r.get("chance_halfwidth") is None:
        return f"{r['chance']:.3f}"
    return f"{r['chance']:.3f} ± {r['chance_halfwidth']:.3f}"


def secagg_verdict(rows) -> str:
    """Issue 31's targets on the transcript attacks and the utility of secure aggregation."""
    attacks = [r for r in rows if r["name"].startswith("leakage: secure aggregation, (")]
    if not attacks:
        return "not measured in this JSON (it predates the protocol's transcript audit)"
    inside = [r for r in attacks if abs(r["rated_set_recall"] - r["chance"])
              <= r["chance_halfwidth"]]
    out = [f"{len(inside)} of {len(attacks)} attacks within the chance interval"]
    plain = next((r for r in rows if r["name"].startswith("plain mean, ")), None)
    sec = next((r for r in rows if r["name"].startswith("secure aggregation, ")), None)
    if plain and sec:
        out.append(f"secure aggregation's RMSE {sec['rmse']:.4f} against the plain row's "
                   f"{plain['rmse']:.4f} ({signed_pct(sec['rmse'] / plain['rmse'] - 1)})")
    return "; ".join(out)


def secagg_auto_values() -> dict:
    """The SecAgg+ degree ``neighbours="auto"`` picks per cohort size: computed by fedcf's
    ``plus_neighbours`` at its stated assumptions (not a measurement)."""
    import math

    from fedcf.federated.aggregators.secagg import (
        AUTO_CORRUPT,
        AUTO_DROPOUT,
        PRIVACY_BITS,
        ROUND_BITS,
        plus_neighbours,
    )

    def row(m):
        k = plus_neighbours(m)
        h = m if k is None else k + 1
        t = math.floor(2 / 3 * h) + 1
        return (f"{m:,}", "every pair" if k is None else f"SecAgg+, k = {k}", f"{t} of {h}",
                f"{h / m:.3g}")
    body = table(["cohort m", "graph", "threshold t of holders", "holders / m"],
                 [row(m) for m in (20, 50, 86, 87, 100, 200, 1000, 10_000, 100_000)])
    return {"secagg_auto": f"Assumptions: at most {AUTO_CORRUPT:.0%} of the cohort colluding "
            f"with the server, dropouts at {AUTO_DROPOUT:.0%} (or the simulation's "
            f"`drop_after_setup` if larger), privacy failures below 2^-{PRIVACY_BITS}, a lost "
            f"round below 2^-{ROUND_BITS}; threshold share 2/3.\n\n" + body}


def secagg_words_values() -> dict:
    """Bytes per value of the compact upload (``SecureAggregation(precision=p)``), by cohort
    and p at value_bound 1 without noise: computed by fedcf's ``Encoding`` (not measured)."""
    from fedcf.federated.aggregators.secagg_client import Encoding

    ps = (None, 20, 16, 12, 8)
    rows = [[f"{m:,}"] + [str(Encoding(1, 1, m, 1.0, 1000.0, precision=p).word_bytes()[0])
                          for p in ps] for m in (10, 30, 100, 250, 1000, 10_000)]
    return {"secagg_words": table(["cohort m"] + [f"p = {p}" if p else "p = None (default)"
                                                  for p in ps], rows)}


def secagg_precision_values(doc) -> dict:
    """PRIVACY.md's accuracy and bytes of the compact upload (scripts/secagg_precision.py)."""
    if doc is None:
        return {"secagg_precision": "Not measured yet: run `python scripts/secagg_precision.py "
                                    "--json eval/results/secagg_precision.json`."}
    groups: dict = {}
    for r in doc["rows"]:
        groups.setdefault(str(r["precision"]), []).append(r)
    plain = [r["rmse"] for r in groups.get("plain", [])]

    from fedcf.federated.aggregators.secagg_client import Encoding

    def row(name, rs):
        rmse = [r["rmse"] for r in rs]
        d = [a - b for a, b in zip(rmse, plain)] if plain and name != "plain" else []
        up = rs[0].get("bytes_per_client")
        enc = None if name == "plain" else Encoding(  # FedReconMF's 100 clients a round
            1, 1, 100, 1.0, 1000.0, precision=None if name == "None" else int(name))
        return ("plain mean" if name == "plain" else f"precision={name}",
                "" if enc is None else f"{enc.word_bytes()[0]} B, 2^-{math.log2(enc.scales()[0]):.0f}",
                ", ".join(f"{v:.6f}" for v in rmse),
                f"{sum(d) / len(d):+.1e} [{min(d):+.1e}, {max(d):+.1e}]" if d else "",
                f"{up / 1024:,.0f}" if up else "")
    seeds = sorted({r["seed"] for r in doc["rows"]})
    body = table(["aggregation", "word, step", f"ReconEval RMSE, seeds {seeds}",
                  "change against plain, mean [min, max] over seeds",
                  "protocol KiB sent per client per round"],
                 [row(name, rs) for name, rs in groups.items()])
    return {"secagg_precision": provenance(doc["meta"], "secagg_precision.json") + "\n\n" +
            f"{doc['meta']['settings']['rounds']} rounds, early stopping off in every row.\n\n" +
            body}


def _where_halves(rows) -> str:
    procs = sorted({r.get("processes", 1) for r in rows})
    if procs == [1]:
        return "every client half and the server in one process on this machine"
    return (f"the client halves in {' or '.join(map(str, procs))} worker processes side by "
            "side, the server in the script's own, on this machine")


def secagg_cost_values(rows) -> dict:
    """PRIVACY.md's cost of secure aggregation (scripts/secagg_cost.py)."""
    if not rows:
        return {"secagg_cost": "Not measured yet: run `python scripts/secagg_cost.py --json "
                               "eval/results/secagg_cost.json`."}
    body = table(["clients m", "graph", "items", "threshold t", "dropped", "seconds per client",
                  "server seconds", "round seconds", "MiB up per client", "plain vector, MiB"],
                 [(f"{r['clients']:,}", "every pair" if not r.get("neighbours") else
                   f"SecAgg+, k = {r['neighbours']}" + (" (default)" if r.get("auto") else ""),
                   f"{r['n_items']:,}",
                   f"{r['threshold']} of {r.get('holders', r['clients'])}", r["dropped"],
                   f"{r['client_seconds']:.3f}", f"{r['server_seconds']:.2f}",
                   f"{r['round_seconds']:.2f}",
                   f"{r['bytes_up_per_client'] / 2**20:.2f}", f"{r['plain_bytes'] / 2**20:.2f}")
                  for r in rows])
    targets = []
    for text, pick, bound in (
            ("100 clients, every pair, 10,000 items: a round within 1 s",
             lambda r: r["clients"] == 100 and not r.get("neighbours") and
             r["n_items"] == 10_000, 1.0),
            ("1,000 clients, SecAgg+, 1,000 items: a round within 10 s",
             lambda r: r["clients"] == 1000 and r.get("neighbours") and
             r["n_items"] == 1_000, 10.0)):
        got = [r for r in rows if pick(r)]
        targets.append(f"{text}: " + ("not measured" if not got else "; ".join(
            f"{r['n_items']:,} items {r['round_seconds']:.2f} s" for r in got) +
            (" (met)" if all(r["round_seconds"] <= bound for r in got) else " (**missed**)")))
    big = max(rows, key=lambda r: (r["n_items"], -r["clients"]))
    phone = (f" For the largest catalog measured, {big['n_items']:,} items at K = {big['K']} "
             f"in a cohort of {big['clients']}, one device spends "
             f"{big['client_seconds']:.3f} s of protocol work on this machine "
             f"and uploads {big['bytes_up_per_client'] / 2**20:.2f} MiB per "
             "round, besides downloading the item matrix.")
    return {"secagg_cost": provenance(rows[0]["meta"], "secagg_cost.json") + "\n\n" + body +
            "\n\nConfigurations over the script's budgets (mask words, share holders) are not "
            "run; the script prints which." + phone + "\n\nTargets (" + _where_halves(rows) + "):\n\n" +
            "\n".join(f"- {t}" for t in targets)}


def secagg_fit_values(rows) -> dict:
    """PRIVACY.md's whole fit under DP around secure aggregation (scripts/secagg_fit.py)."""
    cmd = "`python scripts/secagg_fit.py --json eval/results/secagg_fit.json`"
    if not rows:
        return {"secagg_fit": f"Not measured yet: run {cmd}."}
    body = table(["executor", "clients per round", "rounds", "minutes", "steady round, s",
                  "10-minute target"],
                 [(r["executor"] + (f", {r['shards']} shards" if r["shards"] else ""),
                   r["clients"], r["rounds"], f"{r['seconds'] / 60:.1f}",
                   f"{r['steady_seconds_per_round']:.2f}",
                   "met" if r["seconds"] <= 600 else "not met") for r in rows])
    return {"secagg_fit": provenance(rows[0]["meta"], "secagg_fit.json") + "\n\n" + body}


def precision_note(dep) -> str:
    """The deployment's compact-word setting, as its run config recorded it."""
    p = dep.get("precision")
    return "" if p is None else f", `precision={p}`"


def per_client_up(dep) -> list:
    """KiB a deployment's nodes sent up per client asked, each round (all messages)."""
    asked = dep.get("clients_sampled_per_round")
    return [] if not asked else [b / n / 1024 for b, n in zip(dep["bytes_up_per_round"], asked)]


def flower_secagg_values(dep, plain=None) -> dict:
    """PRIVACY.md's Flower deployment under secure aggregation (scripts/flower_deploy.py
    --secure-aggregation), beside the upload of the plain deployment ``plain`` with the same
    cohort (scripts/flower_deploy.py --warm)."""
    cmd = ("`python scripts/flower_deploy.py --dataset ml-100k --nodes 4 --rounds 3 "
           "--clients-per-round 30 --intruders 1 --secure-aggregation --precision 16 "
           "--kill-after-masking --json eval/results/flower_deploy_secagg.json`")
    if not dep:
        return {"flower_secagg": f"Not measured yet: run {cmd}."}
    hist, kill = dep["secagg"], dep.get("killed_node_at")
    up = per_client_up(dep) or [float("nan")] * len(hist)
    rows = [(r + 1, f"{sec}", f"{dep['round_seconds'][r]:.1f}",
             dep["messages_per_round"][r], f"{dep['bytes_down_per_round'][r] / 2**20:.2f}",
             f"{dep['bytes_up_per_round'][r] / 2**20:.2f}", f"{up[r]:,.0f}",
             f"{h['secagg_bytes_per_client'] / 2**20:.3f}", h["secagg_survivors"],
             "no" if h["secagg_lost_round"] else "yes")
            for r, (h, sec) in enumerate(zip(hist, [h["secagg_threshold"] for h in hist]))]
    body = table(["round", "threshold t", "seconds", "messages", "MiB down (all nodes)",
                  "MiB up (all nodes)", "KiB up per client asked", "protocol MiB per client",
                  "survivors", "aggregated"], rows)
    beside = per_client_up(plain) if plain else []
    if beside:
        body += (f"\n\nThe plain deployment with the same nodes and cohort (`flower_deploy_warm"
                 f".json`, {plain['meta']['date'][:10]}) sent "
                 f"{', '.join(f'{v:,.1f}' for v in beside)} KiB up per client asked in its "
                 f"rounds: only the rows a client touched, in the clear.")
    lost = "" if not kill else (
        f" The last node was killed (SIGKILL) when the `{kill['group']}` message reached it, "
        f"after it had sent its masked vectors; the refusals logged against it: "
        f"{sum(1 for r in dep['refusals'] if 'secagg' in r['stage'])} in training, "
        f"{sum(1 for r in dep['refusals'] if r['stage'] == 'recon eval')} in the evaluation.")
    fields = sorted({f.split('.')[0] for recs in dep["received"].values()
                     for fs in recs.values() for f in fs})
    return {"flower_secagg": provenance(dep["meta"], "flower_deploy_secagg.json") + "\n\n" +
            f"SuperLink and {dep['nodes']} SuperNodes on {dep['dataset']} (TLS and node "
            f"authentication {'on' if dep['tls_and_node_auth'] else 'off'}; "
            f"{dep.get('intruders_turned_away', 0)} of {dep['intruders']} unregistered nodes "
            f"turned away), {len(hist)} rounds under `SecureAggregation` (threshold share 0.5"
            f"{precision_note(dep)}): "
            f"item factors {'identical' if dep['identical_item_factors'] else 'different'} to "
            f"the in-process secure-aggregation fit; message types the server received: "
            f"{', '.join(sorted(dep['received']))} (protocol tables: {', '.join(fields)})."
            f"{lost}\n\n" + body + "\n\nBytes are Flower's serialized messages, all steps "
            "of a round; the protocol column is the server half's count of what one client "
            "sent."}


def device_cost_values(doc) -> dict:
    """PRIVACY.md's cost of the device's own rules (scripts/device_cost.py)."""
    if doc is None:
        return {"device_cost": "Not measured yet: run `python scripts/device_cost.py --json "
                               "eval/results/device_cost.json`."}
    rounds = table(["items", "K", "clients per round", "device's checks, ms per round",
                    "round, seconds", "share of the round"],
                   [(f"{r['items']:,}", r["K"], r["clients"],
                     f"{r['device_seconds_per_round'] * 1e3:.2f}", f"{r['round_seconds']:.2f}",
                     f"{r['share']:.2%}") for r in doc["rounds"]])
    books = table(["rounds answered", "clients on the node", "ledger, KiB",
                   "read and written per begin message, ms"],
                  [(b["rounds"], b["clients"], f"{b['bytes'] / 1024:.0f}",
                    f"{b['seconds_per_message'] * 1e3:.2f}") for b in doc["ledger"]])
    return {"device_cost": provenance(doc["meta"], "device_cost.json") + "\n\n" +
            "In process, a secure fit with the device's checks timed where they run (the model "
            "digest, the ledger, the noise and cohort rules) against the round's seconds:\n\n" +
            rounds + "\n\nOn a Flower node, the ledger that every begin message reads from "
            "the run's state and writes back, after its clients answered every round:\n\n" +
            books}


def mutants_values(doc) -> dict:
    """PRIVACY.md's mutation-testing section (scripts/mutants.py)."""
    if doc is None:
        return {"mutants": "Not measured yet: run `python scripts/mutants.py --json "
                           "eval/results/mutants.json`."}
    rows = doc["rows"]
    killed = sum(r["killed"] for r in rows)
    return {"mutants": provenance(doc["meta"], "mutants.json") + "\n\n" +
            f"{killed} of {len(rows)} mutants killed by " +
            ", ".join(f"`{t}`" for t in doc["tests"]) + ".\n\n" +
            table(["mutant", "file", "killed", "first failing run"],
                  [(r["mutant"], f"`{r['file']}`", "yes" if r["killed"] else "**no**",
                    r["summary"]) for r in rows])}


def promotion_verdict(att) -> str:
    """The issue's promotion target (hit rate at least halved) for each promotion attack: the
    plain mean against the aggregator that holds the item's hit rate lowest."""
    lines = []
    runs = dict.fromkeys((r["attack"], r.get("attack_scale")) for r in att
                         if (r["attack"] or "").startswith("promote"))
    for kind, scale in runs:
        rows = [r for r in att if (r["attack"], r.get("attack_scale")) == (kind, scale)]
        mean = next(r for r in rows if r["name"].endswith("+ mean"))
        best = min(rows, key=lambda r: r["target_hit_rate"])
        met = best["target_hit_rate"] <= 0.5 * mean["target_hit_rate"] and \
            mean["target_hit_rate"] > 0
        lines.append(f"- {mean['name'].rsplit(' + ', 1)[0]}: {pct(mean['target_hit_rate'])} "
                     f"with the plain mean, {pct(best['target_hit_rate'])} at best "
                     f"({best['name'].split(' + ', 1)[1]}) — {'met' if met else 'missed'}")
    return "\n".join(lines)
