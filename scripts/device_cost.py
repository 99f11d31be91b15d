"""What the device's own rules cost (``DevicePolicy`` and its ledger, ``Device``).

In process: a secure-aggregation fit on a synthetic population, with the device's checks timed
where they run — the model digest, the ledger, the noise and cohort rules — against the
round's seconds (the peer measured in the same run). On a Flower node: the ledger, which the
node reads from and writes back to the run's state with every begin message, timed and sized
as it grows with the rounds its clients answered (every client in every round: the worst case).

    python scripts/device_cost.py --json eval/results/device_cost.json
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import Device, DevicePolicy, SecureAggregation
from fedcf.federated.round import device as device_module

CONFIGS = [  # (users, items, ratings, K, clients per round, rounds)
    (600, 200, 12_000, 8, 20, 4),
    (1200, 600, 30_000, 16, 30, 4),
]
LEDGER_ROUNDS = (10, 100, 1000)
NODE_CLIENTS = 100


class Timed:
    """Wrap functions and methods of the device's rules; ``seconds`` is their total."""

    def __init__(self):
        self.seconds, self.undo = 0.0, []

    def wrap(self, owner, name):
        real = owner.__dict__[name]

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        setattr(owner, name, timed)
        self.undo.append((owner, name, real))

    def restore(self):
        for owner, name, real in reversed(self.undo):
            setattr(owner, name, real)


def in_process(users, items, ratings, K, m, rounds) -> dict:
    data = make_synthetic_ratings(users, items, ratings, random_state=0)
    clock = Timed()
    clock.wrap(device_module, "model_digest")
    for name in ("admit",):
        clock.wrap(Device, name)
    for name in ("check_noise", "check_sharing", "check_survivors"):
        clock.wrap(DevicePolicy, name)
    try:
        model = FedReconMF(server_optimizer="sgd", early_stopping=None,
                           n_factors=K, n_rounds=rounds, clients_per_round=m, random_state=0,
                           aggregator=SecureAggregation(min_cohort=10)).fit(data)
    finally:
        clock.restore()
    if any(h["secagg_lost_round"] for h in model.history_):
        raise RuntimeError("a round of the cost run was not aggregated: the figures would "
                           "not be a secure round's")
    round_seconds = float(sum(h["seconds"] for h in model.history_))
    return {"users": users, "items": items, "K": K, "clients": m, "rounds": rounds,
            "device_seconds_per_round": clock.seconds / rounds,
            "round_seconds": round_seconds / rounds,
            "share": clock.seconds / round_seconds}


def ledger(rounds: int) -> dict:
    """A node's ledger after ``rounds`` rounds of NODE_CLIENTS clients, and the seconds to
    read it from the run's state and write it back (what each begin message costs)."""
    d = Device(DevicePolicy())
    clients = np.arange(NODE_CLIENTS)
    for r in range(rounds):
        d.admit("update", r, r.to_bytes(32, "little"), clients)
    blob = pickle.dumps((d.answered, d.participations))
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2 or n < 3:
        answered, participations = pickle.loads(blob)
        pickle.dumps((answered, participations))
        n += 1
    return {"rounds": rounds, "clients": NODE_CLIENTS, "bytes": len(blob),
            "seconds_per_message": (time.perf_counter() - t0) / n}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="the smallest configuration only")
    args = ap.parse_args(argv)
    configs = CONFIGS[:1] if args.quick else CONFIGS
    rows = [in_process(*c) for c in configs]
    for r in rows:
        print(f"{r['items']:>5} items K={r['K']:>2} m={r['clients']:>3}: device "
              f"{r['device_seconds_per_round'] * 1e3:.2f} ms of a {r['round_seconds']:.2f} s "
              f"round ({r['share']:.2%})")
    books = [ledger(n) for n in (LEDGER_ROUNDS[:1] if args.quick else LEDGER_ROUNDS)]
    for b in books:
        print(f"ledger after {b['rounds']} rounds of {b['clients']} clients: "
              f"{b['bytes'] / 1024:.0f} KiB, {b['seconds_per_message'] * 1e3:.2f} ms per begin")
    if args.json:
        from fedcf.provenance import run_meta, write_json

        write_json(args.json, {"meta": run_meta("device_cost.py", argv), "rounds": rows,
                               "ledger": books})
    return rows, books


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "device_cost.py")
