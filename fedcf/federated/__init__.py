"""Federated algorithms: Federated Reconstruction, FedAvg (server-side users), FURL (stateful)."""

from .estimators import FURLMF, FedAvgMF, FedReconImplicitMF, FedReconMF
from .optimizers import OPTIMIZERS, ServerOptimizer, make_server_optimizer
from .rounds import Aggregate, RoundSample, aggregate, sample_round

__all__ = ["OPTIMIZERS", "Aggregate", "FURLMF", "FedAvgMF", "FedReconImplicitMF", "FedReconMF", "RoundSample",
           "ServerOptimizer", "aggregate", "make_server_optimizer", "sample_round"]
