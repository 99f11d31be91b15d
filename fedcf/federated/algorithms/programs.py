"""The client programs of the federated estimators (``ClientProgram``): what a client's device
runs in a round, as the executors call it — the output layout and the client kernel, and the
hypergradient tangents. Kept apart from the estimators so that a process that only runs clients
(a Ray shard, a Flower node) loads the kernels and not scikit-learn."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..._kernels.als import implicit_side
from ..._kernels.catalog import catalog_clients
from ..._kernels.clients import fedrecon_clients, query_sizes, stateful_clients
from ..._kernels.hypergrad import fedrecon_tangent_clients, stateful_tangent_clients
from ..._kernels.implicit_clients import (
    fedrecon_implicit_clients,
    fedrecon_implicit_full_clients,
    implicit_slots,
)
from ..._kernels.layout import (
    HP_OFFSET,
    IC_ITEM_BIAS,
    IC_SPLIT,
    IC_SUPPORT_FRAC,
    IC_USER_BIAS,
    OC_DEFAULT,
)
from ..._kernels.neumf import neumf_clients
from ..._kernels.sampled import sampled_clients
from ...datasets.interactions import csr_take
from ..round.contracts import WholeModelBroadcast


@dataclass(frozen=True)
class FedReconProgram(WholeModelBroadcast):
    """Client work of FedReconMF: split, reconstruct (p, c), k_u steps on the touched item rows."""

    cfg: np.ndarray  # layout.client_cfg
    recon_hp: np.ndarray  # layout.sgd_hp of reconstruction
    update_hp: np.ndarray  # layout.sgd_hp of the update

    def layout(self, counts):
        """(weights = query sizes, output slots) per client."""
        q = query_sizes(counts.astype(np.int64), int(self.cfg[0]), float(self.cfg[1]))
        return q, q

    def run(self, data, clients, params, local, ids, out):
        fedrecon_clients(data, clients, (params["Q"], params["b"]), self.cfg, self.recon_hp,
                         self.update_hp, ids, out)
        return None

    def tangents(self, data, clients, params, local, tangents, ids):
        """(query losses, derivatives along each tangent) of the clients, see hyper.py."""
        losses = np.full(len(clients), np.nan)
        jvp = np.zeros((len(clients), tangents[0].shape[0]))
        fedrecon_tangent_clients(data, clients, (params["Q"], params["b"]), tangents, self.cfg,
                                 self.recon_hp, float(self.update_hp[HP_OFFSET]), ids, losses,
                                 jvp)
        return losses, jvp


@dataclass(frozen=True)
class ImplicitProgram(WholeModelBroadcast):
    """Client work of FedReconImplicitMF (sampled or full-catalog negatives)."""

    cfg: np.ndarray  # layout.implicit_cfg
    hp: np.ndarray  # layout.sgd_hp of the update
    full_negatives: bool

    def layout(self, counts):
        counts = counts.astype(np.int64)
        q = query_sizes(counts, int(self.cfg[IC_SPLIT]), float(self.cfg[IC_SUPPORT_FRAC]))
        return q, (q if self.full_negatives else implicit_slots(counts, self.cfg, self.hp))

    def slots_of(self, weights):
        return weights if self.full_negatives else None  # sampled negatives: from the count

    def run(self, data, clients, params, local, ids, out):
        Q, b = params["Q"], params["b"]
        offsets, d_items, d_Q, d_b, losses = out
        d_b[:] = 0.0
        side = implicit_side(Q, self.cfg[IC_USER_BIAS] > 0, b if self.cfg[IC_ITEM_BIAS] > 0 else None)
        glob = (Q, side, b)
        if not self.full_negatives:
            fedrecon_implicit_clients(data, clients, glob, self.cfg, self.hp, ids, Q.shape[0],
                                      (offsets, d_items, d_Q, losses, d_b))
            return None
        W = np.zeros((len(clients), Q.shape[1], Q.shape[1]))
        fedrecon_implicit_full_clients(data, clients, glob, self.cfg, self.hp, ids, Q.shape[0],
                                       (offsets, d_items, d_Q, losses, W))
        return W


@dataclass(frozen=True)
class CatalogProgram(WholeModelBroadcast):
    """Client work with an open item space: ``catalog_clients`` over the training items' map."""

    cfg: np.ndarray
    cc: np.ndarray
    recon_hp: np.ndarray
    update_hp: np.ndarray
    imap: tuple  # (rptr, rows, coef, bucket) over the training population's items
    max_terms: int

    def layout(self, counts):
        q = query_sizes(counts.astype(np.int64), int(self.cfg[0]), float(self.cfg[1]))
        return q, self.slots_of(q)

    def slots_of(self, weights):
        return weights * self.max_terms + int(self.cc[OC_DEFAULT] >= 0)

    def run(self, data, clients, params, local, ids, out):
        catalog_clients(data, clients, (params["Q"], params["b"]), self.imap, self.cfg, self.cc,
                        self.recon_hp, self.update_hp, ids, out)


