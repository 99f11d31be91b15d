"""Aggregators beyond the weighted mean (phase 3 of a round): clipping and robust statistics
against malicious clients (user-level differential privacy is in ``dp.py``). Each is selected
with an estimator's ``aggregator`` parameter and sees only ``ClientOutputs``.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np
from scipy import sparse

from ..._kernels.server import robust_sorted_runs
from ..round.partials import merged_sums
from ..round.phases import (
    ClientOutputs,
    GlobalDelta,
    RoundHyperparams,
    client_weights,
    empty_delta,
    summarize,
)
from .weighted import WeightedMean, clip_scale, entries, upload_norms


def _positive(name, value, *, upper=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not np.isfinite(value) or value <= 0 or (upper is not None and value >= upper):
        bound = f"in (0, {upper:g})" if upper is not None else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


class NormClippedMean(WeightedMean):
    """Weighted mean after clipping each client's whole upload to L2 norm ``clip_norm`` (bounds
    what one client, honest or not, can move the model; no noise). The norm is taken over the
    client's rows as they are summed: slots naming one item are merged first, so repeating a
    row does not escape the clip.

    Parameters
    ----------
    clip_norm : float > 0 or "median", default 1
        The largest L2 norm of one client's upload (row deltas and bias deltas together), or
        "median": each round, ``multiple`` times the median norm of the round's uploads — a
        clip that follows the honest clients' scale, which clients below half of a cohort
        cannot move far (it needs every upload, so a cluster sends them rather than sums).
    multiple : float > 0, default 3
        With ``clip_norm="median"``: the clip as a multiple of the median norm.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import NormClippedMean
    >>> FedReconMF(aggregator=NormClippedMean(0.5)).get_params()["aggregator__clip_norm"]
    0.5
    >>> NormClippedMean("median").linear
    False
    """

    def __init__(self, clip_norm: float | str = 1.0, multiple: float = 3.0):
        self.clip_norm, self.multiple = clip_norm, multiple
        self.validate()

    def validate(self):
        if self.clip_norm != "median":
            _positive("clip_norm", self.clip_norm)
        _positive("multiple", self.multiple)

    @property
    def linear(self) -> bool:  # a median over the round's uploads is not a sum
        return self.clip_norm != "median"

    def node_recipe(self) -> dict | None:
        if not self.linear or type(self).client_numerators is not \
                NormClippedMean.client_numerators:
            return None
        return {"clip": float(self.clip_norm), "cap": None, "weighted": True}

    def client_numerators(self, out: ClientOutputs, w: np.ndarray):
        norms = upload_norms(out)
        clip = self.clip_norm
        if clip == "median":  # on the driver (not linear): the round's clip is recorded
            live = norms[(w > 0) & np.isfinite(norms)]
            clip = self.multiple * float(np.median(live)) if len(live) else np.inf
            self.round_stats = {"clip_norm": clip,
                                "clients_clipped": int(np.sum((w > 0) & (norms > clip)))}
        return w * clip_scale(norms, clip)


def _check_row_clip(row_clip):
    if row_clip is None:
        return None
    if isinstance(row_clip, bool) or not isinstance(row_clip, numbers.Real) or \
            not (np.isfinite(row_clip) and row_clip > 0):
        raise ValueError(f"row_clip must be a positive number or None, got {row_clip!r}")
    return float(row_clip)


def clip_rows(d_Q, d_b, row_clip):
    """Each uploaded row (its factor delta and bias delta together) scaled to L2 norm at most
    ``row_clip``: one client's push on one item is bounded, however it is built."""
    norms = np.sqrt(np.einsum("ij,ij->i", d_Q, d_Q, dtype=np.float64) +
                    np.square(d_b, dtype=np.float64))
    s = np.minimum(1.0, row_clip / np.maximum(norms, 1e-300))
    return (d_Q * s[:, None]).astype(d_Q.dtype), (d_b * s).astype(d_b.dtype)


