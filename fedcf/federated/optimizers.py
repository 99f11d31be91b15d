"""Server optimizers on the aggregated client delta (the "antigradient" g = −Δ̄, Reddi et al. 2021).

Each optimizer is a pair of pure functions over dicts of arrays:

    state = opt.init(params)
    state, params = opt.step(state, params, mean_delta)

``step`` returns new arrays and never mutates its inputs. Formulas (per array, elementwise,
g = −Δ̄, t = 1, 2, ...):

- sgd:       x ← x − η g
- momentum:  v ← β v + g;  x ← x − η v
- adagrad:   a ← a + g²;  x ← x − η g / (√a + ε)              (a₀ = initial_accumulator)
- adam:      m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  x ← x − η m̂ / (√v̂ + ε),
             m̂ = m / (1−β₁ᵗ), v̂ = v / (1−β₂ᵗ)
- yogi:      m as Adam;  v ← v − (1−β₂) g² sign(v − g²);  x ← x − η m / (√v + ε)   (v₀ = initial_accumulator)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._kernels.server import adagrad_rows, sgd_rows


@dataclass(frozen=True)
class ServerOptimizer:
    name: str
    learning_rate: float
    options: dict = field(default_factory=dict)

    def init(self, params: dict) -> dict:
        o = self.options
        state: dict = {"t": 0}
        if self.name == "momentum":
            state["v"] = {k: np.zeros_like(v, dtype=np.float64) for k, v in params.items()}
        elif self.name == "adagrad":
            state["a"] = {k: np.full(v.shape, o["initial_accumulator"]) for k, v in params.items()}
        elif self.name in ("adam", "yogi"):
            state["m"] = {k: np.zeros(v.shape) for k, v in params.items()}
            v0 = 0.0 if self.name == "adam" else o["initial_accumulator"]
            state["v"] = {k: np.full(v.shape, v0) for k, v in params.items()}
        return state

    def step(self, state: dict, params: dict, delta: dict, *, learning_rate=None, options=None):
        """One step; ``learning_rate`` / ``options`` override this optimizer's for this step
        (a round's ``RoundHyperparams``)."""
        o = {**self.options, **(options or {})}
        lr = self.learning_rate if learning_rate is None else float(learning_rate)
        t = state["t"] + 1
        new_state: dict = {"t": t}
        new_params = {}
        for k, x in params.items():
            g = -np.asarray(delta[k], dtype=np.float64)
            if self.name == "sgd":
                upd = lr * g
            elif self.name == "momentum":
                v = o["momentum"] * state["v"][k] + g
                new_state.setdefault("v", {})[k] = v
                upd = lr * v
            elif self.name == "adagrad":
                a = state["a"][k] + g * g
                new_state.setdefault("a", {})[k] = a
                upd = lr * g / (np.sqrt(a) + o["epsilon"])
            else:
                b1, b2, eps = o["beta1"], o["beta2"], o["epsilon"]
                m = b1 * state["m"][k] + (1 - b1) * g
                g2 = g * g
                if self.name == "adam":
                    v = b2 * state["v"][k] + (1 - b2) * g2
                    upd = lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
                else:
                    vp = state["v"][k]
                    v = vp - (1 - b2) * g2 * np.sign(vp - g2)
                    upd = lr * m / (np.sqrt(v) + eps)
                new_state.setdefault("m", {})[k] = m
                new_state.setdefault("v", {})[k] = v
            new_params[k] = (x - upd).astype(x.dtype)
        return new_state, new_params


    @property
    def sparse(self) -> bool:
        """True when a zero delta leaves a row and its state unchanged (sgd, adagrad)."""
        return self.name in ("sgd", "adagrad")

    def step_rows(self, state: dict, params: dict, rows: np.ndarray, delta_rows: dict, *,
                  learning_rate=None):
        """Sparse fast path for ``sparse`` optimizers: the same result as ``step`` with a dense
        delta that is zero outside ``rows`` (sorted, distinct), but touching only those rows.

        Unlike ``step`` this updates ``params`` (and the Adagrad accumulator) **in place** and
        returns them, so a round over a 10⁶-item catalog costs O(touched rows × K).
        ``state["rows_finite"]`` tells whether every updated value is finite.
        """
        if not self.sparse:
            raise ValueError(f"server optimizer {self.name!r} has no sparse path; use step()")
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        lr = self.learning_rate if learning_rate is None else float(learning_rate)
        finite = True
        for k, x in params.items():
            d = np.asarray(delta_rows[k], dtype=np.float64)
            x2, d2 = (x, d) if x.ndim == 2 else (x.reshape(-1, 1), d.reshape(-1, 1))
            if self.name == "sgd":
                finite &= sgd_rows(x2, rows, d2, lr)
            else:
                acc = state["a"][k]
                acc2 = acc if acc.ndim == 2 else acc.reshape(-1, 1)
                finite &= adagrad_rows(x2, acc2, rows, d2, lr, self.options["epsilon"])
        state["t"] += 1
        state["rows_finite"] = bool(finite)
        return state, params


_DEFAULTS = {
    "sgd": {},
    "momentum": {"momentum": 0.9},
    # TensorFlow's defaults, which the paper's code used
    "adagrad": {"initial_accumulator": 0.1, "epsilon": 1e-7},
    "adam": {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7},
    "yogi": {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-3, "initial_accumulator": 1e-6},
}
OPTIMIZERS = tuple(_DEFAULTS)


def make_server_optimizer(name: str, learning_rate: float, options: dict | None = None
                          ) -> ServerOptimizer:
    """Build a server optimizer; unknown names or options raise, naming them."""
    if name not in _DEFAULTS:
        raise ValueError(f"server_optimizer must be one of {list(OPTIMIZERS)}, got {name!r}")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.number)) \
            or not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"server_learning_rate must be a positive number, got {learning_rate!r}")
    opts = dict(_DEFAULTS[name])
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"server_optimizer_options must be a dict or None, got "
                        f"{type(options).__name__}")
    for k, v in (options or {}).items():
        if k not in opts:
            raise ValueError(f"server optimizer {name!r} has no option {k!r}; "
                             f"it takes {sorted(opts) or 'none'}")
        lo, hi, open_hi = _OPTION_RANGES[k]
        ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        if not ok or not np.isfinite(v) or v < lo or (v >= hi if open_hi else v > hi):
            raise ValueError(f"server_optimizer_options[{k!r}] must be a number in "
                             f"[{lo}, {hi}{')' if open_hi else ']'}, got {v!r}")
        opts[k] = float(v)
    return ServerOptimizer(name, float(learning_rate), opts)


# (low, high, high is excluded): momentum or beta of 1 never forgets and Adam's bias correction
# 1/(1 − β₁ᵗ) divides by zero; epsilon must keep the step finite
_OPTION_RANGES = {"momentum": (0.0, 1.0, True), "beta1": (0.0, 1.0, True),
                  "beta2": (0.0, 1.0, True), "epsilon": (1e-12, np.inf, False),
                  "initial_accumulator": (0.0, np.inf, False)}


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


def server_is_wild(opt: ServerOptimizer, init_scale: float, Q: np.ndarray) -> bool:
    """The server step alone amplifies the mean client delta more than tenfold (SGD: η_s,
    momentum: η_s / (1 − β)), or an adaptive optimizer moves each coordinate by η_s, more than
    ten times the size of the item rows (``Q``, or ``init_scale`` if larger): a divergence is
    then the server's."""
    lr = float(opt.learning_rate)
    if opt.name == "sgd":
        return lr > 10
    if opt.name == "momentum":
        return lr / (1 - opt.options["momentum"]) > 10
    finite = np.isfinite(Q)
    scale = float(np.abs(Q[finite]).max()) if finite.any() else 0.0
    return lr > 10 * max(scale, init_scale)
