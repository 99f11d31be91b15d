"""Federated Reconstruction for explicit ratings (Singhal et al. 2021, Algorithm 1)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .._kernels.clients import fedrecon_clients, query_sizes
from .._kernels.hypergrad import fedrecon_tangent_clients
from .._kernels.layout import HP_OFFSET, client_cfg, recon_init_cfg
from .._kernels.sgd import sgd_reconstruct_rows
from .._validation import Bool, Int, NoneOr, RatingScale
from ..models.base import RatingScoreMixin
from ..models.prediction import inference_keys
from .base import EXECUTOR_CONSTRAINTS, FEDERATED_CONSTRAINTS, FederatedMFBase
from .catalog import CATALOG_ARRAYS, CATALOG_CONSTRAINTS, CatalogMixin
from .contracts import WholeModelBroadcast, phase_rule
from .hyper import HYPER_CONSTRAINTS
from .reconstruction import Reconstruction
from .split import SupportQuerySplit, resolve_split


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


class FedReconMF(CatalogMixin, RatingScoreMixin, FederatedMFBase):
    """Federated Reconstruction for biased matrix factorization (Singhal et al. 2021, Alg. 1).

    Global: item factors Q, item biases b (and the global mean μ). Local: the user's factors p and
    bias c — reconstructed on the device from its support set each round, frozen while
    ``update_steps`` mini-batch steps update the rows of (Q, b) its query set touches, then
    discarded. Only the sparse delta of (Q, b) and the query size leave a client.

    Parameters
    ----------
    n_factors : int, default 50
        K, the embedding dimension.
    biases : bool, default True
        Fit μ, item and user biases; False gives the paper's plain p·q model.
    n_rounds : int, default 500
    clients_per_round : int, default 100
    server_optimizer : {"sgd", "momentum", "adagrad", "adam", "yogi"} or ServerOptimizer
        A name (its defaults, learning rate 1.0) or an object from ``fedcf.federated``
        (``SGD(1.0)``, ``Momentum(0.5, momentum=0.9)``, ``Adagrad``, ``Adam``, ``Yogi``); its
        parameters are nested names (``server_optimizer__learning_rate``).
    learning_rate : float, default 0.5
        Client step size η_u of the update steps.
    batch_size : int, default 5
    update_steps, update_epochs : int, default 50, 1
        k_u: at most this many mini-batch steps and passes over the query set.
    regularization : float, default 0
        L2 weight of the client update.
    client_weighting : {"num_examples", "uniform"}
        Weight of a client in the mean: its query size, or 1.
    min_examples : int, default 1
        Clients with fewer examples are never sampled.
    oversample, dropout : float, default 0
        Invite ceil(m·(1 + oversample)) clients; each fails to report with prob. ``dropout``.
    init_scale : float, default 0.05
        Item factors start uniform in ±init_scale (> 0); also SGD reconstruction's start.
    rating_scale : (low, high) or None
        For clipping predictions; None takes the training ratings' range.
    split : {"random", "time", "none"} or SupportQuerySplit, default "random"
        Support/query split of each client's data: ``RandomSplit(support_fraction=0.5)``,
        ``TimeSplit(...)`` (oldest ratings support), or ``NoSplit()``, which reuses all data for
        both (NO SPLIT). A name builds the default; ``split__support_fraction`` sets the share.
    reconstruction : {"als", "sgd"} or Reconstruction, default "als"
        "als" (``RidgeReconstruction(0.1)``): the exact ridge solve, the optimum of the local
        problem; "sgd" (``SGDReconstruction()``): the paper's R, mini-batch gradient steps. An
        object sets its own parameters (``reconstruction__steps``, ...).
    joint : bool, default False
        Also update the local parameters during the client update (JOINT TRAINING ablation).
    eval_every : int, default 0
        Call ``fit``'s callback every this many rounds (0: never).
    checkpoint_path : str, os.PathLike or None
    checkpoint_every : int, default 50
    dtype : {"float32", "float64"}, default "float32"
    aggregator : aggregator or None
        Phase 3 of a round: None is the weighted mean; ``NormClippedMean``, ``DPGaussianMean``
        (user-level DP, Poisson sampling, ε in ``history_``/``epsilon_``), ``TrimmedMean`` and
        ``CoordinateMedian`` from ``fedcf.federated``.
    executor : None, "local", "ray" or RayExecutor
        Where the client work runs: in this process (None, "local"), or on the shards of a
        Ray cluster (``fedcf.federated.RayExecutor``, "ray" for its defaults; the same model
        bit for bit).
    learn_hyperparams : sequence of {"server_learning_rate", "momentum", "weight_exponent"} or None
        Learn these round hyperparameters during training by federated hypergradient descent
        (``fedcf.federated.hyper``): each round's clients also report the derivative of their
        query loss (after reconstruction) along the last server step's tangents, H numbers each.
        Needs server_optimizer "sgd" or "momentum" ("momentum" for learning the momentum) and the
        plain weighted mean (aggregator=None). "weight_exponent" is α in w_i = n_i^α, starting
        from ``client_weighting`` (1 by examples, 0 uniform).
    hyper_learning_rate : float, default 0.01
        Step of the hyper-optimizer on log η_s, logit β and α.
    hyper_optimizer : {"adam", "sgd"}, default "adam"
    hyper_holdout : float in [0, 0.9], default 0.1
        With learned hyperparameters, this share of the users never trains: each round a cohort of
        them (validation clients, as in the paper's appendix A.2) reports the derivatives, so the
        hyperparameters follow the loss of users the model has not fitted — what ReconEval
        measures. 0 uses the round's own training cohort (the paper's parallel form).
    catalog : None, float in (0, 1] or list of raw item ids
        The items with global rows: all training items (None), the most popular share of them
        (by training interactions), or this list. Other items are *out of catalog* and scored
        by the options below (without any: μ + c_u, no item term). See ``catalog.py``.
    local_item_buckets : int >= 1 or None
        B hashed local rows (raw item id → bucket) of out-of-catalog items: local parameters,
        reconstructed with the user's embedding from the support set, never uploaded
        (FedRecon §5.1.2; B = 1 is a personal "unknown item" row).
    unknown_item_row : bool, default False
        One shared global UNK row for out-of-catalog items (with item features: the adapter's
        intercept).
    learned_default : bool, default False
        Learn a global default (p₀, c₀) of the local parameters: the prior mean of the ridge
        reconstruction and the start of SGD reconstruction.
    local_item_sweeps : int, default 3
        Alternating exact solves (user, then local rows) of ALS reconstruction with local rows.
    random_state : int, RandomState or None
    verbose : bool, default False

    ``fit(X, item_features=...)`` (``fedcf.datasets.ItemFeatures``, a DataFrame indexed by raw
    item id, or an (item_ids, matrix) pair) adds a global linear adapter: an out-of-catalog
    item's row is Σ x_f · W_f (plus its local row) — OOV expansion.

    Attributes
    ----------
    item_factors_ : ndarray (n_items, K)
    item_biases_ : ndarray (n_items,)
    global_mean_ : float
    rating_scale_ : (float, float)
    user_ids_, item_ids_ : ndarray of the raw ids
    interactions_ : Interactions
        The training data, held by this simulation object only to evaluate seen users (the
        server of a deployment never has it; ``save`` does not write it).
    history_ : list of dict
        One record per round: loss, clients sampled/used/dropped/non-finite, items updated,
        numbers sent up and down, seconds (whole round; ``work_seconds`` client work,
        ``reduce_seconds`` aggregation, ``server_seconds`` server step; on Ray also
        ``broadcast_seconds``, ``client_seconds`` and ``shard_restarts``), ε with DP, and with
        learned hyperparameters their values and hypergradients.
    learned_hyperparams_ : dict
        The final learned values (only with ``learn_hyperparams``).
    adapter_factors_, adapter_biases_ : ndarray
        With out-of-catalog options: the UNK row and one row per item feature.
    default_params_ : ndarray (K + 1,) or None
        The learned default [p₀; c₀].

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedReconMF(n_factors=4, n_rounds=3, clients_per_round=20,
    ...                    random_state=0).fit(ratings)
    >>> model.item_factors_.shape
    (20, 4)
    >>> user = model.reconstruct(items=[1, 5, 7], ratings=[5.0, 3.0, 4.0])  # never stored
    >>> user.factors.shape
    (4,)
    """

    _parameter_constraints = {
        **FEDERATED_CONSTRAINTS, **EXECUTOR_CONSTRAINTS,
        "biases": Bool(), "rating_scale": RatingScale(),
        "split": phase_rule("split", SupportQuerySplit),
        "reconstruction": phase_rule("reconstruction", Reconstruction),
        "joint": Bool(), **HYPER_CONSTRAINTS, **CATALOG_CONSTRAINTS,
        "local_item_buckets": NoneOr(Int(1, 2**31 - 1)), "unknown_item_row": Bool(),
        "learned_default": Bool(), "local_item_sweeps": Int(1, 1000),
    }
    _saved_arrays = (*FederatedMFBase._saved_arrays, *CATALOG_ARRAYS)

    def __init__(self, n_factors=50, *, biases=True, n_rounds=500, clients_per_round=100,
                 server_optimizer="sgd",
                 learning_rate=0.5, batch_size=5, update_steps=50, update_epochs=1,
                 regularization=0.0, client_weighting="num_examples", min_examples=1,
                 oversample=0.0, dropout=0.0, init_scale=0.05, rating_scale=None, split="random",
                 reconstruction="als",
                 joint=False, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", aggregator=None, executor=None, learn_hyperparams=None,
                 hyper_learning_rate=0.01, hyper_optimizer="adam", hyper_holdout=0.1,
                 catalog=None, local_item_buckets=None, unknown_item_row=False,
                 learned_default=False, local_item_sweeps=3, random_state=None, verbose=False):
        self.n_factors = n_factors
        self.biases = biases
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.update_steps = update_steps
        self.update_epochs = update_epochs
        self.regularization = regularization
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.rating_scale = rating_scale
        self.split = split
        self.reconstruction = reconstruction
        self.joint = joint
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.aggregator = aggregator
        self.executor = executor
        self.learn_hyperparams = learn_hyperparams
        self.hyper_learning_rate = hyper_learning_rate
        self.hyper_optimizer = hyper_optimizer
        self.hyper_holdout = hyper_holdout
        self.catalog = catalog
        self.local_item_buckets = local_item_buckets
        self.unknown_item_row = unknown_item_row
        self.learned_default = learned_default
        self.local_item_sweeps = local_item_sweeps
        self.random_state = random_state
        self.verbose = verbose

    def _reconstruction(self) -> Reconstruction:
        return phase_rule("reconstruction", Reconstruction)("reconstruction", self.reconstruction)

    def _recon_lam(self) -> float:
        return float(self._reconstruction().regularization)

    def _recon_hp(self, mu):
        return self._reconstruction().hp(self.batch_size, mu, self.biases)

    def _recon_cfg(self):
        """layout.client_cfg of this estimator's split and reconstruction."""
        rec = self._reconstruction()
        split = resolve_split(self.split)
        return client_cfg(split.kind, split.support_fraction, rec.kernel, rec.init,
                          self.init_scale, self._recon_lam(), self._recon_lam0())

    def client_program(self, inter, mu):
        if self._catalog_active():
            return self._catalog_program(inter, mu)
        return FedReconProgram(self._recon_cfg(), self._recon_hp(mu),
                               self._update_hp(mu, self.joint))

    def _recon_can_diverge(self) -> bool:
        return self._reconstruction().can_diverge

    def _blame(self, stage: str) -> str:
        rec = self._reconstruction()
        if stage == "reconstruction" and rec.can_diverge:
            return (f"lower the reconstruction's learning rate (reconstruction={rec!r}: "
                    "reconstruction__learning_rate, the SGD reconstruction step size), or use "
                    "reconstruction='als'")
        return super()._blame(stage)

    def _reconstruct_csr(self, indptr, items, values, keys):
        rec = self._reconstruction()
        if not rec.can_diverge:  # the exact ridge solve
            return super()._reconstruct_csr(indptr, items, values, keys)
        n, K = len(indptr) - 1, self.item_factors_.shape[1]
        dt = self.item_factors_.dtype
        P, c = np.empty((n, K)), np.empty(n)
        sgd_reconstruct_rows(indptr, items, values, (self.item_factors_, self.item_biases_),
                             self._recon_hp(float(self.global_mean_)),
                             recon_init_cfg(rec.init, self.init_scale),
                             inference_keys(self._seed(), keys), (P, c))
        bad = ~(np.isfinite(P).all(axis=1) & np.isfinite(c)) | \
            (np.abs(P).max(axis=1, initial=0.0) > np.finfo(dt).max)
        if bad.any():
            warnings.warn(f"SGD reconstruction diverged for {int(bad.sum())} of {n} users "
                          f"(reconstruction={rec!r}); their local parameters are NaN — lower "
                          "reconstruction__learning_rate or use reconstruction='als'",
                          RuntimeWarning, stacklevel=3)
            P[bad] = np.nan
            c[bad] = np.nan
        return P.astype(dt), c.astype(dt)
