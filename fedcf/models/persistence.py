"""Versioned save/load of a fitted estimator: one ``.npz`` of arrays plus JSON metadata, written
atomically, never pickle (``Persistence``, mixed into ``MFEstimatorBase``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import registry
from .._io import atomic_savez, load_npz

FORMAT_VERSION = 2
_META = "metadata"


def _ids_to_arrays(ids: np.ndarray, what: str) -> dict:
    """Raw ids in a form np.load can read back without pickle: ``<what>_ids``, and for ids that
    mix str and int, their text plus ``<what>_id_is_int`` (which entries were ints)."""
    ids = np.asarray(ids)
    key = f"{what}_ids"
    if ids.dtype.kind in "iufU":
        return {key: ids}
    is_str = np.array([isinstance(x, str) for x in ids], bool)
    is_int = np.array([isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                       for x in ids], bool)
    if is_str.all():
        return {key: ids.astype(str)}
    if is_int.all():
        return {key: ids.astype(np.int64)}
    if (is_str | is_int).all():
        return {key: np.array([str(x) for x in ids]), f"{what}_id_is_int": is_int}
    bad = ids[~(is_str | is_int)][0]
    raise TypeError(f"cannot save {what} id {bad!r} of type {type(bad).__name__}: only str and "
                    f"int ids can be saved without pickle; map the {what} ids to str or int "
                    "before fit")


def _ids_to_array(ids: np.ndarray, what: str) -> np.ndarray:
    """One array of ids of one kind (str or int); mixed kinds are refused, naming them."""
    out = _ids_to_arrays(ids, what)
    if len(out) > 1:
        raise TypeError(f"{what} ids mix str and int (e.g. {show_mixed(ids)}); map them to one "
                        "kind (all str or all int) first")
    return next(iter(out.values()))


def show_mixed(ids) -> str:
    first = {type(x).__name__: x for x in reversed(list(ids))}
    return " and ".join(repr(v) for v in first.values())


def _ids_from_arrays(arrays, what: str) -> np.ndarray:
    ids = arrays[f"{what}_ids"]
    flag = arrays.get(f"{what}_id_is_int")
    if flag is None:
        return ids
    return np.array([int(x) if f else str(x) for x, f in zip(ids, flag)], dtype=object)


# fitted figures a loaded model reports as the fitted one did (JSON in the metadata): the DP
# accounting (public figures, covered by ε) and the learned server hyperparameters (not kept
# in a DP release: they come from the clients' unnoised loss derivatives)
_FITTED_VALUES = ("epsilon_", "epsilon_server_", "epsilons_", "noise_multiplier_",
                  "learned_hyperparams_", "score_seed_")


def npz_path(path) -> Path:
    """Where ``save`` writes: ``path``, with ``.npz`` appended when it does not end in it; a
    folder is refused, naming it."""
    path = Path(path)
    if path.is_dir() or str(path).endswith(os.sep):
        raise IsADirectoryError(f"cannot save the model to {str(path)!r}: it is a folder; pass "
                                "a file name such as folder/model.npz")
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def _plain(value):
    """A fitted figure as JSON data (NumPy scalars and arrays as Python numbers and lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.tolist() if hasattr(value, "tolist") else value


class Persistence:
    """``save`` / ``load`` of a fitted estimator."""

    _saved_arrays: tuple[str, ...] = ("item_factors_", "item_biases_")
    _saved_objects: tuple[str, ...] = ()  # fitted phase objects (as specs in the metadata)
    # the fitted state a model may hold besides its saved arrays and objects;
    # ``_fitted`` reads only declared names, so a misspelt one raises instead of reading as
    # "not fitted"; a subclass adds its own in ``_fitted_extra``
    _fitted_state: tuple[str, ...] = (
        "item_ids_", "user_ids_", "global_mean_", "rating_scale_", "history_", "interactions_",
        "seen_indptr_", "seen_items_", "user_ids_withheld_", "user_factors_", "user_biases_",
        *_FITTED_VALUES)
    _fitted_extra: tuple[str, ...] = ()

    def _fitted(self, name: str):
        """The declared fitted attribute ``name``, or None when this model holds none (not
        fitted yet, or loaded without it)."""
        if name not in (*self._fitted_state, *self._saved_arrays, *self._saved_objects,
                        *self._fitted_extra):
            raise AttributeError(f"{name!r} is not a declared fitted attribute of "
                                 f"{type(self).__name__}")
        return getattr(self, name, None)  # the one read of fitted state that may find none

    # what a release under differential privacy keeps of history_ (covered by ε)
    _DP_HISTORY = ("epsilon", "clip_norm")  # the adaptive clip: from noised counts

    @classmethod
    def _saved_params(cls, params: dict) -> dict:
        """The constructor parameters of a saved model, any a former version named otherwise
        moved to where they live now (a subclass that renamed a parameter says how)."""
        return params

    @classmethod
    def _saved_arrays_of(cls, arrays: dict, meta: dict) -> dict:
        """The arrays of a saved model, any a former version laid out otherwise moved to where
        they live now (``meta`` updated to match; a subclass that changed its layout says
        how)."""
        return arrays

    def _dp_release(self) -> bool:
        """Whether this model was trained under differential privacy (federated subclasses)."""
        return False

    def save(self, path, *, user_ids: bool | None = None) -> Path:
        """Write one versioned ``.npz`` (arrays + JSON metadata, no pickle), atomically: a reader
        sees the old file or the new one, never a part. ``.npz`` is appended to a path that does
        not end in it.

        ``user_ids`` says whether the training users travel with the model. None (default):
        only where the model keeps user rows (centralized, FedAvg, FURL), which are addressed by
        them, with each user's seen items (for ``recommend(user=..., filter_seen=True)``); a
        FedRecon model keeps no user row, so by default its file names no training user. True
        keeps FedRecon's ids (a loaded model then tells a training user from a new one); False
        drops them and, where present, the user rows and seen items: the file is the global
        model alone. A loaded model without user ids scores every user by the new-user
        fallback (and warns): reconstruct users from their ratings instead.

        A model trained under differential privacy is saved as a DP release: no training user
        id (``user_ids=True`` is refused), no user row or seen item, no ``random_state`` (the
        seed), and of ``history_`` only what ε covers (ε per round, the adaptive clip); not the
        unnoised losses, cohort counts or timings. Its μ and rating scale are the public ones
        the fit was given (``rating_scale``, the aggregator's ``public_mean``), and its item
        vocabulary the aggregator's ``public_items`` where given."""
        self._check_fitted()
        path = npz_path(path)
        params = self.get_params(deep=False)
        private = self._dp_release()
        keep_users = self._keep_user_ids(user_ids, private)
        if private:
            params["random_state"] = None
        history = self._fitted("history_") or []
        if private:
            history = [{k: h[k] for k in self._DP_HISTORY if k in h} for h in history]
        meta = {
            "format_version": FORMAT_VERSION,
            "class": type(self).__name__,
            "params": {k: (str(v) if isinstance(v, (np.dtype, type, os.PathLike)) else
                           registry.encode(v)) for k, v in params.items()},
            "global_mean": float(self.global_mean_),
            "rating_scale": None if self.rating_scale_ is None else list(self.rating_scale_),
            "history": history,
            "user_ids_kept": keep_users,
            "fitted_objects": {k: registry.encode(self._fitted(k)) for k in self._saved_objects
                               if self._fitted(k) is not None},
            "fitted_values": {k: _plain(self._fitted(k)) for k in _FITTED_VALUES
                              if self._fitted(k) is not None
                              and not (private and k == "learned_hyperparams_")},
        }
        arrays = {a: self._fitted(a) for a in self._saved_arrays if self._fitted(a) is not None
                  and not (not keep_users and a in ("user_factors_", "user_biases_"))}
        arrays.update(_ids_to_arrays(self.user_ids_ if keep_users else self.user_ids_[:0],
                                     "user"))
        arrays.update(_ids_to_arrays(self.item_ids_, "item"))
        if "user_factors_" in arrays:
            inter = self._fitted("interactions_")
            if inter is not None and inter.holds_ratings:  # a Flower server's does not
                arrays["seen_indptr"], arrays["seen_items"] = inter.indptr, inter.items
            elif self._fitted("seen_indptr_") is not None:
                arrays["seen_indptr"], arrays["seen_items"] = self.seen_indptr_, self.seen_items_
        return atomic_savez(path, arrays, meta, meta_key=_META)

    def _keep_user_ids(self, user_ids, private: bool) -> bool:
        if user_ids not in (None, True, False):
            raise TypeError(f"user_ids must be None, True or False, got {user_ids!r}")
        if private and user_ids:
            raise ValueError("user_ids=True would put the training users' ids in a model "
                             "trained under differential privacy, outside ε; a DP release "
                             "names no user (leave user_ids unset)")
        if user_ids is None:
            return not private and self._fitted("user_factors_") is not None
        return bool(user_ids)

    @classmethod
    def load(cls, path):
        """Load a model written by ``save`` (refuses another class, a newer format, or a file
        that is not a complete fedcf model, naming the path)."""
        arrays, meta = load_npz(path, meta_key=_META, what="model")
        where = f"model file {str(path)!r}"
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(f"{where}: format_version {meta['format_version']} is newer than this "
                             f"fedcf understands ({FORMAT_VERSION}); upgrade fedcf")
        if meta.get("class") != cls.__name__:
            raise ValueError(f"{where} holds a {meta.get('class')}, not a {cls.__name__}; load it "
                             f"with fedcf.{meta.get('class')}.load")
        arrays = cls._saved_arrays_of(dict(arrays), meta)
        params = cls._saved_params({k: registry.decode(v, k) for k, v in meta["params"].items()})
        model = cls(**params)
        missing = [a for a in ("item_factors_", "item_biases_", "user_ids", "item_ids")
                   if a not in arrays]
        if missing:
            raise ValueError(f"{where} lacks array {missing[0]!r}: damaged or not a fedcf model")
        for name in cls._saved_arrays:
            if name in arrays:
                setattr(model, name, arrays[name])
        model.interactions_ = None  # a file holds no user's ratings: reconstruct from them
        model.user_ids_ = _ids_from_arrays(arrays, "user")
        model.item_ids_ = _ids_from_arrays(arrays, "item")
        if "seen_indptr" in arrays:
            model.seen_indptr_, model.seen_items_ = arrays["seen_indptr"], arrays["seen_items"]
        model.global_mean_ = meta["global_mean"]
        model.rating_scale_ = None if meta["rating_scale"] is None else tuple(meta["rating_scale"])
        model.history_ = meta["history"]
        for name, value in meta.get("fitted_values", {}).items():
            if name in _FITTED_VALUES:
                setattr(model, name, value)
        for name, spec in meta.get("fitted_objects", {}).items():
            if name in cls._saved_objects:
                setattr(model, name, registry.decode(spec, name))
        model.user_ids_withheld_ = not meta.get("user_ids_kept", True) or (
            len(model.user_ids_) == 0 and model._dp_release())
        model._check_loaded(where)
        return model

    def _check_loaded(self, where: str):
        Q, b = self.item_factors_, self.item_biases_
        n_items = len(self.item_ids_)
        ok = Q.ndim == 2 and Q.shape[0] == n_items and b.shape == (n_items,)
        P = self._fitted("user_factors_")
        if P is not None:
            ok = ok and P.shape == (len(self.user_ids_), Q.shape[1]) and \
                self.user_biases_.shape == (len(self.user_ids_),)
        if not ok or Q.shape[1] != self._row_width() or Q.dtype.kind != "f":
            raise ValueError(f"{where}: array shapes do not match (item factors {Q.shape}, "
                             f"{n_items} item ids, n_factors={self.n_factors}): damaged or edited")
