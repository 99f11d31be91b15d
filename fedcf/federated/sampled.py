"""FedNCF (federated NeuMF), the ranking papers' neural baseline, on its own round loop (a
Numba local pass, ``_kernels/neumf.py``, whose twin is the NumPy pass here).

Every round each sampled device draws ``negatives`` negatives per positive (never one of its own
items, nor one of ``exclude``'s), runs ``local_epochs`` of mini-batch SGD on its copy of the
global parameters and its own user embeddings, and uploads the change of the item rows it
touched and of the dense layers. The server adds the mean change over the round's devices (a
row a device did not touch counts as no change, as in the authors' code), scaled by
``server_learning_rate`` (0 switches federation off). User embeddings stay on the device,
across rounds (stateful clients, as in the papers).

Unlike FedMF and PFedRec (``sampled_mf.py``), FedNCF is not on fedcf's federated round: its
dense layers are global parameters that are not item rows, which the round's phases (clipping,
noise, masking, robust means of row deltas) do not carry. It has no differential privacy,
secure aggregation or Ray executor.

NCF is the same network trained centrally (every user's examples on one server; a Numba epoch
kernel whose twin is ``NCF._numpy_epoch``), FedNCF's centralized counterpart.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._kernels.neumf import DENSE, ITEMS, USER, neumf_epochs, neumf_local
from .._validation import Int, NoneOr, Real, check_int, check_params
from ..datasets import DataValidationError, Interactions
from ..models.base import atomic_fit, user_keys
from ..models.implicit_mf import coerce_implicit
from .sampled_mf import dense_users, exclusion_csr
from .sampled_nets import NeuMFNet

_CONSTRAINTS = {
    "n_factors": Int(1, 4096), "n_rounds": Int(0, 10**6), "clients_per_round": Int(1, None),
    "local_epochs": Int(1, 1000), "batch_size": Int(1, None), "learning_rate": Real(0.0, low_open=True),
    "server_learning_rate": Real(0.0), "negatives": Int(1, 1000), "regularization": Real(0.0),
}


def _exclusion_rows(inter: Interactions, exclude) -> list:
    """Sorted items each user may never draw as a negative: their own and ``exclude``'s."""
    ptr, items = exclusion_csr(inter, exclude)
    return [items[ptr[u]:ptr[u + 1]] for u in range(inter.n_users)]


