"""Stateful baselines: FedAvgMF (user rows kept on the server) and FURLMF (kept on the device)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._validation import Bool, RatingScale
from ...models.base import RatingScoreMixin
from ..round.contracts import phase_rule
from .base import EXECUTOR_CONSTRAINTS, FEDERATED_CONSTRAINTS, FederatedMFBase
from .hyper import HYPER_CONSTRAINTS
from .programs import StatefulProgram
from .reconstruction import RidgeReconstruction

_PARAMS_DOC = """
    Parameters
    ----------
    n_factors : int, default 50
    biases : bool, default True
    n_rounds : int, default 500
    clients_per_round : int, default 100
    server_optimizer : {"sgd", "momentum", "adagrad", "adam", "yogi"} or ServerOptimizer
        As in FedReconMF.
    client_update : "sgd" or ClientUpdate, default "sgd"
        The joint user + item steps, as in FedReconMF; the step size is 0.1 unless set (the
        paper's 0.5 diverges here).
    client_weighting : {"num_examples", "uniform"}
    min_examples : int, default 1
    oversample, dropout : float, default 0
    init_scale : float, default 0.05
        Item and user rows start uniform in ±init_scale (> 0).
    rating_scale : (low, high) or None
    reconstruction : "als" or RidgeReconstruction, default "als"
        The exact ridge reconstruction that serves users unseen in fit (λ 0.1 unless set).
    eval_every, checkpoint_path, checkpoint_every, dtype, aggregator, executor, random_state,
    verbose
        As in FedReconMF.
    hypergradients : Hypergradients or None, default None
        As in FedReconMF; its holdout must stay 0 (None): the clients report the loss of their
        stored user rows, which held-out users never train.

    Attributes
    ----------
    item_factors_, item_biases_, global_mean_, rating_scale_, user_ids_, item_ids_, history_
        As in FedReconMF.
    user_factors_, user_biases_ : ndarray (n_users, K), (n_users,)
        The per-user rows trained across rounds ({where}).

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> ratings = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = {cls}(n_factors=4, n_rounds=3, clients_per_round=20,
    ...          random_state=0).fit(ratings)
    >>> model.user_factors_.shape
    (60, 4)
"""


@dataclass(frozen=True)
class UserRows:
    """The local state of a stateful run: one row (p, c) per user, kept between rounds — on the
    server (FedAvg) or on the devices (FURL) — and the fitted ``user_factors_``/``user_biases_``.

    Parameters
    ----------
    init_scale : float
        The rows start uniform in ±init_scale (biases at zero).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated.algorithms.stateful import UserRows
    >>> P, c = UserRows(0.05).init(3, 2, np.random.default_rng(0), np.float32)
    >>> P.shape, c.tolist()
    ((3, 2), [0.0, 0.0, 0.0])
    """

    init_scale: float

    def init(self, n_users: int, n_factors: int, rng, dtype) -> tuple:
        P = rng.uniform(-self.init_scale, self.init_scale, (n_users, n_factors))
        return P.astype(dtype), np.zeros(n_users, dtype)

    @staticmethod
    def fitted(local) -> dict:
        """The fitted attributes of the final rows."""
        return {"user_factors_": local[0], "user_biases_": local[1]}


class _StatefulMF(RatingScoreMixin, FederatedMFBase):
    """FedPer-style training: each user's row is trained jointly with the item rows it touches
    and kept between rounds. A client whose update turns non-finite keeps its old user row and
    its item delta is dropped."""

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_")
    _reconstruction_kind = RidgeReconstruction  # new users: the exact ridge solve
    _default_learning_rate = 0.1
    _client_params = ("n_factors", "biases", "client_update", "reconstruction", "dtype",
                      "random_state")
    _parameter_constraints = {**FEDERATED_CONSTRAINTS, **HYPER_CONSTRAINTS,
                              **EXECUTOR_CONSTRAINTS, "biases": Bool(),
                              "rating_scale": RatingScale(),
                              "reconstruction": phase_rule("reconstruction", RidgeReconstruction)}

    def __init__(self, n_factors=50, *, biases=True, n_rounds=500, clients_per_round=100,
                 server_optimizer="sgd",
                 client_update="sgd", client_weighting="num_examples", min_examples=1,
                 oversample=0.0, dropout=0.0, init_scale=0.05, rating_scale=None,
                 reconstruction="als", eval_every=0, checkpoint_path=None,
                 checkpoint_every=50, dtype="float32", aggregator=None, hypergradients=None,
                 executor=None, random_state=None, verbose=False):
        self.n_factors = n_factors
        self.biases = biases
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.client_update = client_update
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.rating_scale = rating_scale
        self.reconstruction = reconstruction
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.aggregator = aggregator
        self.hypergradients = hypergradients
        self.executor = executor
        self.random_state = random_state
        self.verbose = verbose

    def _local_state(self) -> UserRows:
        return UserRows(self.init_scale)

    def client_program(self, inter, mu):
        return StatefulProgram(self._update_hp(mu, True), self._server_rows)


class FedAvgMF(_StatefulMF):
    __doc__ = """FedAvg for MF with user embeddings stored on the server.

    A sampled client downloads the global item rows *and its own user row*, trains both jointly
    for ``update_steps`` mini-batch steps on all its data, and uploads the item delta and its new
    user row; only that row changes on the server. As the paper notes, this equals the stateful
    FedPer approach in result — and exposes every user's embedding to the server. Unseen users are
    served by reconstruction (exact ridge solve, ``reconstruction``).
    """ + _PARAMS_DOC.replace("{where}", "stored by the server").replace("{cls}",
                                                                           "FedAvgMF")

    _server_rows = True


class FURLMF(_StatefulMF):
    __doc__ = """FURL (Bui et al. 2019): private user embeddings kept on each device across rounds
    (stateful), trained jointly with the federated item parameters; only the item delta is
    uploaded. The training arithmetic equals FedAvgMF's (split personalization ≡ FedPer for MF);
    the difference is where the user rows live and what is communicated. Unseen users fall back
    to reconstruction.
    """ + _PARAMS_DOC.replace("{where}", "held by the simulated devices").replace(
        "{cls}", "FURLMF")
