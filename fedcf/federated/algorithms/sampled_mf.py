"""FedMF and PFedRec on the federated round (phases.py): sampled negatives, binary
cross-entropy, user parts kept on the devices — so differential privacy, secure aggregation,
robust aggregators, checkpoints and the divergence guard apply to them as to FedRecon.

A round: the selector draws the cohort; each device draws ``negatives`` negatives per positive
(never one of its own items, nor one of ``exclude``'s), runs its client update (``SampledUpdate``:
epochs of mini-batch SGD)
on its copy of the touched global rows and on its own user part (kept on the device between
rounds), and uploads the change of the item rows and biases it touched; the aggregator averages
the uploads (uniformly over the round's devices by default, a row a device did not touch
counting as no change, as in the authors' code) and the server optimizer applies the mean.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..._kernels.sampled import (
    ITEMS,
    USER,
    personal_scores,
    sampled_fold_in,
)
from ..._validation import Bool, Int
from ...datasets import Interactions
from ...models.base import RankingScoreMixin, user_keys
from ...models.implicit_mf import coerce_implicit
from ...models.negatives import DeviceFoldIn, check_negatives, exclusion_csr
from ..round.contracts import phase_rule
from .base import EXECUTOR_CONSTRAINTS, FEDERATED_CONSTRAINTS, FederatedMFBase
from .client_update import SampledUpdate
from .programs import SampledProgram


def _digest(csr: tuple) -> str:
    h = hashlib.sha256()
    for a in csr:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class DeviceRows:
    """The devices' kept user parts (p_u, c_u), normal with std ``init_scale`` (c at zero)."""

    init_scale: float

    def init(self, n_users: int, n_factors: int, rng, dtype) -> tuple:
        P = rng.normal(0.0, self.init_scale, (n_users, n_factors))
        return P.astype(dtype), np.zeros(n_users, dtype)

    @staticmethod
    def fitted(local) -> dict:
        return {"user_factors_": local[0], "user_biases_": local[1]}


_OWN = {k: v for k, v in FEDERATED_CONSTRAINTS.items() if k != "client_update"}


