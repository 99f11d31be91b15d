"""fedcf: federated collaborative filtering (Federated Reconstruction for matrix factorization)."""

__version__ = "0.1.0"

from . import _numba_cache  # noqa: E402,F401  (before any kernel is compiled or loaded)
from ._registry import load_model  # noqa: E402
from .federated import FURLMF, FedAvgMF, FedReconImplicitMF, FedReconMF  # noqa: E402
from .models import CentralizedMF, ImplicitMF, LocalParams  # noqa: E402

__all__ = [
    "CentralizedMF",
    "FURLMF",
    "FedAvgMF",
    "FedReconImplicitMF",
    "FedReconMF",
    "ImplicitMF",
    "LocalParams",
    "__version__",
    "load_model",
]
