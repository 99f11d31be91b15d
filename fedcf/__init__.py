"""fedcf: federated collaborative filtering (Federated Reconstruction for matrix factorization)."""

__version__ = "0.1.0"

from .federated import FURLMF, FedAvgMF, FedReconImplicitMF, FedReconMF  # noqa: E402
from .models import CentralizedMF, GlobalParams, ImplicitMF, LocalParams  # noqa: E402

__all__ = [
    "CentralizedMF",
    "FURLMF",
    "FedAvgMF",
    "FedReconImplicitMF",
    "FedReconMF",
    "GlobalParams",
    "ImplicitMF",
    "LocalParams",
    "__version__",
]
