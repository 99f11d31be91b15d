"""The in-process twin of a Flower run: the same users, split and fit without any message."""

from __future__ import annotations

import time

import numpy as np

from ..eval.protocols import federated_recon_eval
from ..eval.splits import user_split_indices
from ..federated.algorithms.base import run_seed
from ..federated.round.phases import LocalExecutor
from .node import load_dataset
from .settings import Settings


def fit_in_process(params: dict, data: dict, eval_fraction: float = 0.1,
                   support_fraction: float = 0.5, model: str = "fedrecon",
                   device_policy=None, partitions: int | None = None) -> tuple:
    """(model, federated ReconEval or None, fit seconds) of the ``model`` estimator with
    ``params`` fitted here on the training users a Flower run with these settings and data
    config (``node.load_dataset`` keys) would train on — what the ServerApp must reproduce bit
    for bit. ``device_policy``: the simulated devices' (as the nodes' node configs give
    theirs). With ``partitions`` (the simulation's nodes, each holding every
    ``partitions``-th user) ReconEval leaves out the users of nodes whose devices hold fewer
    evaluation users than the policy's ``min_cohort``, as those devices refuse to report."""
    inter = load_dataset(data)
    est = Settings(params=dict(params), model=model,  # the run's defaults too
                   eval_fraction=eval_fraction).check().estimator()
    est.set_params(executor=LocalExecutor(device_policy=device_policy))
    f = eval_fraction
    train, test = user_split_indices(inter.n_users, (1 - f, f), run_seed(est.random_state)) \
        if f else (np.arange(inter.n_users), np.zeros(0, np.int64))  # as the ServerApp splits
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(
            partitions, (int, np.integer)) or partitions < 1):
        raise ValueError(f"partitions must be a whole number >= 1 (the simulation's nodes), "
                         f"got {partitions!r}")
    if partitions and device_policy is not None and len(test):
        node = test % partitions
        test = test[np.bincount(node, minlength=partitions)[node] >= device_policy.min_cohort]
    t0 = time.perf_counter()
    est.fit(inter.subset_users(train))
    seconds = time.perf_counter() - t0
    evaluation = federated_recon_eval(est, inter.subset_users(test),
                                      seed=run_seed(est.random_state),
                                      support_fraction=support_fraction) if len(test) else None
    return est, evaluation, seconds