def _scatter(idx: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    """Per-example gradients summed onto ``n`` rows."""
    out = np.zeros((n,) + g.shape[1:])
    np.add.at(out, idx, g)
    return out


class _SampledFederated(BaseEstimator):
    """What FedNCF and centralized NCF share, for any net of ``sampled_nets`` (a subclass sets
    ``_net()`` and ``_train``): fit's checks, the sampler, a device's local pass (FedNCF's
    rounds; every new user's fold-in) and scoring."""

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
        rng = np.random.default_rng(check_random_state(self.random_state).randint(2**31))
        net = self._net()
        self.net_ = net
        self.user_params_ = net.init_user(rng, inter.n_users)
        self.global_params_ = net.init_global(rng, inter.n_items)
        self.interactions_, self.user_ids_, self.item_ids_ = inter, inter.user_ids, inter.item_ids
        self.history_ = []
        self.score_seed_ = int(rng.integers(2**31))
        self._train(inter, rng)
        return self

    def _train(self, inter, rng) -> None:
        """FedNCF's rounds: every round a cohort of devices trains and the server averages."""
        active = np.flatnonzero(inter.counts() > 0)
        for r in range(self.n_rounds):
            chosen = rng.choice(active, min(self.clients_per_round, len(active)), replace=False)
            self._record("round", r, self._round(np.sort(chosen), rng))

    def _record(self, step: str, i: int, loss: float) -> None:
        """Append ``{step: i, "loss": loss}`` to ``history_``, or stop naming what to lower."""
        if not np.isfinite(loss) or not all(np.isfinite(v).all()
                                            for v in self.global_params_.values()):
            raise FloatingPointError(
                f"training diverged in {step} {i} (mean loss {loss}): lower learning_rate (now "
                f"{self.learning_rate}) or {self._item_rate_name} (now {self._item_lr():g}); "
                "the estimator keeps its previous state")
        self.history_.append({step: i, "loss": loss})

    _item_rate_name = "item_learning_rate"

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
            stages = self._stages if update_global else (("user",),)
        order = np.array([rng.permutation(n) for _ in range(epochs)])
        hp = (self._user_lr(), self._item_lr(), self.regularization)
        if self._kernel:
            loss = self._kernel_pass(user, rows, dense, idx, y, order, stages, hp)
        else:
            loss = self._numpy_pass(user, rows, dense, idx, y, order, stages, hp)
        return user, uniq, rows, dense, n, loss

    _kernel = True  # the Numba pass; False: the NumPy pass (its twin, which the tests compare)

    def _kernel_pass(self, user, rows, dense, idx, y, order, stages, hp) -> float:
        """``_numpy_pass`` by the Numba kernel (``_kernels.neumf``), the dense layers packed
        into one vector and unpacked after."""
        keys = self.net_.dense_keys
        theta = np.concatenate([dense[k].ravel() for k in keys])
        bits = np.array([("user" in st) * USER + ("items" in st) * ITEMS + ("dense" in st) * DENSE
                         for st in stages], np.int64)
        loss = neumf_local(user["pg"], user["pm"], rows["qg"], rows["qm"], theta,
                           np.array(self.net_.layers, np.int64), idx, y, order, self.batch_size,
                           bits, *hp)
        at = 0
        for k in keys:
            dense[k] = theta[at:at + dense[k].size].reshape(dense[k].shape)
            at += dense[k].size
        return loss

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


    def _item_lr(self) -> float:
        if getattr(self, "item_learning_rate", None) is not None:
            return float(self.item_learning_rate)
        return self.learning_rate * self._item_lr_factor * len(self.item_ids_)


    def _fold_epochs(self) -> int:
        """A new device's local epochs by default: as many passes as a device made in fit."""
        return self.n_rounds

    def _user_lr(self) -> float:
        """A device's step for its own embeddings (FedNCF: learning_rate)."""
        return self.learning_rate

    # ------------------------------------------------------------------ scoring
    def user_scores(self, users) -> np.ndarray:
        """Scores of every item (model item order) for dense users seen in fit: (len, n_items).
        A user's scores do not depend on which other users share the call."""
        check_is_fitted(self, "global_params_")
        users = dense_users(users, len(self.user_ids_))
        params = {k: v[users] for k, v in self.user_params_.items()}
        return self.net_.all_scores(params, self.global_params_, self.global_params_)

    def score_new_users(self, inter: Interactions, exclude=None, *, epochs=None) -> np.ndarray:
        """Scores of every item (model item order) for users unseen in fit, each trained on
        their own device from ``inter`` (same item map as fit) with the global parameters
        frozen: the user part from its initial value for ``epochs`` local epochs (default
        ``n_rounds``, as many passes as a device in fit made). ``exclude`` as in fit. A user's
        scores depend only on their own data."""
        check_is_fitted(self, "global_params_")
        epochs = check_int("epochs", self._fold_epochs() if epochs is None else epochs, low=0)
        if not isinstance(inter, Interactions) or not np.array_equal(inter.item_ids,
                                                                     self.item_ids_):
            raise DataValidationError("score_new_users needs Interactions over the model's item "
                                      "map (item_catalog=model.item_ids_)")
        excluded = _exclusion_rows(inter, exclude)
        keys = user_keys(inter.user_ids)  # a stream per raw user id, whoever shares the call
        out = np.empty((inter.n_users, len(self.item_ids_)))
        for u in range(inter.n_users):
            rng = np.random.default_rng([self.score_seed_, 1, int(keys[u])])
            user = {k: v[0] for k, v in self.net_.init_user(rng, 1).items()}
            pos = inter.items[inter.indptr[u]:inter.indptr[u + 1]]
            if len(pos) and epochs:  # trained on the device, everything global frozen
                user = self._local(pos, excluded[u], rng, update_global=False, user=user,
                                   epochs=epochs)[0]
            out[u] = self.net_.all_scores({k: v[None] for k, v in user.items()},
                                          self.global_params_, self.global_params_)[0]
        return out

    def recommend(self, user, n: int = 10):
        """The ``n`` best items (raw ids) for a user seen in fit, their fit items left out."""
        check_is_fitted(self, "global_params_")
        n = check_int("n", n, low=0)
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


class FedNCF(_SampledFederated):
    """Federated NeuMF (FedNCF, Perifanis & Efraimidis, 2022): GMF and MLP branches trained by
    binary cross-entropy on sampled negatives; user embeddings stay on the device, item
    embeddings and the MLP are averaged by the server (the module docstring says why it runs on
    its own loop).

    Parameters
    ----------
    n_factors : int, default 32
    layers : tuple of int, default (32, 16)
        Widths of the MLP branch's ReLU layers.
    n_rounds, clients_per_round, local_epochs, batch_size, negatives, regularization,
    random_state
        As in FedMF.
    learning_rate : float, default 0.5
        SGD step of the mean batch loss for the user embeddings and the MLP (FedMF's 0.1
        trains them too slowly).
    item_learning_rate : float or None, default None
        None: 2 × n_items × learning_rate (PFedRec's factor 80 makes the MLP branch diverge).
    server_learning_rate : float, default 1.0
        Scale of the devices' mean change the server adds; 0 switches federation off.

    Attributes
    ----------
    global_params_, user_params_ : dict of arrays
    user_ids_, item_ids_, interactions_, history_ (per round: mean local loss)

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
    _parameter_constraints = {**_CONSTRAINTS, "layers": lambda n, v: _check_layers(v),
                              "item_learning_rate": NoneOr(Real(0.0, low_open=True))}

    def __init__(self, n_factors=32, *, layers=(32, 16), n_rounds=100, clients_per_round=1000,
                 local_epochs=1, batch_size=256, learning_rate=0.5, item_learning_rate=None,
                 server_learning_rate=1.0, negatives=4, regularization=0.0, random_state=None):
        self.n_factors, self.layers, self.n_rounds = n_factors, layers, n_rounds
        self.clients_per_round, self.local_epochs = clients_per_round, local_epochs
        self.batch_size, self.learning_rate = batch_size, learning_rate
        self.item_learning_rate, self.server_learning_rate = item_learning_rate, server_learning_rate
        self.negatives, self.regularization = negatives, regularization
        self.random_state = random_state

    def _net(self):
        return NeuMFNet(self.n_factors, _check_layers(self.layers))


class NCF(_SampledFederated):
    """Centralized NeuMF (He et al., 2017), FedNCF's centralized counterpart: the same network
    and loss, with every user's examples on one server, trained by mini-batch SGD over all of
    them (``n_epochs`` passes; ``negatives`` fresh negatives per positive each epoch).

    Parameters
    ----------
    n_factors : int, default 32
    layers : tuple of int, default (32, 16)
    n_epochs : int, default 20
    batch_size : int, default 256
    learning_rate : float, default 0.1
        SGD step of the mean batch loss for the MLP and the output layer (on ML-100K's
        validation item, 0.05 to 0.2 do about equally well; 0.5 is worse).
    embedding_learning_rate : float or None, default None
        SGD step for the user and item embedding rows a batch touches; None: batch_size ×
        learning_rate (each example then moves its rows about as much as a per-example step).
    negatives : int, default 4
    regularization : float, default 0.0
        L2 weight decay on the dense layers and on the embedding rows a batch touches.
    random_state : int, RandomState or None

    Attributes
    ----------
    global_params_, user_params_ : dict of arrays
    user_ids_, item_ids_, interactions_, history_ (per epoch: mean batch loss)

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import NCF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> NCF(n_factors=4, layers=(8,), n_epochs=2, random_state=0).fit(data).user_scores([0]).shape
    (1, 20)
    """

    _item_rate_name = "embedding_learning_rate"
    _parameter_constraints = {
        "n_factors": Int(1, 4096), "layers": lambda n, v: _check_layers(v),
        "n_epochs": Int(0, 10**5), "batch_size": Int(1, None),
        "learning_rate": Real(0.0, low_open=True),
        "embedding_learning_rate": NoneOr(Real(0.0, low_open=True)),
        "negatives": Int(1, 1000), "regularization": Real(0.0)}

    def __init__(self, n_factors=32, *, layers=(32, 16), n_epochs=20, batch_size=256,
                 learning_rate=0.1, embedding_learning_rate=None, negatives=4,
                 regularization=0.0, random_state=None):
        self.n_factors, self.layers, self.n_epochs = n_factors, layers, n_epochs
        self.batch_size, self.learning_rate = batch_size, learning_rate
        self.embedding_learning_rate, self.negatives = embedding_learning_rate, negatives
        self.regularization, self.random_state = regularization, random_state

    local_epochs = 1  # a new user's fold-in passes (``score_new_users``), as FedNCF's

    def _net(self):
        return NeuMFNet(self.n_factors, _check_layers(self.layers))

    def _fold_epochs(self) -> int:
        return self.n_epochs

    def _user_lr(self) -> float:
        """A new user's fold-in steps their embeddings as fit stepped every user's: a batch's
        mean gradient times the embedding rate."""
        return self._item_lr()

    def _item_lr(self) -> float:
        if self.embedding_learning_rate is not None:
            return float(self.embedding_learning_rate)
        return self.batch_size * self.learning_rate

    def _train(self, inter, rng) -> None:
        active = np.flatnonzero(inter.counts() > 0)
        for epoch in range(self.n_epochs):
            draws = [self._draw(*self._device_data(u), rng) for u in active]
            who = np.repeat(active, [len(d[1]) for d in draws])
            items = np.concatenate([d[0] for d in draws])
            y = np.concatenate([d[1] for d in draws])
            order = rng.permutation(len(y))
            self._record("epoch", epoch, self._epoch(who, items, y, order))

    _kernel = True  # the Numba epoch; False: the NumPy epoch (its twin, which the tests compare)

    def _epoch(self, who, items, y, order) -> float:
        """One pass over the examples (user ``who``, item, label) in ``order``, in place; the
        mean batch loss."""
        U, G, net = self.user_params_, self.global_params_, self.net_
        hp = (self.learning_rate, self._item_lr(), self.regularization)
        if not self._kernel:
            return self._numpy_epoch(who, items, y, order, hp)
        keys = net.dense_keys
        theta = np.concatenate([G[k].ravel() for k in keys])
        loss = neumf_epochs(U["pg"], U["pm"], G["qg"], G["qm"], theta,
                            np.array(net.layers, np.int64), who, items, y, order[None, :],
                            self.batch_size, *hp)
        at = 0
        for k in keys:
            G[k] = theta[at:at + G[k].size].reshape(G[k].shape)
            at += G[k].size
        return loss

    def _numpy_epoch(self, who, items, y, order, hp) -> float:
        """The NumPy twin of the kernel's epoch: each batch's gradient from ``NeuMFNet.grads``,
        one user at a time (its share of the batch mean), then one step of everything."""
        U, G, net = self.user_params_, self.global_params_, self.net_
        (lr, emb_lr, lam), n, losses = hp, len(y), []
        dense = {k: G[k] for k in net.dense_keys}
        for b in np.array_split(order, max(1, -(-n // self.batch_size))):
            gu = {k: np.zeros_like(v) for k, v in U.items()}
            gi = {k: np.zeros_like(G[k]) for k in net.item_keys}
            gd = {k: np.zeros_like(v) for k, v in dense.items()}
            loss = 0.0
            for u in np.unique(who[b]):
                mine = b[who[b] == u]
                share = len(mine) / len(b)
                lo, g_u, g_r, g_d = net.grads({k: v[u] for k, v in U.items()},
                                              {k: G[k][items[mine]] for k in net.item_keys},
                                              dense, y[mine])
                loss += share * lo
                for k in g_u:
                    gu[k][u] += share * g_u[k]
                for k in g_r:
                    np.add.at(gi[k], items[mine], share * g_r[k])
                for k in g_d:
                    gd[k] += share * g_d[k]
            tu, ti = np.unique(who[b]), np.unique(items[b])
            for k in U:
                U[k][tu] -= emb_lr * (gu[k][tu] + lam * U[k][tu])
            for k in net.item_keys:
                G[k][ti] -= emb_lr * (gi[k][ti] + lam * G[k][ti])
            for k in dense:
                dense[k] -= lr * (gd[k] + lam * dense[k])
            losses.append(loss)
        return float(np.mean(losses))
