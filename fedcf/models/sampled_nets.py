"""The scoring functions of the sampled-negative baselines, with hand-written gradients of the
binary cross-entropy (checked against finite differences in the tests).

A net has three groups of parameters: ``user`` (one user's own, never uploaded), ``items``
(global, one row per item) and ``dense`` (global, shared by all items). ``grads`` takes one
user's parameters, the item rows of a mini-batch (one row per example) and the labels, and
returns the mean loss and its gradients: summed over the batch for ``user`` and ``dense``,
per example for ``items`` (the caller scatters them onto the rows).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from .negatives import check_layers


def _bce(s: np.ndarray, y: np.ndarray):
    """Mean binary cross-entropy of logits ``s`` and its gradient per logit."""
    loss = np.logaddexp(0.0, s) - y * s
    return float(loss.mean()), (expit(s) - y) / len(s)


class DotNet:
    """score = u·e_i + c_u + b_i, with the user part (u, c) local and (e, b) global: FedMF's
    user vector, or PFedRec's personal score function (a linear layer on the item embedding).
    FedMF and PFedRec train with the kernels of ``_kernels/sampled.py``; this is the gradient
    they follow, written out so the tests can check it against finite differences."""

    user_keys, item_keys, dense_keys = ("u", "c"), ("e", "b"), ()

    def __init__(self, n_factors: int):
        self.d = n_factors

    def init_user(self, rng, n: int) -> dict:
        return {"u": rng.normal(0.0, 0.1, (n, self.d)), "c": np.zeros((n, 1))}

    def init_global(self, rng, n_items: int) -> dict:
        return {"e": rng.normal(0.0, 0.1, (n_items, self.d)), "b": np.zeros((n_items, 1))}

    def logits(self, user, rows, dense):
        return rows["e"] @ user["u"] + user["c"][0] + rows["b"][:, 0]

    def grads(self, user, rows, dense, y):
        loss, ds = _bce(self.logits(user, rows, dense), y)
        g_user = {"u": ds @ rows["e"], "c": np.array([ds.sum()])}
        g_rows = {"e": ds[:, None] * user["u"][None, :], "b": ds[:, None]}
        return loss, g_user, g_rows, {}

    def all_scores(self, users: dict, items: dict, dense) -> np.ndarray:
        return users["u"] @ items["e"].T + users["c"] + items["b"][:, 0][None, :]


class NeuMFNet:
    """NeuMF (He et al., 2017): a GMF branch p_u ⊙ q_i and an MLP branch over [p'_u, q'_i]
    (ReLU layers ``layers``), concatenated into one logit. User embeddings are local; item
    embeddings, the MLP and the output layer are global."""

    user_keys, item_keys = ("pg", "pm"), ("qg", "qm")

    def __init__(self, n_factors: int, layers=(32, 16)):
        self.d, self.layers = n_factors, tuple(layers)
        self.dense_keys = tuple(f"{w}{j}" for j in range(len(self.layers)) for w in "Wb") + ("h", "hb")

    def init_user(self, rng, n: int) -> dict:
        return {k: rng.normal(0.0, 0.1, (n, self.d)) for k in self.user_keys}

    def init_global(self, rng, n_items: int) -> dict:
        out = {k: rng.normal(0.0, 0.1, (n_items, self.d)) for k in self.item_keys}
        return {**out, **self.init_dense(rng)}

    def init_dense(self, rng) -> dict:
        """The MLP (He-normal weights, zero biases) and the output layer."""
        out, fan_in = {}, 2 * self.d
        for j, width in enumerate(self.layers):
            out[f"W{j}"] = rng.normal(0.0, np.sqrt(2.0 / fan_in), (fan_in, width))
            out[f"b{j}"] = np.zeros(width)
            fan_in = width
        out["h"] = rng.normal(0.0, np.sqrt(1.0 / (self.d + fan_in)), self.d + fan_in)
        out["hb"] = np.zeros(1)
        return out

    def _forward(self, user, rows, dense):
        n = len(rows["qm"])
        acts = [np.concatenate([np.broadcast_to(user["pm"], (n, self.d)), rows["qm"]], axis=1)]
        for j in range(len(self.layers)):
            acts.append(np.maximum(acts[-1] @ dense[f"W{j}"] + dense[f"b{j}"], 0.0))
        x = np.concatenate([user["pg"] * rows["qg"], acts[-1]], axis=1)
        return acts, x, x @ dense["h"] + dense["hb"][0]

    def pack(self, dense: dict) -> np.ndarray:
        """The dense parameters as one vector, in ``_kernels.neumf.dense_layout``'s order."""
        return np.concatenate([np.ravel(dense[k]) for k in self.dense_keys])

    def dense_shapes(self) -> list:
        """(key, shape) of each dense parameter, in ``pack``'s order."""
        shapes, fan_in = [], 2 * self.d
        for j, width in enumerate(self.layers):
            shapes += [(f"W{j}", (fan_in, width)), (f"b{j}", (width,))]
            fan_in = width
        return shapes + [("h", (self.d + fan_in,)), ("hb", (1,))]

    @property
    def dense_size(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.dense_shapes())

    def unpack(self, theta: np.ndarray) -> dict:
        """``pack``'s inverse (views of ``theta``)."""
        if len(theta) != self.dense_size:
            raise ValueError(f"a NeuMF with n_factors={self.d} and layers={self.layers} has "
                             f"{self.dense_size} dense parameters, not {len(theta)}")
        out, at = {}, 0
        for k, shape in self.dense_shapes():
            size = int(np.prod(shape))
            out[k] = theta[at:at + size].reshape(shape)
            at += size
        return out

    def logits(self, user, rows, dense):
        return self._forward(user, rows, dense)[2]

    def grads(self, user, rows, dense, y):
        acts, x, s = self._forward(user, rows, dense)
        loss, ds = _bce(s, y)
        g_dense = {"h": x.T @ ds, "hb": np.array([ds.sum()])}
        dx = ds[:, None] * dense["h"][None, :]
        dgmf, da = dx[:, :self.d], dx[:, self.d:]
        for j in reversed(range(len(self.layers))):
            dz = da * (acts[j + 1] > 0)
            g_dense[f"W{j}"], g_dense[f"b{j}"] = acts[j].T @ dz, dz.sum(axis=0)
            da = dz @ dense[f"W{j}"].T
        g_user = {"pg": (dgmf * rows["qg"]).sum(axis=0), "pm": da[:, :self.d].sum(axis=0)}
        g_rows = {"qg": dgmf * user["pg"][None, :], "qm": da[:, self.d:]}
        return loss, g_user, g_rows, g_dense

    def all_scores(self, users: dict, items: dict, dense, chunk: int = 64) -> np.ndarray:
        n_u, n_i = len(users["pg"]), len(items["qg"])
        out = np.empty((n_u, n_i))
        W0 = dense["W0"]
        item_part = items["qm"] @ W0[self.d:] + dense["b0"]  # (n_i, h0)
        for s in range(0, n_u, chunk):
            pm, pg = users["pm"][s:s + chunk], users["pg"][s:s + chunk]
            a = np.maximum((pm @ W0[:self.d])[:, None, :] + item_part[None], 0.0)
            for j in range(1, len(self.layers)):
                a = np.maximum(a @ dense[f"W{j}"] + dense[f"b{j}"], 0.0)
            h = dense["h"]
            out[s:s + chunk] = ((pg[:, None, :] * items["qg"][None]) @ h[:self.d]
                                + a @ h[self.d:] + dense["hb"][0])
        return out


