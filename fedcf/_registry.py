"""Every estimator by its command-line name (``fedcf.registry``'s one list), and loading a saved
model of any class."""

from __future__ import annotations

from . import registry
from ._io import load_npz
from .models.base import _META

ESTIMATORS = {name: registry.lookup("estimator", name) for name in registry.names("estimator")}


def load_model(path):
    """Load a model written by any fedcf estimator's ``save``; the class is read from the file."""
    _, meta = load_npz(path, meta_key=_META, what="model")
    by_class = {cls.__name__: cls for cls in (registry.lookup("estimator", name)  # as now
                                              for name in registry.names("estimator"))}
    cls = by_class.get(meta.get("class"))
    if cls is None:
        raise ValueError(f"{str(path)!r} holds a {meta.get('class')!r}, which is not a "
                         f"registered estimator class ({sorted(by_class)}); register its class "
                         "first (fedcf.registry.register('estimator', name, cls))")
    return cls.load(path)
