"""How a client divides its data into a support set (for reconstruction) and a query set (for the
update and its loss): a phase object, ``FedReconMF(split=TimeSplit(0.8))`` or by name
(``"random"``, ``"time"``, ``"none"``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..round.contracts import phase_rule
from ..round.params import Params


class SupportQuerySplit(Params):
    """A client's support/query split. ``kind`` names the kernel's split ("random", "time",
    "none"); ``support_fraction`` is the share of the client's data in the support set.

    Examples
    --------
    >>> from fedcf.federated import RandomSplit, SupportQuerySplit
    >>> isinstance(RandomSplit(0.5), SupportQuerySplit)
    True
    """

    kind: ClassVar[str]
    support_fraction = 0.5

    def validate(self):
        f = self.support_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float, np.number)) or \
                not (np.isfinite(f) and 0 < f < 1):
            raise ValueError(f"support_fraction must be a number in (0, 1): a share of each "
                             f"client's data for reconstruction, the rest for the update (use "
                             f"NoSplit() to reuse all data for both), got {f!r}")


class RandomSplit(SupportQuerySplit):
    """A random share of each client's data is its support set (from the client's own stream).

    Parameters
    ----------
    support_fraction : float in (0, 1), default 0.5

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import RandomSplit
    >>> FedReconMF(split=RandomSplit(0.8)).get_params()["split__support_fraction"]
    0.8
    """

    kind = "random"

    def __init__(self, support_fraction: float = 0.5):
        self.support_fraction = support_fraction
        self.validate()


class TimeSplit(SupportQuerySplit):
    """Each client's oldest ratings are its support set, the latest its query set.

    Parameters
    ----------
    support_fraction : float in (0, 1), default 0.5

    Examples
    --------
    >>> from fedcf.federated import TimeSplit
    >>> TimeSplit(0.7)
    TimeSplit(support_fraction=0.7)
    """

    kind = "time"

    def __init__(self, support_fraction: float = 0.5):
        self.support_fraction = support_fraction
        self.validate()


class NoSplit(SupportQuerySplit):
    """All of a client's data is both its support and its query set (the paper's NO SPLIT
    ablation and its production setting).

    Examples
    --------
    >>> from fedcf import FedReconImplicitMF
    >>> from fedcf.federated import NoSplit
    >>> FedReconImplicitMF(split=NoSplit()).split
    NoSplit()
    """

    kind = "none"

    def validate(self):
        pass


def resolve_split(value) -> SupportQuerySplit:
    """The ``split`` parameter as an object (a name builds its default)."""
    return phase_rule("split", SupportQuerySplit)("split", value)
