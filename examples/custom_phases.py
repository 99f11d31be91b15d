"""
How to add an aggregator and an executor
========================================

A new aggregator and a new executor are one class each (the how-to page on extending fedcf
has the contract checks).

``ShrunkMean`` changes one thing of the weighted mean — its denominator — so it stays linear:
it is also reduced from partial sums on Ray shards. ``TimedExecutor`` wraps
any executor and records how long each round's client work took; the loop merges its
``round_stats`` into ``history_``. ``tests/test_aggregator_contract.py`` runs the shared contract
tests on both.
"""

import time

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import Executor, LocalExecutor, RoundExecutor, WeightedMean


class ShrunkMean(WeightedMean):
    """Σ_k w_k Δ_k / (Σ_k w_k + shrink): the weighted mean, shrunk towards no update when the
    cohort's total weight is small (a round of a few light clients moves the model less).

    Parameters
    ----------
    shrink : float >= 0
        Pseudo-weight of a zero update; 0 gives the weighted mean.
    """

    def __init__(self, shrink=10.0):
        self.shrink = shrink
        self.validate()

    def validate(self):
        if not (isinstance(self.shrink, (int, float)) and np.isfinite(self.shrink)
                and self.shrink >= 0):
            raise ValueError(f"shrink must be a number >= 0, got {self.shrink!r}")

    def denominator(self, totals):
        return totals["weight"] + self.shrink


class TimedExecutor(Executor):
    """Runs the client work with ``executor`` (None: this process) and times it.

    Parameters
    ----------
    executor : Executor or None
    """

    def __init__(self, executor=None):
        self.executor = executor

    def bind(self, program, data, local_state=None):
        inner = (self.executor or LocalExecutor()).bind(program, data, local_state)
        return TimedRound(inner)


class TimedRound(RoundExecutor):
    def __init__(self, inner):
        self.inner, self.counts, self.round_stats = inner, inner.counts, {}

    def run(self, cohort, params, ids):
        t0 = time.perf_counter()
        out = self.inner.run(cohort, params, ids)
        self.round_stats = {"timed_client_ms": 1e3 * (time.perf_counter() - t0)}
        return out

    def close(self):
        self.inner.close()


if __name__ == "__main__":
    data = make_synthetic_ratings(400, 100, 8000, random_state=0)
    model = FedReconMF(n_factors=8, n_rounds=20, clients_per_round=40, random_state=0,
                       aggregator=ShrunkMean(50.0), executor=TimedExecutor()).fit(data)
    print("loss", round(model.history_[-1]["loss"], 4), "client work ms",
          round(model.history_[-1]["timed_client_ms"], 2))
    print("shrink", model.get_params()["aggregator__shrink"], "- custom phases: ok")
