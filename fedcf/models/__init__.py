"""Centralized baselines (matrix factorization, implicit ALS, NeuMF) and the user-side
parameter container."""

from .base import LocalParams
from .centralized import CentralizedMF
from .implicit_mf import ImplicitMF
from .ncf import NCF

__all__ = ["CentralizedMF", "ImplicitMF", "LocalParams", "NCF"]
