"""Federated algorithms: Federated Reconstruction, FedAvg (server-side users), FURL (stateful),
the ranking papers' baselines (FedMF, FedNCF, PFedRec), and the phases a round is composed of
(to replace one: a custom executor or aggregator)."""

from .aggregators.accounting import device_budget
from .aggregators.dp import DifferentialPrivacy, DPGaussianMean
from .aggregators.robust import (
    CoordinateMedian,
    FoolsGoldMean,
    ItemNormalizedMean,
    NormClippedMean,
    TrimmedMean,
)
from .aggregators.secagg import SecureAggregation
from .aggregators.weighted import WeightedMean
from .algorithms.client_update import ClientUpdate, SampledUpdate
from .algorithms.early_stopping import EarlyStopping
from .algorithms.fedncf import FedNCF
from .algorithms.fedrecon import FedReconMF
from .algorithms.hyper import Hypergradients
from .algorithms.implicit import FedReconImplicitMF
from .algorithms.items import CatalogLocalParams, FullCatalog, ItemRows, ItemSpace, OpenCatalog
from .algorithms.oov import OOVExpansion, OOVLocalParams
from .algorithms.reconstruction import Reconstruction, RidgeReconstruction, SGDReconstruction
from .algorithms.sampled_mf import FedMF, PFedRec
from .algorithms.split import NoSplit, RandomSplit, SupportQuerySplit, TimeSplit
from .algorithms.stateful import FURLMF, FedAvgMF
from .executors.ray_executor import RayExecutor
from .round.contracts import (
    Aggregator,
    ClientProgram,
    Executor,
    Population,
    RoundExecutor,
    RunContext,
)
from .round.device import Device, DevicePolicy, DeviceRefusal
from .round.optimizers import OPTIMIZERS, SGD, Adagrad, Adam, Momentum, ServerOptimizer, Yogi
from .round.phases import (
    ClientOutputs,
    Cohort,
    GlobalDelta,
    LocalExecutor,
    RoundHyperparams,
    Selector,
    server_update,
)

__all__ = [
    # contracts
    "Aggregator", "ClientProgram", "Executor", "Population", "RoundExecutor", "RunContext",
    # estimators
    "FedReconMF", "FedReconImplicitMF", "FedAvgMF", "FURLMF",
    # the ranking papers' sampled-negative baselines
    "FedMF", "FedNCF", "PFedRec",
    # aggregators
    "WeightedMean", "NormClippedMean", "DifferentialPrivacy", "DPGaussianMean",
    "SecureAggregation", "TrimmedMean", "CoordinateMedian", "FoolsGoldMean", "ItemNormalizedMean",
    # client update
    "ClientUpdate", "SampledUpdate",
    # reconstruction
    "Reconstruction", "RidgeReconstruction", "SGDReconstruction",
    # support/query split
    "SupportQuerySplit", "RandomSplit", "TimeSplit", "NoSplit",
    # the kept round (held-out users), learned round hyperparameters
    "EarlyStopping", "Hypergradients",
    # item space
    "ItemSpace", "FullCatalog", "OpenCatalog", "ItemRows", "CatalogLocalParams",
    # out-of-catalog items on the device (OOV expansion)
    "OOVExpansion", "OOVLocalParams",
    # executors, and the device's own rules where its clients run
    "LocalExecutor", "RayExecutor", "DevicePolicy", "Device", "DeviceRefusal", "device_budget",
    # the round
    "ClientOutputs", "Cohort", "GlobalDelta", "RoundHyperparams", "Selector", "server_update",
    # server optimizers
    "ServerOptimizer", "SGD", "Momentum", "Adagrad", "Adam", "Yogi", "OPTIMIZERS",
]

_MOVED = {"NCF": "fedcf.NCF (fedcf.models.ncf): centralized NCF is not a federated estimator"}


def __getattr__(name: str):
    if name in _MOVED:
        raise ImportError(f"fedcf.federated.{name} moved to {_MOVED[name]}")
    raise AttributeError(f"module 'fedcf.federated' has no attribute {name!r}")
