"""Malicious clients, for measuring robust aggregation: an executor wrapper that rewrites the
uploads of a fixed fraction of the population before they reach the aggregator.

Attacks (``kind``):
- ``"sign_flip"``: the client sends −scale × its honest delta;
- ``"noise"``: the client sends Gaussian noise of standard deviation ``scale`` on its rows;
- ``"promote"``: a shilling attack for ``target_item``: the client sends only a delta for that
  item — its bias raised by ``scale`` and its factors moved by ``scale`` along the mean of the
  honest uploads' directions — to push the item up for every user;
- ``"promote_hidden"``: the same push hidden in an honest upload: the client sends its honest
  delta plus, on the target item, a delta of L2 norm ``scale`` × its honest upload's norm (half
  on the bias, half along the honest mean direction) — the attack a similarity defence
  (FoolsGoldMean) forces: small, and looking like everybody else.
Which clients are malicious depends only on their id (a fixed set), never on the round.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..round.contracts import Executor, RoundExecutor
from ..round.phases import ClientOutputs, LocalExecutor
from .weighted import upload_norms

KINDS = ("sign_flip", "noise", "promote", "promote_hidden")


def malicious(clients: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Which of these dense client ids belong to the fixed malicious fraction of the population."""
    h = (np.asarray(clients, np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)) \
        >> np.uint64(11)
    return (h.astype(np.float64) / 2.0**53) < fraction


class AttackedExecutor(Executor):
    """An executor whose malicious clients (a fixed ``fraction`` of the population, by id)
    rewrite their uploads before they reach the aggregator (see the module docstring).

    Parameters
    ----------
    kind : {"sign_flip", "noise", "promote", "promote_hidden"}
    fraction : float in [0, 1)
    scale : float
    target_item : int
        Dense id of the promoted item.
    seed : int
        Which clients are malicious, and the noise attack's stream.
    executor : Executor or None
        Where the honest client work runs (None: this process).

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated.aggregators.attacks import AttackedExecutor
    >>> est = FedReconMF(executor=AttackedExecutor("sign_flip", fraction=0.1))
    >>> est.get_params()["executor__fraction"]
    0.1
    """

    def __init__(self, kind="sign_flip", fraction=0.1, scale=10.0, target_item=0, seed=0,
                 executor=None):
        self.kind, self.fraction, self.scale = kind, fraction, scale
        self.target_item, self.seed, self.executor = target_item, seed, executor
        self.validate()

    def validate(self):
        if self.kind not in KINDS:
            raise ValueError(f"attack kind must be one of {list(KINDS)}, got {self.kind!r}")
        if not 0 <= self.fraction < 1:
            raise ValueError(f"attack fraction must be in [0, 1), got {self.fraction!r}")

    def bind(self, program, data, local_state=None) -> AttackedRound:
        inner = self.executor if self.executor is not None else LocalExecutor()
        return AttackedRound(inner.bind(program, data, local_state), self)


class AttackedRound(RoundExecutor):
    """``AttackedExecutor`` bound to one run: the inner executor's outputs, rewritten."""

    def __init__(self, inner: RoundExecutor, spec: AttackedExecutor):
        self.inner, self.counts = inner, inner.counts
        self.kind, self.fraction, self.scale = spec.kind, float(spec.fraction), float(spec.scale)
        self.target_item, self.seed = int(spec.target_item), int(spec.seed)

    def tangents(self, cohort, params, tangents, ids):
        return self.inner.tangents(cohort, params, tangents, ids)

    def close(self):
        self.inner.close()

    def run(self, cohort, params, ids) -> ClientOutputs:
        out = self.inner.run(cohort, params, ids)
        bad = malicious(cohort.clients, self.fraction, self.seed)
        if not bad.any():
            return out
        owner = np.repeat(np.arange(out.n_clients), np.diff(out.offsets))
        rows = bad[owner] & (out.items >= 0)
        d_Q, d_b, items = out.d_Q.copy(), out.d_b.copy(), out.items.copy()
        if self.kind == "sign_flip":
            d_Q[rows] *= -self.scale
            d_b[rows] *= -self.scale
        elif self.kind == "noise":
            rng = np.random.default_rng([self.seed, int(ids[1])])
            d_Q[rows] = rng.normal(0, self.scale, (int(rows.sum()), d_Q.shape[1]))
            d_b[rows] = rng.normal(0, self.scale, int(rows.sum()))
        elif self.kind == "promote":
            direction = _honest_direction(d_Q, bad[owner] | (out.items < 0))
            first = np.r_[True, owner[1:] != owner[:-1]] & bad[owner]
            d_Q[bad[owner]], d_b[bad[owner]], items[bad[owner]] = 0.0, 0.0, -1
            items[first], d_b[first] = self.target_item, self.scale
            d_Q[first] = self.scale * direction
        else:
            return self._hide_push(out, bad, owner)
        return dataclasses.replace(out, items=items, d_Q=d_Q, d_b=d_b)

    def _hide_push(self, out: ClientOutputs, bad, owner) -> ClientOutputs:
        """promote_hidden: each malicious client's honest upload plus a push on the target row
        (added to its entry for the target when it has one, else a new entry at its end)."""
        direction = _honest_direction(out.d_Q, bad[owner] | (out.items < 0))
        norms = upload_norms(out)
        push = self.scale * norms / np.sqrt(2.0)
        items, d_Q, d_b, offsets = out.items, out.d_Q.copy(), out.d_b.copy(), out.offsets
        has = np.zeros(out.n_clients, bool)
        at = np.flatnonzero(bad[owner] & (items == self.target_item))
        has[owner[at]] = True
        d_Q[at] += (push[owner[at]][:, None] * direction).astype(d_Q.dtype)
        d_b[at] += push[owner[at]].astype(d_b.dtype)
        new = np.flatnonzero(bad & ~has)
        pos = offsets[new + 1]
        items = np.insert(items, pos, self.target_item)
        d_Q = np.insert(d_Q, pos, (push[new][:, None] * direction).astype(d_Q.dtype), axis=0)
        d_b = np.insert(d_b, pos, push[new].astype(d_b.dtype))
        added = np.zeros(out.n_clients + 1, np.int64)
        added[new + 1] = 1
        return dataclasses.replace(out, offsets=offsets + np.cumsum(added), items=items,
                                   d_Q=d_Q, d_b=d_b)


def _honest_direction(d_Q, skip):
    """Unit vector along the mean of the honest clients' factor deltas (0 if there are none)."""
    direction = d_Q[~skip].mean(axis=0) if (~skip).any() else np.zeros(d_Q.shape[1])
    norm = np.linalg.norm(direction)
    return direction / norm if norm > 0 else direction


def attacked(estimator, **attack):
    """A copy of a federated estimator whose rounds run with ``AttackedExecutor(**attack)``."""
    from sklearn.base import clone

    return clone(estimator).set_params(executor=AttackedExecutor(**attack))
