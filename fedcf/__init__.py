"""fedcf: federated collaborative filtering (Federated Reconstruction for matrix factorization)."""

__version__ = "0.1.0"

from .federated import FedAvgMF, FedReconImplicitMF, FedReconMF, FURLMF  # noqa: E402
from .models import CentralizedMF, GlobalParams, ImplicitMF, LocalParams  # noqa: E402

__all__ = ["CentralizedMF", "FURLMF", "ImplicitMF", "FedAvgMF", "FedReconImplicitMF", "FedReconMF", "GlobalParams", "LocalParams",
           "__version__"]
