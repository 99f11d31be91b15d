"""Server optimizers on the aggregated client delta (the "antigradient" g = −Δ̄, Reddi et al. 2021).

Each optimizer is a parameter object (``server_optimizer=Adam(learning_rate=0.01)``, or by name,
``server_optimizer="adam"``, with its defaults) with pure functions over dicts of arrays:

    state = opt.init(params)
    state, params = opt.step(state, params, mean_delta)

``step`` returns new arrays and never mutates its inputs. Formulas (per array, elementwise,
g = −Δ̄, t = 1, 2, ...):

- SGD:       x ← x − η g
- Momentum:  v ← β v + g;  x ← x − η v
- Adagrad:   a ← a + g²;  x ← x − η g / (√a + ε)              (a₀ = initial_accumulator)
- Adam:      m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  x ← x − η m̂ / (√v̂ + ε),
             m̂ = m / (1−β₁ᵗ), v̂ = v / (1−β₂ᵗ)
- Yogi:      m as Adam;  v ← v − (1−β₂) g² sign(v − g²);  x ← x − η m / (√v + ε)   (v₀ = initial_accumulator)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from ..._kernels.server import adagrad_rows, sgd_rows
from ..._threads import small
from .params import Params

# (low, high, high is excluded): momentum or beta of 1 never forgets and Adam's bias correction
# 1/(1 − β₁ᵗ) divides by zero; epsilon must keep the step finite
_OPTION_RANGES = {"momentum": (0.0, 1.0, True), "beta1": (0.0, 1.0, True),
                  "beta2": (0.0, 1.0, True), "epsilon": (1e-12, np.inf, False),
                  "initial_accumulator": (0.0, np.inf, False)}


class ServerOptimizer(Params, ABC):
    """A server optimizer: ``learning_rate`` η_s and its options (the other constructor
    parameters). ``sparse`` ones (a zero delta leaves a row and its state unchanged) also have
    ``step_rows``; ``learnable`` names the round hyperparameters that federated hypergradients
    can differentiate through this optimizer's step (``tangent``).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import Momentum
    >>> opt = Momentum(learning_rate=0.5, momentum=0.9)
    >>> params = {"Q": np.ones(2)}
    >>> state, params = opt.step(opt.init(params), params, {"Q": np.array([0.2, -0.2])})
    >>> params["Q"]
    array([1.1, 0.9])
    """

    name: ClassVar[str]
    sparse: ClassVar[bool] = False
    learnable: ClassVar[tuple] = ()

    def validate(self):
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float, np.number)) \
                or not (np.isfinite(lr) and lr > 0):
            raise ValueError(f"{type(self).__name__}: learning_rate must be a positive number, "
                             f"got {lr!r}")
        for k, v in self.get_params(deep=False).items():
            if k == "learning_rate":
                continue
            lo, hi, open_hi = _OPTION_RANGES[k]
            ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            if not ok or not np.isfinite(v) or v < lo or (v >= hi if open_hi else v > hi):
                raise ValueError(f"{type(self).__name__}: {k} must be a number in "
                                 f"[{lo}, {hi}{')' if open_hi else ']'}, got {v!r}")

    def options(self) -> dict:
        """The optimizer's options (everything but the learning rate), as floats."""
        return {k: float(v) for k, v in self.get_params(deep=False).items()
                if k != "learning_rate"}

    # ------------------------------------------------------------------ the step
    def init(self, params: dict) -> dict:
        state: dict = {"t": 0}
        for slot, fill in self._slots().items():
            state[slot] = {k: np.full(v.shape, fill, np.float64) for k, v in params.items()}
        return state

    def _slots(self) -> dict:
        """State slot → initial value."""
        return {}

    @abstractmethod
    def _update(self, state: dict, new_state: dict, k: str, g: np.ndarray, lr: float, o: dict,
                t: int) -> np.ndarray:
        """The step of array ``k`` (subtracted from it); writes its slots into ``new_state``."""

    def step(self, state: dict, params: dict, delta: dict, *, learning_rate=None, options=None):
        """One step; ``learning_rate`` / ``options`` override this optimizer's for this step
        (a round's ``RoundHyperparams``)."""
        o = {**self.options(), **(options or {})}
        lr = float(self.learning_rate if learning_rate is None else learning_rate)
        t = state["t"] + 1
        new_state: dict = {"t": t}
        new_params = {}
        for k, x in params.items():
            g = -np.asarray(delta[k], dtype=np.float64)
            new_params[k] = (x - self._update(state, new_state, k, g, lr, o, t)).astype(x.dtype)
        return new_state, new_params

    def step_rows(self, state: dict, params: dict, rows: np.ndarray, delta_rows: dict, *,
                  learning_rate=None):
        """Sparse fast path (``sparse`` optimizers): the same result as ``step`` with a dense
        delta that is zero outside ``rows`` (sorted, distinct), touching only those rows.

        Unlike ``step`` this updates ``params`` (and the state) **in place** and returns them, so
        a round over a 10⁶-item catalog costs O(touched rows × K). ``state["rows_finite"]``
        tells whether every updated value is finite.
        """
        raise ValueError(f"server optimizer {type(self).__name__} has no sparse path; use step()")

    # ------------------------------------------------------------------ stability, tangents
    def is_wild(self, init_scale: float, Q: np.ndarray) -> bool:
        """The step alone amplifies the mean client delta more than tenfold, or (adaptive
        optimizers) moves each coordinate by η_s, more than ten times the size of the item rows
        (``Q``, or ``init_scale`` if larger): a divergence is then the server's."""
        finite = np.isfinite(Q)
        scale = float(np.abs(Q[finite]).max()) if finite.any() else 0.0
        return float(self.learning_rate) > 10 * max(scale, init_scale)

    def tangent(self, name: str, state_before: dict, state_after: dict, delta, lr: float,
                options: dict, shape: tuple):
        """∂x_{t+1}/∂z of the last step for learnable hyperparameter ``name`` in its raw
        coordinate z (log η_s, logit β): (TQ (n_items, K), Tb (n_items,)), see hyper.py."""
        raise ValueError(f"{type(self).__name__} has no tangent for {name!r}; learnable: "
                         f"{list(self.learnable)}")


