"""Parameter containers and centralized matrix-factorization baselines."""

from .base import GlobalParams, LocalParams, MFEstimatorBase
from .centralized import CentralizedMF
from .implicit_mf import ImplicitMF, item_gram

__all__ = ["CentralizedMF", "GlobalParams", "ImplicitMF", "LocalParams", "MFEstimatorBase",
           "item_gram"]
