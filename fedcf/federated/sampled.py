"""The federated recommenders the ranking papers compare against, trained on implicit
positives with sampled negatives and binary cross-entropy: FedMF, FedNCF and PFedRec.

Every round each sampled device draws ``negatives`` negatives per positive (never one of its own
items, nor one of ``exclude``'s), runs ``local_epochs`` of mini-batch SGD on its copy of the
global parameters and its own user parameters, and uploads the change of the item rows it
touched and of the dense layers. The server adds the mean change over the round's devices (a
row a device did not touch counts as no change, as in the authors' code), scaled by
``server_learning_rate`` (0 switches federation off: every device then learns only from its
own data). User parameters stay on the device,
across rounds (stateful clients, as in the papers).

These are comparison baselines in NumPy: they have no differential privacy, secure aggregation
or Ray executor (use the FedRecon estimators for those).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._kernels.sampled import ITEMS, USER, dot_local
from .._validation import Int, NoneOr, Real, check_int, check_params
from ..datasets import DataValidationError, Interactions
from ..models.base import _plain, atomic_fit, user_keys
from ..models.implicit_mf import coerce_implicit
from .sampled_nets import DotNet, NeuMFNet

_CONSTRAINTS = {
    "n_factors": Int(1, 4096), "n_rounds": Int(0, 10**6), "clients_per_round": Int(1, None),
    "local_epochs": Int(1, 1000), "batch_size": Int(1, None), "learning_rate": Real(0.0, low_open=True),
    "server_learning_rate": Real(0.0), "negatives": Int(1, 1000), "regularization": Real(0.0),
}


def _exclusion_rows(inter: Interactions, exclude) -> list:
    """Sorted items each user may never draw as a negative: their own and ``exclude``'s."""
    csr = inter.to_csr()
    if exclude is None:
        return [csr.indices[csr.indptr[u]:csr.indptr[u + 1]] for u in range(inter.n_users)]
    if not isinstance(exclude, Interactions) or exclude.n_users != inter.n_users \
            or exclude.n_items != inter.n_items \
            or not np.array_equal(exclude.item_ids, inter.item_ids) \
            or not np.array_equal(exclude.user_ids, inter.user_ids):
        raise DataValidationError(
            f"exclude must be Interactions over the same {inter.n_users} users and "
            f"{inter.n_items} items as the training data (e.g. fedcf.eval.loo."
            "training_exclusions(split, mode))")
    ex = exclude.to_csr()
    return [np.union1d(csr.indices[csr.indptr[u]:csr.indptr[u + 1]],
                       ex.indices[ex.indptr[u]:ex.indptr[u + 1]]) for u in range(inter.n_users)]


def _check_drawable(inter: Interactions, excluded: list) -> None:
    """Every user with data must have an item left to draw as a negative."""
    for u in np.flatnonzero(inter.counts() > 0):
        if len(excluded[u]) >= inter.n_items:
            raise DataValidationError(
                f"user {_plain(inter.user_ids[u])!r} has every item of the catalog excluded, so "
                "no negative can be drawn for them; drop the user or shrink exclude")


