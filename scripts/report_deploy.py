"""The Flower guide's "A deployment that survives its own nodes" table, from the committed
runs of ``scripts/flower_deploy.py --scenario ...`` (eval/results/flower_scenario_*.json)."""

from __future__ import annotations

import numpy as np
from report_common import provenance, signed_pct, table

SCENARIOS = ("fabricated", "liar", "overlap", "restart", "stall")  # one committed run each
DEVICE = {
    "liar": "an extra registered device whose one user rates ±10⁶ (its directory claims follow "
            "from its file)",
    "overlap": "the last device also lists the first device's first user",
    "restart": "the last device killed (SIGKILL) when its round-1 message arrived, started again "
               "at once with the same key and data",
    "stall": "the last device frozen (SIGSTOP) when its round-1 message arrived, continued "
             "after twice the reply timeout",
    "fabricated": "an extra registered device listing 4× a device's users, made up, whose "
                  "uploads carry negated 1000-fold deltas (aggregator: row-clipped median)",
}


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


def _server(doc) -> str:
    """What the server did about the scenario's device, from the run's own records."""
    refused = [r for r in doc["refusals"] if r["stage"] == "directory"]
    rounds = [r for r in doc["refusals"] if r["stage"].startswith("round ")]
    ev = doc.get("device_events") or {}
    parts = []
    if refused:
        parts.append("; ".join(f"directory, node …{str(r['node'])[-4:]}: {_short(r['reason'])}"
                               for r in refused))
    if "restarted" in ev:
        back = ev.get("rejoined", {}).get("seconds")
        released = {True: "the device ended its killed session itself; ",
                    False: "the device found no session of its own open; ",
                    None: "the device ended no session; "}.get(ev["restarted"].get("released"),
                                                             "the device's release failed; ")
        parts.append(released + (f"the SuperLink let the restarted node in after "
                                 f"{ev['restarted']['attempts']} attempt(s), "
                                 f"{back - ev['restarted']['seconds']:.0f} s after the kill"
                                 if back is not None else "the restarted node never got back in"))
    if "stalled" in ev:
        parts.append(f"stalled {ev['resumed']['seconds'] - ev['stalled']['seconds']:.0f} s"
                     if "resumed" in ev else "stalled to the end")
    if rounds:
        parts.append(f"{len(rounds)} round replies refused or missing "
                     f"({', '.join(sorted({r['stage'] for r in rounds}))})")
    return "; ".join(parts) or "nothing refused"


def scenario_block(docs: dict) -> str:
    """One row per scenario: the device, what the server did, nodes asked per round, round
    seconds, and ReconEval (half of each user's ratings as support) over every honest user of
    the deployed model and of the honest in-process fit (the same users whatever a dishonest
    device added)."""
    docs = {name: d for name, d in docs.items() if d is not None}  # load() names a missing one
    if not docs:
        return "Not measured yet."
    rows, metas = [], []
    for name in sorted(docs):
        d = docs[name]
        metas.append(provenance(d["meta"], f"flower_scenario_{name}.json"))
        secs = d["round_seconds"]
        h = d["honest_users_rmse"]
        rows.append((name, DEVICE.get(name, name), _server(d),
                     f"{d['n_train_users'] + d['n_eval_users']:,}",
                     " ".join(str(m) for m in d["messages_per_round"]),
                     f"{np.median(secs):.1f} / {max(secs):.1f}",
                     f"{h['deployed']:.4f} vs {h['honest_fit']:.4f} "
                     f"({signed_pct(h['deployed'] / h['honest_fit'] - 1)}); model "
                     f"{'identical' if d['identical_item_factors'] else 'not identical'}"))
    return "\n\n".join(["\n".join(f"- {m}" for m in metas), table(
        ["scenario", "the device", "what the server did", "users in the run",
         "nodes asked per round",
         "round s (median / max)",
        "RMSE over every honest user: deployed vs the honest in-process fit"], rows)])
