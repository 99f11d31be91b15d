"""Phase objects as scikit-learn parameters: ``get_params``/``set_params`` with nested names,
equality by parameters, and the check of a numeric setting that names it."""

from __future__ import annotations

import inspect

import numpy as np


class Params:
    """``get_params``/``set_params``/``repr`` from the constructor's keyword names, as
    scikit-learn's estimators and Gaussian-process kernels have them."""

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self"
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def _param_values(self) -> dict:
        return {name: getattr(self, name) for name in self._param_names()}

    def get_params(self, deep: bool = True) -> dict:
        out = {}
        for name, value in self._param_values().items():
            out[name] = value
            if deep and isinstance(value, Params):
                out.update({f"{name}__{k}": v for k, v in value.get_params(deep=True).items()})
        return out

    def set_params(self, **params):
        """Set parameters (``name`` or nested ``name__sub``); the object is checked again by
        ``validate`` when it is next bound, and here when it can check itself."""
        valid = self._param_names()
        nested: dict = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; it takes "
                                 f"{valid}")
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub in nested.items():
            inner = self._param_values()[name]
            if not isinstance(inner, Params):
                raise ValueError(f"{type(self).__name__}.{name} is {inner!r}, which has no "
                                 f"parameters to set ({sorted(sub)})")
            inner.set_params(**sub)
        self.validate()
        return self

    def validate(self) -> None:
        """Raise, naming the parameter, when a value is not allowed (subclasses extend)."""

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._param_values().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        """Equal when of the same class with equal parameters (a clone equals its original)."""
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self.get_params(deep=False), other.get_params(deep=False)
        return all(_same(mine[k], theirs[k]) for k in mine)

    __hash__ = None  # mutable through set_params


def _same(a, b) -> bool:
    """Parameter values equal (arrays by their elements)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).shape == np.asarray(b).shape and bool(np.all(np.asarray(a) ==
                                                                          np.asarray(b)))
    return bool(a == b)


def check_number(name, value, low, *, integer=False, low_open=False, high=None) -> None:
    """A phase object's numeric setting: a finite number (or an integer) above ``low`` (and at
    most ``high``); anything else raises, naming the setting."""
    ok = isinstance(value, (int, np.integer) if integer else (int, float, np.number)) and \
        not isinstance(value, bool) and np.isfinite(value) and \
        (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        kind = "an integer" if integer else "a number"
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {kind} {bound}{'' if high is None else f' and <= {high}'}"
                         f", got {value!r}")
