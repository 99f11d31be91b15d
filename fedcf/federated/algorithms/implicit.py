"""Federated Reconstruction for implicit feedback (clicks, shares)."""

from __future__ import annotations

from ..._kernels.layout import implicit_cfg
from ..._validation import Biases, Bool, Int, Real, bias_flags, moved_biases
from ...models.base import RankingScoreMixin
from ...models.implicit_mf import coerce_implicit, implicit_fold_in
from ..round.contracts import phase_rule
from .base import EXECUTOR_CONSTRAINTS, FEDERATED_CONSTRAINTS, FederatedMFBase
from .programs import ImplicitProgram
from .reconstruction import RidgeReconstruction
from .split import SupportQuerySplit, resolve_split


class FedReconImplicitMF(RankingScoreMixin, FederatedMFBase):
    """Federated Reconstruction for implicit feedback (clicks, shares), score = p_u·q_i
    (+ b_i + c_u with ``biases``).

    Each round a sampled client reconstructs its embedding p exactly by confidence-weighted ALS
    (Hu, Koren & Volinsky: confidence 1 + ``alpha``·r on its items, 1 elsewhere) against the
    global item matrix Q and the server-broadcast Gram QᵀQ — O(n·K² + K³) on the device — then
    takes ``update_steps`` mini-batch steps on the rows of Q its positives touch plus
    ``negatives`` weak negatives drawn uniformly from the catalog per positive visit, with p
    frozen. Only the sparse delta of Q (positives and sampled negatives) and the weight leave the
    device. ``split="none"`` (support = query) is the default, as in the paper's deployment where
    most clients hold one or two shares.

    ``full_negatives=True`` uses the exact full-catalog negative term instead: with p frozen its
    effect on every item row is a rank-1 map, so a client uploads its positive rows plus one K×K
    matrix (which reveals p up to sign: use it under secure aggregation), and the server applies
    a dense −Q·M step (O(n_items·K²) per round). Sampling is the default.

    Parameters
    ----------
    n_factors : int, default 50
    alpha : float, default 1.0
        Confidence slope: an interaction of strength r has confidence 1 + alpha·r.
    reconstruction : "als" or RidgeReconstruction, default "als"
        The weighted-ALS reconstruction; its ``regularization`` λ (> 0) is 0.01 unless set
        (``reconstruction=RidgeReconstruction(0.05)``, ``reconstruction__regularization``).
    n_rounds, clients_per_round, server_optimizer, client_update, client_weighting,
    min_examples, oversample, dropout, eval_every, checkpoint_path, checkpoint_every, dtype,
    aggregator, executor, random_state, verbose
        As in FedReconMF (the client step size is 0.5 unless ``client_update`` sets it).
    negatives : int, default 4
        Weak negatives drawn uniformly from the catalog per positive visit.
    negative_weight : float, default 1.0
        ν, the weight of the negative term.
    full_negatives : bool, default False
    biases : bool or {"item", "user"}, default False
        True: a global item bias b_i and a local user bias c_u; "item" or "user": only the one.
        b_i is aggregated like the item rows (its deltas are part of every upload, clipped and
        noised with them under DP); the reconstruction treats it as an offset. c_u is
        reconstructed with p on the device (never uploaded). Needs sampled negatives.
    split : {"none", "random", "time"} or SupportQuerySplit, default "none"
        As in FedReconMF.
    init_scale : float, default 0.1

    Attributes
    ----------
    item_factors_ : ndarray (n_items, K)
    item_biases_ : ndarray (n_items,), zeros unless ``item_bias``; ``global_mean_`` = 0
    user_ids_, item_ids_, interactions_, history_
        As in FedReconMF.

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedReconImplicitMF(n_factors=4, n_rounds=3, clients_per_round=20,
    ...                            random_state=0).fit(ratings)
    >>> len(model.recommend(items=[1, 5, 7], n=3))
    3
    """

    _reconstruction_kind = RidgeReconstruction  # the confidence-weighted ridge solve
    _client_params = ("n_factors", "alpha", "reconstruction", "client_update", "negatives",
                      "negative_weight", "full_negatives", "biases", "split",
                      "init_scale", "dtype", "random_state")
    _default_recon_lam = 0.01
    _parameter_constraints = {
        **FEDERATED_CONSTRAINTS, **EXECUTOR_CONSTRAINTS,
        "alpha": Real(0.0), "reconstruction": phase_rule("reconstruction", RidgeReconstruction),
        "negatives": Int(0, 10**4), "negative_weight": Real(0.0), "full_negatives": Bool(),
        "biases": Biases(),
        "split": phase_rule("split", SupportQuerySplit),
    }

    def __init__(self, n_factors=50, *, alpha=1.0, reconstruction="als", n_rounds=500,
                 clients_per_round=100, server_optimizer="sgd", client_update="sgd", negatives=4,
                 negative_weight=1.0, full_negatives=False, biases=False, split="none",
                 client_weighting="num_examples", min_examples=1, oversample=0.0, dropout=0.0,
                 init_scale=0.1, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", aggregator=None, executor=None, random_state=None, verbose=False):
        self.n_factors = n_factors
        self.alpha = alpha
        self.reconstruction = reconstruction
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.client_update = client_update
        self.negatives = negatives
        self.negative_weight = negative_weight
        self.full_negatives = full_negatives
        self.biases = biases
        self.split = split
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.aggregator = aggregator
        self.executor = executor
        self.random_state = random_state
        self.verbose = verbose

    def _item_biases(self) -> bool:
        return bias_flags(self.biases)[0]  # "user": no item-bias deltas to upload

    @classmethod
    def _saved_params(cls, params: dict) -> dict:
        return moved_biases(super()._saved_params(params))  # item_bias / user_bias before

    def _release_mean_and_scale(self, stats):
        return 0.0, super()._release_mean_and_scale(stats)[1]  # implicit: no global mean

    def _check_combinations(self):
        super()._check_combinations()
        if not self._recon_lam() > 0:
            raise ValueError(f"reconstruction={self.reconstruction!r}: the implicit ridge solve "
                             "needs regularization > 0 (its confidence weights leave unrated "
                             "directions unbounded); the default is 0.01")
        if self.full_negatives and any(bias_flags(self.biases)):
            raise ValueError("full_negatives=True has no bias terms (its closed-form negative "
                             "step is linear in the rows); use sampled negatives "
                             "(full_negatives=False) with biases")
        if self.full_negatives and self.aggregator is not None:
            raise ValueError("full_negatives=True uploads a K×K matrix per client, which only the "
                             "default weighted mean aggregates; use aggregator=None or sampled "
                             "negatives")

    def _coerce_data(self, X, y, **data_kwargs):
        return coerce_implicit(X, y, **data_kwargs)

    def _usable_loss(self, inter) -> float:
        return 1e4 * (1.0 + self.alpha * inter.value_stats()["mean"])  # the loss of p = 0

    def client_program(self, inter, mu):
        split = resolve_split(self.split)
        cfg = implicit_cfg(split.kind, split.support_fraction, self.alpha,
                           self._recon_lam(), self.negatives, self.negative_weight,
                           *bias_flags(self.biases))
        return ImplicitProgram(cfg, self._update_hp(0.0, False), bool(self.full_negatives))

    def fit(self, X, y=None, *, callback=None, availability=None, **data_kwargs):
        """Fit on implicit interactions (Interactions, DataFrame with user/item[/rating as
        strength], or a sparse matrix); strengths must be >= 0. ``callback`` and
        ``availability`` as in FedReconMF.fit."""
        super().fit(X, y, callback=callback, availability=availability, **data_kwargs)
        self.rating_scale_ = None
        return self

    def _reconstruct_csr(self, indptr, items, values, keys):
        return implicit_fold_in(self.item_factors_, indptr, items, values, self.alpha,
                                self._recon_lam(),
                                item_biases=self.item_biases_ if self._item_biases() else None,
                                user_bias=bias_flags(self.biases)[1])
