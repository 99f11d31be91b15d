"""fedcf: federated collaborative filtering (Federated Reconstruction for matrix factorization).

The estimators and submodules load on first use (``fedcf.FedReconMF``, ``fedcf.federated``),
so ``import fedcf`` and the command line start without NumPy, Numba or scikit-learn.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {"load_model": "._registry", "FURLMF": ".federated", "FedAvgMF": ".federated",
         "FedReconImplicitMF": ".federated", "FedReconMF": ".federated", "FedMF": ".federated",
         "PFedRec": ".federated", "FedNCF": ".federated", "CentralizedMF": ".models",
         "ImplicitMF": ".models", "NCF": ".models", "LocalParams": ".models"}

__all__ = [
    "CentralizedMF",
    "FURLMF",
    "FedAvgMF",
    "FedMF",
    "FedNCF",
    "FedReconImplicitMF",
    "FedReconMF",
    "ImplicitMF",
    "LocalParams",
    "NCF",
    "PFedRec",
    "__version__",
    "load_model",
]


def __getattr__(name: str):
    """An estimator or a submodule, imported on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'fedcf' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'fedcf' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
