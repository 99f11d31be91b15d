"""One registry of phase classes by name: what a string parameter (``executor="ray"``,
``server_optimizer="adam"``), the command line and a Flower run config may name.

Entries are "module:Class" paths, imported on first use (Ray is imported only for "ray").
A new phase class registers itself with ``register(kind, name, cls)``.
"""

from __future__ import annotations

import importlib

_ENTRIES: dict[str, dict[str, object]] = {
    "aggregator": {
        "mean": "fedcf.federated.aggregators.weighted:WeightedMean",
        "norm-clipped": "fedcf.federated.aggregators.robust:NormClippedMean",
        "dp": "fedcf.federated.aggregators.dp:DPGaussianMean",
        "differential-privacy": "fedcf.federated.aggregators.dp:DifferentialPrivacy",
        "trimmed-mean": "fedcf.federated.aggregators.robust:TrimmedMean",
        "item-normalized-mean": "fedcf.federated.aggregators.robust:ItemNormalizedMean",
        "median": "fedcf.federated.aggregators.robust:CoordinateMedian",
        "foolsgold": "fedcf.federated.aggregators.robust:FoolsGoldMean",
        "secure": "fedcf.federated.aggregators.secagg:SecureAggregation",
    },
    "executor": {
        "local": "fedcf.federated.round.phases:LocalExecutor",
        "ray": "fedcf.federated.executors.ray_executor:RayExecutor",
        "attacked": "fedcf.federated.aggregators.attacks:AttackedExecutor",
    },
    "server_optimizer": {
        "sgd": "fedcf.federated.round.optimizers:SGD",
        "momentum": "fedcf.federated.round.optimizers:Momentum",
        "adagrad": "fedcf.federated.round.optimizers:Adagrad",
        "adam": "fedcf.federated.round.optimizers:Adam",
        "yogi": "fedcf.federated.round.optimizers:Yogi",
    },
    "reconstruction": {
        "als": "fedcf.federated.algorithms.reconstruction:RidgeReconstruction",
        "sgd": "fedcf.federated.algorithms.reconstruction:SGDReconstruction",
    },
    "split": {
        "random": "fedcf.federated.algorithms.split:RandomSplit",
        "time": "fedcf.federated.algorithms.split:TimeSplit",
        "none": "fedcf.federated.algorithms.split:NoSplit",
    },
    "client_update": {
        "sgd": "fedcf.federated.algorithms.client_update:ClientUpdate",
        "sampled": "fedcf.federated.algorithms.client_update:SampledUpdate",
    },
    "hypergradients": {
        "default": "fedcf.federated.algorithms.hyper:Hypergradients",
    },
    "early_stopping": {
        "default": "fedcf.federated.algorithms.early_stopping:EarlyStopping",
    },
    "item_space": {
        "full": "fedcf.federated.algorithms.items:FullCatalog",
        "open": "fedcf.federated.algorithms.items:OpenCatalog",
    },
    "estimator": {  # by command-line name: the one list load_model, the CLI and the tests read
        "fedrecon": "fedcf.federated.algorithms.fedrecon:FedReconMF",
        "fedavg": "fedcf.federated.algorithms.stateful:FedAvgMF",
        "furl": "fedcf.federated.algorithms.stateful:FURLMF",
        "centralized": "fedcf.models.centralized:CentralizedMF",
        "implicit": "fedcf.models.implicit_mf:ImplicitMF",
        "fedrecon-implicit": "fedcf.federated.algorithms.implicit:FedReconImplicitMF",
        "fedmf": "fedcf.federated.algorithms.sampled_mf:FedMF",
        "pfedrec": "fedcf.federated.algorithms.sampled_mf:PFedRec",
        "fedncf": "fedcf.federated.algorithms.fedncf:FedNCF",
        "ncf": "fedcf.models.ncf:NCF",
    },
}


def register(kind: str, name: str, target) -> None:
    """Make ``target`` (a class or a "module:Class" path) reachable as ``name`` of ``kind``."""
    _ENTRIES.setdefault(kind, {})[name] = target


def unregister(kind: str, name: str) -> None:
    """Forget ``name`` of ``kind`` (a class registered for a while, e.g. by a test)."""
    if name not in _ENTRIES.get(kind, {}):
        raise KeyError(f"{name!r} is not a registered {kind}")
    del _ENTRIES[kind][name]


def names(kind: str) -> list[str]:
    return sorted(_ENTRIES.get(kind, {}))


