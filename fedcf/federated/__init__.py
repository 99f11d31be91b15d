"""Federated algorithms: Federated Reconstruction, FedAvg (server-side users), FURL (stateful),
the ranking papers' baselines (FedMF, FedNCF, PFedRec), and the phases a round is composed of
(to replace one: a custom executor or aggregator)."""

from ..models.ncf import NCF
from .aggregators import (
    CoordinateMedian,
    FoolsGoldMean,
    ItemNormalizedMean,
    NormClippedMean,
    TrimmedMean,
)
from .client_update import ClientUpdate, SampledUpdate
from .contracts import (
    Aggregator,
    ClientProgram,
    Executor,
    Population,
    RoundExecutor,
    RunContext,
)
from .dp import DifferentialPrivacy, DPGaussianMean
from .fedncf import FedNCF
from .fedrecon import FedReconMF
from .hyper import Hypergradients
from .implicit import FedReconImplicitMF
from .items import CatalogLocalParams, FullCatalog, ItemRows, ItemSpace, OpenCatalog
from .oov import OOVExpansion, OOVLocalParams
from .optimizers import OPTIMIZERS, SGD, Adagrad, Adam, Momentum, ServerOptimizer, Yogi
from .phases import (
    ClientOutputs,
    Cohort,
    GlobalDelta,
    LocalExecutor,
    RoundHyperparams,
    Selector,
    server_update,
)
from .ray_executor import RayExecutor
from .reconstruction import Reconstruction, RidgeReconstruction, SGDReconstruction
from .sampled_mf import FedMF, PFedRec
from .secagg import SecureAggregation
from .split import NoSplit, RandomSplit, SupportQuerySplit, TimeSplit
from .stateful import FURLMF, FedAvgMF
from .weighted import WeightedMean

__all__ = [
    # contracts
    "Aggregator", "ClientProgram", "Executor", "Population", "RoundExecutor", "RunContext",
    # estimators
    "FedReconMF", "FedReconImplicitMF", "FedAvgMF", "FURLMF",
    # the ranking papers' sampled-negative baselines
    "FedMF", "FedNCF", "PFedRec", "NCF",
    # aggregators
    "WeightedMean", "NormClippedMean", "DifferentialPrivacy", "DPGaussianMean",
    "SecureAggregation", "TrimmedMean", "CoordinateMedian", "FoolsGoldMean", "ItemNormalizedMean",
    # client update
    "ClientUpdate", "SampledUpdate",
    # reconstruction
    "Reconstruction", "RidgeReconstruction", "SGDReconstruction",
    # support/query split
    "SupportQuerySplit", "RandomSplit", "TimeSplit", "NoSplit",
    # learned round hyperparameters
    "Hypergradients",
    # item space
    "ItemSpace", "FullCatalog", "OpenCatalog", "ItemRows", "CatalogLocalParams",
    # out-of-catalog items on the device (OOV expansion)
    "OOVExpansion", "OOVLocalParams",
    # executors
    "LocalExecutor", "RayExecutor",
    # the round
    "ClientOutputs", "Cohort", "GlobalDelta", "RoundHyperparams", "Selector", "server_update",
    # server optimizers
    "ServerOptimizer", "SGD", "Momentum", "Adagrad", "Adam", "Yogi", "OPTIMIZERS",
]