def _sparse_rows(params, rows, delta_rows, update):
    """Apply ``update(x2, k, rows, d2)`` (a row kernel returning 'all finite') to every array."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    finite = True
    for k, x in params.items():
        d = np.ascontiguousarray(delta_rows[k], dtype=np.float64)  # one kernel signature
        x2, d2 = (x, d) if x.ndim == 2 else (x.reshape(-1, 1), d.reshape(-1, 1))
        finite &= update(x2, k, rows, d2)
    return bool(finite)


class SGD(ServerOptimizer):
    """x ← x − η g (the paper's server optimizer).

    Parameters
    ----------
    learning_rate : float > 0, default 1
        η_s.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import SGD
    >>> FedReconMF(server_optimizer=SGD(learning_rate=0.5)).get_params()[
    ...     "server_optimizer__learning_rate"]
    0.5
    """

    name, sparse, learnable = "sgd", True, ("server_learning_rate", "weight_exponent")

    def __init__(self, learning_rate: float = 1.0):
        self.learning_rate = learning_rate
        self.validate()

    def _update(self, state, new_state, k, g, lr, o, t):
        return lr * g

    def step_rows(self, state, params, rows, delta_rows, *, learning_rate=None):
        lr = float(self.learning_rate if learning_rate is None else learning_rate)
        state["rows_finite"] = _sparse_rows(params, rows, delta_rows,
                                            lambda x2, k, r, d2: small(sgd_rows, d2.size, x2, r,
                                                                       d2, lr))
        state["t"] += 1
        return state, params

    def is_wild(self, init_scale, Q):
        return float(self.learning_rate) > 10

    def tangent(self, name, state_before, state_after, delta, lr, options, shape):
        if name != "server_learning_rate":
            return super().tangent(name, state_before, state_after, delta, lr, options, shape)
        TQ, Tb = np.zeros(shape), np.zeros(shape[0])
        TQ[delta.items], Tb[delta.items] = lr * delta.d_Q, lr * delta.d_b
        return TQ, Tb


class Momentum(ServerOptimizer):
    """v ← β v + g;  x ← x − η v.

    Parameters
    ----------
    learning_rate : float > 0, default 1
    momentum : float in [0, 1), default 0.9
        β.

    Examples
    --------
    >>> from fedcf.federated import Momentum
    >>> Momentum(learning_rate=0.5, momentum=0.8)
    Momentum(learning_rate=0.5, momentum=0.8)
    """

    name = "momentum"
    learnable = ("server_learning_rate", "momentum", "weight_exponent")

    def __init__(self, learning_rate: float = 1.0, momentum: float = 0.9):
        self.learning_rate, self.momentum = learning_rate, momentum
        self.validate()

    def _slots(self):
        return {"v": 0.0}

    def _update(self, state, new_state, k, g, lr, o, t):
        v = o["momentum"] * state["v"][k] + g
        new_state.setdefault("v", {})[k] = v
        return lr * v

    def is_wild(self, init_scale, Q):
        return float(self.learning_rate) / (1 - float(self.momentum)) > 10

    def tangent(self, name, state_before, state_after, delta, lr, options, shape):
        if name == "server_learning_rate":  # ∂x/∂log η = −η v_{t+1}
            return -lr * state_after["v"]["Q"], -lr * state_after["v"]["b"]
        if name == "momentum":  # ∂x/∂logit β = −η β(1−β) v_t
            beta = options["momentum"]
            s = -lr * beta * (1 - beta)
            return s * state_before["v"]["Q"], s * state_before["v"]["b"]
        return super().tangent(name, state_before, state_after, delta, lr, options, shape)


class Adagrad(ServerOptimizer):
    """a ← a + g²;  x ← x − η g / (√a + ε) (TensorFlow's defaults, which the paper's code used).

    Parameters
    ----------
    learning_rate : float > 0, default 1
    initial_accumulator : float >= 0, default 0.1
    epsilon : float >= 1e-12, default 1e-7

    Examples
    --------
    >>> from fedcf.federated import Adagrad
    >>> Adagrad(learning_rate=0.1).options()
    {'initial_accumulator': 0.1, 'epsilon': 1e-07}
    """

    name, sparse = "adagrad", True

    def __init__(self, learning_rate: float = 1.0, initial_accumulator: float = 0.1,
                 epsilon: float = 1e-7):
        self.learning_rate, self.initial_accumulator = learning_rate, initial_accumulator
        self.epsilon = epsilon
        self.validate()

    def _slots(self):
        return {"a": float(self.initial_accumulator)}

    def _update(self, state, new_state, k, g, lr, o, t):
        a = state["a"][k] + g * g
        new_state.setdefault("a", {})[k] = a
        return lr * g / (np.sqrt(a) + o["epsilon"])

    def step_rows(self, state, params, rows, delta_rows, *, learning_rate=None):
        lr = float(self.learning_rate if learning_rate is None else learning_rate)
        eps = float(self.epsilon)

        def update(x2, k, r, d2):
            acc = state["a"][k]
            return small(adagrad_rows, d2.size, x2, acc if acc.ndim == 2 else acc.reshape(-1, 1),
                         r, d2, lr, eps)
        state["rows_finite"] = _sparse_rows(params, rows, delta_rows, update)
        state["t"] += 1
        return state, params


class Adam(ServerOptimizer):
    """m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  x ← x − η m̂ / (√v̂ + ε).

    Parameters
    ----------
    learning_rate : float > 0, default 1
    beta1, beta2 : float in [0, 1), default 0.9, 0.999
    epsilon : float >= 1e-12, default 1e-7

    Examples
    --------
    >>> from fedcf.federated import Adam
    >>> Adam(learning_rate=0.01, beta1=0.8).beta1
    0.8
    """

    name = "adam"

    def __init__(self, learning_rate: float = 1.0, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-7):
        self.learning_rate, self.beta1, self.beta2 = learning_rate, beta1, beta2
        self.epsilon = epsilon
        self.validate()

    def _slots(self):
        return {"m": 0.0, "v": 0.0}

    def _moments(self, state, new_state, k, g, o):
        m = o["beta1"] * state["m"][k] + (1 - o["beta1"]) * g
        new_state.setdefault("m", {})[k] = m
        return m, g * g

    def _update(self, state, new_state, k, g, lr, o, t):
        b1, b2, eps = o["beta1"], o["beta2"], o["epsilon"]
        m, g2 = self._moments(state, new_state, k, g, o)
        v = b2 * state["v"][k] + (1 - b2) * g2
        new_state.setdefault("v", {})[k] = v
        return lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)


class Yogi(Adam):
    """m as Adam;  v ← v − (1−β₂) g² sign(v − g²);  x ← x − η m / (√v + ε).

    Parameters
    ----------
    learning_rate : float > 0, default 1
    beta1, beta2 : float in [0, 1), default 0.9, 0.999
    epsilon : float >= 1e-12, default 1e-3
    initial_accumulator : float >= 0, default 1e-6

    Examples
    --------
    >>> from fedcf.federated import Yogi
    >>> Yogi(learning_rate=0.01).epsilon
    0.001
    """

    name = "yogi"

    def __init__(self, learning_rate: float = 1.0, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-3, initial_accumulator: float = 1e-6):
        self.learning_rate, self.beta1, self.beta2 = learning_rate, beta1, beta2
        self.epsilon, self.initial_accumulator = epsilon, initial_accumulator
        self.validate()

    def _slots(self):
        return {"m": 0.0, "v": float(self.initial_accumulator)}

    def _update(self, state, new_state, k, g, lr, o, t):
        m, g2 = self._moments(state, new_state, k, g, o)
        vp = state["v"][k]
        v = vp - (1 - o["beta2"]) * g2 * np.sign(vp - g2)
        new_state.setdefault("v", {})[k] = v
        return lr * m / (np.sqrt(v) + o["epsilon"])


OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "yogi")


def state_to_arrays(state: dict, prefix: str = "opt") -> dict:
    """Flatten an optimizer state into named arrays (for checkpoints)."""
    out = {f"{prefix}.t": np.array(state["t"])}
    for slot, per in state.items():
        if slot in ("t", "rows_finite"):
            continue
        for k, v in per.items():
            out[f"{prefix}.{slot}.{k}"] = v
    return out


def state_from_arrays(arrays: dict, prefix: str = "opt") -> dict:
    state: dict = {"t": int(arrays[f"{prefix}.t"])}
    for name, v in arrays.items():
        parts = name.split(".")
        if parts[0] == prefix and len(parts) == 3:
            state.setdefault(parts[1], {})[parts[2]] = v
    return state
