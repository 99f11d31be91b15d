"""Checkpoints of a federated run: atomic writes, and resume only into the run that wrote them."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from ..._io import atomic_savez, load_npz
from .optimizers import state_from_arrays, state_to_arrays
from .params import Params

_META = "__meta__"
# parameters that may differ between a checkpoint and the run that resumes it: they do not
# change the model (the executor: same bits wherever the clients run)
RESUME_FREE = {"verbose", "checkpoint_path", "checkpoint_every", "eval_every", "n_rounds",
               "executor"}


def data_fingerprint(inter, seed: int) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint: the seed, the sizes
    and a sha256 over the data itself (entries, values, timestamps, raw ids)."""
    h = hashlib.sha256()
    if inter.executor is not None:  # clients run where their data are: the spec says what
        h.update(repr(sorted(inter.source.describe().items())).encode())
        return {"n_users": inter.n_users, "n_items": inter.n_items, "nnz": inter.nnz,
                "sha256": h.hexdigest(), "seed": int(seed)}
    for a in (inter.indptr, inter.items, inter.values, inter.timestamps):
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    for ids in (inter.user_ids, inter.item_ids):
        h.update(pd.util.hash_array(np.asarray(ids, dtype=object)).tobytes())
    return {"n_users": inter.n_users, "n_items": inter.n_items, "nnz": inter.nnz,
            "sha256": h.hexdigest(), "seed": int(seed)}


def setting(value) -> str:
    """A parameter's value as resume compares it: every element counts (an array is its shape,
    dtype and a hash of all its values, never numpy's shortened repr with "…"); phase objects by
    class and parameters."""
    def enc(x):
        if isinstance(x, (Params, BaseEstimator)):  # a phase object, or an estimator
            return {"class": f"{type(x).__module__}.{type(x).__qualname__}",
                    **{k: enc(v) for k, v in x.get_params(deep=False).items()}}
        if isinstance(x, (np.ndarray, pd.Index, pd.Series)):
            a = np.asarray(x)
            digest = hashlib.sha256(pd.util.hash_array(a.ravel().astype(object)).tobytes())
            return {"array": list(a.shape), "dtype": str(a.dtype),
                    "sha256": digest.hexdigest()[:16]}
        if isinstance(x, (list, tuple)):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            return {str(k): enc(v) for k, v in x.items()}
        if isinstance(x, np.generic):
            return x.item()
        return x if x is None or isinstance(x, (str, int, float, bool)) else repr(x)
    return json.dumps(enc(value), sort_keys=True)


def save_checkpoint(path, *, cls: str, params: dict, opt_state: dict, local, done: int,
                    history: list, fingerprint: dict, run_params: dict,
                    accountant: dict | None = None, aggregator: dict | None = None,
                    participations: np.ndarray | None = None,
                    extra: dict | None = None) -> None:
    arrays = {"Q": params["Q"], "b": params["b"], **state_to_arrays(opt_state), **(extra or {})}
    if participations is not None:  # under DP: each user's rounds so far (ε against the server)
        arrays["participations"] = participations
    if local is not None:
        arrays["P"], arrays["c"] = local
    meta = {"class": cls, "round": done, "fingerprint": fingerprint,
            "params": {k: setting(v) for k, v in run_params.items()},
            "params_shown": {k: repr(v) for k, v in run_params.items()}, "history": history,
            "accountant": accountant, "aggregator": aggregator or {}}
    atomic_savez(path, arrays, meta, meta_key=_META)


def load_checkpoint(path, *, cls: str, run_params: dict, fingerprint: dict, n_rounds: int,
                    expect: dict):
    """(params, opt_state, local or None, history, round, accountant state or None, the
    aggregator's state, each user's participations under DP or None, the arrays named
    ``best_*`` and ``avg_*`` (early stopping's best round and running average)) from
    ``path``, after checking that it
    belongs to this run: same class, parameters and data, and arrays of the expected shapes and
    dtypes (``expect``: name → (shape, dtype)). Any mismatch raises ValueError naming the file
    and what differs; the file is left untouched."""
    arrays, meta = load_npz(path, meta_key=_META, what="checkpoint")
    where = f"checkpoint {str(path)!r}"
    keep = "; it is left untouched — use the same settings and data to resume, or another checkpoint_path"
    for key in ("class", "round", "fingerprint", "params", "history"):
        if key not in meta:
            raise ValueError(f"{where} has no {key!r} in its metadata: not a fedcf checkpoint{keep}")
    if meta["class"] != cls:
        raise ValueError(f"{where} belongs to a {meta['class']}, not a {cls}{keep}")
    mine = {k: setting(v) for k, v in run_params.items()}
    shown = meta.get("params_shown", {})
    for k in sorted(set(mine) | set(meta["params"])):
        if mine.get(k) != meta["params"].get(k):
            theirs = shown.get(k, meta["params"].get(k))
            ours = repr(run_params[k]) if k in run_params else None
            hidden = " (they differ in values the shortened display hides)" \
                if theirs == ours else ""
            raise ValueError(f"{where} was written with {k}={theirs}, this run has "
                             f"{k}={ours}{hidden}{keep}")
    if meta["fingerprint"] != fingerprint:
        raise ValueError(f"{where} was written for other data ({meta['fingerprint']} vs "
                         f"{fingerprint}){keep}")
    done = meta["round"]
    if not isinstance(done, int) or not 0 <= done <= n_rounds:
        raise ValueError(f"{where} is at round {done!r}, outside 0..n_rounds={n_rounds}{keep}")
    for name, (shape, dtype) in expect.items():
        a = arrays.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            got = "missing" if a is None else f"{a.shape} {a.dtype}"
            raise ValueError(f"{where}: array {name!r} is {got}, expected {shape} {dtype}"
                             f" (damaged or edited file){keep}")
        if not np.isfinite(a).all():
            raise ValueError(f"{where}: array {name!r} has non-finite values{keep}")
    params = {"Q": arrays["Q"], "b": arrays["b"]}
    local = (arrays["P"], arrays["c"]) if "P" in expect else None
    best = {k: v for k, v in arrays.items() if k.startswith(("best_", "avg_"))}
    return (params, state_from_arrays(arrays), local, meta["history"], done,
            meta.get("accountant"), meta.get("aggregator") or {}, arrays.get("participations"),
            best)