class _RowStatistic(WeightedMean):
    """Per touched item, a robust statistic of the deltas of the clients that touched it, times
    their share of the cohort's weight (robust_sorted_runs); with ``row_clip`` each client's
    delta on each row is first clipped to that L2 norm (a clipped robust statistic)."""

    beta = 0.0
    median = False
    row_clip = None
    linear = False

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        K = out.d_Q.shape[1]
        bad, w, n_empty, owner, valid, order = entries(out, hp)
        summary = summarize(out, hp)
        if order is None:
            return empty_delta(K, summary, w)
        cover = np.where(valid, w[owner] / w.sum(), 0.0)
        n_valid = int(valid.sum())
        res = (np.empty((n_valid, K)), np.empty(n_valid), np.empty(n_valid, np.int64))
        d_Q, d_b = (out.d_Q, out.d_b) if self.row_clip is None else \
            clip_rows(out.d_Q, out.d_b, self.row_clip)
        m = robust_sorted_runs(order, out.items, d_Q, d_b, cover, float(self.beta), self.median, res)
        return GlobalDelta(res[2][:m], res[0][:m], res[1][:m], None, summary, n_valid * (K + 1),
                           w)


class TrimmedMean(_RowStatistic):
    """Coordinate-wise β-trimmed mean (Yin et al. 2018): per item and coordinate, drop the
    floor(β·n) smallest and largest of the n touching clients' values, average the rest.

    It bounds one client's push only where something is trimmed: an item touched by fewer than
    1/β clients is averaged untrimmed, so one client moves a rarely rated item as far as it
    likes unless ``row_clip`` bounds each client's delta on each row.

    Parameters
    ----------
    beta : float in [0, 0.5), default 0.1
        Share trimmed from each end, per item and coordinate.
    row_clip : float > 0 or None
        Clip each client's delta on each row to this L2 norm first.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import TrimmedMean
    >>> FedReconMF(aggregator=TrimmedMean(0.2, row_clip=1.0)).get_params()["aggregator__beta"]
    0.2
    """

    def __init__(self, beta: float = 0.1, row_clip: float | None = None):
        self.beta, self.row_clip = beta, row_clip
        self.validate()

    def validate(self):
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 <= beta < 0.5:
            raise ValueError(f"beta must be in [0, 0.5) (the share trimmed from each end), "
                             f"got {beta!r}")
        _check_row_clip(self.row_clip)


class CoordinateMedian(_RowStatistic):
    """Coordinate-wise median (Yin et al. 2018) of the touching clients' deltas.

    On an item touched by one client the median is that client's delta (by two, their mean):
    it bounds one client's push only on items many clients touch, unless ``row_clip`` bounds
    each client's delta on each row.

    Parameters
    ----------
    row_clip : float > 0 or None
        Clip each client's delta on each row to this L2 norm first.

    Examples
    --------
    >>> from fedcf.federated import CoordinateMedian
    >>> CoordinateMedian(row_clip=0.5)
    CoordinateMedian(row_clip=0.5)
    """

    median = True

    def __init__(self, row_clip: float | None = None):
        self.row_clip = row_clip
        self.validate()

    def validate(self):
        _check_row_clip(self.row_clip)


class FoolsGoldMean(WeightedMean):
    """Weighted mean with each client down-weighted by how much its upload resembles another
    client's in the same cohort (FoolsGold, Fung et al. 2020, on one round's uploads).

    Sybils pushing one goal (a promoted item) send near-identical deltas, while honest clients'
    deltas sit on their own rated items and point their own ways. Per client k, v_k = max over
    other clients j of cos(Δ_k, Δ_j) over the sparse (item × factor and bias) upload; after
    FoolsGold's pardoning (cs_kj × v_k / v_j when v_j > v_k), α_k = 1 − max_j cs_kj, rescaled
    so the largest is 0.99 and mapped through κ·(logit(α) + 0.5), clipped to [0, 1]. The update
    is Σ w_k α_k Δ_k / Σ w_k α_k. Clients stay stateless: only the round's cohort is compared,
    so a sybil alone in its cohort passes. It needs each upload in the clear (not under secure
    aggregation), and costs a sparse m × m similarity per round.

    Parameters
    ----------
    kappa : float > 0, default 1
        Steepness of the logit mapping of the similarity score.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> FedReconMF(aggregator="foolsgold").check_params().aggregator
    'foolsgold'
    >>> from fedcf.federated import FoolsGoldMean
    >>> FoolsGoldMean(kappa=2.0).kappa
    2.0
    """

    linear = False  # α of a client depends on the whole cohort

    def __init__(self, kappa: float = 1.0):
        self.kappa = kappa
        self.validate()

    def validate(self):
        _positive("kappa", self.kappa)

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        """The mean with weights w_k·α_k (a client with α_k = 0 counts as not used)."""
        bad, w, _ = client_weights(out, hp)
        a = w * sybil_scores(out, w, self.kappa)
        return self.aggregate(merged_sums(out, out.client_ids(), a, a, bad, (w == 0) & ~bad),
                              round_idx)



