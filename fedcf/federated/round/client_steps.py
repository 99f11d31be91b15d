"""The device's steps after local training, each a small object with a declared input and
output — float rows of the clients (one row each) and their ids in, rows or words out — that an
aggregator's public recipe composes (``Encoding.steps``, ``ReportEncoding.steps``) and that run
where the clients run (in process, on a Ray shard, on a Flower node), by the same code."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from . import secret


class ClientStep(ABC):
    """One step of the device's work on the rows of its clients (``clients``: their ids in the
    run, which key a seeded stream)."""

    @abstractmethod
    def __call__(self, rows: np.ndarray, clients: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class NoiseShare(ClientStep):
    """Each client adds its own share N(0, std²) to ``n`` values of its row from ``start``, drawn
    where it runs: from the OS's secure generator, or (``secret=False``, insecure test runs
    only) from the stream keyed [*prefix, client id, *suffix]. The rows are changed in place.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated.round.client_steps import NoiseShare
    >>> rows = NoiseShare(2, 1.0, secret=False, prefix=(0,))(np.zeros((1, 3)), np.array([7]))
    >>> rows[0, 2], bool(rows[0, 0] != 0)
    (np.float64(0.0), True)
    """

    n: int
    std: float
    secret: bool = True
    prefix: tuple = ()
    suffix: tuple = ()
    start: int = 0  # the first value noised

    def __call__(self, rows: np.ndarray, clients: np.ndarray) -> np.ndarray:
        if self.std > 0:
            at = slice(self.start, self.start + self.n)
            for k, c in enumerate(clients):
                rows[k, at] += secret.normal(self.n, self.std) if self.secret else \
                    np.random.default_rng([*self.prefix, int(c), *self.suffix]).normal(
                        0.0, self.std, self.n)
        return rows


@dataclass(frozen=True)
class ClipValues(ClientStep):
    """Each value clipped to its column range's bound (``bounds``: (start, stop, bound)) before
    any noise is added (so the noise is never clipped), and one more column counting the
    client's clipped values.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated.round.client_steps import ClipValues
    >>> ClipValues(((0, 2, 1.0),))(np.array([[0.25, 3.0]]), None)
    array([[0.25, 1.  , 1.  ]])
    """

    bounds: tuple

    def __call__(self, rows: np.ndarray, clients: np.ndarray) -> np.ndarray:
        out = np.empty((rows.shape[0], rows.shape[1] + 1))
        out[:, :-1] = rows
        for start, stop, bound in self.bounds:
            np.clip(rows[:, start:stop], -bound, bound, out=out[:, start:stop])
        out[:, -1] = np.count_nonzero(out[:, :-1] != rows, axis=1)
        return out


@dataclass(frozen=True, eq=False)
class Quantize(ClientStep):
    """Each value rounded to its column's fixed-point ``scales`` as uint32 words (a sum of them
    modulo 2³² is the protocol's). Bounds are ``ClipValues``' job, before any noise.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated.round.client_steps import Quantize
    >>> Quantize(np.array([10.0, 10.0]))(np.array([[0.25, -0.5]]), None)
    array([[         2, 4294967291]], dtype=uint32)
    """

    scales: np.ndarray

    def __call__(self, rows: np.ndarray, clients: np.ndarray) -> np.ndarray:
        return np.round(rows * self.scales).astype(np.int64).astype(np.uint32)


def run_steps(steps, rows: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """The rows through ``steps`` in order."""
    for step in steps:
        rows = step(rows, clients)
    return rows
