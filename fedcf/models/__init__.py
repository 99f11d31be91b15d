"""Centralized matrix-factorization baselines and the user-side parameter container."""

from .base import LocalParams
from .centralized import CentralizedMF
from .implicit_mf import ImplicitMF

__all__ = ["CentralizedMF", "ImplicitMF", "LocalParams"]
