"""How a client updates the global rows it touches: k_u mini-batch SGD steps on its query set with
its local parameters frozen (Federated Reconstruction, Algorithm 1's update; the joint steps of
FedAvg/FURL). A phase object, ``FedReconMF(client_update=ClientUpdate(0.1, steps=20))`` or by name
(``"sgd"``), the client-side counterpart of the server optimizer."""

from __future__ import annotations

import numpy as np

from .._kernels.layout import sgd_hp
from .contracts import Params
from .contracts import check_number as _check


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
