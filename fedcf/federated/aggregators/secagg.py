"""The weighted mean under secure aggregation: each client's dense upload is quantized,
masked by the client half of ``secagg_protocol`` (X25519, HKDF, AES-GCM, Ed25519 and AES-CTR
from ``cryptography``, Shamir sharing vectorised in ``shamir``; secrets from the OS), and the server
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

import functools
import numbers
import os
import warnings

import numpy as np

from ..round.contracts import RunContext
from ..round.device import Device, DeviceRefusal, model_digest
from ..round.phases import (
    ClientOutputs,
    GlobalDelta,
    RoundHyperparams,
    RoundSummary,
    empty_delta,
)
from ..round.reports import ReportEncoding, Reports
from .secagg_client import Encoding, SecureJob
from .secagg_protocol import ProtocolAbort, SecAggServer, run_round
from .weighted import WeightedMean

CLIP_WARNING = 1e-3  # share of clipped coordinates above which a round warns


def warn_if_masked_on_driver(executor, aggregator) -> None:
    """Say so when the clients run elsewhere (Ray shards) but the protocol's client halves
    run in the driver: each upload then travels to the driver in the clear."""
    if isinstance(aggregator.inner, SecureAggregation) and executor.supports_partials \
            and not executor.supports_secure:
        warnings.warn("SecureAggregation with a remote executor: the protocol's client halves "
                      "run in the driver's process, so each client's upload travels from its "
                      "shard to the driver in the clear; only a server outside the driver sees "
                      "masked vectors alone", UserWarning, stacklevel=4)


REPORT_ROUNDING = 0.05  # relative rounding error of the hypergradient reports that warns

# what neighbours="auto" assumes: a share of colluding clients, a dropout rate (at least), and
# the failure probabilities it allows (privacy 2^-PRIVACY_BITS, a lost round 2^-ROUND_BITS)
AUTO_CORRUPT, AUTO_DROPOUT, PRIVACY_BITS, ROUND_BITS = 0.1, 0.1, 40, 20


@functools.lru_cache(maxsize=256)
def plus_neighbours(m: int, share: float = 2 / 3, *, dropout: float = AUTO_DROPOUT,
                    corrupt: float = AUTO_CORRUPT, privacy_bits: int = PRIVACY_BITS,
                    round_bits: int = ROUND_BITS) -> int | None:
    """The smallest even SecAgg+ degree k for a cohort of m whose ring (``share_graph``: the
    client and k/2 neighbours on either side, h = k + 1 holders, threshold t = ⌊share·h⌋ + 1)
    keeps three union bounds over the m clients, positions on the ring being uniformly random
    and each client independently colluding (``corrupt``) or dropping before its masked
    vector (``dropout``):

    - no client has t colluding holders among its other h − 1 (they would rebuild both of its
      seeds): m · P[Bin(h − 1, corrupt) ≥ t] ≤ 2^−privacy_bits;
    - the honest survivors' pairwise masks stay connected, so the server learns only their
      whole sum: a split needs a run of k/2 colluding or dropped clients on the ring,
      m · (corrupt + dropout)^(k/2) ≤ 2^−privacy_bits;
    - the round completes (every client keeps t surviving holders besides itself):
      m · P[Bin(h − 1, 1 − dropout) < t] ≤ 2^−round_bits.

    Returns None — every pair (Bonawitz et al.) — when no k below m − 1 meets them (small
    cohorts). Bell et al. (2020) bound an Erdős–Rényi graph the same way; this is the ring's
    own bound. A server that deviates can draw fresh rings (leave adverts out), each winning
    with probability at most 2^−privacy_bits / m against one client."""
    from scipy.stats import binom

    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a cohort size (an integer >= 1), got {m!r}")
    for name, v, lo, hi in (("share", share, 0.5, 1.0), ("dropout", dropout, 0.0, 1.0),
                            ("corrupt", corrupt, 0.0, 1.0)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not lo <= v < hi:
            raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}), got {v!r}")
    for name, v in (("privacy_bits", privacy_bits), ("round_bits", round_bits)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v <= 1000:
            raise ValueError(f"{name} must be a number of bits in (0, 1000], got {v!r}")
    half = np.arange(1, max((m - 2) // 2 + 1, 1))  # h = 2·half + 1 < m
    h = 2 * half + 1
    t = np.floor(share * h).astype(np.int64) + 1
    ok = ((m * binom.sf(t - 1, h - 1, corrupt) <= 2.0 ** -privacy_bits)
          & (m * (corrupt + dropout) ** half.astype(float) <= 2.0 ** -privacy_bits)
          & (m * binom.cdf(t - 1, h - 1, 1 - dropout) <= 2.0 ** -round_bits))
    return int(h[ok][0] - 1) if ok.any() else None


class SecureAggregation(WeightedMean):
    """The weighted mean computed under secure aggregation (see the module docstring).

    Parameters
    ----------
    threshold : float in [0.5, 1) or int
        Shares needed to rebuild a client's secret: t = ⌊share·h⌋ + 1 of its h share holders
        (the cohort m, or k + 1 with ``neighbours``; > h/2 always; the default 2/3 gives
        t > 2h/3, the bound for a malicious server), or a count, which must exceed h/2 in
        every round (else the round is not aggregated).
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
    neighbours : "auto", int or None, default "auto"
        None: every pair of clients masks and holds shares (Bonawitz et al.). An integer k:
        the SecAgg+ graph of Bell et al. 2020 — each client masks with, and shares with, its
        k nearest clients on a ring ordered by a hash of the round's advertised keys, so a
        client's work grows with k instead of m and the threshold applies among the k + 1
        holders (eval/PRIVACY.md measures the cost). "auto": per round, the k of
        ``plus_neighbours`` for the cohort (of order log m; at most 10 % colluding clients,
        dropouts at the larger of 10 % and ``drop_after_setup``, failures below 2⁻⁴⁰ for
        privacy and 2⁻²⁰ for the round), and every pair for cohorts too small to gain or
        with a threshold given as a count.
    precision : int or None, default None
        None: each value travels in a 4-byte word at the finest step the cohort's sum allows.
        An integer p: each value of the dense upload is rounded to a step of at most
        value_bound·2^−p and travels in the fewest whole bytes that hold the cohort's sum at
        that step (``Encoding.word_bytes``; e.g. 3 bytes at p = 16 for cohorts up to 127 with
        ``value_bound`` 1). The width is a public function of the cohort size,
        ``value_bound``, the noise and p; each masked word stays uniform given the sum
        (eval/PRIVACY.md). The step is relative to ``value_bound``, not to the values: with
        the default bounds a client's weighted values are far below it, and in a two-round
        FedNCF test p = 16 moved the network's weights far outside the plain mean's
        tolerance — set ``value_bound`` near the values before lowering the width
        (eval/PRIVACY.md measures the trade).

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
                 min_cohort: int = 10, drop_after_setup: float = 0.0,
                 neighbours: int | str | None = "auto", precision: int | None = None):
        self.threshold, self.value_bound = threshold, value_bound
        self.max_weight, self.min_cohort = max_weight, min_cohort
        self.drop_after_setup, self.neighbours = drop_after_setup, neighbours
        self.precision = precision
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
        for name, v in (("value_bound", self.value_bound), ("max_weight", self.max_weight)):
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and np.isfinite(v)
                                           and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if isinstance(self.min_cohort, bool) or not isinstance(self.min_cohort, (int, np.integer)) \
                or self.min_cohort < 2:
            raise ValueError(f"min_cohort must be an integer >= 2 (a cohort of one reveals its "
                             f"upload as the sum), got {self.min_cohort!r}")
        drop = self.drop_after_setup
        if isinstance(drop, bool) or not (isinstance(drop, numbers.Real) and 0 <= drop < 1):
            raise ValueError(f"drop_after_setup must be in [0, 1), got {self.drop_after_setup!r}")
        p = self.precision
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, np.integer))
                              or not 1 <= p <= 30):
            raise ValueError(f"precision must be None (4-byte words) or a number of bits in "
                             f"[1, 30] below value_bound, got {p!r}")
        k = self.neighbours
        if k is not None and not (isinstance(k, str) and k == "auto") and (
                isinstance(k, (bool, str)) or not isinstance(k, (int, np.integer)) or k < 2):
            raise ValueError(f"neighbours must be 'auto' (the SecAgg+ degree from the cohort), "
                             f"None (every pair) or an integer >= 2 (the SecAgg+ graph "
                             f"degree), got {k!r}")

    linear = False  # the protocol runs on every client's masked vector
    secure = True

    def bind(self, context: RunContext) -> SecureAggregation:
        self.validate()
        bound = SecureAggregation(self.threshold, self.value_bound, self.max_weight,
                                  self.min_cohort, self.drop_after_setup, self.neighbours,
                                  self.precision)
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

    def degree(self, m: int) -> int | None:
        """The SecAgg+ degree of a round whose cohort has m clients (None: every pair)."""
        if not (isinstance(self.neighbours, str) and self.neighbours == "auto"):
            return None if self.neighbours is None else int(self.neighbours)
        if isinstance(self.threshold, (int, np.integer)):
            return None
        return plus_neighbours(m, float(self.threshold),
                               dropout=max(AUTO_DROPOUT, float(self.drop_after_setup)))

    def holders(self, m: int) -> int:
        """How many clients hold each client's shares: the cohort, or with a SecAgg+ degree
        (``degree``) the client and its neighbours on the ring."""
        k = self.degree(m)
        return m if k is None or k >= m - 1 else 2 * ((k + 1) // 2) + 1

    def threshold_for(self, m: int) -> int | None:
        """t for a cohort of m (of the share holders, with ``neighbours``), or None when no
        t > holders/2 fits, or the cohort is below ``min_cohort``."""
        h = self.holders(m)
        t = int(self.threshold) if isinstance(self.threshold, (int, np.integer)) else \
            int(np.floor(self.threshold * h)) + 1
        if h == m:  # every pair: the threshold also keeps the survivors >= min_cohort
            t = max(t, int(self.min_cohort))
        return t if h / 2 < t <= h and m >= self.min_cohort else None

    def encoding(self, m: int, round_idx: int = 0, *, clip=None, noise_scale: float = 0.0,
                 secret_noise: bool = True, adaptive: bool = False,
                 count_noise_scale: float = 0.0) -> Encoding:
        """The public encoding of a round whose cohort has m clients (see ``Encoding``);
        distributed noise N(0, noise_scale²/t) per client, and N(0, count_noise_scale²/t) on
        the adaptive clip's centred bit (``adaptive``)."""
        t = self.threshold_for(m)
        c = self.context

        def share(scale):
            return scale / np.sqrt(t) if scale and t else 0.0
        return Encoding(c.n_items, c.n_factors, max(m, 1), float(self.value_bound),
                        float(self.max_weight), noise_std=share(noise_scale),
                        count_noise_std=share(count_noise_scale), adaptive=bool(adaptive),
                        secret_noise=secret_noise, seed=(int(c.seed), int(round_idx)),
                        clip=None if clip is None else float(clip[0]),
                        weight_cap=None if clip is None or clip[1] is None else float(clip[1]),
                        exponent=bool(c.learns_exponent),
                        precision=None if self.precision is None else int(self.precision))

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        return self.masked_mean(out, hp, round_idx)

    def masked_mean(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0, *,
                    clip=None, denominator=None, noise_scale: float = 0.0,
                    secret_noise: bool = True, device=None, **count) -> GlobalDelta:
        """The cohort's aggregate from uploads held in this process: each client's half
        encodes and masks here, under ``device`` (a ``Device``; None: one with the default
        ``DevicePolicy``).

        Plain: client k sends s_k·Δ_k and s_k with s_k = min(w_k, W)/W; the server divides
        the sum by Σ s_k. Under ``DifferentialPrivacy`` (``clip`` = (C, weight cap or None)):
        client k sends its clipped, capped-weight upload (``weighted.clip_factors``) and 1, the
        sum is divided by the fixed
        ``denominator``, and with ``noise_scale`` = σC each client adds its share N(0,
        σ²C²/t) before quantization, from the OS's secure generator unless ``secret_noise``
        is False. A round not aggregated gives no update."""
        enc = self.encoding(out.n_clients, round_idx, clip=clip, noise_scale=noise_scale,
                            secret_noise=secret_noise, **count)
        q, rows = enc.encode(out, hp)
        ids = out.client_ids()
        job = self.job(enc, out.n_clients)
        halves = (device or Device()).begin(job, "update", round_idx, model_digest(q), ids, q)
        delta = self.secure_round(halves, job.session, enc, ids, round_idx, denominator)
        if delta.summary.n_used:
            got = enc.decode(self._last_total)[0]
            exact = rows[delta.client_weights > 0, :enc.n_dense].sum(axis=0)
            total = denominator or self._last_stats["used"]
            self.round_stats["secagg_error"] = float(np.abs(got - exact).max() / total)
        return delta

    def remote_round(self, executor, cohort, params, ids, hp, round_idx: int, *, clip=None,
                     denominator=None, noise_scale: float = 0.0, secret_noise: bool = True,
                     **count) -> GlobalDelta:
        """One round whose clients run elsewhere (``executor.secure_clients``, e.g. Ray shards):
        they encode and mask there, and only protocol messages come back."""
        enc = self.encoding(len(cohort.clients), round_idx, clip=clip, noise_scale=noise_scale,
                            secret_noise=secret_noise, **count)
        job = self.job(enc, len(cohort.clients))
        clients = executor.secure_clients(cohort, params, ids, hp, job)
        return self.secure_round(clients, job.session, enc, cohort.clients, round_idx,
                                 denominator)

    def job(self, enc, m: int) -> SecureJob:
        """The clients' part of a round of ``m`` clients, in a fresh session."""
        return SecureJob(enc, self.threshold_for(m) or 2, os.urandom(16), self.degree(m))

    def secure_round(self, clients, session: bytes, enc: Encoding, cohort_ids: np.ndarray,
                     round_idx: int, denominator=None) -> GlobalDelta:
        """The server half of one round against ``clients`` (``ClientHalves`` or shards
        holding them): run the protocol, decode the sum, and build the update and the round
        summary from it — the server sees only protocol messages and the survivor list."""
        m, t = len(cohort_ids), self.threshold_for(len(cohort_ids))
        self.round_stats = {"secagg_survivors": 0, "secagg_lost_round": True,
                            "secagg_threshold": t, "secagg_below_min_cohort": m < self.min_cohort}
        total, u3 = None, []
        if t is not None:
            try:
                total, u3 = self._protocol(clients, session, t, enc, round_idx, m)
            except (ProtocolAbort, DeviceRefusal) as e:
                self.round_stats["secagg_abort"] = str(e)
        self._last_total = total
        survived = np.isin(cohort_ids, u3).astype(np.float64)
        return self._delta(enc, total, survived, m, denominator)

    # ------------------------------------------------------------------ hypergradient reports
    def report_encoding(self, m: int, H: int, clip: float, round_idx: int = 0, *,
                        equal: bool = False, noise_scale: float = 0.0,
                        secret_noise: bool = True) -> ReportEncoding:
        """The public encoding of H-value reports from a cohort of m clients (reports.py):
        weights min(n, W)/W, or ``equal`` (under DP); distributed noise N(0, noise_scale²/t)
        each."""
        t = self.threshold_for(m)
        return ReportEncoding(int(H), max(m, 1), float(clip), None if equal else
                              float(self.max_weight),
                              noise_scale / np.sqrt(t) if noise_scale and t else 0.0,
                              secret_noise, (int(self.context.seed), int(round_idx)))

    def report_mean(self, reports: Reports, clip: float, round_idx: int = 0, *,
                    denominator=None, device=None, **encoding) -> np.ndarray | None:
        """The mean of hypergradient reports held in this process, under masks: each client
        clips, weighs and masks its own; the server divides the sum by the summed weight (or
        ``denominator``). None when the round is not aggregated or no report counts."""
        m, H = len(reports.clients), reports.jvp.shape[1]
        enc = self.report_encoding(m, H, clip, round_idx, **encoding)
        job = self.job(enc, m)
        q = enc.encode(reports)
        halves = (device or Device()).begin(job, "reports", round_idx, model_digest(q),
                                            reports.clients, q)
        return self.report_round(halves, job.session, enc, reports.clients, round_idx,
                                 denominator)

    def remote_reports(self, executor, cohort, params, tangents, ids, clip: float,
                       round_idx: int = 0, *, denominator=None, **encoding):
        """As ``report_mean`` with clients that run elsewhere (``executor.secure_reports``):
        they compute, encode and mask their reports there."""
        m = len(cohort.clients)
        enc = self.report_encoding(m, tangents[0].shape[0], clip, round_idx, **encoding)
        job = self.job(enc, m)
        clients = executor.secure_reports(cohort, params, tangents, ids, job)
        return self.report_round(clients, job.session, enc, cohort.clients, round_idx,
                                 denominator)

    def report_round(self, clients, session, enc: ReportEncoding, cohort_ids, round_idx: int,
                     denominator=None) -> np.ndarray | None:
        """The server half against the reporting clients: the unmasked sum, divided."""
        t = self.threshold_for(len(cohort_ids))
        self.report_stats = {"hyper_secagg_lost_round": True}
        if t is None:
            return None
        stats = self.round_stats
        try:
            total, u3 = self._protocol(clients, session, t, enc, round_idx,
                                       len(cohort_ids), tag=0x4E9)
        except (ProtocolAbort, DeviceRefusal):
            return None
        finally:
            self.round_stats = stats
        values, weight, used = enc.decode(total)
        error = enc.rounding_error(values, used)
        self.report_stats = {"hyper_secagg_lost_round": False,
                             "hyper_secagg_survivors": len(u3), "hyper_rounding_error": error}
        if error > REPORT_ROUNDING:
            warnings.warn(f"the hypergradient reports lose about {error:.0%} to fixed-point "
                          f"rounding in round {round_idx}: their weighted values are small "
                          f"against the step the sum's range allows (clip {enc.clip:g}, "
                          f"max_weight {enc.max_weight}); lower Hypergradients' clip_norm or "
                          "SecureAggregation's max_weight", RuntimeWarning, stacklevel=2)
        if used < 1 or not (denominator or weight) > 0:
            return None
        return values / (denominator or weight)

    def _protocol(self, clients, session, t, enc, round_idx, m: int, tag: int = 0x5EC):
        server = SecAggServer(t, enc.width, session, self.degree(m),
                              word_bytes=enc.word_bytes())

        def dropped(u2):  # who drops after sharing (a simulation of the network)
            draw = np.random.default_rng([self.context.seed, round_idx, tag]).random(len(u2))
            return [c for c, r in zip(u2, draw) if r < self.drop_after_setup]

        total, u3 = run_round(clients, server, dropped, min_survivors=self.min_cohort)
        self.round_stats["secagg_bytes_per_client"] = server.bytes_received() / max(
            len(server.adverts), 1)
        return total, u3

    def _delta(self, enc, total, survived, m, denominator) -> GlobalDelta:
        K, nv = enc.K, enc.n_values
        values, st = (None, {k: 0.0 for k in enc.stats + ("clipped",)}) if total is None else \
            enc.decode(total)
        self._last_stats = st
        count = {k: int(round(st[k])) for k in ("empty", "nonfinite", "nonfinite_recon")}
        n_used = int(len(np.flatnonzero(survived))) - sum(count.values()) \
            if values is not None and st["used"] > 0 else 0
        loss = st["loss"] / st["weight"] if n_used and st["weight"] > 0 else float("nan")
        summary = RoundSummary(m, n_used, count["nonfinite"] + count["nonfinite_recon"],
                               count["nonfinite_recon"], count["empty"], float(loss), -1,
                               float("nan"))
        if not n_used:
            return empty_delta(K, summary, survived * 0)
        clipped, nv = int(round(st["clipped"])), enc.n_dense
        self.round_stats.update(
            secagg_survivors=int(survived.sum()), secagg_lost_round=False,
            secagg_clipped=clipped, secagg_clipped_share=clipped / (n_used * nv))
        if enc.clip is not None:
            self.round_stats["secagg_indicator_sum"] = float(st["unclipped"])  # Σ (b − ½)
        if clipped > CLIP_WARNING * n_used * nv:
            warnings.warn(f"secure aggregation clipped {clipped} of {n_used * nv} values to "
                          f"±value_bound={self.value_bound:g} this round: the aggregate is "
                          "biased; raise value_bound (or max_weight)", RuntimeWarning,
                          stacklevel=5)
        total_weight = denominator or st["used"]
        mean = values[:enc.n_values] / total_weight
        block, items = mean.reshape(enc.n_items, K + 1), np.arange(enc.n_items)
        terms = None
        if enc.exponent:  # ∂Δ̄/∂α = (Σ s'Δ − Δ̄ Σ s') / Σ s, from the masked sums
            d = ((values[enc.n_values:] - mean * st["dweight"]) / total_weight).reshape(
                enc.n_items, K + 1)
            terms = (items, d[:, :K], d[:, K])
        return GlobalDelta(items, block[:, :K], block[:, K], None, summary,
                           int(survived.sum()) * enc.width, survived, exponent_terms=terms)
