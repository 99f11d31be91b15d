"""Numba kernels: arrays and scalars in, arrays out. Each has a NumPy twin in fedcf._reference."""
