"""Centralized NCF (NeuMF, He et al. 2017): FedNCF's network (``sampled_nets.NeuMFNet``) trained on one
server, every user's examples shuffled together; a Numba epoch kernel
(``_kernels.neumf.neumf_epochs``) whose twin is ``NCF._numpy_epoch``. New users are folded in
on their own device, everything global frozen (``_kernels.neumf.neumf_local``).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .. import registry
from .._io import atomic_savez, load_npz
from .._kernels.neumf import USER, neumf_epochs, neumf_local
from .._validation import Int, NoneOr, Real, check_int, check_params, named_kwargs
from ..datasets import DataValidationError, Interactions
from .base import atomic_fit, check_memory, user_keys
from .implicit_mf import coerce_implicit
from .negatives import check_layers, check_negatives, dense_users, exclusion_csr
from .persistence import _META, FORMAT_VERSION, _ids_from_arrays, _ids_to_arrays, npz_path
from .sampled_nets import NeuMFNet


def _exclusion_rows(inter: Interactions, exclude) -> list:
    """Sorted items each user may never draw as a negative: their own and ``exclude``'s."""
    ptr, items = exclusion_csr(inter, exclude)
    return [items[ptr[u]:ptr[u + 1]] for u in range(inter.n_users)]


class NCF(BaseEstimator):
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

    interactions_ = seen_indptr_ = seen_items_ = None  # fit's data, or a loaded model's items

    _parameter_constraints = {
        "n_factors": Int(1, 4096), "layers": lambda n, v: check_layers(v),
        "n_epochs": Int(0, 10**5), "batch_size": Int(1, None),
        "learning_rate": Real(0.0, low_open=True),
        "embedding_learning_rate": NoneOr(Real(0.0, low_open=True)),
        "negatives": Int(1, 1000), "regularization": Real(0.0)}

    @named_kwargs
    def __init__(self, n_factors=32, *, layers=(32, 16), n_epochs=20, batch_size=256,
                 learning_rate=0.1, embedding_learning_rate=None, negatives=4,
                 regularization=0.0, random_state=None):
        self.n_factors, self.layers, self.n_epochs = n_factors, layers, n_epochs
        self.batch_size, self.learning_rate = batch_size, learning_rate
        self.embedding_learning_rate, self.negatives = embedding_learning_rate, negatives
        self.regularization, self.random_state = regularization, random_state

    def _net(self):
        return NeuMFNet(self.n_factors, check_layers(self.layers))

    def _user_lr(self) -> float:
        """A new user's fold-in steps their embeddings as fit stepped every user's: a batch's
        mean gradient times the embedding rate."""
        return self._item_lr()

    def _item_lr(self) -> float:
        if self.embedding_learning_rate is not None:
            return float(self.embedding_learning_rate)
        return self.batch_size * self.learning_rate

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
        check_negatives(self.negatives, inter.n_items)
        net = self._net()
        check_memory(8 * (4 * (inter.n_users + inter.n_items) * 2 * self.n_factors
                          + 4 * net.dense_size),
                     f"NCF with layers={net.layers!r}, n_factors={self.n_factors}",
                     "lower layers or n_factors")
        self.exclude_rows_ = _exclusion_rows(inter, exclude)
        rng = np.random.default_rng(check_random_state(self.random_state).randint(2**31))
        self.net_ = net
        self.user_params_ = net.init_user(rng, inter.n_users)
        self.global_params_ = net.init_global(rng, inter.n_items)
        self.interactions_, self.user_ids_, self.item_ids_ = inter, inter.user_ids, inter.item_ids
        self.history_ = []
        self.score_seed_ = int(rng.integers(2**31))
        self._train(inter, rng)
        return self

    def _train(self, inter, rng) -> None:
        active = np.flatnonzero(inter.counts() > 0)
        for epoch in range(self.n_epochs):
            draws = [self._draw(*self._device_data(u), rng) for u in active]
            who = np.repeat(active, [len(d[1]) for d in draws])
            items = np.concatenate([d[0] for d in draws])
            y = np.concatenate([d[1] for d in draws])
            order = rng.permutation(len(y))
            self._record("epoch", epoch, self._epoch(who, items, y, order))

    def _record(self, step: str, i: int, loss: float) -> None:
        """Append ``{step: i, "loss": loss}`` to ``history_``, or stop naming what to lower."""
        if not np.isfinite(loss) or not all(np.isfinite(v).all()
                                            for v in self.global_params_.values()):
            raise FloatingPointError(
                f"training diverged in {step} {i} (mean loss {loss}): lower learning_rate (now "
                f"{self.learning_rate}) or embedding_learning_rate (now {self._item_lr():g}); "
                "the estimator keeps its previous state")
        self.history_.append({step: i, "loss": loss})

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

    def _local(self, positives, excluded, rng, *, user, epochs) -> dict:
        """A new device's fold-in: its ``user`` embeddings trained for ``epochs`` local epochs
        on its positives and fresh negatives, everything global frozen (the kernel's USER
        stage; the network's rows are copies, never written back)."""
        draws = [self._draw(positives, excluded, rng) for _ in range(epochs)]  # fresh each epoch
        uniq, idx = np.unique(np.concatenate([d[0] for d in draws]), return_inverse=True)
        y, n = draws[0][1], len(draws[0][1])
        g, net = self.global_params_, self.net_
        order = np.array([rng.permutation(n) for _ in range(epochs)])
        theta = net.pack({k: g[k] for k in net.dense_keys})
        neumf_local(user["pg"], user["pm"], g["qg"][uniq], g["qm"][uniq], theta,
                    np.array(net.layers, np.int64), idx, y, order, self.batch_size,
                    np.array([USER], np.int64), self._user_lr(), 0.0, self.regularization)
        return user

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
        ``n_epochs``, as many passes as fit made over each user). ``exclude`` as in fit. A user's
        scores depend only on their own data."""
        check_is_fitted(self, "global_params_")
        epochs = check_int("epochs", self.n_epochs if epochs is None else epochs, low=0)
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
                user = self._local(pos, excluded[u], rng, user=user, epochs=epochs)
            out[u] = self.net_.all_scores({k: v[None] for k, v in user.items()},
                                          self.global_params_, self.global_params_)[0]
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, path):
        """Write the fitted network, the seen users' embeddings and ids, and their fit items (for
        ``recommend``) to one ``.npz`` with JSON metadata, atomically, never pickle."""
        check_is_fitted(self, "global_params_")
        path = npz_path(path)
        arrays = {**{f"global_{k}": v for k, v in self.global_params_.items()},
                  **{f"user_{k}": v for k, v in self.user_params_.items()},
                  **_ids_to_arrays(self.user_ids_, "user"), **_ids_to_arrays(self.item_ids_, "item"),
                  "seen_indptr": self._seen()[0], "seen_items": self._seen()[1]}
        meta = {"format_version": FORMAT_VERSION, "class": type(self).__name__,
                "params": {k: registry.encode(v) for k, v in self.get_params().items()},
                "history": self.history_, "score_seed": self.score_seed_}
        return atomic_savez(path, arrays, meta, meta_key=_META)

    @classmethod
    def load(cls, path):
        """A model written by ``save``; a file of another class, a newer format or arrays that do
        not fit the saved network are refused, naming the path."""
        arrays, meta = load_npz(path, meta_key=_META, what="model")
        where = f"model file {str(path)!r}"
        if meta.get("class") != cls.__name__ or meta.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(f"{where} holds a {meta.get('class')} (format "
                             f"{meta.get('format_version')}), not a {cls.__name__} this fedcf "
                             "reads; load it with fedcf.load_model")
        model = cls(**{k: registry.decode(v, k) for k, v in meta["params"].items()})
        model.user_ids_ = _ids_from_arrays(arrays, "user")
        model.item_ids_ = _ids_from_arrays(arrays, "item")
        model.net_ = net = model._net()
        rng = np.random.default_rng(0)  # shapes only
        want = {**{f"global_{k}": v for k, v in net.init_global(rng, len(model.item_ids_)).items()},
                **{f"user_{k}": v for k, v in net.init_user(rng, len(model.user_ids_)).items()}}
        for k, v in want.items():
            got = arrays.get(k)
            if got is None or got.shape != v.shape or not np.isfinite(got).all():
                raise ValueError(f"{where}: array {k!r} is missing, of another shape than the "
                                 f"saved network's {v.shape}, or not finite: damaged or edited")
        model.global_params_ = {k[7:]: arrays[k] for k in want if k.startswith("global_")}
        model.user_params_ = {k[5:]: arrays[k] for k in want if k.startswith("user_")}
        model.seen_indptr_, model.seen_items_ = arrays["seen_indptr"], arrays["seen_items"]
        model.history_, model.score_seed_ = meta["history"], int(meta["score_seed"])
        model.interactions_ = None  # a file holds no user's ratings
        return model

    def _seen(self):
        """(indptr, items) of the seen users' fit items."""
        inter = self.interactions_
        return (inter.indptr, inter.items) if inter is not None else \
            (self.seen_indptr_, self.seen_items_)

    def recommend(self, user, n: int = 10):
        """The ``n`` best items (raw ids) for a user seen in fit, their fit items left out."""
        check_is_fitted(self, "global_params_")
        n = check_int("n", n, low=0)
        where = np.flatnonzero(np.asarray(self.user_ids_) == user)
        if len(where) == 0:
            raise KeyError(f"user {user!r} was not seen in fit")
        u = int(where[0])
        s = self.user_scores([u])[0]
        indptr, items = self._seen()
        s[items[indptr[u]:indptr[u + 1]]] = -np.inf
        top = np.argsort(-s, kind="stable")[:n]
        return list(np.asarray(self.item_ids_)[top[np.isfinite(s[top])]])


