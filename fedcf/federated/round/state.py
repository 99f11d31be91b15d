"""The global model as named arrays (``ModelState``), the one table a round carries them in, and
the algorithm object a fit runs (``Algorithm``).

A round's machinery — the clients' kernels, the uploads, the aggregators' sums, the clip, the
DP noise, secure aggregation's encoding, the server optimizers and the checkpoints — works on
one table of rows, ``{"Q": (rows, width), "b": (rows,)}``: a client uploads the rows it touched
(row-sparse), a clip bounds the whole upload, noise goes on every value, and a server optimizer
steps value by value. An estimator never lays that table out itself. It declares its global
arrays as ``Part``s — a name (its fitted attribute), the rows it takes, and its role — and the
state packs them into the table and unpacks them from it:

- ``"rows"``: one row per item (or per adapter row), uploaded row-sparse, with a bias column
  held in another fitted array (``bias``), unused (None), or ``INLINE`` (the fitted array is
  [row | bias] per row);
- ``"dense"``: an array every client updates and uploads whole (FedNCF's MLP), laid out row
  after row over its rows' factor columns, zero padded; its bias column is unused.

Every part is global and uploaded, and a client's parts are clipped and noised together: the
guarantee of a clip or of DP covers the whole upload. What stays on the device is not part of
the state (``ClientProgram`` and the local state hold it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INLINE = "inline"  # a part whose fitted array is [row | bias] per row
ROLES = ("rows", "dense")


@dataclass(frozen=True)
class Part:
    """One named global array: ``rows`` rows of the round's table, in role ``role``; ``bias``
    (role "rows"): the fitted array of its bias column, None (unused) or ``INLINE``; ``size``
    (role "dense"): how many numbers it holds."""

    name: str
    rows: int
    role: str = "rows"
    bias: str | None = None
    size: int = 0

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"part {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.role == "dense" and self.bias is not None:
            raise ValueError(f"part {self.name!r}: a dense part has no bias column")


def dense_part(name: str, size: int, width: int) -> Part:
    """A dense part of ``size`` numbers over rows ``width`` wide."""
    return Part(name, -(-size // width), "dense", size=size)


@dataclass(frozen=True)
class ModelState:
    """The global arrays of an estimator, in table order, over rows ``width`` factors wide."""

    parts: tuple
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, width) of the table's ``Q`` (``b`` has the rows)."""
        return sum(p.rows for p in self.parts), self.width

    @property
    def dense_rows(self) -> int:
        """Rows every client uploads whole (the dense parts')."""
        return sum(p.rows for p in self.parts if p.role == "dense")

    @property
    def names(self) -> tuple[str, ...]:
        """The fitted arrays the state reads and writes: each part's, and its bias array."""
        return tuple(n for p in self.parts for n in (p.name, p.bias)
                     if n is not None and n != INLINE)

    def _blocks(self):
        at = 0
        for p in self.parts:
            yield p, slice(at, at + p.rows)
            at += p.rows

    def pack(self, arrays: dict, dtype) -> dict:
        """The round's table from the named arrays (``arrays[name]``)."""
        Q, b = np.zeros(self.shape, dtype), np.zeros(self.shape[0], dtype)
        for p, rows in self._blocks():
            value = np.asarray(arrays[p.name])
            if p.role == "dense":
                Q[rows].reshape(-1)[:p.size] = value.ravel()
            elif p.bias == INLINE:
                value = value.reshape(p.rows, self.width + 1)
                Q[rows], b[rows] = value[:, :self.width], value[:, self.width]
            else:
                Q[rows] = value
                if p.bias is not None:
                    b[rows] = arrays[p.bias]
        return {"Q": Q, "b": b}

    def unpack(self, params: dict) -> dict:
        """The named arrays from the round's table: row parts as views of it, dense parts and
        inline rows as copies."""
        if params["Q"].shape != self.shape or params["b"].shape != self.shape[:1]:
            raise ValueError(f"the global parameters have shape {params['Q'].shape}, not the "
                             f"declared state's {self.shape}")
        out = {}
        for p, rows in self._blocks():
            Q, b = params["Q"][rows], params["b"][rows]
            if p.role == "dense":
                out[p.name] = Q.reshape(-1)[:p.size].copy()
            elif p.bias == INLINE:
                out[p.name] = np.hstack([Q, b[:, None]]).reshape(-1)
            else:
                out[p.name] = Q
                if p.bias is not None:
                    out[p.bias] = b
        return out

    def describe(self) -> list[str]:
        """One line per part: name, rows, role (for documentation and errors)."""
        return [f"{p.name}: {p.rows} rows, {p.role}"
                + (f", bias in {p.bias}" if p.bias not in (None, INLINE) else
                   ", bias inline" if p.bias == INLINE else "") for p in self.parts]


@dataclass(frozen=True)
class Algorithm:
    """What one fit runs, built once from an estimator's parameters on the data it trains on
    (``FederatedMFBase._algorithm``; the shape of TFF's ``build_fed_recon``): the global arrays
    (``state``), the client work (``program``, a ``ClientProgram``), the clients' state kept
    between rounds (``local``: its spec, e.g. ``DeviceRows``; None for stateless clients) and
    the global mean ``mu`` the clients use. The round loop, the Ray shards and the Flower nodes
    run it; none of them holds or asks the estimator."""

    state: ModelState
    program: object
    local: object | None
    mu: float