class FedMF(DeviceFoldIn, RankingScoreMixin, FederatedMFBase):
    """FedMF (Chai et al., 2020) on implicit feedback: score = p_u·q_i + c_u + b_i, trained by
    binary cross-entropy on each device's positives and sampled negatives, on the federated
    round of fedcf (any aggregator: differential privacy, secure aggregation, robust means).

    The device keeps p_u and c_u and uploads the change of the item rows it touched: this is
    fedcf's FURLMF (user rows on the device, joint local steps) with the loss of implicit
    feedback instead of the squared error of ratings. Chai et al. encrypt the upload
    homomorphically; ``aggregator=SecureAggregation(...)`` hides each upload from the server.
    Users unseen in fit are served by training their user part on their own device with every
    global row frozen (a logistic regression; ``reconstruct``, ``recommend(items=...)``).

    Parameters
    ----------
    n_factors : int, default 32
    n_rounds : int, default 100
    clients_per_round : int, default 1000
        Devices per round (all of them when there are fewer, as the papers' default).
    client_update : "sampled" or SampledUpdate, default "sampled"
        The device's local training: epochs of mini-batch SGD (batch 256) with step 0.1 for
        the user part and, for the item rows, 80 × n_items × that step (PFedRec's rule), unless
        set (``client_update__learning_rate``, ``client_update__item_learning_rate``, ...).
    negatives : int, default 4
        Negatives drawn per positive each time a device trains.
    upload_items : bool, default True
        False: devices upload nothing, so the global rows keep their initial values and every
        device learns only from its own data (the PFedRec authors' "federation off" probe).
    server_optimizer : str or ServerOptimizer, default "sgd"
        Applies the round's mean change (SGD with learning rate 1: the papers' averaging).
    client_weighting : {"uniform", "num_examples"}, default "uniform"
        Each device counts once in the mean (the papers'), or by its positives.
    init_scale : float, default 0.1
        Standard deviation of the normal initial item rows and user parts.
    min_examples, oversample, dropout, eval_every, checkpoint_path, checkpoint_every, dtype,
    aggregator, executor, random_state, verbose
        As in FedReconMF.

    Attributes
    ----------
    item_factors_, item_biases_ : the global rows
    user_factors_, user_biases_ : each device's kept (p_u, c_u)
    user_ids_, item_ids_, interactions_, history_
        As in FedReconMF (``history_`` per round: mean local loss and the round's counts).

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import FedMF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedMF(n_factors=4, n_rounds=3, random_state=0).fit(data)
    >>> model.user_scores([0, 1]).shape
    (2, 20)
    """

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_")
    _stages = (USER | ITEMS,)
    _exclude_arg = None  # fit's ``exclude`` while a fit runs
    _fitted_extra = ("exclusions_",)
    _parameter_constraints = {
        **_OWN, **EXECUTOR_CONSTRAINTS,
        "client_update": phase_rule("client_update", SampledUpdate),
        "negatives": Int(1, 1000), "upload_items": Bool(),
    }
    _client_update_name = "SampledUpdate"
    _client_params = ("n_factors", "client_update", "negatives", "upload_items", "dtype",
                      "random_state")
    _default_learning_rate = 0.1  # the user part's step when client_update names none
    _item_rate_factor = 80.0  # the item rows' step: this × n_items × the user part's

    def __init__(self, n_factors=32, *, n_rounds=100, clients_per_round=1000,
                 client_update="sampled", negatives=4, upload_items=True, server_optimizer="sgd",
                 client_weighting="uniform", min_examples=1, oversample=0.0, dropout=0.0,
                 init_scale=0.1, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", aggregator=None, executor=None, random_state=None,
                 verbose=False):
        self.n_factors, self.n_rounds = n_factors, n_rounds
        self.clients_per_round, self.client_update = clients_per_round, client_update
        self.negatives, self.upload_items = negatives, upload_items
        self.server_optimizer, self.client_weighting = server_optimizer, client_weighting
        self.min_examples, self.oversample, self.dropout = min_examples, oversample, dropout
        self.init_scale, self.eval_every = init_scale, eval_every
        self.checkpoint_path, self.checkpoint_every = checkpoint_path, checkpoint_every
        self.dtype, self.aggregator, self.executor = dtype, aggregator, executor
        self.random_state, self.verbose = random_state, verbose

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, exclude=None, callback=None, availability=None, **data_kwargs):
        """Fit on implicit positives X (Interactions, a DataFrame with user/item columns, (user,
        item) pairs or a sparse matrix; every entry is a positive, whatever its strength).
        ``exclude``: Interactions over the same users and items whose entries are never drawn
        as negatives (see ``fedcf.eval.loo.training_exclusions``). ``callback`` and
        ``availability`` as in FedReconMF.fit. A fit that fails leaves the estimator as it
        was."""
        self._exclude_arg = exclude
        try:
            super().fit(X, y, callback=callback, availability=availability, **data_kwargs)
        finally:
            del self._exclude_arg  # back to the class's None
        self.rating_scale_ = None
        return self

    def _coerce_data(self, X, y, **data_kwargs):
        return coerce_implicit(X, y, **data_kwargs)

    def _public_vocabulary(self, inter):
        """The training data as fit uses it, and this fit's exclusions (``exclusions_``: each
        device's items never drawn as negatives, kept for scoring)."""
        inter = super()._public_vocabulary(inter)
        self.exclusions_ = self._exclusions(inter)
        check_negatives(self.negatives, inter.n_items)
        return inter

    def _exclusions(self, inter):
        """Each device's items never drawn as negatives (``exclusion_csr``); None for a
        population whose ratings stay on the devices (a Flower server's): each device builds
        its own rows from its own data."""
        return exclusion_csr(inter, self._exclude_arg) if inter.holds_ratings else None

    def _fit_inputs(self) -> dict:
        return {"exclude": None if self.exclusions_ is None else _digest(self.exclusions_)}

    def _init_globals(self, inter, rng, dtype) -> dict:
        Q = rng.normal(0.0, self.init_scale, (inter.n_items, self.n_factors))
        return {"Q": Q.astype(dtype), "b": np.zeros(inter.n_items, dtype)}

    def _local_state(self) -> DeviceRows:
        return DeviceRows(self.init_scale)

    # FedMF, PFedRec and FedNCF took their client update's settings flat before they moved
    # into ``client_update``; a model saved then loads with them moved
    _FLAT_UPDATE = {"learning_rate": "learning_rate", "item_learning_rate": "item_learning_rate",
                    "local_epochs": "epochs", "batch_size": "batch_size",
                    "regularization": "regularization"}

    @classmethod
    def _saved_params(cls, params: dict) -> dict:
        flat = {new: params.pop(old) for old, new in cls._FLAT_UPDATE.items() if old in params}
        if flat:
            params["client_update"] = SampledUpdate(**flat)
        return params

    def _client_update(self) -> SampledUpdate:
        return phase_rule("client_update", SampledUpdate)("client_update", self.client_update)

    def _cfg(self, n_items: int, epochs: int | None = None) -> np.ndarray:
        upd, lr = self._client_update(), self._default_learning_rate
        return np.array([self.negatives, upd.epochs if epochs is None else epochs,
                         upd.batch_size, upd.rate(lr),
                         upd.item_rate(lr, self._item_rate_factor, n_items),
                         upd.regularization, float(bool(self.upload_items))])

    def client_program(self, inter, mu):
        return SampledProgram(self._cfg(inter.n_items), np.array(self._stages, np.int64),
                              self._exclusions(inter), inter.n_items)

    def _release_mean_and_scale(self, stats):
        return 0.0, None  # logits: no global mean, no rating scale

    def _usable_loss(self, inter) -> float:
        return 1e4  # the cross-entropy of a zero score is ln 2

    def _blame(self, stage: str) -> str:
        if stage == "client update":
            upd = self._client_update()
            return (f"lower client_update's learning_rate (now {upd.learning_rate}; None is "
                    f"{self._default_learning_rate}) or item_learning_rate (now "
                    f"{upd.item_learning_rate}; None is {self._item_rate_factor:g} × n_items × "
                    "learning_rate)")
        return super()._blame(stage)

    def _damped(self, stage: str, factor: float):
        if stage != "client update":
            return None
        damped = copy.copy(self)
        damped.client_update = self._client_update().damped(self._default_learning_rate, factor)
        return damped

    # ------------------------------------------------------------------ serving
    def _fold_in_epochs(self) -> int:
        return self.n_rounds * self._client_update().epochs  # a device's passes in fit

    def _fold_in(self, indptr, items, excl, keys, epochs: int):
        n, K = len(indptr) - 1, self.item_factors_.shape[1]
        P, c = np.zeros((n, K)), np.zeros(n)
        Q, b = self.item_factors_.astype(np.float64), self.item_biases_.astype(np.float64)
        sampled_fold_in(np.asarray(indptr, np.int64), np.asarray(items, np.int64), excl, Q, b,
                        self._cfg(len(b), epochs), int(epochs), self._seed(),
                        np.asarray(keys, np.uint64), P, c)
        return P, c


