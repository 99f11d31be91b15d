"""Packed parameter vectors passed to the kernels: one builder per vector, with named indices.

Kernels take a few scalars as one float64 array (numba specializes on argument types, so one
array keeps the signature small and stable). Every kernel and ``fedcf._reference`` reads these
vectors through the index names below, never through raw positions.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- mini-batch gradient steps
# [lr, lam, batch_size, max_steps, epochs, offset μ, fit_bias, joint]
HP_LR, HP_LAM, HP_BATCH, HP_STEPS, HP_EPOCHS, HP_OFFSET, HP_FIT_BIAS, HP_JOINT = range(8)


def sgd_hp(lr, lam, batch_size, max_steps, epochs, offset, fit_bias, joint=False) -> np.ndarray:
    """Settings of k mini-batch steps (reconstruction k_r or client update k_u)."""
    return np.array([lr, lam, batch_size, max_steps, epochs, offset, float(fit_bias), float(joint)],
                    dtype=np.float64)


# ---------------------------------------------------------------- explicit FedRecon client
# [split, support fraction, reconstruction method, init, init scale, ridge λ, ridge λ0]
CC_SPLIT, CC_SUPPORT_FRAC, CC_RECON, CC_INIT, CC_INIT_SCALE, CC_ALS_LAM, CC_ALS_LAM0 = range(7)
SPLIT_NONE, SPLIT_RANDOM, SPLIT_TIME = 0, 1, 2
SPLITS = {"none": SPLIT_NONE, "random": SPLIT_RANDOM, "time": SPLIT_TIME}
RECON_ALS, RECON_SGD = 0, 1
INIT_ZEROS, INIT_UNIFORM = 0, 1


def client_cfg(split: str, support_fraction, reconstruction: str, init: str, init_scale, als_lam,
               als_lam0) -> np.ndarray:
    """How a FedRecon client splits its data and reconstructs its local parameters."""
    return np.array([SPLITS[split], support_fraction,
                     RECON_ALS if reconstruction == "als" else RECON_SGD,
                     INIT_UNIFORM if init == "uniform" else INIT_ZEROS, init_scale, als_lam,
                     als_lam0], dtype=np.float64)


# ---------------------------------------------------------------- implicit FedRecon client
# [split, support fraction, confidence slope α, reconstruction λ, negatives per visit, ν,
#  item bias (0/1), user bias (0/1)]
IC_SPLIT, IC_SUPPORT_FRAC, IC_ALPHA, IC_LAM, IC_NEG, IC_NEG_WEIGHT, IC_ITEM_BIAS, IC_USER_BIAS = \
    range(8)


def implicit_cfg(split: str, support_fraction, alpha, lam, negatives, negative_weight,
                 item_bias=False, user_bias=False) -> np.ndarray:
    return np.array([SPLITS[split], support_fraction, alpha, lam, negatives, negative_weight,
                     float(item_bias), float(user_bias)], dtype=np.float64)


# ---------------------------------------------------------------- ridge solves
# [lam, lam0, offset, fit_bias]
CFG_LAM, CFG_LAM0, CFG_OFFSET, CFG_FIT_BIAS = range(4)


def ridge_cfg(lam: float, lam0: float, offset: float, fit_bias: bool) -> np.ndarray:
    return np.array([lam, lam0, offset, 1.0 if fit_bias else 0.0], dtype=np.float64)


# ---------------------------------------------------------------- SGD reconstruction at inference
# [init (INIT_ZEROS | INIT_UNIFORM), init scale]
RI_INIT, RI_SCALE = range(2)


def recon_init_cfg(init: str, init_scale) -> np.ndarray:
    return np.array([INIT_UNIFORM if init == "uniform" else INIT_ZEROS, init_scale], np.float64)


# ---------------------------------------------------------------- centralized SGD epoch
# [lr, lam, offset μ, fit_bias]
SE_LR, SE_LAM, SE_OFFSET, SE_FIT_BIAS = range(4)


def sgd_epoch_cfg(lr, lam, offset, fit_bias) -> np.ndarray:
    return np.array([lr, lam, offset, float(fit_bias)], dtype=np.float64)


# ---------------------------------------------------------------- implicit ALS
# [alpha, lam]
IA_ALPHA, IA_LAM = range(2)


def implicit_als_cfg(alpha, lam) -> np.ndarray:
    return np.array([float(alpha), float(lam)], dtype=np.float64)


# ---------------------------------------------------------------- out-of-catalog items
# [local item buckets B, row of the learned default in the global matrix (−1: none), ALS sweeps]
OC_BUCKETS, OC_DEFAULT, OC_SWEEPS = range(3)


def catalog_cfg(n_buckets: int, default_row: int, sweeps: int) -> np.ndarray:
    """Local out-of-catalog rows, the learned default's row, alternating sweeps (catalog.py)."""
    return np.array([n_buckets, default_row, sweeps], dtype=np.float64)
