"""FedNCF (federated NeuMF) on the federated round (phases.py), so differential privacy, secure
aggregation, robust aggregators, checkpoints and the divergence guard apply to it as to FedMF.

The global model is two named arrays (``_model_state``): the item rows [q_g | q_m] (the GMF and
MLP embeddings, row-sparse) and the MLP with the output layer (``dense_params_``, a dense part
in ``_kernels.neumf.dense_layout``'s order). Every device uploads the dense part whole, so
each round's mean includes it; a clip bounds a device's whole upload, item rows and dense part
together. A device keeps its user row
[p_g | p_m] between rounds (``DeviceRows``) and never uploads it.
"""

from __future__ import annotations

import numpy as np

from ..._kernels.neumf import neumf_fold_in
from ...models.base import check_memory
from ...models.negatives import check_layers
from ...models.sampled_nets import NeuMFScoring
from ..round.state import ModelState, Part, dense_part
from .programs import NeuMFProgram
from .sampled_mf import FedMF


class FedNCF(NeuMFScoring, FedMF):
    """Federated NeuMF (FedNCF, Perifanis & Efraimidis, 2022) on fedcf's federated round: a GMF
    branch p_g ⊙ q_g and an MLP branch over [p_m, q_m] (ReLU layers ``layers``) joined into one
    logit, trained by binary cross-entropy on each device's positives and sampled negatives.
    The user embeddings stay on the device; the item embeddings, the MLP and the output layer
    are global, aggregated by any aggregator (differential privacy, secure aggregation, robust
    means). Users unseen in fit are served by training their embeddings on their own device
    with everything global frozen.

    Parameters
    ----------
    n_factors : int, default 32
        Width of each branch's embeddings (a row of ``item_factors_`` holds both: 2 × n_factors).
    layers : tuple of int, default (32, 16)
        Widths of the MLP branch's ReLU layers.
    client_update : "sampled" or SampledUpdate, default "sampled"
        As FedMF's, with step 0.5 for the user embeddings and the dense layers (FedMF's 0.1
        trains them too slowly) and 2 × n_items × that step for the item rows (PFedRec's
        factor 80 makes the MLP branch diverge), unless set.
    init_scale : float, default 0.1
        Standard deviation of the normal initial embeddings (the MLP is He-initialised).
    n_rounds, clients_per_round, negatives, upload_items, server_optimizer, client_weighting,
    min_examples, oversample, dropout, eval_every, checkpoint_path, checkpoint_every, dtype,
    aggregator, executor, random_state, verbose
        As in FedMF (``upload_items=False`` switches federation off).

    Attributes
    ----------
    item_factors_ : ndarray (n_items, 2 × n_factors), each item's [q_g | q_m]
    item_biases_ : ndarray (n_items,), zero (NeuMF has no item bias)
    dense_params_ : ndarray, the MLP and output layer packed (``NeuMFNet.unpack`` reads it)
    user_factors_ : ndarray (n_users, 2 × n_factors), each device's kept [p_g | p_m]
    user_biases_ : ndarray (n_users,), zero
    user_ids_, item_ids_, interactions_, history_
        As in FedMF.

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import FedNCF
    >>> data = make_synthetic_ratings(60, 20, 600, random_state=0)
    >>> model = FedNCF(n_factors=4, layers=(8, 4), n_rounds=3, random_state=0).fit(data)
    >>> model.user_scores([0]).shape
    (1, 20)
    """

    _saved_arrays = FedMF._saved_arrays + ("dense_params_",)
    _parameter_constraints = {**FedMF._parameter_constraints,
                              "layers": lambda name, v: check_layers(v)}
    _default_learning_rate = 0.5
    _item_rate_factor = 2.0
    _client_params = (*FedMF._client_params, "layers")

    def __init__(self, n_factors=32, *, layers=(32, 16), n_rounds=100, clients_per_round=1000,
                 client_update="sampled", negatives=4, upload_items=True, server_optimizer="sgd",
                 client_weighting="uniform", min_examples=1, oversample=0.0, dropout=0.0,
                 init_scale=0.1, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", aggregator=None, executor=None, random_state=None,
                 verbose=False):
        super().__init__(
            n_factors, n_rounds=n_rounds, clients_per_round=clients_per_round,
            client_update=client_update, negatives=negatives, upload_items=upload_items,
            server_optimizer=server_optimizer, client_weighting=client_weighting,
            min_examples=min_examples, oversample=oversample, dropout=dropout,
            init_scale=init_scale, eval_every=eval_every, checkpoint_path=checkpoint_path,
            checkpoint_every=checkpoint_every, dtype=dtype, aggregator=aggregator,
            executor=executor, random_state=random_state, verbose=verbose)
        self.layers = layers

    # ------------------------------------------------------------------ the round
    def _check_memory(self, inter, dtype):
        """The matrix factorization's need, plus the MLP: its rows in the global state and a
        copy in every upload of the cohort (each device uploads all of them)."""
        m = min(self.clients_per_round, inter.n_users) * (1 + self.oversample)
        dense = self._net().dense_size * (dtype.itemsize + 6 * 8 + m * (dtype.itemsize + 8))
        check_memory(self._memory_need(inter, dtype) + dense, f"FedNCF with layers="
                     f"{self.layers!r}, n_factors={self.n_factors}", "lower layers or n_factors")

    def _model_state(self, n_items: int) -> ModelState:
        """Item rows [q_g | q_m] (their bias column unused: ``item_biases_`` stays zero), then
        the MLP and the output layer, a dense part every device uploads whole."""
        W = self._row_width()
        return ModelState((Part("item_factors_", n_items, bias="item_biases_"),
                           dense_part("dense_params_", self._net().dense_size, W)), W)

    def _init_globals(self, inter, rng, dtype) -> dict:
        emb = rng.normal(0.0, self.init_scale, (inter.n_items, self._row_width()))
        theta = self._net().pack(self._net().init_dense(rng))
        return self._model_state(inter.n_items).pack(
            {"item_factors_": emb, "item_biases_": np.zeros(inter.n_items),
             "dense_params_": theta}, dtype)

    def client_program(self, inter, mu):
        return NeuMFProgram(self._cfg(inter.n_items), np.zeros(0, np.int64),
                            self._exclusions(inter), inter.n_items, self._widths(),
                            self._model_state(inter.n_items).dense_rows)

    # ------------------------------------------------------------------ serving
    def _fold_in(self, indptr, items, excl, keys, epochs: int):
        """User rows of new devices trained on each device, everything global frozen."""
        n, Q = len(indptr) - 1, self._global_params()["Q"].astype(np.float64)
        P = np.zeros((n, self._row_width()))
        neumf_fold_in(np.asarray(indptr, np.int64), np.asarray(items, np.int64), excl, Q,
                      len(self.item_ids_), self._widths(), self._cfg(len(self.item_ids_), epochs),
                      int(epochs), self._seed(), np.asarray(keys, np.uint64), P)
        return P, np.zeros(n)
