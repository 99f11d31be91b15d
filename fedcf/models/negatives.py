"""What a device may draw as negatives, the checks of the sampled-negative models' settings, and
how they serve (``DeviceFoldIn``), shared by the federated (FedMF, PFedRec, FedNCF) and the
centralized (NCF) ones."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._validation import check_int
from ..datasets import DataValidationError, Interactions
from .base import _plain, user_keys


def exclusion_csr(inter: Interactions, exclude=None) -> tuple:
    """(indptr, items): each user's sorted items never drawn as a negative — their own and
    ``exclude``'s (Interactions over the same users and items, e.g.
    ``fedcf.eval.loo.training_exclusions``). Refuses a user with every item excluded."""
    own = sp.csr_matrix((np.ones(inter.nnz), inter.items, inter.indptr),
                        shape=(inter.n_users, inter.n_items))
    if exclude is not None:
        if not isinstance(exclude, Interactions) or exclude.n_users != inter.n_users \
                or exclude.n_items != inter.n_items \
                or not np.array_equal(exclude.item_ids, inter.item_ids) \
                or not np.array_equal(exclude.user_ids, inter.user_ids):
            raise DataValidationError(
                f"exclude must be Interactions over the same {inter.n_users} users and "
                f"{inter.n_items} items as the training data (e.g. fedcf.eval.loo."
                "training_exclusions(split, mode))")
        own = own + sp.csr_matrix((np.ones(exclude.nnz), exclude.items, exclude.indptr),
                                  shape=own.shape)
    own.sum_duplicates()
    own.sort_indices()
    full = np.flatnonzero((np.diff(own.indptr) >= inter.n_items) & (inter.counts() > 0))
    if len(full):
        raise DataValidationError(
            f"user {_plain(inter.user_ids[full[0]])!r} has every item of the catalog excluded, "
            "so no negative can be drawn for them; drop the user or shrink exclude")
    return own.indptr.astype(np.int64), own.indices.astype(np.int64)


def check_negatives(negatives: int, n_items: int) -> None:
    """Refuse more negatives per positive than the catalog has items: they would be the same
    few items drawn again and again (with replacement), a silently different model."""
    if negatives >= n_items:
        raise ValueError(f"negatives={negatives} per positive, but the catalog has only "
                         f"{n_items} items to draw them from; use negatives <= {max(n_items - 1, 1)} "
                         "(the papers use 4)")


def dense_users(users, n_users: int) -> np.ndarray:
    """``users`` as int64 dense ids in [0, n_users); anything else is refused, naming it."""
    users = np.asarray(users)
    if users.ndim != 1 or (users.size and (users.dtype.kind not in "iu" or users.min() < 0
                                           or users.max() >= n_users)):
        raise ValueError(f"users must be a 1-D array of dense user ids in [0, {n_users}) "
                         f"(positions in model.user_ids_), got {users!r}")
    return users.astype(np.int64)


def check_layers(layers) -> tuple:
    """``layers`` as a tuple of positive widths, or a ValueError naming it."""
    given = layers
    if isinstance(layers, np.ndarray) and layers.ndim == 1:
        layers = layers.tolist()
    layers = tuple(layers) if isinstance(layers, (tuple, list)) else None
    if not layers or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1
                         for w in layers):
        raise ValueError(f"layers must be a non-empty tuple of widths >= 1, e.g. (32, 16), "
                         f"got {given!r}")
    return tuple(int(w) for w in layers)


class DeviceFoldIn:
    """Serving of the sampled-negative models (FedMF, FedNCF, NCF; PFedRec scores its own
    way): a user seen in fit scores with the row fit kept; a new user's row is trained on
    their own device from their positives, everything global frozen (``_fold_in``)."""

    def _fold_in(self, indptr, items, excl, keys, epochs: int):
        """(P, c): user parts of new devices holding the CSR rows (model items), each trained
        for ``epochs`` local epochs, ``excl`` (indptr, items) never drawn as a negative, ``keys``
        (one per row) seeding each device's draws."""
        raise NotImplementedError

    def _fold_in_epochs(self) -> int:
        """A new device's local epochs by default: as many passes as fit made over a user."""
        raise NotImplementedError

    def _reconstruct_csr(self, indptr, items, values, keys):
        own = Interactions(indptr=np.asarray(indptr, np.int64), items=np.asarray(items),
                           values=np.ones(len(items)), timestamps=None,
                           user_ids=np.arange(len(indptr) - 1),
                           item_ids=np.arange(self.item_factors_.shape[0]))
        P, c = self._fold_in(indptr, items, exclusion_csr(own), keys, self._fold_in_epochs())
        dt = self.item_factors_.dtype
        return P.astype(dt), c.astype(dt)

    def user_scores(self, users) -> np.ndarray:
        """Scores of every item (model item order) for dense users seen in fit: (len, n_items).
        A user's scores do not depend on which other users share the call."""
        self._check_fitted()
        users = self._dense_users(users)
        return self.score_all_items(self.user_factors_[users], self.user_biases_[users])

    def score_new_users(self, inter: Interactions, exclude=None, *, epochs=None) -> np.ndarray:
        """Scores of every item (model item order) for users unseen in fit, each trained on
        their own device from ``inter`` (same item map as fit) with everything global frozen,
        for ``epochs`` local epochs (default: as many passes as fit made over a user; 0: no
        training). ``exclude`` as in fit. A user's scores depend only on their own data and
        raw id."""
        self._check_fitted()
        epochs = check_int("epochs", self._fold_in_epochs() if epochs is None else epochs,
                           low=0)
        if not isinstance(inter, Interactions) or not np.array_equal(inter.item_ids,
                                                                     self.item_ids_):
            raise DataValidationError("score_new_users needs Interactions over the model's item "
                                      "map (item_catalog=model.item_ids_)")
        excl, keys = exclusion_csr(inter, exclude), user_keys(inter.user_ids)
        P, c = self._fold_in(inter.indptr, inter.items, excl, keys, epochs)
        return self._scores_of(inter.indptr, inter.items, excl, keys, P, c)

    def _scores_of(self, indptr, items, excl, keys, P, c) -> np.ndarray:
        """Scores of every item for user parts (P, c) of devices holding the CSR rows."""
        return self.score_all_items(P, c)

    def _dense_users(self, users) -> np.ndarray:
        return dense_users(users, len(self.user_ids_))
