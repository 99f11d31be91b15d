"""Parameter checks for estimators: every error names the parameter and the value."""

from __future__ import annotations

import numbers

import numpy as np


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return int(value)


def check_float(name: str, value, *, low: float | None = None, high: float | None = None,
                low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value < low or (low_open and value == low)):
        op = ">" if low_open else ">="
        raise ValueError(f"{name} must be {op} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def raw_ids(values, name: str = "ids") -> np.ndarray:
    """Raw ids as a 1-D array that keeps each id's type: a list mixing str and int becomes an
    object array (``np.asarray`` would turn 5 into '5' and every id into an unknown one); one
    id becomes a one-element array; None is refused, naming ``name``."""
    if values is None:
        raise TypeError(f"{name} must be raw ids (a list or array), got None")
    if isinstance(values, (str, bytes)) or np.isscalar(values):
        values = [values]
    if hasattr(values, "to_numpy"):  # a pandas Index or Series
        arr = values.to_numpy()
    elif isinstance(values, np.ndarray):
        arr = values
    else:
        seq = list(values)
        arr = np.asarray(seq)
        if arr.dtype.kind in "US" and not all(isinstance(x, str) for x in seq):
            arr = np.empty(len(seq), dtype=object)
            arr[:] = seq
    arr = np.atleast_1d(arr)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional raw ids, got shape {arr.shape}")
    if arr.dtype.kind in "fcOmM":  # ids that can be missing: None, NaN, NaT
        import pandas as pd

        missing = np.flatnonzero(pd.isna(arr))
        if len(missing):
            raise ValueError(f"{name} has a missing id ({arr[missing[0]]!r}) at position "
                             f"{missing[0]}; drop it or give the id (a missing id never "
                             "matches one the model knows)")
    return arr


def id_kind_mismatch(ids: np.ndarray, model_ids: np.ndarray) -> object | None:
    """An id of ``ids`` whose kind (text or number) differs from the model's ids — such an id
    can never match — or None."""
    text = np.asarray(model_ids).dtype.kind in "USO" and len(model_ids) and \
        isinstance(np.asarray(model_ids)[0], str)
    for x in ids:
        if isinstance(x, (str, np.str_)) != bool(text):
            return x
    return None


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_dtype(value) -> np.dtype:
    try:
        dt = np.dtype(value)
    except TypeError as exc:
        raise ValueError(f"dtype must be float32 or float64, got {value!r}") from exc
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {value!r}")
    return dt


def check_rating_scale(value):
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"rating_scale must be a pair (low, high) or None, got {value!r}")
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rating_scale must be a pair (low, high), got {value!r}") from exc
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"rating_scale must be (low, high) with finite low < high, got {value!r}")
    return lo, hi


# ---------------------------------------------------------------------- declared parameter rules
# Estimators declare ``_parameter_constraints = {name: rule}`` once (subclasses extend their
# parent's dict); ``check_params`` applies every rule. A rule is a callable (name, value) that
# raises naming the parameter, or returns the cleaned value.
def Int(low=None, high=None):
    return lambda name, v: check_int(name, v, low=low, high=high)


def Real(low=None, high=None, low_open=False, high_open=False):
    def rule(name, v):
        x = check_float(name, v, low=low, high=high, low_open=low_open)
        if high_open and high is not None and x >= high:
            raise ValueError(f"{name} must be < {high}, got {x}")
        return x
    return rule


def Options(*choices):
    return lambda name, v: check_choice(name, v, set(choices))


def Sequence(*choices):
    """A list or tuple of distinct names from ``choices`` (a str alone is refused: ambiguous)."""
    def rule(name, v):
        if isinstance(v, str) or not isinstance(v, (list, tuple)):
            raise TypeError(f"{name} must be a list or tuple of names from {sorted(choices)}, "
                            f"got {v!r}")
        for x in v:
            check_choice(name, x, set(choices))
        return tuple(v)
    return rule


def Bool():
    def rule(name, v):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {v!r} ({type(v).__name__})")
        return bool(v)
    return rule


BIAS_CHOICES = {False: (False, False), True: (True, True), "item": (True, False),
                "user": (False, True)}


def Biases():
    """An implicit model's ``biases``: False, True (an item and a user bias), "item" or
    "user"."""
    def rule(name, v):
        if not (isinstance(v, (bool, np.bool_)) or (isinstance(v, str) and v in ("item", "user"))):
            raise ValueError(f"{name} must be False, True (an item and a user bias), 'item' or "
                             f"'user', got {v!r}")
        return bool(v) if isinstance(v, (bool, np.bool_)) else v
    return rule


def bias_flags(biases) -> tuple[bool, bool]:
    """(item bias, user bias) of an implicit model's ``biases``."""
    return BIAS_CHOICES[Biases()("biases", biases)]