class NeuMFScoring:
    """Scoring of a fitted NeuMF network, shared by centralized NCF and FedNCF: a row of
    ``item_factors_`` (and of ``user_factors_``) holds both branches' embeddings [q_g | q_m],
    ``dense_params_`` the MLP and the output layer (``NeuMFNet.pack``'s order)."""

    def _net(self) -> NeuMFNet:
        return NeuMFNet(self.n_factors, check_layers(self.layers))

    def _widths(self) -> np.ndarray:
        return np.array(check_layers(self.layers), np.int64)

    def _row_width(self) -> int:
        return 2 * self.n_factors

    def _parts(self, P, Qi):
        """(user, item, dense) dicts of NeuMFNet from user rows P and item rows Qi."""
        d = self.n_factors
        P, Qi = np.asarray(P, np.float64), np.asarray(Qi, np.float64)
        return ({"pg": P[:, :d], "pm": P[:, d:]}, {"qg": Qi[:, :d], "qm": Qi[:, d:]},
                self._net().unpack(np.asarray(self.dense_params_, np.float64)))

    def score_all_items(self, factors, biases) -> np.ndarray:
        """(n_users, n_items) NeuMF logits for the user rows ``factors`` (biases unused)."""
        users, items, dense = self._parts(factors, self.item_factors_)
        return self._net().all_scores(users, items, dense)

    def _pair_scores(self, users, items, P, c, out) -> None:
        """NeuMF logits of pairs; an unknown user or item (−1) has zero embeddings."""
        P = np.vstack([np.asarray(P, np.float64), np.zeros((1, self._row_width()))])
        Qi = np.vstack([np.asarray(self.item_factors_, np.float64),
                        np.zeros((1, self._row_width()))])
        if len(out):
            user, rows, dense = self._parts(P[np.asarray(users)], Qi[np.asarray(items)])
            out[:] = self._net().logits(user, rows, dense)

    def _check_loaded(self, where: str):
        super()._check_loaded(where)
        theta = self._fitted("dense_params_")
        size = self._net().dense_size
        if theta is None or theta.shape != (size,) or theta.dtype.kind != "f" \
                or not np.isfinite(theta).all():
            raise ValueError(f"{where}: the dense parameters ({None if theta is None else theta.shape}) "
                             f"do not match a {type(self).__name__} with n_factors={self.n_factors} "
                             f"and layers={self.layers} ({size} finite numbers): damaged or edited")
