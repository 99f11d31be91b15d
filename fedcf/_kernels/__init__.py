"""Numba kernels: arrays and scalars in, arrays out. Each has a NumPy twin in fedcf._reference."""

from .. import _numba_cache  # noqa: E402,F401  (Numba's cache folder before any kernel is defined)
