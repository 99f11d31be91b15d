"""Parameter containers and centralized matrix-factorization baselines."""

from .base import GlobalParams, LocalParams, MFEstimatorBase
from .centralized import CentralizedMF

__all__ = ["CentralizedMF", "GlobalParams", "LocalParams", "MFEstimatorBase"]