@dataclass(frozen=True)
class StatefulProgram(WholeModelBroadcast):
    """Client work of FedAvg/FURL: joint steps on the client's own row and the item rows.
    With ``server_rows`` (FedAvg) the user rows live on the server: each client also downloads
    and uploads its own row (K + 1 numbers)."""

    update_hp: np.ndarray
    server_rows: bool = False

    def values_down(self, n_items, K, n_clients):
        return super().values_down(n_items, K, n_clients) + n_clients * (K + 1) * self.server_rows

    def values_up_local(self, n_used, K):
        return n_used * (K + 1) * self.server_rows

    def layout(self, counts):
        q = counts.astype(np.int64)
        return q, q

    def run(self, data, clients, params, local, ids, out):
        stateful_clients(data, clients, (params["Q"], params["b"]), local, self.update_hp, ids, out)
        return None

    def tangents(self, data, clients, params, local, tangents, ids):
        """(losses of the stored user rows, derivatives along each tangent), see hyper.py."""
        losses = np.full(len(clients), np.nan)
        jvp = np.zeros((len(clients), tangents[0].shape[0]))
        stateful_tangent_clients(data, clients, (params["Q"], params["b"]), local, tangents,
                                 float(self.update_hp[HP_OFFSET]), losses, jvp)
        return losses, jvp


@dataclass(frozen=True)
class SampledProgram(WholeModelBroadcast):
    """Client work of FedMF / PFedRec (``_kernels.sampled.sampled_clients``): ``cfg`` (layout
    ``SC_*``), the stage bits of each local batch, the exclusion CSR and the catalog size."""

    cfg: np.ndarray
    stages: np.ndarray
    excl: tuple
    n_items: int

    def for_users(self, users: np.ndarray) -> SampledProgram:
        """The exclusion rows of ``users`` only, renumbered in that order."""
        ptr, items = self.excl
        own, take = csr_take(ptr, users)
        return dataclasses.replace(self, excl=(own, items[take]))

    def layout(self, counts):
        """Weight: the device's positives; slots: every item it can touch."""
        n = counts.astype(np.int64)
        return n, self.slots_of(n)

    def slots_of(self, weights):
        touched = weights.astype(np.int64) * (1 + int(self.cfg[0]) * int(self.cfg[1]))
        return np.minimum(touched, self.n_items)

    def run(self, data, clients, params, local, ids, out):
        sampled_clients(data, clients, (params["Q"], params["b"]), local, self.excl, self.cfg,
                        self.stages, ids, out)
        return None

    def tangents(self, data, clients, params, local, tangents, ids):
        raise ValueError("FedMF and PFedRec do not learn round hyperparameters")


@dataclass(frozen=True)
class NeuMFProgram(SampledProgram):
    """FedNCF's client work (``_kernels.neumf.neumf_clients``): SampledProgram's, plus the MLP
    widths and the R dense rows every device uploads."""

    widths: np.ndarray
    n_dense: int

    def slots_of(self, weights):
        return super().slots_of(weights) + self.n_dense  # and the dense rows

    def run(self, data, clients, params, local, ids, out):
        neumf_clients(data, clients, (params["Q"], params["b"]), local, self.excl, self.cfg,
                      self.widths, self.n_items, ids, out)
        return None

    def tangents(self, data, clients, params, local, tangents, ids):
        raise ValueError("FedNCF does not learn round hyperparameters")
