"""The command-line settings of the simulated expression population and its federated model,
shared by scripts/ctr_simulation.py and scripts/ope_study.py (both simulate the same deployment).
"""

from __future__ import annotations


def add_population_args(ap) -> None:
    """Population size, model size and federated training of the simulated deployment."""
    ap.add_argument("--users", type=int, default=50_000)
    ap.add_argument("--items", type=int, default=3800)
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--clients", type=int, default=200, help="clients per round")
    ap.add_argument("--slate", type=int, default=5, help="slate size shown to a user")