class PFedRec(FedMF):
    """PFedRec (Zhang et al., IJCAI 2023), dual personalization: a global item embedding and,
    on each device, a personal score function (a linear layer on the item embedding, kept across
    rounds) and a personal item embedding finetuned from the global one.

    Each local batch first steps the score function with the item embedding fixed, then the
    item embedding with the score function fixed (as the authors' code); the server averages
    the item embeddings. To score, the device finetunes the current global embedding once more
    (one local pass, nothing uploaded), as it would before recommending: ``user_scores``,
    ``score_new_users``, ``recommend`` and ``score`` do so; ``predict`` and ``reconstruct``,
    which have no room for a personal embedding, are refused.

    Parameters
    ----------
    As FedMF (``client_update__item_learning_rate`` None is the authors' 80 × n_items ×
    learning_rate).

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import PFedRec
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = PFedRec(n_factors=4, n_rounds=3, random_state=0).fit(data)
    >>> len(model.recommend(user=data.user_ids[0], n=3))
    3
    """

    _stages = (USER, ITEMS)

    def _scores_of(self, indptr, items, excl, keys, P, c) -> np.ndarray:
        n = len(indptr) - 1
        out = np.empty((n, self.item_factors_.shape[0]))
        Q, b = self.item_factors_.astype(np.float64), self.item_biases_.astype(np.float64)
        personal_scores(np.asarray(indptr, np.int64), np.asarray(items, np.int64), excl, Q, b,
                        np.asarray(P, np.float64), np.asarray(c, np.float64),
                        self._cfg(len(b)), np.array(self._stages, np.int64), self._seed(),
                        np.asarray(keys, np.uint64), out)
        return out

    def user_scores(self, users) -> np.ndarray:
        self._check_fitted()
        users = self._dense_users(users)
        inter = self._fit_data("user_scores")
        sub = inter.subset_users(users)
        ptr, ex = self.exclusions_
        rows = [ex[ptr[u]:ptr[u + 1]] for u in users]
        excl = (np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64),
                np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64))
        return self._scores_of(sub.indptr, sub.items, excl, user_keys(inter.user_ids[users]),
                               self.user_factors_[users], self.user_biases_[users])

    def _fit_data(self, what: str) -> Interactions:
        inter = self._fitted("interactions_")
        if inter is None or self._fitted("exclusions_") is None:
            raise ValueError(f"PFedRec's {what} finetunes each device's item embedding on its "
                             "fit data, which a model loaded from disk does not hold; refit it")
        return inter

    def recommend(self, items=None, ratings=None, *, user=None, n: int = 10,
                  filter_seen: bool = True) -> pd.DataFrame:
        """As FedMF's, scored with the device's personal item embedding."""
        u = self._check_recommend(items, user, n)
        if user is not None:
            scores = self.user_scores([u])[0]
            seen = self._seen_items(u)
        else:
            idx = self._item_index(items) if len(items) else np.zeros(0, np.int32)
            seen = np.unique(idx[idx >= 0]).astype(np.int64)
            one = Interactions(indptr=np.array([0, len(seen)]), items=seen,
                               values=np.ones(len(seen)), timestamps=None,
                               user_ids=np.zeros(1, np.int64), item_ids=self.item_ids_)
            scores = self.score_new_users(one)[0]
        if filter_seen and len(seen):
            scores[seen] = -np.inf
        top = np.argsort(-scores, kind="stable")[:min(int(n), int(np.isfinite(scores).sum()))]
        return pd.DataFrame({"item": self.item_ids_[top], "score": scores[top]})

    def _user_params(self, users):
        raise ValueError("PFedRec scores with an item embedding finetuned on each device, which "
                         "predict and reconstruct cannot carry; use user_scores, "
                         "score_new_users, recommend or score")

    def _reconstruct_csr(self, indptr, items, values, keys):
        return self._user_params(None)

    def _dense_user_scores(self, users) -> np.ndarray:
        return self.user_scores(users)

    def _held_out_scores(self, support: Interactions):
        scores = self.score_new_users(support)
        return lambda b: scores[b]