class ItemNormalizedMean(WeightedMean):
    """The weighted mean with each item row divided by the weight of the clients that touched
    it rather than by the whole cohort's (as federated MF papers average item updates):
    Δ̄_i = (W / W_i)^power · Σ_k w_k Δ_k,i / W, with W the cohort's weight and W_i that of the
    clients with item i (a client's repeated slots of one item count once). power = 0 is the
    plain mean, 1 the mean over the item's own clients: a rarely rated item then moves as far
    as a popular one. A dense rank map (full-catalog implicit negatives) is left as it is.
    It needs every upload (not linear), so it is not available under secure aggregation or DP.

    Parameters
    ----------
    power : float in [0, 1], default 1
        How far the per-item normalisation goes.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import ItemNormalizedMean
    >>> FedReconMF(aggregator=ItemNormalizedMean(0.5)).get_params()["aggregator__power"]
    0.5
    """

    linear = False  # W_i needs to know which clients touched each row

    def __init__(self, power: float = 1.0):
        self.power = power
        self.validate()

    def validate(self):
        p = self.power
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"power must be a number in [0, 1] (0: the plain mean, 1: the mean "
                             f"over each item's own clients), got {p!r}")

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        delta = super().__call__(out, hp, round_idx)
        if not len(delta.items) or self.power == 0:
            return delta
        _, w, _, owner, valid, _ = entries(out, hp)
        pairs = np.unique(np.stack([owner[valid], out.items[valid]]), axis=1)
        touched = np.bincount(pairs[1], weights=w[pairs[0]],
                              minlength=int(delta.items.max()) + 1)[delta.items]
        scale = (w.sum() / touched) ** float(self.power)
        return dataclasses.replace(delta, d_Q=delta.d_Q * scale[:, None], d_b=delta.d_b * scale)


def upload_matrix(out: ClientOutputs, w: np.ndarray):
    """The cohort's uploads as rows of a sparse (clients × items·(K+1)) matrix, unit L2 norm
    (a client with weight 0 or nothing valid is an empty row)."""
    K1 = out.d_Q.shape[1] + 1
    owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
    valid = (out.items >= 0) & (w[owner] > 0)
    items = out.items[valid]
    cols = (items[:, None] * K1 + np.arange(K1)).ravel()
    vals = np.hstack([out.d_Q[valid].astype(np.float64), out.d_b[valid, None]]).ravel()
    n_cols = (int(items.max()) + 1) * K1 if len(items) else K1
    S = sparse.csr_matrix((vals, (np.repeat(owner[valid], K1), cols)),
                          shape=(out.n_clients, n_cols))
    norms = np.sqrt(np.asarray(S.multiply(S).sum(axis=1)).ravel())
    return sparse.diags(np.where(norms > 0, 1.0 / np.maximum(norms, 1e-300), 0.0)) @ S


def sybil_scores(out: ClientOutputs, w: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    """FoolsGold's per-client factor α in [0, 1] (see FoolsGoldMean), from one cohort."""
    S = upload_matrix(out, w)
    G = (S @ S.T).tocoo()
    off = G.row != G.col
    i, j, cs = G.row[off], G.col[off], G.data[off]
    v = np.zeros(out.n_clients)
    np.maximum.at(v, i, cs)
    cs = np.where(v[j] > v[i], cs * v[i] / np.maximum(v[j], 1e-300), cs)
    top = np.zeros(out.n_clients)
    np.maximum.at(top, i, cs)
    alpha = np.clip(1.0 - top, 0.0, 1.0)
    alpha = alpha / alpha.max() if alpha.max() > 0 else alpha
    alpha = np.minimum(alpha, 0.99)
    with np.errstate(divide="ignore"):
        alpha = kappa * (np.log(alpha / (1.0 - alpha)) + 0.5)
    return np.clip(alpha, 0.0, 1.0)
