"""Federated ReconEval over Flower nodes: each node holding evaluation users reconstructs them on
their own support sets and reports sums over their query ratings; the server checks and adds
the sums (``eval.protocols.finish_recon_sums``)."""

from __future__ import annotations

import numpy as np

from ..eval.protocols import finish_recon_sums
from .directory import Directory, Refusals, exchange, message
from .wire import RECON_FIELDS, ReplyError, arrays, client_params, flwr


def federated_recon_eval(grid, directory: Directory, users: np.ndarray, model, *, seed: int,
                         support_fraction: float, timeout: float, refusals: Refusals) -> dict:
    """Federated ReconEval: each node holding evaluation users gets the model and their ids,
    they reconstruct on their own support sets and the node reports sums over their query
    ratings; the server adds the reports (``eval.protocols.finish_recon_sums``)."""
    node = directory.node_of[users]
    glob = arrays(Q=model.item_factors_, b=model.item_biases_)
    msgs, asked = [], {}
    for k in np.unique(node):
        n, raw = directory.nodes[k], directory.user_ids[users[node == k]]
        asked[n] = len(raw)
        config = flwr().ConfigRecord({
            "users": [int(u) for u in raw], "params": client_params(model),
            "mu": float(model.global_mean_), "rating_scale": [float(x) for x in
                                                              model.rating_scale_],
            "support": float(support_fraction), "seed": int(seed)})
        msgs.append(message({"global": glob, "config": config}, n,
                             flwr().MessageType.EVALUATE, "recon-eval"))
    parts = []
    for n, content in exchange(grid, msgs, timeout, "recon eval", refusals):
        rec = content.metric_records.get("recon")
        try:
            if rec is None or set(rec) != set(RECON_FIELDS):
                raise ReplyError(f"the reply needs a 'recon' metric record with {RECON_FIELDS}")
            part = {k: rec[k] for k in RECON_FIELDS}
            if not all(np.isfinite(float(v)) for v in part.values()) or part["n"] < 0 or \
                    not 0 <= part["hits"] <= part["n"] or not 0 <= part["users"] <= asked[n] \
                    or part["sse"] < 0 or part["sae"] < 0:
                raise ReplyError(f"its sums are not possible: {part}")
            parts.append(part)
        except ReplyError as e:
            refusals.add("recon eval", n, str(e), asked[n])
    out = finish_recon_sums(parts)
    out["nodes_reporting"] = len(parts)
    return out
