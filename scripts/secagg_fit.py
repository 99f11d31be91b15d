#!/usr/bin/env python
"""What training under differential privacy around secure aggregation costs: a whole FedReconMF
fit at the estimator's defaults (100 clients per round, K = 50) on MovieLens-100K with
``DifferentialPrivacy(SecureAggregation())``, every round's protocol run for real (key
agreement, Shamir sharing, masking, unmasking), timed end to end per executor:

- ``local``: every client half in this process (a simulation);
- ``ray``: the client halves on a local Ray instance's shards (``RayExecutor``), two by
  default on a two-core machine, the server half here.

Each row also has the seconds of a ``--probe``-round fit (after an untimed two-round fit that
loads the kernels and starts Ray once), so a reader sees the start-up and the steady round
apart: a steady round is (whole − probe) / (rounds − probe).

Example: python scripts/secagg_fit.py --json eval/results/secagg_fit.json
"""

from __future__ import annotations

import argparse
import time
import warnings

from fedcf.provenance import run_meta, write_json


def data(name: str):
    from fedcf.datasets import load_movielens, make_synthetic_ratings

    if name == "ml-100k":
        return load_movielens("100k")
    return make_synthetic_ratings(300, 120, 6000, random_state=0)  # tests: a small stand-in


def fit_seconds(inter, rounds: int, executor: str, shards: int, clients: int) -> float:
    from fedcf import FedReconMF
    from fedcf.federated import DifferentialPrivacy, RayExecutor, SecureAggregation

    ex = RayExecutor(n_shards=shards, num_cpus=1) if executor == "ray" else None
    model = FedReconMF(n_rounds=rounds, clients_per_round=clients, rating_scale=(1, 5),
                       aggregator=DifferentialPrivacy(SecureAggregation(), noise_multiplier=1.0),
                       executor=ex, random_state=0)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the DP run's ε warnings are not what is measured
        model.fit(inter)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["ml-100k", "synthetic"], default="ml-100k")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--probe", type=int, default=20, help="rounds of the short fit per row")
    ap.add_argument("--clients", type=int, default=100, help="clients per round")
    ap.add_argument("--executors", nargs="+", choices=["local", "ray"], default=["local", "ray"])
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    inter, rows = data(args.dataset), []
    for ex in args.executors:
        fit_seconds(inter, 2, ex, args.shards, args.clients)  # warm: kernels, Ray's first start
        probe = fit_seconds(inter, args.probe, ex, args.shards, args.clients)
        whole = fit_seconds(inter, args.rounds, ex, args.shards, args.clients)
        steady = (whole - probe) / max(args.rounds - args.probe, 1)
        rows.append({"dataset": args.dataset, "executor": ex,
                     "shards": args.shards if ex == "ray" else None, "clients": args.clients,
                     "rounds": args.rounds, "seconds": whole, "probe_rounds": args.probe,
                     "probe_seconds": probe, "steady_seconds_per_round": steady})
        print(f"{ex:<5} {args.rounds} rounds: {whole:.1f} s ({whole / 60:.1f} min); "
              f"a steady round {steady:.3f} s", flush=True)
    if args.json:
        meta = {**run_meta("secagg_fit.py", argv, packages=("ray",)), "settings": vars(args)}
        write_json(args.json, [{**r, "meta": meta} for r in rows])
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "secagg_fit.py")
