"""Secure aggregation, simulated faithfully (Bonawitz et al. 2017, pairwise masking with dropout
recovery): the server learns the sum of the cohort's uploads and nothing else.

Per round, each reporting client k
1. draws a secret key sk_k, publishes pk_k = g^sk_k mod P (Diffie-Hellman over the Mersenne prime
   P = 2^127 − 1), and Shamir-shares sk_k among the cohort with threshold t;
2. turns its upload into a *dense* vector over the whole catalog (w_k·Δq for every item row, w_k·Δb,
   then w_k) — sparse uploads would reveal which rows it touched — quantizes it to fixed point
   (``frac_bits``) after clipping every coordinate to ±``value_bound``, and adds, modulo 2^32,
   the pairwise masks ±PRG(s_kj) with s_kj = pk_j^sk_k mod P (= pk_k^sk_j: both ends compute it);
3. sends the masked vector. A client may drop after step 1 (``drop_after_setup``): the server
   then collects t shares of its key from the survivors, rebuilds the key, recomputes its pair
   seeds with every survivor and removes those masks. With fewer than t survivors the round is
   lost (no update) and recorded.
The masks cancel in the sum modulo 2^32; the server dequantizes and divides by Σ w_k. With
``DifferentialPrivacy`` around it the noise is added by the server to the unmasked sum or, with
``noise="distributed"``, by the clients before masking (``masked_mean``). Clients whose
update is not finite do not take part (they can tell locally). Every number here is a real
protocol step on real arrays; only the network is simulated.
"""

from __future__ import annotations

import dataclasses

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

P = 2**127 - 1  # prime modulus of the key-agreement group and of the Shamir field
G = 3
MOD_BITS = 32


def shamir_shares(secret: int, n: int, t: int, rng: np.random.Generator) -> list[int]:
    """Shares f(1), ..., f(n) of a degree t−1 polynomial over GF(P) with f(0) = secret."""
    coeffs = [secret] + [int(rng.integers(0, 2**62)) * (2**62) + int(rng.integers(0, 2**62))
                         for _ in range(t - 1)]
    return [sum(c * pow(x, e, P) for e, c in enumerate(coeffs)) % P for x in range(1, n + 1)]


def shamir_recover(points: list[tuple[int, int]]) -> int:
    """f(0) from t points (x, f(x)) by Lagrange interpolation over GF(P)."""
    secret = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % P
                den = den * (xi - xj) % P
        secret = (secret + yi * num * pow(den, P - 2, P)) % P
    return secret


def _prg(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed & (2**64 - 1), seed >> 64]).integers(
        0, 2**MOD_BITS, size, dtype=np.uint64).astype(np.uint32)


