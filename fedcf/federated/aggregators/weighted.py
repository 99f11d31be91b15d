"""The weighted mean of a round's uploads, the summing aggregator the clipped means, DP and
secure aggregation build on; the clipped sum DP wraps in the clear (``ClippedSum``); and the
per-client weights and clip factors they share."""

from __future__ import annotations

import numpy as np

from ..round.contracts import Aggregator
from ..round.partials import Merged, PartialSums, group_sums, merge, merged_sums
from ..round.phases import (
    ClientOutputs,
    GlobalDelta,
    RoundHyperparams,
    RoundSummary,
    client_weights,
    empty_delta,
)
from ..round.reports import weighted_mean


class WeightedMean(Aggregator):
    """Σ_k w_k Δ_k / Σ_k w_k over clients whose upload is finite (Δ_k = 0 off its rows).

    Linear: computed from ``PartialSums`` (partials.py) — sums over fixed groups of clients in
    cohort order, added in group order — so the result is the same bit for bit whether the
    clients ran here or on the shards of a cluster, and costs O(entries × K), never
    O(n_items × K). Subclasses change the per-client factor (``client_numerators``), the
    denominator, or post-process the result (``finish``); an aggregator that needs the run's
    context (catalog size, seed, sampling rate) gets it from ``bind``. A subclass that
    overrides ``__call__`` needs every upload and sets ``linear = False``.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import WeightedMean
    >>> FedReconMF(aggregator=WeightedMean()).aggregator
    WeightedMean()
    """

    linear = True  # reducible from PartialSums; False: needs every client's upload

    def client_numerators(self, out: ClientOutputs, w: np.ndarray) -> np.ndarray:
        """Factor of client k's entries in the sum (here w_k); computed from its own upload."""
        return w

    def node_recipe(self) -> dict | None:
        """How a node that runs several clients computes their factors itself
        (``recipe_numerators``), so it can send their sums instead of their uploads; None
        when this aggregator's factors have no public recipe (a subclass's own)."""
        if not self.linear or type(self).client_numerators is not \
                WeightedMean.client_numerators:
            return None
        return {"clip": None, "cap": None, "weighted": True}

    def denominator(self, totals: dict) -> float:
        """What the merged sum is divided by (here Σ w_k of the used clients)."""
        return totals["weight"]

    def finish(self, delta: GlobalDelta, round_idx: int) -> GlobalDelta:
        return delta

    def report_mean(self, reports, clip: float, round_idx: int = 0):
        """Hypergradient reports in the clear: their mean weighted by query size (the
        empirical risk's derivative, whatever the weight exponent is); ``clip`` is unused."""
        return weighted_mean(reports)

    def partials(self, out: ClientOutputs, hp: RoundHyperparams) -> PartialSums:
        """Sums per reduce group (what a cluster's shard sends; ``reduce`` ends them)."""
        return self._sums(out, hp, group_sums)

    def reduce(self, parts: PartialSums, round_idx: int = 0) -> GlobalDelta:
        return self.aggregate(merge(parts), round_idx)

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        """``reduce(partials(out, hp))`` bit for bit, without the per-group rows."""
        return self.aggregate(self._sums(out, hp, merged_sums), round_idx)

    def _sums(self, out: ClientOutputs, hp: RoundHyperparams, how):
        bad, w, _ = client_weights(out, hp)
        num = np.where(w > 0, self.client_numerators(out, w), 0.0)
        return how(out, out.client_ids(), num, w, bad, (w == 0) & ~bad)

    def aggregate(self, mg: Merged, round_idx: int) -> GlobalDelta:
        """The aggregate from the cohort's merged sums."""
        summary = RoundSummary.from_merged(mg)
        denom = self.denominator(mg.totals)
        if not denom > 0:
            return self.finish(empty_delta(mg.s_Q.shape[1], summary), round_idx)
        rank = None if mg.rank is None else mg.rank / denom
        return self.finish(GlobalDelta(mg.items, mg.s_Q / denom, mg.s_b / denom, rank, summary,
                                       int(mg.totals["values_up"])), round_idx)