def lookup(kind: str, name: str):
    """The class registered as ``name``; an unknown name raises, listing the known ones."""
    entries = _ENTRIES.get(kind, {})
    target = entries.get(name) if isinstance(name, str) else None
    if target is None:
        raise ValueError(f"{name!r} is not a registered {kind}; use one of {names(kind)}")
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
        entries[name] = target
    return target


def name_of(kind: str, cls) -> str | None:
    """The registered name of ``cls`` (None if it has none)."""
    for name in names(kind):
        if lookup(kind, name) is cls:
            return name
    return None


def resolve(kind: str, value, contract, param: str):
    """``value`` as a ``contract`` instance: a registered name builds its class with defaults,
    an instance is taken as is; anything else (a name of a class this parameter cannot take
    too) raises naming ``param`` and the names it takes."""
    given = value
    if isinstance(value, str):
        try:
            value = lookup(kind, value)()
        except ValueError as e:
            raise ValueError(f"{param}={value!r}: {e}") from None
        given = f"{given!r} (a {type(value).__name__})"
        if isinstance(value, contract):
            return value
    elif isinstance(value, contract):
        return value
    else:
        given = repr(given)
    allowed = [n for n in names(kind) if isinstance(lookup(kind, n), type)
               and issubclass(lookup(kind, n), contract)]
    raise TypeError(f"{param} must be one of {allowed} or an object of a "
                    f"fedcf.federated.{contract.__name__} subclass, got {given}")


def from_spec(kind: str, spec):
    """A phase object from a JSON spec such as ``{"name": "trimmed-mean", "beta": 0.1}`` (what a
    command line or a run config can carry); anything but a dict is returned as it is. A
    parameter named after a kind takes a nested spec: ``{"name": "differential-privacy",
    "aggregator": {"name": "secure"}, ...}``."""
    if not isinstance(spec, dict):
        return spec
    kinds = phase_kinds()
    kwargs = {k: from_spec(k, v) if k in kinds and isinstance(v, dict) else v
              for k, v in spec.items()}
    name = kwargs.pop("name", None)
    try:
        cls = lookup(kind, name)
    except ValueError as e:
        raise ValueError(f"{kind} name: {e}") from None
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{kind} {name}: {e}") from e


def phase_kinds() -> list[str]:
    """The kinds of phase object, each also the name of the estimator parameter that takes it."""
    return [k for k in sorted(_ENTRIES) if k != "estimator"]


def kind_of(cls) -> tuple[str, str] | None:
    """(kind, registered name) of ``cls``, or None if it is registered under no name."""
    for kind in sorted(_ENTRIES):
        name = name_of(kind, cls)
        if name is not None:
            return kind, name
    return None


def encode(value):
    """A parameter value as JSON-ready data: a phase object (anything with ``get_params``)
    becomes {"__phase__": kind, "name": ..., "params": {...}} (nested objects too), so a saved
    model's parameters are objects again when loaded. An unregistered class is stored by its
    dotted name, and ``decode`` asks for it to be registered rather than importing code named by
    a file."""
    if isinstance(value, tuple):  # JSON has lists only: a tuple comes back as a tuple
        return {"__tuple__": [encode(v) for v in value]}
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        if getattr(value, "ndim", 0) and value.dtype.kind in "biufU":  # an array stays one
            return {"__array__": value.tolist(), "dtype": value.dtype.str}
        return value.tolist()
    if not hasattr(value, "get_params") or isinstance(value, type):
        return value
    found = kind_of(type(value))
    kind, name = found if found else ("unregistered", f"{type(value).__module__}."
                                                      f"{type(value).__qualname__}")
    return {"__phase__": kind, "name": name,
            "params": {k: encode(v) for k, v in value.get_params(deep=False).items()}}


def decode(value, param: str = "parameter"):
    """The inverse of ``encode``; an unregistered class raises, naming it and what to do."""
    if isinstance(value, dict) and set(value) == {"__tuple__"}:
        return tuple(decode(v, param) for v in value["__tuple__"])
    if isinstance(value, dict) and set(value) == {"__array__", "dtype"}:
        import numpy as np

        return np.asarray(value["__array__"], dtype=np.dtype(value["dtype"]))
    if not (isinstance(value, dict) and "__phase__" in value):
        return value
    kind, name = value["__phase__"], value.get("name")
    if kind == "unregistered":
        raise ValueError(f"{param} is a {name}, which is not registered: register the class first "
                         f"(fedcf.registry.register(kind, name, cls)), then load")
    try:
        cls = lookup(kind, name)
        return cls(**{k: decode(v, f"{param}__{k}") for k, v in value.get("params", {}).items()})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{param}: cannot rebuild the {kind} {name!r}: {e}") from None
