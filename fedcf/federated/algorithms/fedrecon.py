"""Federated Reconstruction for explicit ratings (Singhal et al. 2021, Algorithm 1)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
from sklearn.base import clone

from ..._kernels.layout import client_cfg, recon_init_cfg
from ..._kernels.sgd import sgd_reconstruct_rows
from ..._validation import Bool, NoneOr, RatingScale
from ...datasets import ItemFeatures
from ...models.base import RatingScoreMixin
from ...models.prediction import inference_keys
from ..round.contracts import phase_rule
from ..round.optimizers import SGD, Adam, ServerOptimizer
from .base import EXECUTOR_CONSTRAINTS, FEDERATED_CONSTRAINTS, FederatedMFBase
from .catalog import OpenScorer
from .early_stopping import (
    AUTO_ADAM,
    AUTO_MAX_DENSE,
    AUTO_STOPPING,
    AutoOr,
    EarlyStopping,
    auto_holds_out,
    no_split,
)
from .hyper import HYPER_CONSTRAINTS
from .items import OPEN_ARRAYS, ItemRows, ItemSpace, features_arrays, features_of
from .programs import FedReconProgram
from .reconstruction import Reconstruction
from .split import SupportQuerySplit, resolve_split


class FedReconMF(RatingScoreMixin, FederatedMFBase):
    """Federated Reconstruction for biased matrix factorization (Singhal et al. 2021, Alg. 1).

    Global: item factors Q, item biases b (and the global mean μ). Local: the user's factors p and
    bias c — reconstructed on the device from its support set each round, frozen while
    the client update's k_u mini-batch steps update the rows of (Q, b) its query set touches, then
    discarded. Only the sparse delta of (Q, b) and the query size leave a client.

    Parameters
    ----------
    n_factors : int, default 50
        K, the embedding dimension.
    biases : bool, default True
        Fit μ, item and user biases; False gives the paper's plain p·q model.
    n_rounds : int, default 500
    clients_per_round : int, default 100
    server_optimizer : "auto", {"sgd", "momentum", "adagrad", "adam", "yogi"} or ServerOptimizer
        "auto" (the default): ``Adam(0.0175, epsilon=1e-3)`` when the fit holds users out for
        early stopping and the item matrix has at most 10⁷ values (Adam's state is dense), else
        the paper's ``SGD(1.0)``, whose step is sparse (``server_optimizer_`` is what ran). A
        name (its defaults, learning rate 1.0) or an object from ``fedcf.federated`` (``SGD(1.0)``,
        ``Momentum(0.5, momentum=0.9)``, ``Adagrad``, ``Adam``, ``Yogi``); its parameters are
        nested names (``server_optimizer__learning_rate``).
    client_update : "sgd" or ClientUpdate, default "sgd"
        The client's k_u mini-batch SGD steps on its query set: ``ClientUpdate(learning_rate,
        batch_size=5, steps=50, epochs=1, regularization=0)``, step size η_u 0.5 unless set;
        nested names ``client_update__learning_rate``, ``client_update__steps``, ...
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
    hypergradients : Hypergradients or None, default None
        Learn round hyperparameters during training by federated hypergradient descent
        (``fedcf.federated.Hypergradients(learn, learning_rate, optimizer, holdout)``; its
        parameters are nested names, ``hypergradients__learning_rate``). None: fixed.
    early_stopping : "auto", EarlyStopping or None, default "auto"
        Hold out some users (``fedcf.federated.EarlyStopping(holdout, max_holdout, every,
        patience, decay, average)``): every ``every`` rounds they report the query loss of the
        current model (or of the running average of the rounds') after reconstructing their own
        rows, and the fit keeps the checked model with the lowest (``best_round_``). None: the
        last round's model. Refused with a DP or secure aggregator (the losses are sent in the
        clear) and with an open item space. "auto": ``EarlyStopping(max_holdout=100,
        decay=0.5, average=0.97)`` (no average on a catalog too large for Adam's dense state)
        when the fit has at least 500 eligible users (here or on Ray), an aggregator neither DP nor secure, no
        ``hypergradients``, a full item space and a split, else None (``early_stopping_`` is what ran;
        a Flower run settles it to None). With ``server_optimizer="auto"`` this is the setting
        meant to need no tuning; how it compares with centralized training + ReconEval is in
        ``eval/RESULTS.md``.
    item_space : {"full", "open"} or ItemSpace, default "full"
        Which raw items have global rows: ``FullCatalog()`` (every training item; an unseen
        item scores μ + c_u) or ``OpenCatalog(catalog, unknown_item_row, local_item_buckets,
        local_item_sweeps, learned_default)`` (a catalog, and UNK / adapter / hashed local rows
        / a learned default for the rest; ``item_space__local_item_buckets``). See ``items.py``.
    random_state : int, RandomState or None
    verbose : bool, default False

    With an open item space, ``fit(X, item_features=...)`` (``fedcf.datasets.ItemFeatures``, a
    DataFrame indexed by raw item id, or an (item_ids, matrix) pair) adds a global linear
    adapter: an out-of-catalog item's row is Σ x_f · W_f (plus its local row) — the federated
    linear adapter (the seed's on-device OOV expansion is ``OOVExpansion``).

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
        The final learned values (only with ``hypergradients``).
    best_round_ : int or None
        With ``early_stopping``: the rounds done when the kept model was checked.
    validation_users_ : ndarray or None
        With ``early_stopping``: the raw ids of the held-out users (they never trained).
    server_optimizer_, early_stopping_ : ServerOptimizer, EarlyStopping or None
        What the fit ran ("auto" resolved).
    adapter_factors_, adapter_biases_ : ndarray
        With an open item space: the UNK row and one row per item feature.
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
        "joint": Bool(), **HYPER_CONSTRAINTS,
        "server_optimizer": AutoOr(phase_rule("server_optimizer", ServerOptimizer)),
        "early_stopping": AutoOr(NoneOr(phase_rule("early_stopping", EarlyStopping))),
        "item_space": phase_rule("item_space", ItemSpace),
    }
    _saved_arrays = (*FederatedMFBase._saved_arrays, *OPEN_ARRAYS)
    _client_params = ("n_factors", "biases", "client_update", "init_scale", "split",
                      "reconstruction", "joint", "dtype", "random_state")
    _saved_objects = ("item_space_",)
    # fitted with an open item space only (see items.OPEN_ARRAYS)
    adapter_factors_ = adapter_biases_ = default_params_ = None
    feature_item_ids_ = feature_indptr_ = feature_indices_ = feature_values_ = None
    feature_shape_ = None
    _fit_features = None  # the item features of the fit under way
    _fit_rows = None  # the item rows of the fit under way (open item space)
    _auto = False  # this fit holds out users by early_stopping="auto" (decided at fit)
    _auto_dense = True  # ... and "auto" may run Adam's dense step on its catalog

    def __init__(self, n_factors=50, *, biases=True, n_rounds=500, clients_per_round=100,
                 server_optimizer="auto", client_update="sgd", client_weighting="num_examples",
                 min_examples=1, oversample=0.0, dropout=0.0, init_scale=0.05,
                 rating_scale=None, split="random", reconstruction="als", joint=False,
                 eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", aggregator=None, executor=None, hypergradients=None,
                 early_stopping="auto", item_space="full", random_state=None, verbose=False):
        self.n_factors, self.biases, self.n_rounds = n_factors, biases, n_rounds
        self.clients_per_round, self.server_optimizer = clients_per_round, server_optimizer
        self.client_update, self.client_weighting = client_update, client_weighting
        self.min_examples, self.oversample, self.dropout = min_examples, oversample, dropout
        self.init_scale, self.rating_scale, self.split = init_scale, rating_scale, split
        self.reconstruction, self.joint, self.eval_every = reconstruction, joint, eval_every
        self.checkpoint_path, self.checkpoint_every = checkpoint_path, checkpoint_every
        self.dtype, self.aggregator, self.executor = dtype, aggregator, executor
        self.hypergradients, self.early_stopping = hypergradients, early_stopping
        self.item_space, self.random_state, self.verbose = item_space, random_state, verbose

    # ------------------------------------------------------------------ item space
    def fit(self, X, y=None, *, item_features=None, **kwargs):
        """As ``FederatedMFBase.fit``; with an open item space, ``item_features``
        (``ItemFeatures``, a DataFrame indexed by raw item id, or an (item_ids, matrix) pair)
        adds the federated linear adapter over item features."""
        self._fit_features = None if item_features is None else \
            ItemFeatures.coerce(item_features)
        try:
            return super().fit(X, y, **kwargs)
        finally:
            self._fit_features = self._fit_rows = None

    def _fit_inputs(self) -> dict:
        f = self._fit_features
        return {} if f is None else {"item_features": (f.item_ids, f.matrix.indptr,
                                                       f.matrix.indices, f.matrix.data,
                                                       f.matrix.shape)}

    def _item_space(self) -> ItemSpace:
        return phase_rule("item_space", ItemSpace)("item_space", self.item_space)

    def _fitted_space(self) -> ItemSpace:
        """The item space the model was fitted with (a copy taken at fit, saved with the model):
        scoring reads it, so ``set_params(item_space=...)`` after fit changes the next fit,
        never this model's predictions."""
        fitted = self._fitted("item_space_")
        return fitted if fitted is not None else self._item_space()

    def _rows(self) -> ItemRows | None:
        """The fitted model's open item rows, or None (one global row per item)."""
        space = self._fitted_space()
        if not space.open:
            return None
        self._check_fitted()
        return ItemRows(space, self.item_ids_, features_of(self))

    def _scorer(self):
        """Where a scoring call goes: the open item space's scorer, else the base methods."""
        rows = self._rows()
        return super() if rows is None else OpenScorer(self, rows)

    def _resolve_auto(self, inter) -> None:
        """Decide what the "auto" parameters mean for this fit (``auto_holds_out``; Adam only
        while its dense state stays within ``AUTO_MAX_DENSE`` item values)."""
        self._auto = auto_holds_out(self, inter)
        self._auto_dense = inter.n_items * (self._row_width() + 1) <= AUTO_MAX_DENSE

    def _early_stopping(self) -> EarlyStopping | None:
        value = self._check_params()["early_stopping"]
        if isinstance(value, str):  # "auto"
            dense = {} if self._auto_dense else {"average": None}  # the average is dense
            return EarlyStopping(**{**AUTO_STOPPING, **dense}) if self._auto else None
        return value

    def _server_optimizer(self):
        if isinstance(self.server_optimizer, str) and self.server_optimizer == "auto":
            adam = self._early_stopping() is not None and self._auto_dense
            return Adam(**AUTO_ADAM) if adam else SGD(1.0)
        return super()._server_optimizer()

    def _check_combinations(self):
        agg = self._aggregator()
        if isinstance(self.early_stopping, EarlyStopping) and (agg.secure or self._dp_release()):
            raise ValueError(f"early_stopping={self.early_stopping!r} sends the held-out users' "
                             f"losses in the clear, which aggregator={agg!r} is there to "
                             "prevent; leave early_stopping=None with this aggregator")
        if isinstance(self.early_stopping, EarlyStopping) and no_split(self):
            raise ValueError("early_stopping needs held-out users' query sets apart from what "
                             "they reconstruct from; with split='none' leave early_stopping=None")
        if isinstance(self.early_stopping, EarlyStopping) and self.early_stopping.decay \
                and self.hypergradients is not None:
            raise ValueError("early_stopping__decay scales the server step, which "
                             "hypergradients learn; set early_stopping__decay=None")
        super()._check_combinations()
        space = self._item_space()
        if not space.open:
            space.bind((), (), self._fit_features)  # refuses item features
            return
        bad = [(k, v) for k, v, on in (
            ("joint", self.joint, bool(self.joint)),
            ("hypergradients", self.hypergradients, self.hypergradients is not None),
            ("early_stopping", self.early_stopping,
             isinstance(self.early_stopping, EarlyStopping)),
            ("executor", self.executor, self.executor not in (None, "local"))) if on]
        if bad:
            raise ValueError(f"{bad[0][0]}={bad[0][1]!r} is not available with an open item "
                             f"space (item_space={space!r}); leave it at its default")

    def _public_vocabulary(self, inter):
        """With ``OpenCatalog(drop_out_of_catalog=True)``: each device's entries of items
        outside the catalog left out, as the device leaves them out before it trains."""
        inter = super()._public_vocabulary(inter)
        space = self._item_space()
        if not space.drop_out_of_catalog:
            return inter
        if inter.executor is not None:
            raise ValueError("drop_out_of_catalog=True needs the training data in this process "
                             "(a Ray or Flower population's devices hold their own)")
        counts = np.bincount(inter.items, minlength=inter.n_items)
        rows = space.bind(inter.item_ids, counts, None)
        return inter.take(rows.kept(inter.item_ids)[inter.items])

    def _init_globals(self, inter, rng, dtype) -> dict:
        space = self._item_space()
        self.item_space_ = clone(space)
        if not space.open:
            return super()._init_globals(inter, rng, dtype)
        counts = np.bincount(inter.items, minlength=inter.n_items)
        self._fit_rows = space.bind(inter.item_ids, counts, self._fit_features)
        for name, value in features_arrays(self._fit_features).items():
            setattr(self, name, value)
        return self._fit_rows.init(rng, self.n_factors, self.init_scale, dtype)

    def _set_globals(self, params):
        super()._set_globals(params)  # the declared arrays (an open space's rows among them)
        if self._fit_rows is not None:  # ... whose items are the catalog's
            self.item_ids_ = self._fit_rows.catalog_ids
            if not self._fit_rows.learned:
                self.default_params_ = None

    def _model_state(self, n_items: int):
        rows = self._fit_rows if self._fit_rows is not None else self._rows()
        return super()._model_state(n_items) if rows is None else rows.state(self.n_factors)

    def _global_params(self) -> dict:
        if self._fitted_space().open:
            raise ValueError("client_uploads is not available with an open item space yet (its "
                             "clients also hold local item rows)")
        return super()._global_params()

    def _check_loaded(self, where: str):
        super()._check_loaded(where)
        rows = self._rows()
        if rows is not None:
            rows.check(self, where)

    @property
    def item_features_(self):
        """The item features the model was fitted with (``ItemFeatures``), or None."""
        return features_of(self) if self._fitted_space().open else None

    # ------------------------------------------------------------------ scoring
    def predict(self, X, *, clip: bool = True, user_col: str = "user", item_col: str = "item"):
        """Predicted ratings of (user, item) pairs: a seen user is reconstructed from their fit
        data; an item outside the model scores by the item space (see ``Prediction.predict``)."""
        return self._scorer().predict(X, clip=clip, user_col=user_col, item_col=item_col)

    def recon_predict(self, support, query, *, clip: bool = True, finetune=None):
        """Reconstruct each user of ``support`` and predict the entries of ``query`` (same users,
        same order) — ReconEval's step.

        ``finetune`` (Table 2 of the paper, open item space only): after reconstruction the user
        also runs the model's client update (``client_update``) on its
        support set, on the global rows it touches — "all" of them (FedRecon + finetune) or only
        the "adapter" rows (UNK, features: OOV finetuning) — and scores the query with those
        finetuned copies. Nothing is sent or stored."""
        if finetune not in (None, "all", "adapter"):
            raise ValueError(f"finetune must be None, 'all' or 'adapter', got {finetune!r}")
        if finetune is not None and not self._fitted_space().open:
            raise ValueError("finetune needs an open item space (e.g. "
                             "item_space=OpenCatalog(1.0) for the full catalog)")
        scorer = self._scorer()
        kw = {} if finetune is None else {"finetune": finetune}
        return scorer.recon_predict(support, query, clip=clip, **kw)

    def reconstruct_users(self, inter):
        """(P, c) of each user of ``inter``, reconstructed from their interactions."""
        return self._scorer().reconstruct_users(inter)

    def reconstruct(self, items, ratings=None):
        """A new user's local parameters from their ratings of raw items (never stored); with
        local item rows a ``CatalogLocalParams`` holding their buckets."""
        return self._scorer().reconstruct(items, ratings)

    def predict_local(self, local, items, *, clip: bool = True):
        """Scores of a reconstructed user on raw items."""
        return self._scorer().predict_local(local, items, clip=clip)

    def recommend(self, items=None, ratings=None, *, user=None, n: int = 10,
                  filter_seen: bool = True, extra_items=None):
        """Top-``n`` items for a history (``items``, ``ratings``) or a seen ``user``; with an
        open item space also of ``extra_items`` (raw ids outside the catalog)."""
        scorer = self._scorer()
        if extra_items is not None and not isinstance(scorer, OpenScorer):
            raise ValueError("extra_items needs an open item space (item_space=OpenCatalog(...)),"
                             " which scores items outside the catalog")
        kw = {} if extra_items is None else {"extra_items": extra_items}
        return scorer.recommend(items, ratings, user=user, n=n, filter_seen=filter_seen, **kw)


    def _recon_hp(self, mu):
        return self._reconstruction().hp(self._client_update().batch_size, mu, self.biases,
                                         self._default_recon_lam)

    def _recon_cfg(self):
        """layout.client_cfg of this estimator's split and reconstruction."""
        rec = self._reconstruction()
        split = resolve_split(self.split)
        return client_cfg(split.kind, split.support_fraction, rec.kernel, rec.init,
                          self.init_scale, self._recon_lam(), self._recon_lam0())

    def client_program(self, inter, mu):
        if self._fit_rows is not None:
            return self._fit_rows.program(inter.item_ids, self._recon_cfg(), self._recon_hp(mu),
                                          self._update_hp(mu, False))
        return FedReconProgram(self._recon_cfg(), self._recon_hp(mu),
                               self._update_hp(mu, self.joint))

    def _recon_can_diverge(self) -> bool:
        return self._reconstruction().can_diverge

    def _damped(self, stage: str, factor: float):
        rec = self._reconstruction()
        if stage != "reconstruction" or not rec.can_diverge:
            return super()._damped(stage, factor)
        damped = copy.copy(self)
        damped.reconstruction = type(rec)(**{**rec.get_params(deep=False),
                                             "learning_rate": rec.learning_rate / factor})
        return damped

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
