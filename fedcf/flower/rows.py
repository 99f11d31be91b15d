"""The user rows of a stateful estimator on a Flower node (FURLMF, FedMF, PFedRec, FedNCF: the
device keeps them; FedAvgMF: the server does, and each message carries them).

A train message for a stateful estimator carries record ``"rows"`` (P, c): the asked users'
rows in the message's order. For FedAvg these are the server's rows, and the node answers with
the trained ones in its own ``"rows"`` record. For FURL they are only the starting rows, drawn
from the run's seed as a simulation draws them: a device that has trained a user keeps that
user's row in the run's ``context.state`` and uses its own, whatever the message says — so no
server message can replace a device's row, and the trained row never leaves the device.
A SuperNode that restarts loses the run's state and starts its users from the message's rows
again.
"""

from __future__ import annotations

import numpy as np

from .wire import ReplyError, arrays, record_arrays

ROWS_STATE = "fedcf-rows"  # a device's kept rows in the run's context.state: users, P, c


class NodeRowsError(ValueError):
    """A stateful message the node cannot run: no rows, or rows of the wrong shape or type."""


class NodeRows:
    """The rows one message's users train with, and where they go after the work.

    Parameters
    ----------
    content : RecordDict or dict
        The message's content (its ``"rows"`` record, if any).
    state : RecordDict or None
        The run's ``context.state`` (the device's kept rows).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.flower.rows import NodeRows
    >>> from fedcf.flower.wire import arrays
    >>> state = {}
    >>> rows = NodeRows({"rows": arrays(P=np.zeros((2, 3), np.float32),
    ...                                 c=np.zeros(2, np.float32))}, state)
    >>> P, c = rows.load([7, 9], 3, "float32", on_device=True)
    >>> P[:] = 1.0
    >>> rows.keep([7, 9], (P, c), on_device=True)
    {}
    >>> again = NodeRows({"rows": arrays(P=np.zeros((1, 3), np.float32),
    ...                                  c=np.zeros(1, np.float32))}, state)
    >>> again.load([9], 3, "float32", on_device=True)[0].tolist()  # the device's own row
    [[1.0, 1.0, 1.0]]
    """

    def __init__(self, content, state=None):
        self.given = content["rows"] if content is not None and "rows" in content else None
        self.state, self.reply = state, {}  # reply: the records the node's answer adds

    def load(self, users, K: int, dtype, *, on_device: bool) -> tuple[np.ndarray, np.ndarray]:
        """(P, c) of ``users`` (raw ids, the message's order): on a device that keeps rows, its
        own row of each user it has trained, else the message's."""
        if self.given is None:
            raise NodeRowsError("the message is for a model whose users keep rows between "
                                "rounds, but it carries no 'rows' record")
        m, dt = len(users), np.dtype(dtype)
        try:
            given = record_arrays(self.given)
            P, c = given["P"], given["c"]
        except (KeyError, ReplyError) as e:
            raise NodeRowsError(f"the message's rows record is refused: {e}") from None
        if P.shape != (m, K) or c.shape != (m,) or P.dtype != dt or c.dtype != dt or \
                not (np.isfinite(P).all() and np.isfinite(c).all()):
            raise NodeRowsError(f"the message's rows must be finite {dt} of shapes ({m}, {K}) "
                                f"and ({m},), got {P.dtype} {P.shape} and {c.dtype} {c.shape}")
        P, c = P.copy(), c.copy()
        if on_device and self.state is not None and ROWS_STATE in self.state:
            kept = record_arrays(self.state[ROWS_STATE])
            own, at, found = _find(kept["users"], users)
            if kept["P"].shape[1:] != (K,):
                raise NodeRowsError(f"this device keeps rows of width {kept['P'].shape[1]}, "
                                    f"the message's model has K={K}: a run changes no model "
                                    "mid-way")
            P[found] = kept["P"][at[found]].astype(dt)
            c[found] = kept["c"][at[found]].astype(dt)
        return P, c

    def keep(self, users, local, *, on_device: bool) -> dict:
        """After the work: a device keeps its users' trained rows (nothing is sent); for
        rows the server keeps, the reply's ``"rows"`` record."""
        P, c = local
        if not on_device:
            self.reply = {"rows": arrays(P=P, c=c)}
            return self.reply
        if self.state is None:
            raise NodeRowsError("this node has no run state to keep its users' rows in")
        raw = np.asarray(users, np.int64)
        if ROWS_STATE in self.state:
            kept = record_arrays(self.state[ROWS_STATE])
            old, oP, oc = (kept[k] for k in ("users", "P", "c"))
            stay = ~np.isin(old, raw)
            raw, P, c = (np.concatenate([a[stay], b]) for a, b in ((old, raw), (oP, P),
                                                                   (oc, c)))
        order = np.argsort(raw, kind="stable")
        self.state[ROWS_STATE] = arrays(users=raw[order], P=P[order], c=c[order])
        return {}


def _find(sorted_users: np.ndarray, users) -> tuple:
    """(sorted_users, position of each of ``users`` in it, whether it is there)."""
    raw = np.asarray(users, np.int64)
    at = np.minimum(np.searchsorted(sorted_users, raw), max(len(sorted_users) - 1, 0))
    found = (sorted_users[at] == raw) if len(sorted_users) else np.zeros(len(raw), bool)
    return sorted_users, at, found
