"""Randomness no one can regenerate: draws from the operating system's cryptographically secure
generator (``os.urandom``), independent of ``random_state`` and never stored in a model, a
checkpoint or a history. Differential privacy draws its noise and its Poisson cohorts here: noise
derived from a seed that is saved with the model (or set by the user) can be subtracted by anyone
who knows the seed, and subsampling amplification assumes the cohort is secret.

The uniforms carry 53 random bits; normals come from them by the Box–Muller transform, whose
largest magnitude is √(2·ln 2⁵⁴) ≈ 8.65 (the Gaussian's mass beyond it is below 10⁻¹⁷, far
below any δ in use). Floating-point noise has the usual caveat (Mironov 2012): its low-order
bits are not exactly Gaussian.

Examples
--------
>>> from fedcf.federated.round import secret
>>> z = secret.normal(100_000, scale=2.0)
>>> bool(1.9 < z.std() < 2.1), bool(abs(z.mean()) < 0.05)
(True, True)
"""

from __future__ import annotations

import os

import numpy as np


def uniform(size: int) -> np.ndarray:
    """``size`` independent uniforms in (0, 1), 53 random bits each, from ``os.urandom``."""
    size = int(size)
    bits = np.frombuffer(os.urandom(8 * size), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0 ** -53


def normal(shape, scale: float = 1.0) -> np.ndarray:
    """Independent N(0, scale²) draws of ``shape`` (Box–Muller on ``uniform``)."""
    n = int(np.prod(shape))
    half = (n + 1) // 2
    u = uniform(2 * half)
    r = np.sqrt(-2.0 * np.log(u[:half]))
    angle = 2.0 * np.pi * u[half:]
    z = np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:n]
    return (scale * z).reshape(shape)
