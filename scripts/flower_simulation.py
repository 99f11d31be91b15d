"""FedRecon through Flower's simulation engine vs the same FedReconMF fit in process.

    python scripts/flower_simulation.py --json eval/results/flower.json          # ML-100K
    python scripts/flower_simulation.py --dataset synthetic --quick               # smoke test
    python scripts/flower_simulation.py --model furl --dataset synthetic --quick  # another one

Flower runs ``fedcf.flower``'s ServerApp and ClientApp on ``--partitions`` virtual SuperNodes,
each holding a partition of the users (Flower's Ray backend). The same FedReconMF parameters are
fitted in process on the same training users. Reported: whether the fitted item factors are
identical bit for bit, federated ReconEval of both on the held-out users, bytes through Flower's
messages per client per round against fedcf's own ``values_up``/``values_down`` accounting, and
the fields every message carried (a recording client mod; no local parameter may appear:
a ``"rows"`` record goes up only for FedAvg, whose rows are the server's). ``--model`` names
another estimator (``fedcf-model``): FURL, FedMF, PFedRec and FedNCF keep their user rows in
the simulated nodes' run state across rounds, so their bit-for-bit match checks that state.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ALLOWED = {  # record -> fields that may cross the wire (fedcf.flower.wire)
    "global": {"Q", "b", "ids"}, "config": {"users", "clients", "params", "mu", "rating_scale",
                                            "support", "seed"},
    "upload": {"offsets", "items", "d_Q", "d_b", "weights", "losses", "clients"},
    "users": {"users", "counts", "sums", "catalog"},
    "recon": {"sse", "sae", "hits", "n", "users"},
    "rows": {"P", "c"},  # a stateful model's rows (down: starting rows; up: FedAvg only)
}


def recorder(folder: str):
    """A Flower client mod writing, per message in and out, its records' fields and shapes (a
    packed ArrayRecord's arrays, as its header names them)."""
    from flwr.app import ArrayRecord

    from fedcf.flower.wire import record_arrays

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        rows = []
        for direction, m in (("down", msg), ("up", reply)):
            if m.has_error():
                rows.append({"dir": direction, "type": msg.metadata.message_type, "error": True})
                continue
            fields = {}
            for name, rec in m.content.items():
                got = record_arrays(rec) if isinstance(rec, ArrayRecord) else rec
                fields[name] = {k: (list(v.shape) if hasattr(v, "shape") else type(v).__name__)
                                for k, v in got.items()}
            rows.append({"dir": direction, "type": msg.metadata.message_type, "fields": fields})
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        return reply

    return mod


def check_messages(folder: Path, rows_up: bool = False) -> dict:
    """Every recorded field is an allowed one (a ``"rows"`` record going up only where
    ``rows_up``: FedAvg); the count of messages by type and direction."""
    seen, bad = {}, []
    for file in folder.glob("*.jsonl"):
        for line in file.read_text().splitlines():
            r = json.loads(line)
            key = f"{r['type']}/{r['dir']}"
            seen[key] = seen.get(key, 0) + 1
            for name, fields in r.get("fields", {}).items():
                if name == "rows" and r["dir"] == "up" and not rows_up:
                    bad.append(f"{key}: a user's rows left the device")
                extra = set(fields) - ALLOWED.get(name, set())
                if extra:
                    bad.append(f"{key}: record {name!r} fields {sorted(extra)}")
    return {"messages": seen, "unexpected_fields": bad}