class ClippedSum(WeightedMean):
    """Σ_k f_k·Δ_k / D: each client's whole upload clipped to L2 norm ``clip_norm`` = C, times
    its capped weight min(n_k, c)/c with ``weight_cap`` = c (else 1), summed and divided by the
    fixed ``fixed_denominator`` D (``weighted.clip_factors``: the DP clip rule). The summing
    aggregator ``DifferentialPrivacy`` wraps in the clear; linear, so shards and nodes send its
    partial sums. ``unclipped_`` is the last sum's count of clients at or below C, centred
    (``centred_count``: the adaptive clip's count).

    Parameters
    ----------
    clip_norm : float > 0, default 1.0
    weight_cap : float > 0 or None, default None
    fixed_denominator : float > 0, default 1.0

    Examples
    --------
    >>> from fedcf.federated.aggregators.weighted import ClippedSum
    >>> ClippedSum(0.5, fixed_denominator=20.0).node_recipe()
    {'clip': 0.5, 'cap': None, 'weighted': False}
    """

    def __init__(self, clip_norm: float = 1.0, weight_cap: float | None = None,
                 fixed_denominator: float = 1.0):
        self.clip_norm, self.weight_cap = clip_norm, weight_cap
        self.fixed_denominator, self.unclipped_ = fixed_denominator, 0.0

    def client_numerators(self, out: ClientOutputs, w: np.ndarray):
        clip, unclipped = clip_factors(out, w, self.clip_norm, self.weight_cap)
        self.unclipped_ = centred_count(unclipped, w)
        return clip

    def node_recipe(self) -> dict | None:
        if type(self).client_numerators is not ClippedSum.client_numerators:
            return None
        cap = None if self.weight_cap is None else float(self.weight_cap)
        return {"clip": float(self.clip_norm), "cap": cap, "weighted": False}

    def denominator(self, totals: dict) -> float:
        return self.fixed_denominator


def centred_count(unclipped: np.ndarray, w: np.ndarray) -> float:
    """Σ (b − ½) over the clients used (w > 0): the adaptive clip's count, sensitivity ½."""
    return float(np.where(w > 0, unclipped - 0.5, 0.0).sum())

def entries(out: ClientOutputs, hp: RoundHyperparams):
    """What every aggregator starts from: (non-finite mask, weights, empty count, owner of each
    entry, valid entries, entry order sorted by item then client — None when nothing is valid)."""
    bad, w, n_empty = client_weights(out, hp)
    owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
    valid = (out.items >= 0) & (w[owner] > 0)
    if w.sum() <= 0 or not valid.any():
        return bad, w, n_empty, owner, valid, None
    order = np.argsort(np.where(valid, out.items, -1), kind="stable")
    return bad, w, n_empty, owner, valid, order


def clip_scale(norms: np.ndarray, clip: float) -> np.ndarray:
    """min(1, C/‖Δ_k‖) per upload: what scales an upload down to L2 norm C (the one clip rule
    of norm clipping and DP)."""
    return np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def recipe_numerators(out: ClientOutputs, w: np.ndarray, recipe: dict) -> np.ndarray:
    """Each client's factor in a linear aggregate from a public recipe (``node_recipe``): w_k
    (no clip); w_k·min(1, C/‖Δ_k‖) (``weighted``: norm clipping); or the DP clip rule with
    its capped weights (``clip_factors``). The same numbers the aggregator computes."""
    clip = recipe["clip"]
    if clip is None:
        return w
    if recipe["weighted"]:
        return w * clip_scale(upload_norms(out), clip)
    return clip_factors(out, w, clip, recipe["cap"])[0]


def clip_factors(out: ClientOutputs, w: np.ndarray, clip: float,
                 weight_cap: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the factor of each client's upload: clip its whole upload to L2 norm ``clip``, times
    its capped weight min(n, cap)/cap; whether it was at or below ``clip``) — the DP clip rule,
    computed where each client runs under secure aggregation. Clients with w = 0 get 0."""
    norms = upload_norms(out)
    unclipped = (w > 0) & (norms <= clip)
    factor = np.where(w > 0, clip_scale(norms, clip), 0.0)
    if weight_cap is not None:
        factor = factor * np.minimum(out.weights, weight_cap) / weight_cap
    return factor, unclipped.astype(np.float64)


def upload_norms(out: ClientOutputs) -> np.ndarray:
    """L2 norm of each client's whole upload (its row deltas and bias deltas), float64, over its
    rows as the server adds them up: slots of one client naming the same item are merged first
    (else k copies of a row would escape a clip by √k)."""
    owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
    dQ, db = out.d_Q.astype(np.float64), out.d_b.astype(np.float64)
    order = np.lexsort((out.items, owner))
    same = (owner[order][1:] == owner[order][:-1]) & (out.items[order][1:] ==
                                                      out.items[order][:-1])
    if same.any():  # merge each client's slots of one item into one row
        group = np.concatenate([[0], np.cumsum(~same)])
        merged_q = np.zeros((group[-1] + 1, dQ.shape[1]))
        np.add.at(merged_q, group, dQ[order])
        merged_b = np.bincount(group, weights=db[order])
        owner, dQ, db = owner[order][np.r_[True, ~same]], merged_q, merged_b
    sq = np.einsum("ij,ij->i", dQ, dQ) + np.square(db)
    return np.sqrt(np.bincount(owner, weights=sq, minlength=out.n_clients))