class SecureAggregation(WeightedMean):
    """The weighted mean computed under secure aggregation (see the module docstring).

    Parameters
    ----------
    threshold : float in (0, 1] or int
        Shares needed to rebuild a dropped client's key: a share of the cohort, or a count.
    value_bound : float
        Each coordinate of w_k·Δ is clipped to ±value_bound before quantization (the sum of the
        cohort must fit in the 32-bit ring; the fixed-point scale is chosen from it).
    drop_after_setup : float in [0, 1)
        Probability that a client drops after sharing its key and before sending its vector.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import DifferentialPrivacy, SecureAggregation
    >>> agg = DifferentialPrivacy(SecureAggregation(value_bound=10.0), clip_norm=0.1,
    ...                           noise_multiplier=1.0, noise="distributed")
    >>> FedReconMF(aggregator=agg).get_params()["aggregator__aggregator__value_bound"]
    10.0
    """

    def __init__(self, threshold=0.5, value_bound: float = 1.0, drop_after_setup: float = 0.0):
        self.threshold, self.value_bound = threshold, value_bound
        self.drop_after_setup = drop_after_setup
        self.context, self.round_stats = None, {}
        self.validate()

    def validate(self):
        threshold, value_bound = self.threshold, self.value_bound
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
                threshold <= 0 or (isinstance(threshold, float) and threshold > 1):
            raise ValueError(f"threshold must be a share in (0, 1] or a count >= 1, got "
                             f"{threshold!r}")
        if not (isinstance(value_bound, (int, float)) and np.isfinite(value_bound)
                and value_bound > 0):
            raise ValueError(f"value_bound must be a finite number > 0, got {value_bound!r}")
        if not (isinstance(self.drop_after_setup, (int, float))
                and 0 <= self.drop_after_setup < 1):
            raise ValueError(f"drop_after_setup must be in [0, 1), got {self.drop_after_setup!r}")

    linear = False  # the protocol runs on every client's masked vector

    def bind(self, context: RunContext) -> SecureAggregation:
        self.validate()
        bound = SecureAggregation(self.threshold, self.value_bound, self.drop_after_setup)
        bound.context = context
        if isinstance(self.threshold, int) and self.threshold > context.clients_per_round:
            raise ValueError(f"threshold={self.threshold} is larger than the cohort "
                             f"(clients_per_round={context.clients_per_round}): no key of a "
                             "dropped client could ever be rebuilt")
        return bound

    def _t(self, m: int) -> int:
        t = self.threshold if isinstance(self.threshold, int) else int(np.ceil(self.threshold * m))
        return max(1, t)

    def dense_uploads(self, out: ClientOutputs, w: np.ndarray, clients: np.ndarray):
        """What each taking-part client would send before masking: [w·Δq rows | w·Δb | w]."""
        n_items, K = self.context.n_items, out.d_Q.shape[1]
        X = np.zeros((len(clients), n_items * (K + 1) + 1))
        for r, k in enumerate(clients):
            lo, hi = out.offsets[k], out.offsets[k + 1]
            rows = out.items[lo:hi]
            ok = rows >= 0
            block = X[r, :n_items * (K + 1)].reshape(n_items, K + 1)
            block[rows[ok], :K] = w[k] * out.d_Q[lo:hi][ok]
            block[rows[ok], K] = w[k] * out.d_b[lo:hi][ok]
            X[r, -1] = w[k]
        return X

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        return self.masked_mean(out, hp, round_idx)

    def masked_mean(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0, *,
                    factors=None, denominator=None, noise_scale: float = 0.0,
                    secret_noise: bool = True) -> GlobalDelta:
        """The cohort's aggregate, learned by the server only as the unmasked sum.

        Plain: each client sends w_k·Δ_k and w_k; the server divides the sum by Σ w_k. Under
        ``DifferentialPrivacy``: client k sends ``factors[k]``·Δ_k (clipped, capped weight) and
        1, the sum is divided by the fixed ``denominator``, and with ``noise_scale`` = σC each
        client adds its share N(0, σ²C²/t) before masking (distributed noise), from the OS's
        secure generator unless ``secret_noise`` is False. A lost round (fewer than t
        survivors) gives no update."""
        c = self.context
        n_items, K = c.n_items, out.d_Q.shape[1]
        bad, w, n_empty = client_weights(out, hp)
        clients = np.flatnonzero(w > 0)
        rng = np.random.default_rng([c.seed, round_idx, 0x5EC])
        m = len(clients)
        X = self.dense_uploads(out, w if factors is None else factors, clients)
        if factors is not None:
            X[:, -1] = 1.0
        noise_std = noise_scale / np.sqrt(self._t(m)) if noise_scale and m else 0.0
        summed, survivors, exact = self.protocol(X, rng, noise_std, secret_noise)
        self.round_stats = {"secagg_taking_part": m, "secagg_survivors": int(len(survivors)),
                            "secagg_lost_round": summed is None}
        w_used = np.zeros_like(w)
        w_used[clients[survivors]] = w[clients[survivors]]
        summary = dataclasses.replace(summarize(out, hp), n_used=int(len(survivors)))
        if summed is None or summed[-1] <= 0:
            return empty_delta(K, dataclasses.replace(summary, n_used=0), w_used * 0)
        total = summed[-1] if denominator is None else denominator
        self.round_stats["secagg_max_quantization_error"] = float(
            np.abs(summed - exact).max() / total)
        block = (summed[:-1] / total).reshape(n_items, K + 1)
        return GlobalDelta(np.arange(n_items), block[:, :K], block[:, K], None, summary,
                           int(len(survivors)) * X.shape[1], w_used)

    def protocol(self, X: np.ndarray, rng: np.random.Generator, noise_std: float = 0.0,
                 secret_noise: bool = True):
        """Run the masking protocol on the dense uploads X (one row per client), each client
        adding N(0, noise_std²) to its values (not to its weight) before masking. Returns (the
        unmasked dequantized sum or None if the round is lost, survivor rows, exact float sum
        of the survivors' clipped uploads, noise included)."""
        m, d = X.shape
        if m == 0:
            return None, np.zeros(0, np.int64), None
        t = self._t(m)
        # room for m clipped values plus the summed noise out to 8 standard deviations
        reach = m * max(self.value_bound, X[:, -1].max()) + 8.0 * noise_std * np.sqrt(m)
        frac_bits = int(np.floor(np.log2((2.0 ** (MOD_BITS - 1) - 1) / reach)))
        if frac_bits < 0:
            raise ValueError(f"value_bound={self.value_bound} and client weights up to "
                             f"{X[:, -1].max():g} do not fit {m} clients in a {MOD_BITS}-bit "
                             "sum; lower value_bound or use client_weighting='uniform'")
        scale = 2.0 ** frac_bits
        clipped = np.clip(X, -self.value_bound, self.value_bound)
        clipped[:, -1] = X[:, -1]
        if noise_std > 0:  # each client's own share, drawn on its device
            clipped[:, :-1] += secret.normal((m, d - 1), noise_std) if secret_noise else \
                rng.normal(0.0, noise_std, (m, d - 1))
        quant = np.round(clipped * scale).astype(np.int64).astype(np.uint32)
        sk = [int(rng.integers(1, 2**62)) * 2**64 + int(rng.integers(0, 2**62)) for _ in range(m)]
        pk = [pow(G, s, P) for s in sk]
        shares = [shamir_shares(s, m, t, rng) for s in sk]  # shares[k][j]: k's key, held by j
        survivors = np.flatnonzero(rng.random(m) >= self.drop_after_setup)
        if len(survivors) < t:
            return None, survivors, None
        total = np.zeros(d, np.uint32)
        for k in survivors:  # each survivor's masked vector, summed as it arrives
            total += masked(quant[k], k, sk[k], pk, m)
        for dropped in sorted(set(range(m)) - set(survivors.tolist())):
            key = shamir_recover([(int(j) + 1, shares[dropped][j]) for j in survivors[:t]])
            for j in survivors:  # remove the mask j added for its pair with the dropped client
                seed = pow(pk[j], key, P)
                total -= _prg(seed, d) if j < dropped else -_prg(seed, d)
        signed = total.astype(np.int64)
        signed[signed >= 2**(MOD_BITS - 1)] -= 2**MOD_BITS
        return signed / scale, survivors, clipped[survivors].sum(axis=0)


def masked(q: np.ndarray, k: int, sk_k: int, pk: list, m: int) -> np.ndarray:
    """Client k's vector modulo 2^32: q + Σ_{j>k} PRG(s_kj) − Σ_{j<k} PRG(s_kj)."""
    y = q.copy()
    for j in range(m):
        if j != k:
            mask = _prg(pow(pk[j], sk_k, P), len(q))
            y = y + mask if k < j else y - mask
    return y
