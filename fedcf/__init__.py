"""fedcf: federated collaborative filtering (Federated Reconstruction for matrix factorization)."""

__version__ = "0.1.0"

from .models import CentralizedMF, GlobalParams, LocalParams  # noqa: E402

__all__ = ["CentralizedMF", "GlobalParams", "LocalParams", "__version__"]
