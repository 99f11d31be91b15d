"""The in-process twin of a Flower run: the same users, split and fit without any message."""

from __future__ import annotations

import time

from ..eval.protocols import federated_recon_eval
from ..eval.splits import user_split_indices
from ..federated.algorithms.base import run_seed
from ..federated.algorithms.fedrecon import FedReconMF
from .node import load_dataset
from .settings import Settings


def fit_in_process(params: dict, data: dict, eval_fraction: float = 0.1,
                   support_fraction: float = 0.5) -> tuple:
    """(model, federated ReconEval, fit seconds) of FedReconMF(**params) fitted here on the
    training users a Flower run with these settings and data config (``node.load_dataset``
    keys) would train on — what the ServerApp must reproduce bit for bit."""
    inter = load_dataset(data)
    est = FedReconMF(**Settings(params=dict(params)).check().params)  # the run's defaults too
    train, test = user_split_indices(inter.n_users, (1 - eval_fraction, eval_fraction),
                                     run_seed(est.random_state))
    t0 = time.perf_counter()
    est.fit(inter.subset_users(train))
    seconds = time.perf_counter() - t0
    return est, federated_recon_eval(est, inter.subset_users(test), seed=run_seed(est.random_state),
                                     support_fraction=support_fraction), seconds