def moved_biases(params: dict) -> dict:
    """A saved model's parameters with the former ``item_bias``/``user_bias`` as ``biases``."""
    if "item_bias" in params or "user_bias" in params:
        flags = (bool(params.pop("item_bias", False)), bool(params.pop("user_bias", False)))
        params["biases"] = {v: k for k, v in BIAS_CHOICES.items()}[flags]
    return params


def Dtype():
    return lambda name, v: check_dtype(v)


def RatingScale():
    return lambda name, v: check_rating_scale(v)


def NoneOr(rule):
    return lambda name, v: None if v is None else rule(name, v)


def RandomState():
    def rule(name, v):
        if v is None or isinstance(v, np.random.RandomState):
            return v
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be None, an int or a numpy RandomState, got {v!r}")
        if not 0 <= v < 2**63:
            raise ValueError(f"{name} must be in [0, 2**63), got {v}")
        return int(v)
    return rule


def Path():
    import os

    def rule(name, v):
        if not isinstance(v, (str, os.PathLike)) or str(v) == "":
            raise TypeError(f"{name} must be a file path (str or os.PathLike), got {v!r}")
        return v
    return rule


def Dict():
    def rule(name, v):
        if not isinstance(v, dict):
            raise TypeError(f"{name} must be a dict, got {type(v).__name__}")
        return v
    return rule


def check_params(est) -> dict:
    """Apply ``est._parameter_constraints``; returns {name: cleaned value}."""
    return {name: rule(name, getattr(est, name)) for name, rule in est._parameter_constraints.items()}


# constructor names a user may reach for, and where each setting lives (by the parameter that
# must exist on the class for the advice to apply)
MOVED = {
    "learning_rate": ("client_update", "client_update={update}(learning_rate=...)"),
    "batch_size": ("client_update", "client_update={update}(batch_size=...)"),
    "item_learning_rate": ("client_update", "client_update={update}(item_learning_rate=...)"),
    "regularization": ("client_update", "client_update={update}(regularization=...)"),
    "local_epochs": ("client_update", "client_update={update}(epochs=...)"),
    "client_epochs": ("client_update", "client_update={update}(epochs=...)"),
    "epochs": ("client_update", "client_update={update}(epochs=...)"),
    "update_steps": ("client_update", "client_update=ClientUpdate(steps=...)"),
    "client_learning_rate": ("client_update", "client_update={update}(learning_rate=...)"),
    "server_learning_rate": ("server_optimizer",
                             "server_optimizer=SGD(learning_rate=...) (or another optimizer)"),
    "recon_regularization": ("reconstruction",
                             "reconstruction=RidgeReconstruction(regularization=...)"),
    "recon_steps": ("reconstruction", "reconstruction=SGDReconstruction(steps=...)"),
    "recon_learning_rate": ("reconstruction",
                            "reconstruction=SGDReconstruction(learning_rate=...)"),
    "item_bias": ("biases", "biases=True/False (an implicit model also takes 'item' or "
                  "'user' for one of the two)"),
    "user_bias": ("biases", "biases=True/False (an implicit model also takes 'item' or "
                  "'user' for one of the two)"),
    "use_biases": ("biases", "biases=True/False"),
    "n_epochs": ("n_rounds", "n_rounds=... (a federated fit counts rounds, not epochs)"),
    "noise_multiplier": ("aggregator", "aggregator=DPGaussianMean(..., noise_multiplier=...)"),
    "clip_norm": ("aggregator", "aggregator=DPGaussianMean(clip_norm=...) or NormClippedMean"),
    "seed": ("random_state", "random_state=..."),
    "factors": ("n_factors", "n_factors=..."),
    "rounds": ("n_rounds", "n_rounds=..."),
    "n_rounds": ("n_epochs", "n_epochs=... (a centralized fit counts epochs, not rounds)"),
}


def unknown_parameter(cls, name: str, known) -> str:
    """Why ``cls(name=...)`` is refused, and where the setting lives now (or the closest names)."""
    import difflib

    known = list(known)
    where, advice = MOVED.get(name, (None, None))
    if where in known:  # the client update's class: ClientUpdate, or FedMF's SampledUpdate
        if "{update}" in advice:  # (only a federated class has a client update)
            advice = advice.format(update=cls._client_update_name)
        hint = f"set it with {advice}"
    else:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "it takes: " + ", ".join(known)
    return f"{cls.__name__} has no parameter {name!r}; {hint}"


def named_kwargs(init):
    """``init`` refusing an unknown keyword with ``unknown_parameter``'s message instead of
    Python's bare one (scikit-learn still reads the signature: ``__wrapped__``)."""
    import functools
    import inspect

    params = [p for p in inspect.signature(init).parameters.values()][1:]
    names = {p.name for p in params}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return init

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        for key in kwargs:
            if key not in names:
                raise TypeError(unknown_parameter(type(self), key, [p.name for p in params]))
        init(self, *args, **kwargs)

    return checked
