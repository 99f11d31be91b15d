"""Federated algorithms: Federated Reconstruction, FedAvg (server-side users), FURL (stateful),
and the phases a round is composed of (to replace one: a custom executor or aggregator)."""

from .aggregators import CoordinateMedian, DPGaussianMean, FoolsGoldMean, NormClippedMean, TrimmedMean
from .fedrecon import FedReconMF
from .implicit import FedReconImplicitMF
from .optimizers import OPTIMIZERS, make_server_optimizer
from .phases import (
    ClientOutputs,
    Cohort,
    GlobalDelta,
    LocalExecutor,
    RoundHyperparams,
    Selector,
    WeightedMean,
    server_update,
)
from .ray_executor import RayExecutor
from .secagg import SecureAggregation
from .stateful import FURLMF, FedAvgMF

__all__ = ["CoordinateMedian", "DPGaussianMean", "FoolsGoldMean", "NormClippedMean", "RayExecutor",
           "SecureAggregation",
           "TrimmedMean",
           "FURLMF", "OPTIMIZERS", "ClientOutputs", "Cohort", "FedAvgMF", "FedReconImplicitMF",
           "FedReconMF", "GlobalDelta", "LocalExecutor", "RoundHyperparams", "Selector",
           "WeightedMean", "make_server_optimizer", "server_update"]
