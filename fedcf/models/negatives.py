"""What a device may draw as negatives, and the checks of the sampled-negative models'
settings shared by the federated (FedMF, PFedRec, FedNCF) and the centralized (NCF) ones."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..datasets import DataValidationError, Interactions
from .base import _plain


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
