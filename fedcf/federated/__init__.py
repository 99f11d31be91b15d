"""Federated algorithms: Federated Reconstruction, FedAvg (server-side users), FURL (stateful),
the ranking papers' baselines (FedMF, FedNCF, PFedRec), and the phases a round is composed of
(to replace one: a custom executor or aggregator)."""

import importlib

_SUBMODULES = {  # the submodule that defines each public name, imported on first use
    ".aggregators.accounting": ("device_budget",),
    ".aggregators.dp": ("DifferentialPrivacy", "DPGaussianMean"),
    ".aggregators.robust": ("CoordinateMedian", "FoolsGoldMean", "ItemNormalizedMean",
                            "NormClippedMean", "TrimmedMean"),
    ".aggregators.secagg": ("SecureAggregation",),
    ".aggregators.weighted": ("WeightedMean",),
    ".algorithms.client_update": ("ClientUpdate", "SampledUpdate"),
    ".algorithms.early_stopping": ("EarlyStopping",),
    ".algorithms.fedncf": ("FedNCF",),
    ".algorithms.fedrecon": ("FedReconMF",),
    ".algorithms.hyper": ("Hypergradients",),
    ".algorithms.implicit": ("FedReconImplicitMF",),
    ".algorithms.items": ("CatalogLocalParams", "FullCatalog", "ItemRows", "ItemSpace",
                          "OpenCatalog"),
    ".algorithms.oov": ("OOVExpansion", "OOVLocalParams"),
    ".algorithms.reconstruction": ("Reconstruction", "RidgeReconstruction", "SGDReconstruction"),
    ".algorithms.sampled_mf": ("FedMF", "PFedRec"),
    ".algorithms.split": ("NoSplit", "RandomSplit", "SupportQuerySplit", "TimeSplit"),
    ".algorithms.stateful": ("FURLMF", "FedAvgMF"),
    ".executors.ray_executor": ("RayExecutor",),
    ".round.contracts": ("Aggregator", "ClientProgram", "Executor", "Population",
                         "RoundExecutor", "RunContext"),
    ".round.device": ("Device", "DevicePolicy", "DeviceRefusal"),
    ".round.optimizers": ("OPTIMIZERS", "SGD", "Adagrad", "Adam", "Momentum", "ServerOptimizer",
                          "Yogi"),
    ".round.phases": ("ClientOutputs", "Cohort", "GlobalDelta", "LocalExecutor",
                      "RoundHyperparams", "Selector", "server_update"),
}
_WHERE = {name: module for module, names in _SUBMODULES.items() for name in names}

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
    """A public name, imported from its submodule on first use: a process that needs one part
    (a Ray shard, a Flower node) does not pay for the estimators' imports (scikit-learn)."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    if name in _MOVED:
        raise ImportError(f"fedcf.federated.{name} moved to {_MOVED[name]}")
    raise AttributeError(f"module 'fedcf.federated' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
