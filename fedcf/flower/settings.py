"""The ServerApp's settings: the run config's keys, checked before any node is contacted, and
the JSON specs of phase objects (aggregator, server optimizer, reconstruction)."""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import registry
from ..federated.aggregators.dp import DifferentialPrivacy
from ..federated.aggregators.secagg import SecureAggregation
from ..federated.algorithms.fedrecon import FedReconMF
from ..federated.algorithms.hyper import check_learnable
from ..federated.algorithms.items import ItemSpace
from ..models.base import RatingScoreMixin
from .wire import flower_estimator


@dataclass
class Settings:
    """The ServerApp's settings (from the run config: see ``from_run_config``).

    Parameters
    ----------
    params : dict
        The estimator's parameters (JSON in the run config ``fedcf-params``; phase objects as
        {"name": ...} specs).
    model : str, default "fedrecon"
        The estimator by registered name (run config ``fedcf-model``): any federated one
        ("fedrecon", "fedrecon-implicit", "furl", "fedavg", "fedmf", "pfedrec", "fedncf") or
        a registered subclass. FURL's, FedMF's, PFedRec's and FedNCF's devices keep their user
        rows in the run's node state; FedAvg's travel with each message and back (so not
        under secure aggregation). Federated ReconEval (``eval_fraction``) reports rating
        errors, so a ranking model's run takes eval_fraction=0.
    eval_fraction : float in [0, 1), default 0.1
        Share of the users held out for federated ReconEval.
    eval_support_fraction : float in (0, 1), default 0.5
    min_nodes : int, default 1
        Nodes to wait for before the directory query.
    wait_seconds, reply_timeout : float
        Seconds to wait for the nodes, and for a round's replies (its deadline).
    min_replies : int, default 1
        A training round whose accepted replies come from fewer nodes than this by its
        deadline is not aggregated (the model stays; the round is recorded).
    model_path, result_path : str or None
        Where the fitted model (.npz) and the run's JSON are written.
    catalog_path : str or None
        The run's public item catalog, one integer item id per line. With it the directory
        query sends the catalog and each node maps its own items into it: the setting for
        nodes that hold their own data (node config ``data-path``).
    max_node_share : float in (0, 1], default 0.4
        The largest share of the run's users one node may hold (``directory.cap_node_shares``):
        a node that lists more (fabricated users, say) has a random part of its users left
        out of training and evaluation, named in the refusals — so while most nodes are
        honest, no node holds the majority of a cohort that a robust mean (the median clip)
        assumes. It needs more than 1/share nodes (3 at the default); with fewer it cannot
        hold and is not applied. 1 turns it off.

    Examples
    --------
    >>> from fedcf.flower import Settings
    >>> s = Settings.from_run_config({"fedcf-params": '{"n_factors": 8, "n_rounds": 5}',
    ...                               "min-nodes": 2})
    >>> s.params["n_factors"], s.min_nodes
    (8, 2)
    """

    params: dict = field(default_factory=dict)  # the estimator's parameters
    model: str = "fedrecon"  # the estimator, by registered name (one with _client_params)
    eval_fraction: float = 0.1  # share of the users held out for federated ReconEval
    eval_support_fraction: float = 0.5
    min_nodes: int = 1  # wait for this many nodes before the directory query
    wait_seconds: float = 120.0
    reply_timeout: float = 600.0  # seconds a round waits for replies
    min_replies: int = 1  # fewer accepted node replies by the deadline: the round is dropped
    model_path: str | None = None  # where the fitted model (.npz) is saved
    result_path: str | None = None  # a JSON of the run (history, evaluation, refusals, bytes)
    catalog_path: str | None = None  # the run's public item catalog (one integer id per line)
    max_node_share: float = 0.4  # the largest share of the run's users one node may hold

    KEYS = {"fedcf-params": "params", "fedcf-model": "model", "eval-fraction": "eval_fraction",
            "eval-support-fraction": "eval_support_fraction", "min-nodes": "min_nodes",
            "wait-seconds": "wait_seconds", "reply-timeout": "reply_timeout",
            "min-replies": "min_replies",
            "model-path": "model_path", "result-path": "result_path",
            "catalog-path": "catalog_path", "max-node-share": "max_node_share"}

    @classmethod
    def from_run_config(cls, run_config) -> Settings:
        """Keys: fedcf-params (JSON of the estimator's parameters), fedcf-model, eval-fraction,
        eval-support-fraction, min-nodes, min-replies, wait-seconds, reply-timeout, model-path,
        result-path, catalog-path, max-node-share; others (the nodes' dataset keys) are ignored here."""
        kw = {cls.KEYS[k]: v for k, v in dict(run_config).items() if k in cls.KEYS}
        if isinstance(kw.get("params"), str):
            try:
                kw["params"] = json.loads(kw["params"] or "{}")
            except json.JSONDecodeError as e:
                raise ValueError(f"run config fedcf-params is not JSON ({e}): pass e.g. "
                                 "'{\"n_factors\": 20, \"n_rounds\": 30}'") from e
        for key in ("model_path", "result_path", "catalog_path"):
            kw[key] = kw.get(key) or None
        return cls(**kw).check()

    def catalog(self):
        """The run's item catalog from ``catalog_path`` (sorted integer ids), or None: then
        the nodes report the catalog of the dataset they share."""
        if self.catalog_path is None:
            return None
        path = Path(self.catalog_path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"catalog-path {str(path)!r}: cannot read it ({e})") from None
        ids = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                try:
                    ids.append(int(line))
                except ValueError:
                    raise ValueError(f"catalog-path {str(path)!r} line {n}: {line!r} is not an "
                                     "integer item id (one id per line)") from None
        if not ids:
            raise ValueError(f"catalog-path {str(path)!r} lists no item id")
        catalog, counts = np.unique(np.asarray(ids, np.int64), return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"catalog-path {str(path)!r} lists item {catalog[counts > 1][0]} "
                             "twice; list each item once")
        return catalog

    def check(self) -> Settings:
        if not isinstance(self.params, dict):
            raise TypeError(f"fedcf-params must be a JSON object of the estimator's parameters, got "
                            f"{type(self.params).__name__}")
        if self.params.get("executor"):
            raise ValueError(f"fedcf-params executor={self.params['executor']!r} is not "
                             "available in a Flower run (the nodes are the executor)")
        for key, kind, value in (
                ("eval_fraction", float, self.eval_fraction),
                ("eval_support_fraction", float, self.eval_support_fraction),
                ("min_nodes", int, self.min_nodes), ("min_replies", int, self.min_replies),
                ("wait_seconds", float, self.wait_seconds),
                ("reply_timeout", float, self.reply_timeout),
                ("max_node_share", float, self.max_node_share)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not np.isfinite(value) or (kind is int and value != int(value)):
                raise TypeError(f"{key.replace('_', '-')} must be a finite {kind.__name__}, got "
                                f"{value!r}")
        if not 0.0 <= float(self.eval_fraction) < 1.0:
            raise ValueError(f"eval-fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 < float(self.max_node_share) <= 1.0:
            raise ValueError(f"max-node-share must be in (0, 1] (1: no cap), got "
                             f"{self.max_node_share}")
        if not 0.0 < float(self.eval_support_fraction) < 1.0:
            raise ValueError(f"eval-support-fraction must be in (0, 1), got "
                             f"{self.eval_support_fraction}")
        self.catalog()  # a bad catalog file is named before any node is contacted
        if int(self.min_nodes) < 1:
            raise ValueError(f"min-nodes must be >= 1, got {self.min_nodes}")
        if int(self.min_replies) < 1:
            raise ValueError(f"min-replies must be >= 1, got {self.min_replies}")
        for key, value in (("wait_seconds", self.wait_seconds),
                           ("reply_timeout", self.reply_timeout)):
            if not float(value) > 0:
                raise ValueError(f"{key.replace('_', '-')} must be > 0 seconds")
        self.params = {**self.params, **{k: make_phase(k, self.params[k]) for k in
                                         PHASE_PARAMS if k in self.params}}
        if self.params.get("aggregator") is None:  # robust by default: one node's wild
            self.params["aggregator"] = default_aggregator()  # uploads are clipped
        agg = self.params.get("aggregator")
        if isinstance(agg, DifferentialPrivacy) and isinstance(agg.inner, SecureAggregation) \
                and agg.noise == "distributed" and agg.insecure_seeded_noise:
            raise ValueError("insecure_seeded_noise=True with distributed noise: in a Flower run "
                             "each device draws its share of the noise from its own secure "
                             "randomness; use noise='server' for a seeded test run")
        est = self.estimator()
        if isinstance(est, FedReconMF):
            self._check_fedrecon(est)
        if est._server_rows and est._aggregator().inner.secure:
            raise ValueError(f"fedcf-model={self.model!r} with secure aggregation: its user "
                             "rows go back to the server in the clear with each upload "
                             "(FedAvg), which a masked round does not carry; use 'furl', "
                             "whose rows stay on the devices")
        if not isinstance(est, RatingScoreMixin) and float(self.eval_fraction) > 0:
            raise ValueError(f"eval-fraction={self.eval_fraction} with fedcf-model="
                             f"{self.model!r}: federated ReconEval reports rating errors, which "
                             "an implicit model does not predict; set eval-fraction=0 and rank "
                             "held-out users in process")
        if est.dp_release and isinstance(est.aggregator, DifferentialPrivacy) and \
                est.aggregator.weight_cap is not None:
            raise ValueError("fedcf-params: weight_cap needs every user's rating count at the "
                             "server, which a Flower run under differential privacy never "
                             "sends (the nodes list only eligible users); leave weight_cap=None")
        return self

    def estimator(self):
        """The run's estimator (``model``, see ``wire.flower_estimator``), its parameters
        checked; a bad name or parameter is refused, naming it."""
        cls = flower_estimator(self.model)
        try:
            est = cls(**self.params).check_params()  # names a bad parameter now, not mid-run
        except TypeError as e:
            raise ValueError(f"fedcf-params: {e}; see help(fedcf.{cls.__name__}) for the "
                             "names") from e
        if est.get_params(deep=False).get("early_stopping") == "auto":
            # a Flower run keeps every round (its held-out users are the federated ReconEval's,
            # eval_every); so "auto" settles the server step to the paper's SGD
            est.set_params(early_stopping=None)
        return est

    def _check_fedrecon(self, est) -> None:
        """What a Flower run of FedReconMF cannot do yet, refused before it starts."""
        if registry.resolve("item_space", est.item_space, ItemSpace, "item_space").open:
            raise ValueError("fedcf-params: an open item space (item_space=OpenCatalog) is not "
                             "available in a Flower run yet (its nodes run FedReconMF's "
                             "full-catalog kernel); leave item_space unset")
        if est.hypergradients is not None and est.dp_release:
            raise ValueError("fedcf-params: hypergradients in a Flower run take the plain mean "
                             "or secure aggregation without DP for now: the clipped and noised "
                             "reports of DP run in process or on Ray only; drop hypergradients "
                             "or the DP aggregator")
        if est.hypergradients is not None:
            try:
                check_learnable(est, est.hypergradients, stateful=False)
            except ValueError as e:
                raise ValueError(f"fedcf-params: {e}. In a Flower run the default aggregator is "
                                 "NormClippedMean; name the plain mean with "
                                 "\"aggregator\": {\"name\": \"mean\"}") from None


def default_aggregator():
    """A Flower run's aggregator when the run config names none: uploads clipped to 3× the
    round's median norm (NormClippedMean("median")), so a node sending scaled or wild deltas
    moves the model no more than an honest client. Name {"name": "mean"} for the plain mean."""
    from ..federated.aggregators.robust import NormClippedMean

    return NormClippedMean("median")


# parameters that are phase objects (JSON specs in a run config)
PHASE_PARAMS = tuple(k for k in registry.phase_kinds() if k != "executor")


def make_phase(kind: str, spec):
    """A phase object (aggregator, server optimizer, ...) as given, or one from a JSON spec such
    as ``{"name": "trimmed-mean", "beta": 0.1}`` or ``{"name": "adam", "learning_rate": 0.01}``
    (the run config can only carry JSON); the names are ``fedcf.registry``'s."""
    try:
        return registry.from_spec(kind, spec)
    except ValueError as e:
        raise ValueError(f"fedcf-params {e}") from None