def _scatter(idx: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    """Per-example gradients summed onto ``n`` rows."""
    out = np.zeros((n,) + g.shape[1:])
    np.add.at(out, idx, g)
    return out


class _SampledFederated(BaseEstimator):
    """Round loop and local training shared by the sampled-negative baselines (not used
    directly). A subclass sets ``_net()`` and may override ``_stages`` (which parameter groups
    each local pass updates) and ``_personal_items`` (the device finetunes its own item rows to
    score)."""

    _stages: tuple = (("user", "items", "dense"),)

    def _net(self):
        raise NotImplementedError

    # ------------------------------------------------------------------ fit
    @atomic_fit
    def fit(self, X, y=None, *, exclude=None):
        """Fit on implicit positives X (Interactions, a DataFrame with user/item columns, (user,
        item) pairs or a sparse matrix; every entry is a positive, whatever its strength).
        ``exclude``: Interactions over the same users and items whose entries are never drawn
        as negatives (see ``fedcf.eval.loo.training_exclusions``). A fit that fails (bad input,
        divergence) leaves the estimator as it was."""
        check_params(self)
        inter = coerce_implicit(X, y)
        if inter.nnz == 0:
            raise DataValidationError("fit needs at least one interaction")
        self.exclude_rows_ = _exclusion_rows(inter, exclude)
        _check_drawable(inter, self.exclude_rows_)
        rng = np.random.default_rng(check_random_state(self.random_state).randint(2**31))
        net = self._net()
        self.net_ = net
        self.user_params_ = net.init_user(rng, inter.n_users)
        self.global_params_ = net.init_global(rng, inter.n_items)
        self.interactions_, self.user_ids_, self.item_ids_ = inter, inter.user_ids, inter.item_ids
        self.history_ = []
        self.score_seed_ = int(rng.integers(2**31))
        active = np.flatnonzero(inter.counts() > 0)
        for r in range(self.n_rounds):
            chosen = rng.choice(active, min(self.clients_per_round, len(active)), replace=False)
            loss = self._round(np.sort(chosen), rng)
            if not np.isfinite(loss) or not all(np.isfinite(v).all()
                                                for v in self.global_params_.values()):
                raise FloatingPointError(
                    f"training diverged in round {r} (mean local loss {loss}): lower "
                    f"learning_rate (now {self.learning_rate}) or item_learning_rate (now "
                    f"{self._item_lr():g}); the estimator keeps its previous state")
            self.history_.append({"round": r, "loss": loss})
        return self

    def _round(self, clients, rng) -> float:
        g = self.global_params_
        sums = {k: np.zeros_like(v) for k, v in g.items()}
        losses = []
        for u in clients:
            user = {k: v[u].copy() for k, v in self.user_params_.items()}
            user, uniq, rows, dense, n, loss = self._local(*self._device_data(u), rng,
                                                           update_global=True, user=user)
            for k, v in user.items():
                self.user_params_[k][u] = v
            for k in self.net_.item_keys:
                sums[k][uniq] += rows[k] - g[k][uniq]
            for k in self.net_.dense_keys:
                sums[k] += dense[k] - g[k]
            losses.append(loss)
        for k in g:  # the mean over the round's devices, as the papers' FedAvg
            g[k] += self.server_learning_rate * sums[k] / len(clients)
        return float(np.mean(losses))

    # ------------------------------------------------------------------ one device
    def _device_data(self, u: int):
        """A seen device's positives and the items it never draws as negatives."""
        inter = self.interactions_
        return inter.items[inter.indptr[u]:inter.indptr[u + 1]], self.exclude_rows_[u]

    def _draw(self, positives: np.ndarray, excluded: np.ndarray, rng):
        mask = np.ones(len(self.item_ids_), bool)
        mask[excluded] = False
        pool = np.flatnonzero(mask)
        neg = pool[rng.integers(0, len(pool), len(positives) * self.negatives)]
        items = np.concatenate([positives, neg])
        return items, np.r_[np.ones(len(positives)), np.zeros(len(neg))]

    def _local(self, positives, excluded, rng, *, update_global: bool, user, epochs=None,
               stages=None):
        """One device's local training from the current global parameters and its ``user``
        parameters; returns them, the touched item rows (ids and values), the dense layers,
        the example count and the mean loss."""
        epochs = self.local_epochs if epochs is None else epochs
        draws = [self._draw(positives, excluded, rng) for _ in range(epochs)]  # fresh each epoch
        uniq, idx = np.unique(np.concatenate([d[0] for d in draws]), return_inverse=True)
        y, n = draws[0][1], len(draws[0][1])
        g, net = self.global_params_, self.net_
        rows = {k: g[k][uniq].copy() for k in net.item_keys}
        dense = {k: g[k].copy() for k in net.dense_keys}
        if stages is None:
            stages = self._stages if update_global else tuple(
                tuple(s for s in st if s == "user" or (s == "items" and self._personal_items))
                for st in self._stages)
        order = np.array([rng.permutation(n) for _ in range(epochs)])
        hp = (self.learning_rate, self._item_lr(), self.regularization)
        if isinstance(net, DotNet) and self._kernel:
            bits = np.array([("user" in st) * USER + ("items" in st) * ITEMS for st in stages])
            loss = dot_local(user["u"], user["c"], rows["e"], rows["b"], idx, y, order,
                             self.batch_size, bits, *hp)
        else:
            loss = self._numpy_pass(user, rows, dense, idx, y, order, stages, hp)
        return user, uniq, rows, dense, n, loss

    _kernel = True  # the Numba pass for DotNet models; False: the NumPy pass (tests compare)

    def _numpy_pass(self, user, rows, dense, idx, y, order, stages, hp) -> float:
        """Mini-batch SGD of any net, in NumPy (in place); the mean batch loss."""
        net, (lr, item_lr, lam), n = self.net_, hp, len(y)
        losses = []
        for epoch, perm in enumerate(order):
            for b in np.array_split(perm, max(1, -(-n // self.batch_size))):
                rows_b = idx[epoch * n + b]
                for stage in stages:  # PFedRec: score function first, then item rows
                    loss, gu, gr, gd = net.grads(user, {k: v[rows_b] for k, v in rows.items()},
                                                 dense, y[b])
                    if "user" in stage:
                        for k in gu:
                            user[k] -= lr * (gu[k] + lam * user[k])
                    if "items" in stage:
                        for k in gr:
                            m = len(rows[k])
                            rows[k] -= item_lr * (_scatter(rows_b, gr[k], m) + lam * rows[k])
                    if "dense" in stage:
                        for k in gd:
                            dense[k] -= lr * (gd[k] + lam * dense[k])
                losses.append(loss)
        return float(np.mean(losses))


    _personal_items = False

    def _item_lr(self) -> float:
        if self.item_learning_rate is not None:
            return float(self.item_learning_rate)
        return self.learning_rate * self._item_lr_factor * len(self.item_ids_)

    _item_lr_factor = 80.0  # PFedRec's rule (its lr_eta)

    # ------------------------------------------------------------------ scoring
    def user_scores(self, users) -> np.ndarray:
        """Scores of every item (model item order) for dense users seen in fit: (len, n_items).
        A user's scores do not depend on which other users share the call."""
        check_is_fitted(self, "global_params_")
        users = np.asarray(users, np.int64)
        params = {k: v[users] for k, v in self.user_params_.items()}
        if not self._personal_items:
            return self.net_.all_scores(params, self.global_params_, self.global_params_)
        out = np.empty((len(users), len(self.item_ids_)))
        for r, u in enumerate(users):  # the device's finetuned item embedding
            rng = np.random.default_rng([self.score_seed_, int(u)])
            user = {k: v[r].copy() for k, v in params.items()}
            out[r] = self._device_scores(*self._device_data(u), rng, user)
        return out

    def score_new_users(self, inter: Interactions, exclude=None, *, epochs=None) -> np.ndarray:
        """Scores of every item (model item order) for users unseen in fit, each trained on
        their own device from ``inter`` (same item map as fit) with the global parameters
        frozen: the user part from its initial value for ``epochs`` local epochs (default
        ``n_rounds``, as many passes as a device in fit made), then PFedRec's personal item rows
        for one local pass. ``exclude`` as in fit. A user's scores depend only on their own
        data."""
        check_is_fitted(self, "global_params_")
        epochs = check_int("epochs", self.n_rounds if epochs is None else epochs, low=0)
        if not isinstance(inter, Interactions) or not np.array_equal(inter.item_ids,
                                                                     self.item_ids_):
            raise DataValidationError("score_new_users needs Interactions over the model's item "
                                      "map (item_catalog=model.item_ids_)")
        excluded = _exclusion_rows(inter, exclude)
        keys = user_keys(inter.user_ids)  # a stream per raw user id, whoever shares the call
        out = np.empty((inter.n_users, len(self.item_ids_)))
        _check_drawable(inter, excluded)
        for u in range(inter.n_users):
            rng = np.random.default_rng([self.score_seed_, 1, int(keys[u])])
            user = {k: v[0] for k, v in self.net_.init_user(rng, 1).items()}
            pos = inter.items[inter.indptr[u]:inter.indptr[u + 1]]
            out[u] = self._device_scores(pos, excluded[u], rng, user, epochs, fold_in=True)
        return out

    def _device_scores(self, positives, excluded, rng, user, epochs=None, fold_in=False):
        """One device's scores of every item (nothing leaves the device): a new device first
        trains its user part for ``epochs`` with everything global frozen; a PFedRec device
        then finetunes its personal item rows, one local pass as in a round."""
        if len(positives) and fold_in and epochs:
            user = self._local(positives, excluded, rng, update_global=False, user=user,
                               epochs=epochs, stages=(("user",),))[0]
        items = self.global_params_
        if len(positives) and self._personal_items:
            user, uniq, rows, _, _, _ = self._local(positives, excluded, rng, update_global=False,
                                                    user=user)
            items = {k: self.global_params_[k].copy() for k in self.net_.item_keys}
            for k in self.net_.item_keys:
                items[k][uniq] = rows[k]
        one = {k: v[None] for k, v in user.items()}
        return self.net_.all_scores(one, items, self.global_params_)[0]

    def recommend(self, user, n: int = 10):
        """The ``n`` best items (raw ids) for a user seen in fit, their fit items left out."""
        check_is_fitted(self, "global_params_")
        where = np.flatnonzero(np.asarray(self.user_ids_) == user)
        if len(where) == 0:
            raise KeyError(f"user {user!r} was not seen in fit")
        u = int(where[0])
        s = self.user_scores([u])[0]
        inter = self.interactions_
        s[inter.items[inter.indptr[u]:inter.indptr[u + 1]]] = -np.inf
        top = np.argsort(-s, kind="stable")[:n]
        return list(np.asarray(self.item_ids_)[top[np.isfinite(s[top])]])


def _check_layers(layers) -> tuple:
    layers = tuple(layers) if isinstance(layers, (tuple, list)) else None
    if not layers or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1
                         for w in layers):
        raise ValueError(f"layers must be a non-empty tuple of widths >= 1, got {layers!r}")
    return layers


class FedMF(_SampledFederated):
    """FedMF (Chai et al., 2020) on implicit feedback: score = p_u·q_i + c_u + b_i, trained by
    binary cross-entropy on the device's positives and sampled negatives.

    The device keeps p_u and c_u and uploads the change of the item rows it touched. This is
    fedcf's FURLMF (user rows on the device, joint local steps) with the loss of implicit
    feedback instead of the squared error of ratings; Chai et al.'s homomorphic encryption of
    the upload is what SecureAggregation gives the FedRecon estimators.

    Parameters
    ----------
    n_factors : int, default 32
    n_rounds : int, default 100
    clients_per_round : int, default 1000
        Devices per round (all of them when there are fewer, as the papers' default).
    local_epochs : int, default 1
    batch_size : int, default 256
    learning_rate : float, default 0.1
        SGD step of the mean batch loss for the user part and the dense layers.
    item_learning_rate : float or None, default None
        SGD step for the item rows; None: 80 × n_items × learning_rate, PFedRec's rule (the
        mean loss gives each row a gradient about batch_size times smaller).
    server_learning_rate : float, default 1.0
        Scale of the devices' mean change the server adds; 0 switches federation off.
    negatives : int, default 4
        Negatives drawn per positive each time a device trains.
    regularization : float, default 0.0
        L2 weight decay on every parameter a device updates.
    random_state : int, RandomState or None

    Attributes
    ----------
    global_params_, user_params_ : dict of arrays
    user_ids_, item_ids_, interactions_, history_ (per round: mean local loss)

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import FedMF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedMF(n_factors=4, n_rounds=3, random_state=0).fit(data)
    >>> model.user_scores([0, 1]).shape
    (2, 20)
    """

    _parameter_constraints = {**_CONSTRAINTS, "item_learning_rate": NoneOr(Real(0.0, low_open=True))}

    def __init__(self, n_factors=32, *, n_rounds=100, clients_per_round=1000, local_epochs=1,
                 batch_size=256, learning_rate=0.1, item_learning_rate=None,
                 server_learning_rate=1.0, negatives=4, regularization=0.0, random_state=None):
        self.n_factors, self.n_rounds, self.clients_per_round = n_factors, n_rounds, clients_per_round
        self.local_epochs, self.batch_size = local_epochs, batch_size
        self.learning_rate, self.item_learning_rate = learning_rate, item_learning_rate
        self.server_learning_rate, self.negatives = server_learning_rate, negatives
        self.regularization, self.random_state = regularization, random_state

    def _net(self):
        return DotNet(self.n_factors)


class PFedRec(FedMF):
    """PFedRec (Zhang et al., IJCAI 2023), dual personalization: a global item embedding and,
    on each device, a personal score function (a linear layer on the item embedding, kept across
    rounds) and a personal item embedding finetuned from the global one.

    Each local batch first steps the score function with the item embedding fixed, then the
    item embedding with the score function fixed (as the authors' code); the server averages the
    item embeddings. To score, the device finetunes the current global embedding once more
    (nothing uploaded), as it would before recommending.

    Parameters
    ----------
    As FedMF (``item_learning_rate`` None is the authors' 80 × n_items × learning_rate).

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import PFedRec
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = PFedRec(n_factors=4, n_rounds=3, random_state=0).fit(data)
    >>> len(model.recommend(data.user_ids[0], n=3))
    3
    """

    _stages = (("user",), ("items",))
    _personal_items = True


class FedNCF(FedMF):
    """Federated NeuMF (FedNCF, Perifanis & Efraimidis, 2022): GMF and MLP branches; user
    embeddings stay on the device, item embeddings and the MLP are averaged by the server.

    Parameters
    ----------
    As FedMF, except:

    learning_rate : float, default 0.5
        FedMF's 0.1 trains the user embeddings and the MLP too slowly.
    item_learning_rate : float or None, default None
        None: 2 × n_items × learning_rate (PFedRec's factor 80 makes the MLP branch diverge).
    layers : tuple of int, default (32, 16)
        Widths of the MLP branch's ReLU layers.

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import FedNCF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedNCF(n_factors=4, layers=(8, 4), n_rounds=3, random_state=0).fit(data)
    >>> model.user_scores([0]).shape
    (1, 20)
    """

    _item_lr_factor = 2.0

    _parameter_constraints = {**FedMF._parameter_constraints, "layers": lambda n, v: _check_layers(v)}

    def __init__(self, n_factors=32, *, layers=(32, 16), n_rounds=100, clients_per_round=1000,
                 local_epochs=1, batch_size=256, learning_rate=0.5, item_learning_rate=None,
                 server_learning_rate=1.0, negatives=4, regularization=0.0, random_state=None):
        super().__init__(n_factors, n_rounds=n_rounds, clients_per_round=clients_per_round,
                         local_epochs=local_epochs, batch_size=batch_size,
                         learning_rate=learning_rate, item_learning_rate=item_learning_rate,
                         server_learning_rate=server_learning_rate, negatives=negatives,
                         regularization=regularization, random_state=random_state)
        self.layers = layers

    def _net(self):
        return NeuMFNet(self.n_factors, _check_layers(self.layers))
