"""OOV expansion on the device (Shenoy et al., "Now It Sounds Like You: Learning Personalized
Vocabulary On Device"), for items outside a model's catalog.

The seed's form, item for word: a *global feature extractor* maps an out-of-catalog item's
features to a representation (the seed's CharCNN; here a ridge map from item features to the
item's row [q_i, b_i], fitted on the server to the catalog's rows, so no user upload is
involved), then a randomly initialised *residual MLP adapter* ã(e) = e + MLP(e), trained on the
device on the user's own out-of-catalog ratings after reconstruction, turns it into the row
the user scores the item with. Nothing about a user's out-of-catalog items leaves the device:
pair it with a model trained with ``OpenCatalog(drop_out_of_catalog=True)`` (or on a catalog
alone), whose devices leave those entries out of every upload.

``adapter=False`` is the seed's "trivial adapter" (the extractor's rows as they are). The
federated linear adapter (``FedReconMF.fit(item_features=...)``), trained from uploads that
depend on the out-of-catalog items a user touched, is a different method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from ..._validation import Bool, Int, Real, check_params, raw_ids
from ...datasets import DataValidationError, Interactions, ItemFeatures, hash_buckets
from ...models.base import LocalParams, content_key
from .catalog import _history


@dataclass(frozen=True)
class OOVLocalParams(LocalParams):
    """A reconstructed user and their trained adapter. Never leaves the device.

    Parameters
    ----------
    factors : ndarray (K,)
    bias : float
    adapter : tuple of ndarray
        Weights and biases of each hidden layer, then the output layer's; () for the trivial
        adapter.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import OOVLocalParams
    >>> OOVLocalParams(np.zeros(2), 0.0, ()).adapter
    ()
    """

    adapter: tuple = ()


def _check_hidden(name, v):
    ok = isinstance(v, (tuple, list)) and len(v) > 0 and all(
        isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 1 for w in v)
    if not ok:
        raise ValueError(f"{name} must be a non-empty tuple of layer widths >= 1, got {v!r}")
    return tuple(int(w) for w in v)


def adapter_init(rng, D: int, hidden: tuple, scale: float) -> tuple:
    """Weights normal with std ``scale``, biases zero: [W_1, b_1, ..., W_L, b_L, W_o, b_o]."""
    out, width = [], D
    for h in (*hidden, D):
        out += [rng.normal(0.0, scale, (width, h)), np.zeros(h)]
        width = h
    return tuple(out)


def adapter_forward(theta, E):
    """ã = E + MLP(E) for rows E (n, D); returns (ã, the hidden activations)."""
    acts = [E]
    for j in range(0, len(theta) - 2, 2):
        acts.append(np.maximum(acts[-1] @ theta[j] + theta[j + 1], 0.0))
    return E + acts[-1] @ theta[-2] + theta[-1], acts


def adapter_loss_grad(theta, E, t, x, lam):
    """Loss mean((t − ã·x)²) + lam·‖θ‖² of the adapted rows ã = adapter(E) scored against the
    user x = [p; 1] (θ: every weight and bias), and its gradient with respect to each."""
    A, acts = adapter_forward(theta, E)
    r = t - A @ x
    loss = float(np.mean(r ** 2)) + lam * sum(float(np.sum(W ** 2)) for W in theta)
    g = np.outer(-2.0 * r / len(t), x)  # d loss / d ã
    grads = [None] * len(theta)
    grads[-2] = acts[-1].T @ g + 2 * lam * theta[-2]
    grads[-1] = g.sum(axis=0) + 2 * lam * theta[-1]
    g = g @ theta[-2].T
    for j in range(len(theta) - 4, -1, -2):
        g = g * (acts[j // 2 + 1] > 0)
        grads[j] = acts[j // 2].T @ g + 2 * lam * theta[j]
        grads[j + 1] = g.sum(axis=0) + 2 * lam * theta[j + 1]
        g = g @ theta[j].T
    return loss, grads


class OOVExpansion(BaseEstimator):
    """OOV expansion on the device for a fitted FedReconMF whose out-of-catalog items get no
    global term (``FullCatalog`` on a catalog, or ``OpenCatalog(drop_out_of_catalog=True)``).

    Parameters
    ----------
    hidden : tuple of int, default (32,)
        Widths of the adapter's ReLU layers (the seed's H).
    adapter : bool, default True
        False: the trivial adapter (identity), the extractor's rows as they are.
    init_scale : float, default 0.01
        Standard deviation of the adapter's initial weights (the seed's σ; biases start at 0).
    learning_rate : float, default 0.05
        Step of the adapter's full-batch gradient descent on the device.
    steps : int, default 100
        Gradient steps on the device's out-of-catalog support entries.
    regularization : float, default 10.0
        L2 weight on every adapter parameter, weights and biases, counted in ratings: a device
        with n out-of-catalog support ratings minimizes their mean squared error plus
        (regularization / n)·‖θ‖², a prior worth ``regularization`` ratings. It shrinks the
        adapter toward the identity, the more the fewer ratings a device has (weights alone
        leave the output bias, a personal shift of every out-of-catalog row, free to fit
        noise). Each step applies it exactly (θ ← (θ − η∇)/(1 + 2ηλ/n), a proximal step), so
        no value of it makes the steps diverge.
    encoder_regularization : float, default 1.0
        Ridge weight of the global extractor (features → [q_i, b_i]; intercept unpenalized).
    random_state : int or None, default None
        Seeds the adapters' initial weights (a device's draw depends on its history alone).

    Attributes
    ----------
    model_ : the fitted FedReconMF
    features_ : ItemFeatures
    encoder_ : ndarray (n_features + 1, n_factors + 1), the extractor (last row: intercept)

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf import FedReconMF
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import OOVExpansion, OpenCatalog
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedReconMF(n_factors=4, n_rounds=3, clients_per_round=20, random_state=0,
    ...                    item_space=OpenCatalog(0.5, drop_out_of_catalog=True)).fit(data)
    >>> feats = (data.item_ids, np.eye(20)[:, :6])
    >>> oov = OOVExpansion(steps=10, random_state=0).fit(model, feats)
    >>> oov.predict_local(oov.personalize([1, 2, 3], [5.0, 4.0, 3.0]), [1, 19]).shape
    (2,)
    """

    _parameter_constraints = {
        "hidden": _check_hidden, "adapter": Bool(), "init_scale": Real(0.0),
        "learning_rate": Real(0.0, low_open=True), "steps": Int(0, 10**6),
        "regularization": Real(0.0), "encoder_regularization": Real(0.0, low_open=True),
    }

    def __init__(self, *, hidden=(32,), adapter=True, init_scale=0.01, learning_rate=0.05,
                 steps=100, regularization=10.0, encoder_regularization=1.0,
                 random_state=None):
        self.hidden, self.adapter, self.init_scale = hidden, adapter, init_scale
        self.learning_rate, self.steps, self.regularization = learning_rate, steps, regularization
        self.encoder_regularization, self.random_state = encoder_regularization, random_state

    # ------------------------------------------------------------------ the server's part
    def fit(self, model, item_features):
        """Fit the global extractor to ``model``'s catalog rows from ``item_features``
        (``ItemFeatures``, a DataFrame indexed by raw item id, or an (item_ids, matrix) pair,
        covering out-of-catalog items too). Reads no user data."""
        check_params(self)
        _check_model(model)
        feats = ItemFeatures.coerce(item_features)
        rows = feats.rows_of(model.item_ids_)
        has = rows >= 0
        if not has.any():
            raise DataValidationError("item_features cover none of the model's catalog items "
                                      f"(e.g. {model.item_ids_[0]!r}); the extractor is fitted "
                                      "to their rows, so give features for catalog items too")
        X = _with_intercept(feats.matrix[rows[has]])
        Y = np.column_stack([model.item_factors_[has], model.item_biases_[has]]).astype(float)
        pen = np.full(X.shape[1], float(self.encoder_regularization))
        pen[-1] = 0.0
        self.encoder_ = np.linalg.solve(X.T @ X + np.diag(pen) + 1e-9 * np.eye(X.shape[1]),
                                        X.T @ Y)
        self.model_, self.features_ = model, feats
        self.seed_ = int(np.random.RandomState(self.random_state).randint(2**31))
        return self

    def encode(self, items) -> tuple[np.ndarray, np.ndarray]:
        """(rows (n, n_factors + 1), whether each raw item has features): the extractor's
        [q, b] of each item (zeros where it has no features)."""
        check_is_fitted(self, "encoder_")
        rows = self.features_.rows_of(raw_ids(items, "items"))
        has = rows >= 0
        out = np.zeros((len(rows), self.encoder_.shape[1]))
        if has.any():
            out[has] = _with_intercept(self.features_.matrix[rows[has]]) @ self.encoder_
        return out, has

    # ------------------------------------------------------------------ the device's part
    def personalize(self, items, ratings=None) -> OOVLocalParams:
        """One device: reconstruct the user from their history (raw items, ratings) as the
        model does, then train the adapter on their out-of-catalog entries that have
        features. The result stays on the device."""
        check_is_fitted(self, "encoder_")
        items, ratings = _history(items, ratings)
        local = self.model_.reconstruct(items, ratings)
        return self._adapt(local.factors, local.bias, items, ratings)

    def _adapt(self, p, c, items, ratings) -> OOVLocalParams:
        K = len(p)
        theta = ()
        if self.adapter:
            key = content_key(hash_buckets(items, 2**62), np.asarray(ratings, float))
            rng = np.random.default_rng([self.seed_, int(key)])
            theta = adapter_init(rng, K + 1, _check_hidden("hidden", self.hidden),
                                 float(self.init_scale))
            E, has = self.encode(items)
            out = ~self._in_catalog(items) & has
            if out.any() and self.steps:
                t = np.asarray(ratings, float)[out] - float(self.model_.global_mean_) - c
                theta = self._train(theta, E[out], t, np.append(p, 1.0))
        return OOVLocalParams(np.asarray(p), float(c), theta)

    def _train(self, theta, E, t, x) -> tuple:
        """Proximal gradient descent on adapter_loss_grad's objective with λ = regularization/n:
        a gradient step on the mean squared error, then the L2 term's exact step."""
        theta = [w.copy() for w in theta]
        lr = float(self.learning_rate)
        shrink = 1.0 / (1.0 + 2.0 * lr * float(self.regularization) / len(t))
        for _ in range(int(self.steps)):
            with np.errstate(over="ignore", invalid="ignore"):  # a divergence is named below
                loss, grads = adapter_loss_grad(theta, E, t, x, 0.0)
            if not np.isfinite(loss):
                raise FloatingPointError(f"the adapter's training diverged (loss {loss}); lower "
                                         f"learning_rate (now {self.learning_rate})")
            for w, g in zip(theta, grads):
                w -= lr * g
                w *= shrink
        return tuple(theta)

    def predict_local(self, local: OOVLocalParams, items, *, clip: bool = True) -> np.ndarray:
        """Scores of a personalized user on raw items: catalog items by the model's rows,
        out-of-catalog items with features by their adapted rows, others with no item term."""
        check_is_fitted(self, "encoder_")
        self._check_local(local)
        m = self.model_
        items = raw_ids(items, "items")
        p, c = np.asarray(local.factors, float), float(local.bias)
        out = np.full(len(items), float(m.global_mean_) + c)
        idx = pd.Index(m.item_ids_).get_indexer(pd.Index(items))
        cat = idx >= 0
        out[cat] += m.item_biases_[idx[cat]] + m.item_factors_[idx[cat]].astype(float) @ p
        E, has = self.encode(items)
        far = ~cat & has
        if far.any():
            A = adapter_forward(local.adapter, E[far])[0] if local.adapter else E[far]
            out[far] += A @ np.append(p, 1.0)
        return m._clip(out, clip)

    def _check_local(self, local) -> None:
        if not isinstance(local, OOVLocalParams):
            raise TypeError(f"expected OOVLocalParams (from personalize), got "
                            f"{type(local).__name__}")
        D = self.encoder_.shape[1]
        ok = np.shape(local.factors) == (D - 1,) and np.isfinite(local.factors).all() and \
            np.isfinite(local.bias) and (local.adapter == () or (
                len(local.adapter) % 2 == 0 and np.shape(local.adapter[0])[0] == D
                and np.shape(local.adapter[-1]) == (D,)
                and all(np.isfinite(w).all() for w in local.adapter)))
        if not ok:
            raise ValueError(f"OOVLocalParams do not fit this model (n_factors={D - 1}): "
                             "personalize with this OOVExpansion, not another one")

    def recon_predict(self, support: Interactions, query: Interactions, *,
                      clip: bool = True) -> np.ndarray:
        """ReconEval with OOV expansion: each user of ``support`` is personalized on their own
        device (``personalize``) and scores the entries of the same user in ``query``."""
        check_is_fitted(self, "encoder_")
        if not (isinstance(support, Interactions) and isinstance(query, Interactions)) or \
                not np.array_equal(support.user_ids, query.user_ids):
            raise ValueError("recon_predict takes two Interactions over the same users in the "
                             "same order (e.g. the parts of support_query_split)")
        out = np.empty(query.nnz)
        for u in range(support.n_users):
            s = slice(support.indptr[u], support.indptr[u + 1])
            q = slice(query.indptr[u], query.indptr[u + 1])
            local = self.personalize(support.item_ids[support.items[s]], support.values[s])
            out[q] = self.predict_local(local, query.item_ids[query.items[q]], clip=clip)
        return out

    def _in_catalog(self, items) -> np.ndarray:
        return pd.Index(self.model_.item_ids_).get_indexer(pd.Index(items)) >= 0


def _with_intercept(M) -> np.ndarray:
    M = M.toarray() if sp.issparse(M) else np.asarray(M, float)
    return np.column_stack([M, np.ones(len(M))])


def _check_model(model) -> None:
    """A fitted FedReconMF whose out-of-catalog items get no global term."""
    from .fedrecon import FedReconMF
    if not isinstance(model, FedReconMF) or model._fitted("item_factors_") is None:
        raise TypeError(f"OOVExpansion.fit takes a fitted FedReconMF, got {model!r}")
    rows = model._rows()
    if rows is not None and (rows.n_adapter or rows.space.local_item_buckets):
        raise ValueError("OOVExpansion serves items the model gives no global term; this model "
                         f"scores them with its own rows ({rows.space!r}); fit it with "
                         "OpenCatalog(catalog, drop_out_of_catalog=True)")
