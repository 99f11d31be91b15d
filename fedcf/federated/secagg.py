"""The weighted mean under secure aggregation: each client's dense upload is quantized,
masked by the client half of ``secagg_protocol`` (X25519, HKDF, AES-GCM, Ed25519, ChaCha20 and
Shamir sharing from ``cryptography`` and ``pycryptodome``; secrets from the OS), and the server
half learns only the sum over the surviving cohort.

Per round, each client k taking part (finite, non-empty upload)
1. turns its upload into a *dense* vector over the whole catalog — sparse uploads would reveal
   which rows it touched — scaled by its normalised weight min(w_k, W)/W with the public
   maximum W = ``max_weight`` (under DP: its clip factor), followed by that weight and by how
   many of its coordinates it clipped;
2. clips each value to ±``value_bound`` and quantizes it to fixed point with a scale that
   depends only on public figures (the cohort size, ``value_bound``, the DP noise);
3. runs the five message rounds of the protocol. Clients that vanish after sharing their keys
   (``drop_after_setup``) are unmasked from the survivors' shares.
The server dequantizes the sum and divides by the summed weight (or the DP denominator). A
round is not aggregated — no update, counted in the history — when the cohort is below
``min_cohort`` or fewer than the threshold survive. With ``DifferentialPrivacy`` around it the
noise is added by the server to the unmasked sum or, with ``noise="distributed"``, by each
client before quantization (a Gaussian share; the rounding to fixed point is not part of the DP
analysis: its gap is one quantization step per client and coordinate, reported).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from . import secret
from .contracts import RunContext
from .phases import (
    ClientOutputs,
    GlobalDelta,
    RoundHyperparams,
    WeightedMean,
    client_weights,
    empty_delta,
    summarize,
)
from .secagg_protocol import ProtocolAbort, simulate

MOD_BITS = 32
CLIP_WARNING = 1e-3  # share of clipped coordinates above which a round warns


def quantize(X: np.ndarray, value_bound: float, m: int, noise_std: float = 0.0,
             n_values: int | None = None):
    """(uint32 rows [fixed point of X | clip count], fractional bits) of the dense uploads X:
    its first ``n_values`` columns (default all but the last) clipped to ±value_bound and
    counted, the rest (counts and a weight, each in [0, 1]) kept; the scale chosen from public
    figures only (the cohort size m, the bound, the noise) so that m rows sum without overflow
    out to 8 standard deviations of the summed noise."""
    n_values = X.shape[1] - 1 if n_values is None else n_values
    reach = m * max(value_bound, 1.0) + 8.0 * noise_std * np.sqrt(m)
    frac_bits = int(np.floor(np.log2((2.0 ** (MOD_BITS - 1) - 1) / reach)))
    if frac_bits < 0:
        raise ValueError(f"value_bound={value_bound} does not fit {m} clients in a {MOD_BITS}-bit "
                         "sum; lower value_bound")
    clipped = X.copy()
    clipped[:, :n_values] = np.clip(X[:, :n_values], -value_bound, value_bound)
    q = np.empty((X.shape[0], X.shape[1] + 1), np.uint32)
    q[:, :-1] = np.round(clipped * 2.0 ** frac_bits).astype(np.int64).astype(np.uint32)
    q[:, -1] = np.count_nonzero(clipped != X, axis=1)  # summed inside the protocol
    return q, frac_bits


class SecureAggregation(WeightedMean):
    """The weighted mean computed under secure aggregation (see the module docstring).

    Parameters
    ----------
    threshold : float in (0.5, 1) or int
        Shares needed to rebuild a client's secret: t = ⌊share·m⌋ + 1 of a cohort of m (> m/2
        always; the default 2/3 gives t > 2m/3, the bound for a malicious server), or a count,
        which must exceed m/2 in every round (else the round is not aggregated).
    value_bound : float
        Each value of a client's normalised upload is clipped to ±value_bound before
        quantization (counted: ``secagg_clipped`` in the history, a warning above 0.1 %).
    max_weight : float
        The public maximum client weight W: client k's upload is scaled by min(w_k, W)/W (its
        weight capped at W; weights are query sizes by default). Ignored under DP.
    min_cohort : int
        Rounds with fewer clients taking part are not aggregated: the sum of a very small
        cohort reveals its members' uploads (eval/PRIVACY.md measures by cohort size).
    drop_after_setup : float in [0, 1)
        Probability that a client drops after sharing its keys and before sending its vector.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import DifferentialPrivacy, SecureAggregation
    >>> agg = DifferentialPrivacy(SecureAggregation(value_bound=10.0), clip_norm=0.1,
    ...                           noise_multiplier=1.0, noise="distributed")
    >>> FedReconMF(aggregator=agg).get_params()["aggregator__aggregator__value_bound"]
    10.0
    """

    def __init__(self, threshold=2 / 3, value_bound: float = 1.0, max_weight: float = 1000.0,
                 min_cohort: int = 10, drop_after_setup: float = 0.0):
        self.threshold, self.value_bound = threshold, value_bound
        self.max_weight, self.min_cohort = max_weight, min_cohort
        self.drop_after_setup = drop_after_setup
        self.context, self.round_stats = None, {}
        self.validate()

    def validate(self):
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer,
                                                                     np.floating)) or \
                (isinstance(threshold, (float, np.floating)) and not 0.5 <= threshold < 1) or \
                (isinstance(threshold, (int, np.integer)) and threshold < 2):
            raise ValueError(f"threshold must be a share in [0.5, 1) of the cohort (t = "
                             f"floor(share·m) + 1 > m/2) or a count >= 2, got {threshold!r}")
        for name in ("value_bound", "max_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and np.isfinite(v)
                                           and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if isinstance(self.min_cohort, bool) or not isinstance(self.min_cohort, (int, np.integer)) \
                or self.min_cohort < 2:
            raise ValueError(f"min_cohort must be an integer >= 2 (a cohort of one reveals its "
                             f"upload as the sum), got {self.min_cohort!r}")
        if not (isinstance(self.drop_after_setup, (int, float))
                and 0 <= self.drop_after_setup < 1):
            raise ValueError(f"drop_after_setup must be in [0, 1), got {self.drop_after_setup!r}")

    linear = False  # the protocol runs on every client's masked vector

    def bind(self, context: RunContext) -> SecureAggregation:
        self.validate()
        bound = SecureAggregation(self.threshold, self.value_bound, self.max_weight,
                                  self.min_cohort, self.drop_after_setup)
        bound.context = context
        m = context.clients_per_round
        if isinstance(self.threshold, (int, np.integer)) and self.threshold > m:
            raise ValueError(f"threshold={self.threshold} is larger than the cohort "
                             f"(clients_per_round={m}): no round could ever be unmasked")
        if self.min_cohort > m:
            raise ValueError(f"min_cohort={self.min_cohort} is larger than the cohort "
                             f"(clients_per_round={m}): no round would be aggregated; raise "
                             "clients_per_round or lower min_cohort")
        return bound

    def threshold_for(self, m: int) -> int | None:
        """t for a cohort of m, or None when no t > m/2 (and >= min_cohort) fits."""
        t = int(self.threshold) if isinstance(self.threshold, (int, np.integer)) else \
            int(np.floor(self.threshold * m)) + 1
        t = max(t, int(self.min_cohort))
        return t if m / 2 < t <= m else None

    def dense_uploads(self, out: ClientOutputs, scale: np.ndarray, clients: np.ndarray):
        """What each taking-part client would send before masking: [scale·Δq rows | scale·Δb
        | scale]."""
        n_items, K = self.context.n_items, out.d_Q.shape[1]
        X = np.zeros((len(clients), n_items * (K + 1) + 1))
        for r, k in enumerate(clients):
            lo, hi = out.offsets[k], out.offsets[k + 1]
            rows = out.items[lo:hi]
            ok = rows >= 0
            block = X[r, :n_items * (K + 1)].reshape(n_items, K + 1)
            block[rows[ok], :K] = scale[k] * out.d_Q[lo:hi][ok]
            block[rows[ok], K] = scale[k] * out.d_b[lo:hi][ok]
            X[r, -1] = scale[k]
        return X

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        return self.masked_mean(out, hp, round_idx)

    def masked_mean(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0, *,
                    factors=None, denominator=None, noise_scale: float = 0.0,
                    secret_noise: bool = True, indicators=None) -> GlobalDelta:
        """The cohort's aggregate, learned by the server only as the unmasked sum.

        Plain: client k sends s_k·Δ_k and s_k with s_k = min(w_k, W)/W; the server divides
        the sum by Σ s_k. Under ``DifferentialPrivacy``: client k sends ``factors[k]``·Δ_k
        (clipped, capped weight) and 1, the sum is divided by the fixed ``denominator``, and
        with ``noise_scale`` = σC each client adds its share N(0, σ²C²/t) before quantization
        (distributed noise), from the OS's secure generator unless ``secret_noise`` is False.
        ``indicators`` (0/1 per client, e.g. "my upload was not clipped" for adaptive
        clipping) ride in the secure sum: only their total over the survivors is learned
        (``round_stats["secagg_indicator_sum"]``). A round not aggregated gives no update."""
        K, n_values = out.d_Q.shape[1], self.context.n_items * (out.d_Q.shape[1] + 1)
        _, w, _ = client_weights(out, hp)
        clients = np.flatnonzero(w > 0)
        m = len(clients)
        scale = np.minimum(w, self.max_weight) / self.max_weight if factors is None else factors
        X = self.dense_uploads(out, scale, clients)
        if factors is not None:
            X[:, -1] = 1.0
        if indicators is not None:
            X = np.column_stack([X[:, :-1], np.asarray(indicators, float)[clients], X[:, -1]])
        t = self.threshold_for(m)
        noise_std = noise_scale / np.sqrt(t) if noise_scale and t else 0.0
        rng = np.random.default_rng([self.context.seed, round_idx, 0x5EC])  # dropouts only
        summed, survivors, exact = self.protocol(X, t, rng, noise_std, secret_noise, n_values)
        w_used = np.zeros_like(w)
        w_used[clients[survivors]] = w[clients[survivors]]
        summary = dataclasses.replace(summarize(out, hp), n_used=int(len(survivors)))
        if summed is None or summed[-1] <= 0:
            return empty_delta(K, dataclasses.replace(summary, n_used=0), w_used * 0)
        if indicators is not None:
            self.round_stats["secagg_indicator_sum"] = int(round(summed[n_values]))
        total = summed[-1] if denominator is None else denominator
        self.round_stats["secagg_error"] = float(np.abs(summed - exact).max() / total)
        block = (summed[:n_values] / total).reshape(self.context.n_items, K + 1)
        return GlobalDelta(np.arange(self.context.n_items), block[:, :K], block[:, K], None,
                           summary, int(len(survivors)) * (X.shape[1] + 1), w_used)

    def protocol(self, X: np.ndarray, t: int | None, rng: np.random.Generator,
                 noise_std: float = 0.0, secret_noise: bool = True, n_values: int | None = None):
        """Quantize the dense uploads X (one row per client: ``n_values`` values, then counts
        and a weight in [0, 1]; each client adds N(0, noise_std²) to its values first) and
        aggregate them with the protocol. Returns (the dequantized sum of the survivors or
        None when the round is not aggregated, survivor rows, the exact float sum of the
        survivors' *unclipped* uploads with their noise)."""
        m, d = X.shape
        n_values = d - 1 if n_values is None else n_values
        self.round_stats = {"secagg_taking_part": m, "secagg_survivors": 0,
                            "secagg_lost_round": True, "secagg_threshold": t,
                            "secagg_below_min_cohort": m < self.min_cohort}
        none = (None, np.zeros(0, np.int64), None)
        if t is None:
            return none
        noisy = X.copy()
        if noise_std > 0:  # each client's own share, drawn on its device
            noisy[:, :n_values] += secret.normal((m, n_values), noise_std) if secret_noise \
                else rng.normal(0.0, noise_std, (m, n_values))
        q, frac_bits = quantize(noisy, self.value_bound, m, noise_std, n_values)
        dropped = np.flatnonzero(rng.random(m) < self.drop_after_setup)
        try:
            total, u3, server = simulate(q, range(m), t, drop_after_shares=dropped)
        except ProtocolAbort as e:
            self.round_stats["secagg_abort"] = str(e)
            return none
        survivors = np.asarray(u3, np.int64)
        signed = total.astype(np.int64)
        signed[signed >= 2 ** (MOD_BITS - 1)] -= 2 ** MOD_BITS
        clipped_total = int(signed[d])  # (column d: each client's clip count)
        self.round_stats.update(
            secagg_survivors=len(survivors), secagg_lost_round=False,
            secagg_clipped=clipped_total,
            secagg_clipped_share=clipped_total / (len(u3) * n_values),
            secagg_bytes_per_client=server.bytes_received() / m)
        if clipped_total > CLIP_WARNING * len(u3) * n_values:
            warnings.warn(f"secure aggregation clipped {clipped_total} of "
                          f"{len(u3) * n_values} values "
                          f"to ±value_bound={self.value_bound:g} this round: the aggregate is "
                          "biased; raise value_bound (or max_weight)", RuntimeWarning,
                          stacklevel=4)
        return signed[:d] / 2.0 ** frac_bits, survivors, noisy[survivors].sum(axis=0)
