"""How a client updates the global rows it touches: k_u mini-batch SGD steps on its query set with
its local parameters frozen (Federated Reconstruction, Algorithm 1's update; the joint steps of
FedAvg/FURL). A phase object, ``FedReconMF(client_update=ClientUpdate(0.1, steps=20))`` or by name
(``"sgd"``), the client-side counterpart of the server optimizer."""

from __future__ import annotations

import numpy as np

from ..._kernels.layout import sgd_hp
from ..round.params import Params
from ..round.params import check_number as _check


class ClientUpdate(Params):
    """Mini-batch SGD on the client's examples, on the global rows they touch.

    Parameters
    ----------
    learning_rate : float > 0 or None, default None
        Client step size η_u; None takes the estimator's default (0.5 for FedReconMF and
        FedReconImplicitMF, 0.1 for FedAvgMF/FURLMF, whose joint steps diverge at 0.5).
    batch_size : int >= 1, default 5
        Examples per step (also SGD reconstruction's batch).
    steps : int >= 0, default 50
        k_u: at most this many steps ...
    epochs : int >= 1, default 1
        ... and at most this many passes over the client's (query) examples.
    regularization : float >= 0, default 0
        L2 weight of the update.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import ClientUpdate
    >>> model = FedReconMF(client_update=ClientUpdate(0.1, steps=20))
    >>> model.get_params()["client_update__steps"]
    20
    """

    def __init__(self, learning_rate=None, *, batch_size=5, steps=50, epochs=1,
                 regularization=0.0):
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.steps = steps
        self.epochs = epochs
        self.regularization = regularization
        self.validate()

    def validate(self):
        if self.learning_rate is not None:
            _check("learning_rate", self.learning_rate, 0.0, low_open=True)
        _check("batch_size", self.batch_size, 1, integer=True, high=10**9)
        _check("steps", self.steps, 0, integer=True, high=10**9)
        _check("epochs", self.epochs, 1, integer=True, high=10**6)
        _check("regularization", self.regularization, 0.0)

    def rate(self, default: float) -> float:
        """The step size: ``learning_rate``, or the estimator's ``default``."""
        return float(default if self.learning_rate is None else self.learning_rate)

    def hp(self, default_rate: float, mu: float, biases: bool, joint: bool) -> np.ndarray:
        """The kernel's packed settings (``layout.sgd_hp``) of this update."""
        return sgd_hp(self.rate(default_rate), self.regularization, self.batch_size, self.steps,
                      self.epochs, mu, biases, joint)


class SampledUpdate(Params):
    """Local epochs of mini-batch SGD on a device's positives and sampled negatives, on its
    own user part and on the global rows (and layers) it touches: the client update of FedMF,
    PFedRec and FedNCF. ``FedMF(client_update=SampledUpdate(0.05, epochs=2))``, or by name
    (``"sampled"``).

    Parameters
    ----------
    learning_rate : float > 0 or None, default None
        SGD step of the mean batch loss for the user part (and FedNCF's dense layers); None
        takes the estimator's default (0.1 for FedMF and PFedRec, 0.5 for FedNCF).
    item_learning_rate : float > 0 or None, default None
        SGD step for the item rows; None: the estimator's rule, a multiple of n_items ×
        learning_rate (80 for FedMF and PFedRec as PFedRec's authors; 2 for FedNCF): the mean
        loss gives each row a gradient about batch_size times smaller.
    epochs : int >= 1, default 1
        Passes over the device's positives per round.
    batch_size : int >= 1, default 256
    regularization : float >= 0, default 0
        L2 weight decay on every parameter the device updates.

    Examples
    --------
    >>> from fedcf.federated import FedMF, SampledUpdate
    >>> FedMF(client_update=SampledUpdate(0.05, epochs=2)).get_params()["client_update__epochs"]
    2
    """

    def __init__(self, learning_rate=None, *, item_learning_rate=None, epochs=1, batch_size=256,
                 regularization=0.0):
        self.learning_rate = learning_rate
        self.item_learning_rate = item_learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.regularization = regularization
        self.validate()

    def validate(self):
        for name, value in (("learning_rate", self.learning_rate),
                            ("item_learning_rate", self.item_learning_rate)):
            if value is not None:
                _check(name, value, 0.0, low_open=True)
        _check("epochs", self.epochs, 1, integer=True, high=1000)
        _check("batch_size", self.batch_size, 1, integer=True, high=10**9)
        _check("regularization", self.regularization, 0.0)

    def rate(self, default: float) -> float:
        """The user part's step: ``learning_rate``, or the estimator's ``default``."""
        return float(default if self.learning_rate is None else self.learning_rate)

    def item_rate(self, default: float, factor: float, n_items: int) -> float:
        """The item rows' step: ``item_learning_rate``, or factor × n_items × the user step."""
        if self.item_learning_rate is not None:
            return float(self.item_learning_rate)
        return factor * n_items * self.rate(default)

    def damped(self, default: float, by: float) -> SampledUpdate:
        """This update with both steps ``by`` times smaller (a diverged fit's retry)."""
        item = self.item_learning_rate
        return SampledUpdate(self.rate(default) / by,
                             item_learning_rate=None if item is None else item / by,
                             epochs=self.epochs, batch_size=self.batch_size,
                             regularization=self.regularization)
