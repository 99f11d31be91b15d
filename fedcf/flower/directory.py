"""Who the server may train: the directory of users the Flower nodes said they hold, checked
before it is trusted, and the population ``fit`` sees over it; and the one exchange of messages
with the nodes every stage uses (``exchange``), which keeps each refused reply with its reason.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import numpy as np

from .transport import send_and_receive
from .wire import DIRECTORY_FIELDS, ERROR_CODE, NO_CATALOG, ReplyError, arrays, flwr, read_arrays

log = logging.getLogger("fedcf.flower")
NO_REPLY = "no reply within"
UNREACHABLE = "Flower answered for the node"  # an error reply not from a fedcf node


class Refusals:
    """Replies the server did not use, each with its reason (also logged)."""

    def __init__(self):
        self.items: list[dict] = []
        self.stale: set = set()  # nodes that may have lost the run's state (restart):
        # they said so, gave no reply, or Flower answered for them (unreachable)
        self.timed_out: set = set()  # nodes that gave no reply in time since last asked

    def refused_entries(self) -> set:
        """Nodes whose directory entry was refused for what it said (not for silence)."""
        return {r["node"] for r in self.items if r["stage"] == "directory" and
                not r["reason"].startswith((NO_REPLY, UNREACHABLE))}

    def add(self, stage: str, node: int, reason: str, clients: int = 0):
        self.items.append({"stage": stage, "node": int(node), "reason": reason,
                           "clients": int(clients)})
        if NO_CATALOG in reason or reason.startswith((NO_REPLY, UNREACHABLE)):
            self.stale.add(int(node))
        if reason.startswith(NO_REPLY):
            self.timed_out.add(int(node))
        log.warning("fedcf.flower: %s: refused the reply of node %s (%d clients): %s", stage,
                    node, clients, reason)


def message(content: dict, node: int, kind: str, group: str):
    app = flwr()
    return app.Message(content=app.RecordDict(content), dst_node_id=int(node), message_type=kind,
                       group_id=group)


def exchange(grid, messages, timeout: float, stage: str, refusals: Refusals,
             clients: dict | None = None):
    """Send ``messages``; yield (node, content) for each reply, refusing error replies and
    nodes that did not answer in time. A reply belongs to the node its message went to (by
    ``reply_to_message_id``): the SuperLink answers for an unreachable node in its own name.
    ``clients``: node -> how many clients its message was for (for the refusal record)."""
    sent = {int(m.metadata.dst_node_id) for m in messages}
    replies = send_and_receive(grid, messages, timeout) if messages else []
    to = {m.metadata.message_id: int(m.metadata.dst_node_id) for m in messages}
    answered = set()
    for reply in replies:
        node = to.get(reply.metadata.reply_to_message_id, int(reply.metadata.src_node_id))
        answered.add(node)
        if reply.has_error():
            who = "the node reported an error" if reply.error.code == ERROR_CODE else \
                f"{UNREACHABLE} (code {reply.error.code})"
            refusals.add(stage, node, f"{who}: {reply.error.reason}",
                         (clients or {}).get(node, 0))
            continue
        yield node, reply.content
    for node in sorted(sent - answered):
        refusals.add(stage, node, f"{NO_REPLY} {timeout:g} s", (clients or {}).get(node, 0))


def claims_error(counts, sums, scale=None) -> str | None:
    """Why a node's per-user claims cannot be true, or None: each user needs ≥ 1 rating,
    min ≤ mean ≤ max, Σv² between (Σv)²/n and n·max(min², max²), all inside ``scale``."""
    n, (total, squares, lo, hi) = counts.astype(np.float64), sums.T
    eps = 1e-9 * np.maximum(1.0, np.abs(sums).max(axis=1))
    checks = (("a user with no rating", counts < 1),
              ("a user whose min is above its max", lo > hi + eps),
              ("a user whose mean is outside its [min, max]",
               (total < lo * n - eps * n) | (total > hi * n + eps * n)),
              ("a user whose Σv² is impossible for its Σv and range",
               (squares < total ** 2 / np.maximum(n, 1) - eps * n) |
               (squares > n * np.maximum(lo ** 2, hi ** 2) + eps * n)))
    if scale is not None:
        checks += ((f"a user with ratings outside the public rating scale {tuple(scale)}",
                    (lo < scale[0]) | (hi > scale[1])),)
    for what, bad in checks:
        if np.any(bad):
            return f"it claims {what} (user {int(np.flatnonzero(bad)[0])} of its list)"
    return None


def _contested_left_out(entries, refusals) -> list:
    """Leave out of every entry the users two or more nodes list (which node is honest cannot
    be told); each node keeps its other users."""
    if not entries:
        return entries
    users, counts = np.unique(np.concatenate([d["users"] for _, d in entries]),
                              return_counts=True)
    contested = users[counts > 1]
    if not len(contested):
        return entries
    kept = []
    for node, d in entries:
        mine = np.isin(d["users"], contested)
        if mine.any():
            refusals.add("directory", node, f"{int(mine.sum())} of its users another node "
                                            "also lists are left out")
        if (~mine).any():
            kept.append((node, {k: (v[~mine] if k in ("users", "counts", "sums") else v)
                                for k, v in d.items()}))
    return kept


OUTLIER = 10.0  # a node's ratings reaching this many spans beyond the others' is refused


def _outliers_refused(entries, refusals, scale) -> list:
    """Without a public rating scale: refuse a node whose users' ratings reach more than
    ``OUTLIER`` times the others' span beyond the range every other node's ratings cover
    (one lying node cannot move μ or the scale); needs three nodes or more."""
    if scale is not None or len(entries) < 3 or "sums" not in entries[0][1]:
        return entries
    ranges = np.array([(d["sums"][:, 2].min(), d["sums"][:, 3].max()) for _, d in entries])
    kept = []
    for k, (node, d) in enumerate(entries):
        others = np.delete(ranges, k, axis=0)
        lo, hi = others[:, 0].min(), others[:, 1].max()
        reach = OUTLIER * max(hi - lo, 1e-12)
        if ranges[k, 0] < lo - reach or ranges[k, 1] > hi + reach:
            refusals.add("directory", node, f"its ratings span [{ranges[k, 0]:.4g}, "
                                            f"{ranges[k, 1]:.4g}], far beyond the other "
                                            f"nodes' [{lo:.4g}, {hi:.4g}]; give the run a "
                                            "public rating_scale to check claims exactly")
        else:
            kept.append((node, d))
    return kept


def cap_node_shares(directory: Directory, share: float, seed: int,
                    refusals: Refusals) -> np.ndarray:
    """Positions of the directory's users the run may train and evaluate: all of them, except
    that no node may hold more than ``share`` of the users kept. A node over it keeps a random
    ``share`` of the total (the largest T with Σ_k min(n_k, share·T) = T, found by fixed-point
    iteration; seeded by the run's ``seed``) and is named in ``refusals``. Not applied with
    ``share`` ≥ 1 or with at most 1/share nodes, where it cannot hold."""
    n_nodes = len(directory.nodes)
    counts = np.bincount(directory.node_of, minlength=n_nodes).astype(np.float64)
    keep_all = np.arange(len(directory.user_ids))
    if share >= 1.0 or (counts > 0).sum() <= 1.0 / share:
        if share < 1.0:
            log.warning("fedcf.flower: %d nodes hold users; max-node-share=%g needs more than "
                        "%d, so it is not applied (a node may hold most of a cohort)",
                        int((counts > 0).sum()), share, int(1.0 / share))
        return keep_all
    total = counts.sum()
    for _ in range(200):  # T shrinks by a factor ≤ share per step toward its fixed point
        new = np.minimum(counts, share * total).sum()
        if total - new < 0.5:
            break
        total = new
    allowed = np.minimum(counts, np.floor(share * total)).astype(np.int64)
    keep = np.ones(len(keep_all), bool)
    rng = np.random.default_rng([seed, 0x5EA7])
    for k in np.flatnonzero(counts > allowed):
        mine = np.flatnonzero(directory.node_of == k)
        keep[rng.choice(mine, len(mine) - allowed[k], replace=False)] = False
        refusals.add("directory", directory.nodes[k], f"it lists {len(mine)} users, more than "
                     f"max-node-share={share:g} of the run allows ({allowed[k]}); "
                     f"{len(mine) - allowed[k]} of them are left out of training and evaluation",
                     int(len(mine) - allowed[k]))
    return keep_all[keep]


@dataclass
class Directory:
    """Who holds which user, from the nodes' answers to the first (query) message: raw user ids
    in sorted order, the node of each, rating counts and per-user sums, the item catalog.
    Under differential privacy (``private_floor`` = the run's min_examples) the nodes list only
    their eligible users and send no count or sum: ``counts`` and ``sums`` are None.

    Parameters
    ----------
    user_ids : ndarray
        Raw user ids, sorted.
    node_of : ndarray
        Position in ``nodes`` of each user's node.
    nodes : list of int
        Flower node ids.
    counts : ndarray or None
        Each user's number of ratings (None under DP).
    sums : ndarray (n, 4) or None
        Σv, Σv², min, max of each user's ratings (None under DP).
    catalog : ndarray
        The item catalog every node shares.
    private_floor : int or None
        Under DP, the least number of ratings every listed user has (the nodes' filter).
    catalog_sent : bool
        Whether the catalog is the server's, sent with the query (nodes holding their own
        data), rather than the one the nodes reported.
    scale : (low, high) or None
        The run's public rating scale, which every claim must respect (None: not public).

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.flower import Directory
    >>> d = Directory(user_ids=np.array([7, 9]), node_of=np.array([0, 1]), nodes=[101, 202],
    ...               counts=np.array([3, 5]), sums=np.zeros((2, 4)), catalog=np.arange(4))
    >>> d.nodes[d.node_of[1]]
    202
    """

    user_ids: np.ndarray
    node_of: np.ndarray  # position in ``nodes`` of each user's node
    nodes: list  # Flower node ids (uint64: kept as Python ints)
    counts: np.ndarray | None
    sums: np.ndarray | None  # (n, 4): Σv, Σv², min, max
    catalog: np.ndarray
    private_floor: int | None = None
    catalog_sent: bool = False
    scale: tuple | None = None  # the run's public rating scale, which claims must respect

    @classmethod
    def query(cls, grid, nodes, timeout: float, refusals: Refusals,
              private_floor: int | None = None, catalog: np.ndarray | None = None,
              scale: tuple | None = None) -> Directory:
        """Ask every node for its entry. With ``catalog`` (the run's public item catalog) the
        message carries it and each node maps its own items into it (a device holding its
        own ratings); without, the nodes report theirs and must agree. The server trusts no
        claim it can check: each user's count and sums must be consistent (and inside the
        public rating ``scale``, when the run has one), else the node is refused by name; a
        user two nodes list is left out of both (never a whole node); without a public scale,
        a node whose ratings reach far beyond every other node's is refused."""
        private = private_floor is not None
        config = {} if not private else \
            {"config": flwr().ConfigRecord({"private-floor": int(private_floor)})}
        if catalog is not None:
            config["catalog"] = arrays(items=np.asarray(catalog, np.int64))
        fields = ("users", "catalog") if private else DIRECTORY_FIELDS
        if catalog is not None:
            fields = tuple(f for f in fields if f != "catalog")
        msgs = [message(config, n, flwr().MessageType.QUERY, "directory") for n in nodes]
        entries = []
        for node, content in sorted(exchange(grid, msgs, timeout, "directory", refusals),
                                    key=lambda r: r[0]):
            try:
                d = read_arrays(content, "users", fields)
                n = len(d["users"])
                if not all(np.issubdtype(d[f].dtype, np.integer) for f in fields if f != "sums"):
                    raise ReplyError(f"its {', '.join(f for f in fields if f != 'sums')} must "
                                     "be integer arrays")
                if not private and (d["counts"].shape != (n,) or d["sums"].shape != (n, 4) or (
                        n and d["counts"].min() < 1) or not np.isfinite(d["sums"]).all()):
                    raise ReplyError("its users, counts and sums do not line up")
                if n == 0:
                    raise ReplyError("it holds no users (an empty partition)")
                if "catalog" not in fields:
                    pass  # the run's catalog, sent with the query
                elif catalog is None:
                    catalog = d["catalog"]
                elif not np.array_equal(d["catalog"], catalog):
                    raise ReplyError(f"its item catalog ({len(d['catalog'])} items) is not the "
                                     f"one of the other nodes ({len(catalog)} items)")
                if len(np.unique(d["users"])) < n:
                    raise ReplyError("it lists a user twice")
                if not private:
                    bad = claims_error(d["counts"], d["sums"], scale)
                    if bad:
                        raise ReplyError(bad)
                entries.append((node, d))
            except ReplyError as e:
                refusals.add("directory", node, str(e))
        entries = _outliers_refused(_contested_left_out(entries, refusals), refusals, scale)
        if not entries:
            raise RuntimeError("no node answered the directory query with users; check that "
                               "the SuperNodes have a partition (node config) and the data")
        users = np.concatenate([d["users"] for _, d in entries])
        order = np.argsort(users, kind="stable")
        node_of = np.concatenate([np.full(len(d["users"]), k) for k, (_, d) in
                                  enumerate(entries)])
        def joined(f):
            return None if private else np.concatenate([d[f] for _, d in entries])[order]

        return cls(users[order], node_of[order], [n for n, _ in entries], joined("counts"),
                   joined("sums"), catalog, private_floor, catalog is not None and
                   "catalog" not in fields, scale)

    def admit(self, other: Directory, refusals: Refusals, connected=()) -> None:
        """Nodes that joined during the run (``other``, their directory entries): a node
        holding users this run knows serves them from now on (a device back with a new id) —
        unless their node is still ``connected`` (a node claiming users another live node
        serves is refused); users the run never listed are not added (the training population
        is fixed) and the node is logged."""
        if not np.array_equal(other.catalog, self.catalog):
            for node in other.nodes:
                refusals.add("directory", node, "it joined with another item catalog")
            return
        pos = np.searchsorted(self.user_ids, other.user_ids)
        pos = np.minimum(pos, len(self.user_ids) - 1)
        known = self.user_ids[pos] == other.user_ids
        live = set(int(n) for n in connected)
        for k, node in enumerate(other.nodes):
            mine = other.node_of == k
            held = [int(self.nodes[j]) for j in self.node_of[pos[mine & known]]]
            if live.intersection(held):
                refusals.add("directory", node, "it claims users a connected node serves")
                continue
            if (mine & ~known).any():
                refusals.add("directory", node, f"it joined with {int((mine & ~known).sum())} "
                             "users this run never listed; they are left out")
            if (mine & known).any():
                self.nodes.append(int(node))
                self.node_of[pos[mine & known]] = len(self.nodes) - 1

    def describe(self) -> dict:
        h = hashlib.sha256()
        for a in (self.user_ids, self.counts, self.sums, self.catalog):
            if a is not None:
                h.update(np.ascontiguousarray(a).tobytes())
        return {"flower_directory": h.hexdigest(), "private_floor": self.private_floor}


class FlowerPopulation:
    """The training users of a Flower run, as ``fit`` sees them: sizes, counts and value sums
    from the directory, client work by messages to the nodes. The ratings stay on the nodes.

    Parameters
    ----------
    directory : Directory
    users : ndarray
        Positions in the directory of the training users.
    executor : FlowerExecutor or None

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.flower import Directory
    >>> d = Directory(user_ids=np.array([7, 9]), node_of=np.array([0, 1]), nodes=[101, 202],
    ...               counts=np.array([3, 5]), sums=np.zeros((2, 4)), catalog=np.arange(4))
    >>> from fedcf.flower import FlowerPopulation
    >>> pop = FlowerPopulation(d, users=np.array([0, 1]), executor=None)
    >>> pop.n_users, pop.holds_ratings
    (2, False)
    """

    holds_ratings = False
    timestamps = None

    def __init__(self, directory: Directory, users: np.ndarray, executor):
        self.source, self.executor = directory, executor
        self.user_ids = directory.user_ids[users]
        self.item_ids = directory.catalog
        self.n_users, self.n_items = len(users), len(directory.catalog)
        self._stats = None
        if directory.counts is None:  # under DP: only the public floor every user passes
            self._counts = np.full(len(users), directory.private_floor, np.int64)
        else:
            self._counts = directory.counts[users]
            s = directory.sums[users]
            total = max(int(self._counts.sum()), 1)
            self._stats = {"mean": float(s[:, 0].sum()) / total,
                           "mean_sq": float(s[:, 1].sum()) / total,
                           "min": float(s[:, 2].min()), "max": float(s[:, 3].max())}
        self.nnz = int(self._counts.sum())

    def counts(self) -> np.ndarray:
        """Each user's rating count; under DP the public floor (the nodes listed only users
        with at least that many and sent no count)."""
        return self._counts

    def value_stats(self) -> dict:
        if self._stats is None:
            raise RuntimeError("under differential privacy the Flower nodes send no rating "
                               "statistics; μ and the rating scale are the public ones")
        return dict(self._stats)

    def subset_users(self, users):
        raise RuntimeError("the ratings of a Flower run stay on the nodes; the server cannot "
                           "read a user's ratings")

    def __getstate__(self):  # a fitted model keeps this; the grid does not travel
        return {"source": self.source, "executor": None, "user_ids": self.user_ids,
                "item_ids": self.item_ids, "n_users": self.n_users, "n_items": self.n_items,
                "_stats": self._stats, "_counts": self._counts, "nnz": self.nnz}


def wait_for_nodes(grid, min_nodes: int, seconds: float) -> list[int]:
    """The connected nodes, once at least ``min_nodes`` are (or all there are after
    ``seconds``; none at all is an error)."""
    deadline = time.monotonic() + seconds
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= min_nodes or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not nodes:
        raise RuntimeError(f"no Flower node connected within {seconds:g} s; start SuperNodes "
                           "pointing at this SuperLink's Fleet API")
    if len(nodes) < min_nodes:
        log.warning("fedcf.flower: only %d of min-nodes=%d nodes connected after %g s; going on",
                    len(nodes), min_nodes, seconds)
    return nodes
