"""Centralized NCF, FedNCF's network trained on one server (NeuMF: He et al., 2017;
``sampled_nets.NeuMFNet``): every user's examples shuffled together, a Numba epoch kernel
(``_kernels.neumf.neumf_epochs``) whose twin is ``NCF._numpy_epoch``. It serves as FedNCF does
(``NeuMFScoring``, ``DeviceFoldIn``): new users are folded in on their own device, everything
global frozen (``_kernels.neumf.neumf_local``).
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from .. import registry
from .._kernels.neumf import USER, neumf_epochs, neumf_local
from .._validation import Int, NoneOr, Real
from ..datasets import DataValidationError
from .base import MFEstimatorBase, RankingScoreMixin, atomic_fit, check_memory
from .implicit_mf import coerce_implicit
from .negatives import DeviceFoldIn, check_layers, check_negatives, exclusion_csr
from .sampled_nets import NeuMFScoring


class NCF(NeuMFScoring, DeviceFoldIn, RankingScoreMixin, MFEstimatorBase):
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
    item_factors_ : ndarray (n_items, 2 × n_factors), each item's [q_g | q_m]
    dense_params_ : ndarray, the MLP and output layer packed (``NeuMFNet.unpack`` reads it)
    user_factors_ : ndarray (n_users, 2 × n_factors), each user's [p_g | p_m]
    item_biases_, user_biases_ : ndarray, zero (NeuMF has no bias terms)
    user_ids_, item_ids_, interactions_, history_ (per epoch: mean batch loss)

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf import NCF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> NCF(n_factors=4, layers=(8,), n_epochs=2, random_state=0).fit(data).user_scores([0]).shape
    (1, 20)
    """

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_",
                     "dense_params_")
    global_mean_, rating_scale_ = 0.0, None  # logits: no global mean, no rating scale

    _parameter_constraints = {
        "n_factors": Int(1, 4096), "layers": lambda n, v: check_layers(v),
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
    def fit(self, X, y=None, *, exclude=None, **data_kwargs):
        """Fit on implicit positives X (Interactions, a DataFrame with user/item columns, (user,
        item) pairs or a sparse matrix; every entry is a positive, whatever its strength;
        ``data_kwargs`` as ``Interactions.coerce``'s, e.g. ``duplicates``). ``exclude``:
        Interactions over the same users and items whose entries are never drawn as negatives
        (see ``fedcf.eval.loo.training_exclusions``). A fit that fails (bad input, divergence)
        leaves the estimator as it was."""
        self._check_params()
        inter = coerce_implicit(X, y, **data_kwargs)
        if inter.nnz == 0:
            raise DataValidationError("fit needs at least one interaction")
        check_negatives(self.negatives, inter.n_items)
        net = self._net()
        check_memory(8 * (4 * (inter.n_users + inter.n_items) * 2 * self.n_factors
                          + 4 * net.dense_size),
                     f"NCF with layers={net.layers!r}, n_factors={self.n_factors}",
                     "lower layers or n_factors")
        excl = exclusion_csr(inter, exclude)
        rng = np.random.default_rng(check_random_state(self.random_state).randint(2**31))
        U, G = net.init_user(rng, inter.n_users), net.init_global(rng, inter.n_items)
        self.score_seed_ = int(rng.integers(2**31))
        self.history_ = self._train(inter, excl, U, G, rng)
        self.item_factors_ = np.hstack([G["qg"], G["qm"]])
        self.dense_params_ = net.pack({k: G[k] for k in net.dense_keys})
        self.user_factors_ = np.hstack([U["pg"], U["pm"]])
        self.item_biases_, self.user_biases_ = np.zeros(inter.n_items), np.zeros(inter.n_users)
        self.interactions_, self.user_ids_, self.item_ids_ = inter, inter.user_ids, inter.item_ids
        return self

    def _train(self, inter, excl, U, G, rng) -> list:
        """``n_epochs`` passes over every user's positives and fresh negatives, shuffled
        together; updates U and G in place, returns the history."""
        active, history = np.flatnonzero(inter.counts() > 0), []
        for epoch in range(self.n_epochs):
            draws = [self._draw(inter.items[inter.indptr[u]:inter.indptr[u + 1]],
                                excl[1][excl[0][u]:excl[0][u + 1]], inter.n_items, rng)
                     for u in active]
            who = np.repeat(active, [len(d[1]) for d in draws])
            items = np.concatenate([d[0] for d in draws])
            y = np.concatenate([d[1] for d in draws])
            order = rng.permutation(len(y))
            loss = self._epoch(who, items, y, order, U, G)
            self._check_finite("epoch", epoch, loss, G)
            history.append({"epoch": epoch, "loss": loss})
        return history

    def _check_finite(self, step: str, i: int, loss: float, G: dict) -> None:
        """Stop, naming what to lower, when ``step`` ``i`` left a non-finite loss or model."""
        if not np.isfinite(loss) or not all(np.isfinite(v).all() for v in G.values()):
            raise FloatingPointError(
                f"training diverged in {step} {i} (mean loss {loss}): lower learning_rate (now "
                f"{self.learning_rate}) or embedding_learning_rate (now {self._item_lr():g}); "
                "the estimator keeps its previous state")

    def _draw(self, positives: np.ndarray, excluded: np.ndarray, n_items: int, rng):
        mask = np.ones(n_items, bool)
        mask[excluded] = False
        pool = np.flatnonzero(mask)
        neg = pool[rng.integers(0, len(pool), len(positives) * self.negatives)]
        items = np.concatenate([positives, neg])
        return items, np.r_[np.ones(len(positives)), np.zeros(len(neg))]

    _kernel = True  # the Numba epoch; False: the NumPy epoch (its twin, which the tests compare)

    def _epoch(self, who, items, y, order, U, G) -> float:
        """One pass over the examples (user ``who``, item, label) in ``order``, updating the
        user parameters U and the network G in place; the mean batch loss."""
        net, hp = self._net(), (self.learning_rate, self._item_lr(), self.regularization)
        if not self._kernel:
            return self._numpy_epoch(who, items, y, order, hp, U, G)
        theta = net.pack({k: G[k] for k in net.dense_keys})
        loss = neumf_epochs(U["pg"], U["pm"], G["qg"], G["qm"], theta,
                            np.array(net.layers, np.int64), who, items, y, order[None, :],
                            self.batch_size, *hp)
        G.update(net.unpack(theta))
        return loss

    def _numpy_epoch(self, who, items, y, order, hp, U, G) -> float:
        """The NumPy twin of the kernel's epoch: each batch's gradient from ``NeuMFNet.grads``,
        one user at a time (its share of the batch mean), then one step of everything."""
        net, (lr, emb_lr, lam), n, losses = self._net(), hp, len(y), []
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

    # ------------------------------------------------------------------ serving
    def _fold_in_epochs(self) -> int:
        return self.n_epochs  # as many passes as fit made over each user

    def _fold_in(self, indptr, items, excl, keys, epochs: int):
        """Each new device's [p_g | p_m], from its initial value trained for ``epochs`` local
        epochs on its positives and fresh negatives, everything global frozen; a device's
        draws come from its own stream (``score_seed_`` and its key)."""
        n, d, net = len(indptr) - 1, self.n_factors, self._net()
        P = np.empty((n, self._row_width()))
        for u in range(n):
            rng = np.random.default_rng([self.score_seed_, 1, int(keys[u])])
            user = {k: v[0] for k, v in net.init_user(rng, 1).items()}
            pos = np.asarray(items[indptr[u]:indptr[u + 1]], np.int64)
            if len(pos) and epochs:
                self._local(pos, excl[1][excl[0][u]:excl[0][u + 1]], rng, user, epochs)
            P[u, :d], P[u, d:] = user["pg"], user["pm"]
        return P, np.zeros(n)

    def _local(self, positives, excluded, rng, user: dict, epochs: int) -> None:
        """One device's fold-in, in place on ``user`` (the kernel's USER stage; the network's
        rows are copies, never written back)."""
        n_items, d = len(self.item_ids_), self.n_factors
        draws = [self._draw(positives, excluded, n_items, rng) for _ in range(epochs)]
        uniq, idx = np.unique(np.concatenate([dr[0] for dr in draws]), return_inverse=True)
        y, n = draws[0][1], len(draws[0][1])
        order = np.array([rng.permutation(n) for _ in range(epochs)])
        Q = np.asarray(self.item_factors_, np.float64)[uniq]
        neumf_local(user["pg"], user["pm"], np.ascontiguousarray(Q[:, :d]),
                    np.ascontiguousarray(Q[:, d:]),
                    np.array(self.dense_params_, np.float64), self._widths(), idx, y, order,
                    self.batch_size, np.array([USER], np.int64), self._user_lr(), 0.0,
                    self.regularization)

    # ------------------------------------------------------------------ persistence
    @classmethod
    def _saved_arrays_of(cls, arrays: dict, meta: dict) -> dict:
        """A file written before NCF joined the family's format (its network as ``global_*``
        and ``user_*`` arrays, the fold-in seed in the metadata) loads with them moved."""
        if "global_qg" not in arrays:
            return arrays
        net = cls(**{k: registry.decode(v, k) for k, v in meta["params"].items()
                     if k in ("n_factors", "layers")})._net()
        g = {k[7:]: v for k, v in arrays.items() if k.startswith("global_")}
        try:
            moved = {"item_factors_": np.hstack([g["qg"], g["qm"]]),
                     "user_factors_": np.hstack([arrays["user_pg"], arrays["user_pm"]]),
                     "dense_params_": net.pack(g)}
        except (KeyError, ValueError):
            raise ValueError("an NCF model file of the earlier format whose arrays do not fit "
                             "its network: damaged or edited") from None
        moved["item_biases_"] = np.zeros(len(moved["item_factors_"]))
        moved["user_biases_"] = np.zeros(len(moved["user_factors_"]))
        meta.update(global_mean=0.0, rating_scale=None, user_ids_kept=True,
                    fitted_values={"score_seed_": int(meta.get("score_seed", 0))})
        return {**{k: v for k, v in arrays.items() if not k.startswith(("global_", "user_p"))},
                **moved}