def simulate(args, params, data, folder) -> dict:
    """The Flower run (Ray backend of Flower's simulation engine)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1 only
    from flwr.simulation import run_simulation

    from fedcf.flower import Settings, make_client_app, make_server_app

    results = []
    settings = Settings(params=params, model=args.model, eval_fraction=args.eval_fraction,
                        min_nodes=args.partitions, model_path=str(folder / "flower_model.npz"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # run_simulation's deprecation note (flwr run is the CLI)
        run_simulation(make_server_app(settings.check(), results.append),
                       make_client_app([recorder(str(folder))], data=data,
                                       policy={"min-cohort": args.device_min_cohort}),
                       num_supernodes=args.partitions,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": args.cpus,
                                                     "include_dashboard": False,
                                                     "_node_ip_address": "127.0.0.1"}})
    if not results:
        raise RuntimeError("the Flower ServerApp did not finish; see the log above")
    return results[0]


def per_client_round(history, key) -> float:
    """Mean of ``key`` per client asked to work (a node holding several asked users gets one
    message for them all, so a deployment with one user per node pays ``per_message``)."""
    asked = sum(r["clients_sampled"] - r["clients_dropped"] - r["clients_surplus"]
                for r in history)
    return float(sum(r[key] for r in history)) / max(asked, 1)


def per_message(history, key) -> float:
    return float(sum(r[key] for r in history)) / max(sum(r["flower_messages"] for r in history), 1)


def run(args) -> dict:
    from fedcf import load_model

    params = {"n_factors": args.factors, "n_rounds": args.rounds,
              "clients_per_round": args.clients_per_round, "random_state": args.seed}
    if args.model == "fedrecon":
        params.update({"server_optimizer": {"name": "sgd", "learning_rate": 1.0},
                       "client_update": {"name": "sgd", "learning_rate": 0.1, "steps": 50},
                       "reconstruction": "als"})
    data = {"dataset": args.dataset, "data-path": args.data_path or ""}
    if args.dataset == "synthetic":
        data.update({"synthetic-users": 600, "synthetic-items": 120, "synthetic-ratings": 12_000,
                     "synthetic-seed": 0})
    folder = Path(tempfile.mkdtemp(prefix="fedcf_flower_"))
    from fedcf.federated import DevicePolicy
    from fedcf.flower import fit_in_process

    ref, ref_eval, ref_seconds = fit_in_process(  # the devices' policy: as the nodes' below
        params, data, args.eval_fraction, model=args.model, device_policy=DevicePolicy(
            min_cohort=args.device_min_cohort), partitions=args.partitions)
    t0 = time.perf_counter()
    res = simulate(args, params, data, folder)
    flower_seconds = time.perf_counter() - t0
    model = load_model(res["model_path"])
    hist = res["history"]
    itemsize = np.dtype(params.get("dtype", "float32")).itemsize
    return {
        "dataset": args.dataset, "model": args.model, "partitions": args.partitions,
        "params": params,
        "eval_fraction": args.eval_fraction, "device_min_cohort": args.device_min_cohort,
        "n_train_users": res["n_train_users"], "n_eval_users": res["n_eval_users"],
        "identical_item_factors": bool(np.array_equal(model.item_factors_, ref.item_factors_)),
        "identical_item_biases": bool(np.array_equal(model.item_biases_, ref.item_biases_)),
        "max_abs_difference": float(np.max(np.abs(model.item_factors_.astype(np.float64)
                                                  - ref.item_factors_))),
        "identical_losses": [h["loss"] for h in hist] == [h["loss"] for h in ref.history_],
        "flower_recon_eval": res.get("recon_eval"), "local_recon_eval": ref_eval,
        "rmse_relative_difference": None if ref_eval is None else
        abs(res["recon_eval"]["rmse"] - ref_eval["rmse"]) / ref_eval["rmse"],
        "bytes_down_per_client_round": per_client_round(hist, "flower_bytes_down"),
        "bytes_up_per_client_round": per_client_round(hist, "flower_bytes_up"),
        "values_down_per_client_round": per_client_round(hist, "values_down"),
        "values_up_per_client_round": per_client_round(hist, "values_up"),
        "bytes_down_per_message": per_message(hist, "flower_bytes_down"),
        "bytes_up_per_message": per_message(hist, "flower_bytes_up"),
        "clients_per_message": per_message(hist, "clients_used"),
        "value_bytes": itemsize, "refusals": res["refusals"],
        "flower_seconds": flower_seconds, "local_seconds": ref_seconds,
        **check_messages(folder, rows_up=args.model == "fedavg"),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k", choices=["ml-100k", "synthetic", "file"])
    ap.add_argument("--model", default="fedrecon",
                    help="the estimator by registered name (fedrecon, fedrecon-implicit, furl, "
                         "fedavg, fedmf, pfedrec, fedncf); a ranking model needs "
                         "--eval-fraction 0")
    ap.add_argument("--data-path", default=None)
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients-per-round", type=int, default=50)
    ap.add_argument("--factors", type=int, default=20)
    ap.add_argument("--eval-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--device-min-cohort", type=int, default=2,
                    help="the simulated devices' own min-cohort (their policy; a node reports "
                         "evaluation sums only over at least this many of its users)")
    ap.add_argument("--quick", action="store_true", help="a small run (CI smoke test)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    if args.quick:
        args.partitions, args.rounds, args.clients_per_round = 8, 3, 20
    from fedcf.provenance import report_result, run_meta

    print(f"Flower simulation: {args.partitions} nodes, {args.rounds} rounds of "
          f"{args.clients_per_round} users on {args.dataset} (starting Ray and the nodes takes "
          "most of a minute; Flower's own log follows) ...", file=sys.stderr, flush=True)
    out = {"meta": run_meta("flower_simulation.py", argv, packages=("flwr", "ray")), **run(args)}
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "flower_simulation.py", strict=True)
