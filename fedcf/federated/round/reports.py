"""The clients' hypergradient reports as an aggregate (hyper.py): each client of a reporting
cohort sends H derivatives of its query loss, and the server needs only their mean — a ratio of
sums, so it is computed like the round's update:

- in the clear (``WeightedMean``): Σ n_k g_k / Σ n_k, weighted by query size n_k;
- under secure aggregation: each client clips its report to L2 norm C (``Hypergradients``'
  ``clip_norm``), scales it by its normalised weight r_k = min(n_k, W)/W and masks
  [r_k·g_k | r_k | 1]; the server learns Σ r_k g_k / Σ r_k and the count alone;
- under differential privacy: each report is clipped to C and summed with equal weight,
  Gaussian noise N(0, σ²C²) is added (by the server, or in shares by the clients under
  ``noise="distributed"``) and the sum is divided by the fixed expected number of reporting
  clients; the accountant composes this mechanism with the round's update (dp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import secret
from .client_steps import NoiseShare, Quantize

MOD_BITS = 32  # masked sums are taken modulo 2**MOD_BITS


def fixed_point_scale(reach: float, fix: str, bits: int = MOD_BITS) -> float:
    """The largest power-of-two scale at which a signed sum of magnitude up to ``reach`` fits
    in ``bits`` bits; ``fix`` says what to lower when none does."""
    frac = int(np.floor(np.log2((2.0 ** (bits - 1) - 1) / reach)))
    if frac < 0:
        raise ValueError(f"{fix} does not fit a {bits}-bit sum; lower it")
    return 2.0 ** frac


def signed_sum(total: np.ndarray, word_bytes=None) -> np.ndarray:
    """An unmasked sum modulo 2**MOD_BITS, reduced modulo 2^(8·word_bytes) per word (None: 4
    bytes each) and read back as signed integers."""
    bits = 8 * np.broadcast_to(np.asarray(4 if word_bytes is None else word_bytes, np.int64),
                               np.shape(total))
    signed = np.asarray(total).astype(np.int64) & ((np.int64(1) << bits) - 1)
    return np.where(signed >= np.int64(1) << (bits - 1), signed - (np.int64(1) << bits), signed)


@dataclass(frozen=True)
class Reports:
    """One reporting cohort's hypergradient reports, where the clients ran.

    Parameters
    ----------
    clients : ndarray of int64
        Dense ids of the reporting clients.
    losses : ndarray (m,)
        Each client's query loss after reconstruction.
    jvp : ndarray (m, H)
        Its derivative along each of the last server step's tangents.
    weights : ndarray (m,)
        Its query size (0: nothing to report).
    """

    clients: np.ndarray
    losses: np.ndarray
    jvp: np.ndarray
    weights: np.ndarray

    def usable(self) -> np.ndarray:
        """Clients whose report counts: a query set and finite values."""
        return (self.weights > 0) & np.isfinite(self.losses) & np.isfinite(self.jvp).all(axis=1)


def weighted_mean(reports: Reports) -> np.ndarray | None:
    """Σ n_k g_k / Σ n_k over the usable reports (None when none is usable)."""
    ok = reports.usable()
    if not ok.any():
        return None
    w = reports.weights[ok]
    return (w @ reports.jvp[ok]) / w.sum()


def clipped(jvp: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled to L2 norm at most ``clip`` (float64)."""
    jvp = np.asarray(jvp, np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", jvp, jvp))
    return jvp * np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]


def dp_noise(H: int, std: float, secret_noise: bool, seed: tuple) -> np.ndarray:
    """N(0, std²) for H values: from the OS's secure generator, or seeded (insecure runs)."""
    if secret_noise:
        return secret.normal(H, std)
    return np.random.default_rng([*seed, 0x4E9]).normal(0.0, std, H)


@dataclass(frozen=True)
class ReportEncoding:
    """What every client of a reporting cohort needs to turn its report into the integers it
    masks — all public: H, the cohort size m, the clip C, the public maximum weight W (None:
    equal weights, as under DP) and the share of distributed noise. Row layout:
    [r·clip(g) (H values) | r | used], r = min(n, W)/W (or 1), all zero for a client whose
    report does not count, which the server cannot tell apart from the others."""

    H: int
    m: int
    clip: float
    max_weight: float | None = None
    noise_std: float = 0.0
    secret_noise: bool = True
    seed: tuple = (0, 0)
    adaptive = False  # no clip count travels with the reports (a device's DP rule reads it)

    @property
    def width(self) -> int:
        return self.H + 2

    def word_bytes(self) -> np.ndarray:
        """Bytes of each masked word on the wire (4: the reports are a few words)."""
        return np.full(self.width, 4, np.int64)

    def scales(self) -> np.ndarray:
        fix = f"hypergradients__clip_norm={self.clip:g} with {self.m} clients"
        values = fixed_point_scale(self.m * self.clip + 8.0 * self.noise_std * np.sqrt(self.m),
                                   fix)
        return np.concatenate([np.full(self.H, values), [fixed_point_scale(self.m, fix), 1.0]])

    def rows(self, reports: Reports) -> np.ndarray:
        """The float rows before rounding (each client's own, computed where it runs)."""
        ok = reports.usable()
        r = np.ones(len(ok)) if self.max_weight is None else \
            np.minimum(reports.weights, self.max_weight) / self.max_weight
        r = np.where(ok, r, 0.0)
        g = clipped(np.where(ok[:, None], reports.jvp, 0.0), self.clip)
        rows = np.column_stack([r[:, None] * g, r, ok.astype(np.float64)])
        return self.steps()[0](rows, reports.clients)

    def steps(self) -> tuple:
        """The device's steps after its report is clipped and weighed: its share of the noise,
        then the words (the clip bounds the values: nothing is clipped there)."""
        return (NoiseShare(self.H, self.noise_std, self.secret_noise, self.seed, (0x4E9,)),
                Quantize(self.scales()))

    def encode(self, reports: Reports) -> np.ndarray:
        """uint32 rows of every client of ``reports`` (noise shares are bounded by rounding
        to the scale, which leaves 8σ√m of headroom)."""
        return self.steps()[1](self.rows(reports), reports.clients)

    def rounding_error(self, values: np.ndarray, used: int) -> float:
        """The relative error rounding to the fixed-point step leaves in the decoded sum of
        ``used`` reports: the rounding noise's norm (each value of each client off by up to
        half a step, std step/√12) over the sum's norm (0 for a zero sum)."""
        step = 1.0 / self.scales()[0]
        noise = step * np.sqrt(max(used, 1) * self.H / 12.0)
        norm = float(np.linalg.norm(values))
        return noise / norm if norm > 0 else 0.0

    def decode(self, total: np.ndarray) -> tuple[np.ndarray, float, int]:
        """(Σ r·clip(g), Σ r, reports counted) from the unmasked sum."""
        got = signed_sum(total) / self.scales()
        return got[:self.H], float(got[self.H]), int(round(got[self.H + 1]))
