"""How a client reconstructs its local parameters (p, c) from its support set with the global
parameters frozen (Federated Reconstruction, Algorithm 1's R): a phase object,
``FedReconMF(reconstruction=SGDReconstruction(steps=20))`` or by name (``"als"``, ``"sgd"``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..._kernels.layout import sgd_hp
from ..round.params import Params
from ..round.params import check_number as _check


class Reconstruction(Params):
    """The reconstruction step of a client. ``kernel`` names the client kernel's method ("als":
    exact ridge solve; "sgd": mini-batch gradient steps), ``can_diverge`` whether it can blow
    up (gradient steps can, an exact solve cannot), ``regularization`` is the ridge λ per rating.

    Examples
    --------
    >>> from fedcf.federated import Reconstruction, RidgeReconstruction
    >>> isinstance(RidgeReconstruction(), Reconstruction)
    True
    """

    kernel: ClassVar[str]
    can_diverge: ClassVar[bool] = False
    # what the kernel's SGD settings hold for an exact solve (read only by SGD reconstruction)
    steps, epochs, learning_rate, init = 50, 1, 0.1, "uniform"

    def lam(self, default: float) -> float:
        """The ridge λ per rating: ``regularization``, or the estimator's ``default``."""
        return float(default if self.regularization is None else self.regularization)

    def hp(self, batch_size: int, mu: float, biases: bool, default_lam: float) -> np.ndarray:
        """The kernel's packed settings (``layout.sgd_hp``) of this reconstruction."""
        return sgd_hp(self.learning_rate, self.lam(default_lam), batch_size, self.steps,
                      self.epochs, mu, biases)


class RidgeReconstruction(Reconstruction):
    """The exact optimum of the local problem: one ridge solve per client ((K + 1) × (K + 1), or
    the n × n dual for a client with fewer ratings than unknowns). fedcf's default.

    Parameters
    ----------
    regularization : float >= 0 or None, default None
        λ per rating of the ridge solve; None takes the estimator's default (0.1 for explicit
        ratings, 0.01 for FedReconImplicitMF).

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import RidgeReconstruction
    >>> FedReconMF(reconstruction=RidgeReconstruction(0.05)).get_params()[
    ...     "reconstruction__regularization"]
    0.05
    """

    kernel = "als"

    def __init__(self, regularization: float | None = None):
        self.regularization = regularization
        self.validate()

    def validate(self):
        if self.regularization is not None:
            _check("regularization", self.regularization, 0.0)


class SGDReconstruction(Reconstruction):
    """The paper's R: at most ``steps`` mini-batch gradient steps (``epochs`` passes over the
    support set) at ``learning_rate`` from ``init`` ("uniform": ±init_scale of the estimator,
    "zeros"), with ridge ``regularization``.

    Parameters
    ----------
    steps : int >= 0, default 50
    epochs : int >= 1, default 1
    learning_rate : float > 0, default 0.1
    init : {"uniform", "zeros"}, default "uniform"
    regularization : float >= 0, default 0

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import SGDReconstruction
    >>> est = FedReconMF(reconstruction=SGDReconstruction(steps=20, learning_rate=0.05))
    >>> est.set_params(reconstruction__steps=10).reconstruction.steps
    10
    """

    kernel, can_diverge = "sgd", True

    def __init__(self, steps: int = 50, epochs: int = 1, learning_rate: float = 0.1,
                 init: str = "uniform", regularization: float = 0.0):
        self.steps, self.epochs, self.learning_rate = steps, epochs, learning_rate
        self.init, self.regularization = init, regularization
        self.validate()

    def validate(self):
        _check("steps", self.steps, 0, integer=True, high=10**9)
        _check("epochs", self.epochs, 1, integer=True, high=10**6)
        _check("learning_rate", self.learning_rate, 0.0, low_open=True)
        _check("regularization", self.regularization, 0.0)
        if self.init not in ("uniform", "zeros"):
            raise ValueError(f"init must be 'uniform' or 'zeros', got {self.init!r}")
