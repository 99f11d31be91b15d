"""The server side of the Flower app: the estimator's own round loop, whose client work is sent to
Flower nodes as messages (``FlowerExecutor``), over the users the nodes said they hold
(``Directory``, ``FlowerPopulation``: directory.py). Selection, aggregation (any fedcf
aggregator), the server optimizer, checkpoints and the history are the ones of an in-process
fit, so with the same parameters and seed the fitted model is the in-process model bit for bit.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from ..eval.splits import user_split_indices
from ..federated.aggregators.weighted import upload_norms
from ..federated.algorithms.base import run_seed
from ..federated.round.contracts import RoundExecutor
from ..federated.round.partials import PartialSums, add_nodes
from ..federated.round.phases import ClientOutputs, cohort_order
from .directory import (
    Directory,
    FlowerPopulation,
    Refusals,
    cap_node_shares,
    exchange,
    message,
    wait_for_nodes,
)
from .evaluation import federated_recon_eval
from .settings import Settings
from .wire import (
    NO_CATALOG,
    ReplyError,
    arrays,
    client_params,
    content_bytes,
    decode_reports,
    decode_rows,
    decode_sums,
    decode_upload,
    flwr,
    record_fields,
)

log = logging.getLogger("fedcf.flower")


NORM_ROUNDS = 50  # rounds whose per-node upload norms are kept for the divergence blame
NODE_BLOWUP = 100.0  # a node whose uploads are this many times the others' is blamed
MAX_BACKOFF = 3  # a stalled node sits out at most 2**3 rounds before it is asked again


class FlowerExecutor(RoundExecutor):
    """Phase 2 of each round as Flower messages: one message per node holding sampled clients,
    with the global model and those clients' ids; the replies' uploads are checked
    (``wire.decode_upload``) and put back in cohort order. ``round_stats`` has the bytes that
    went down and up through Flower in the round.

    Parameters
    ----------
    grid : flwr Grid
        The ServerApp's grid, through which messages go.
    directory : Directory
    users : ndarray
        Positions in the directory of the training users.
    est : FedReconMF
        Whose client parameters the messages carry.
    mu : float
        The global mean the clients use.
    timeout : float
        Seconds a round waits for replies.
    refusals : Refusals
        Where refused replies are recorded.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.flower import Directory
    >>> d = Directory(user_ids=np.array([7, 9]), node_of=np.array([0, 1]), nodes=[101, 202],
    ...               counts=np.array([3, 5]), sums=np.zeros((2, 4)), catalog=np.arange(4))
    >>> from fedcf import FedReconMF
    >>> from fedcf.flower import FlowerExecutor, directory
    >>> ex = FlowerExecutor(None, d, np.array([0, 1]), FedReconMF(random_state=0), mu=3.5,
    ...                     timeout=60.0, refusals=directory.Refusals())  # grid=None: nothing is sent
    >>> ex.counts.tolist()
    [3, 5]
    """

    def __init__(self, grid, directory: Directory, users: np.ndarray, est, mu: float,
                 timeout: float, refusals: Refusals, min_replies: int = 1):
        self.min_replies = int(min_replies)
        self.grid, self.directory, self.users = grid, directory, users
        self.params_json, self.mu, self.timeout = client_params(est), float(mu), timeout
        self.refusals, self.program, self.round_stats = refusals, None, {}
        self.local = None  # a stateful estimator's rows (set_program)
        self.round_norms: dict = {}  # node -> its clients' upload norms this round
        self.in_hyper = False  # round_stats are the hypergradient exchange's (new_round_stats)
        self.counts = None if directory.counts is None else directory.counts[users]
        self.received = {}  # message type -> record -> fields received
        # a stalled node (no reply in time) sits out 1, 2, 4, then 8 rounds, so it costs one
        # deadline per back-off, not every round
        self.refreshes, self.misses, self.skip_until = 0, {}, {}
        self.seen = {int(n) for n in directory.nodes}  # connected at the last look
        self.turned_away: set = set()  # nodes the directory refused: never asked again
        # round -> node -> its largest finite upload norm (with node sums: its sums' norm
        # per client)
        self.node_norms: dict = {}

    def node_finding(self):
        """A node to blame for a divergence (blame.py): in the earliest recorded round where
        one node's largest upload norm (with node sums: its sums' norm per client) is more
        than ``NODE_BLOWUP`` times the median of the other nodes' — a node sending wild
        deltas. None when no node stands out (or the
        uploads were masked: secure aggregation records none)."""
        from ..federated.round.blame import Finding

        for t in sorted(self.node_norms):
            norms = self.node_norms[t]
            for node, top in norms.items():
                others = [v for n, v in norms.items() if n != node]
                if others and top > NODE_BLOWUP * max(float(np.median(others)), 1e-30):
                    return Finding("node", f"in round {t} node {node}'s updates had norm "
                                           f"{top:.3g} (its largest upload, or its sums per "
                                           f"client), against a median of "
                                           f"{float(np.median(others)):.3g} over the other "
                                           f"{len(others)} nodes'")
        return None

    def set_program(self, program, local_state=None) -> FlowerExecutor:
        """``local_state``: a stateful estimator's rows (P, c). Where the server keeps them
        (FedAvg) each message carries its clients' rows and the replies bring them back;
        else they are only the starting rows a device takes for a user it has not trained
        yet (``rows.NodeRows``)."""
        self.program, self.local = program, local_state
        return self

    def attribute(self, stats: dict) -> dict:
        """The nodes whose uploads this round's clip cut (``stats["clip_norm"]``, a clip the
        server took over every upload) and how many of each one's: history key
        ``flower_clipped_by_node``, node id -> clients clipped."""
        norms, self.round_norms = self.round_norms, {}
        clip = stats.get("clip_norm")
        if clip is None or not norms:
            return {}
        cut = {str(n): int(np.sum(v > clip)) for n, v in norms.items()}
        return {"flower_clipped_by_node": {n: k for n, k in cut.items() if k}}

    def kept_rows(self, local):
        return local if self.program.server_rows else None  # FURL: on the devices

    def row_record(self, clients) -> dict:
        """The ``"rows"`` record of a message to ``clients`` (none for a stateless model)."""
        return {} if self.local is None else {"rows": arrays(P=self.local[0][clients],
                                                             c=self.local[1][clients])}

    def refresh(self) -> np.ndarray:
        """The training users whose node is connected now — the round's availability: a node
        that left is not asked, nor one sitting out its back-off after a missed deadline; a
        node that joined is asked for its directory entry, and the users it holds that the
        run knows are served by it from now on."""
        self.refreshes += 1
        for n in self.refusals.timed_out:
            k = self.misses[n] = self.misses.get(n, 0) + 1
            self.skip_until[n] = self.refreshes + 2 ** min(k - 1, MAX_BACKOFF)
            log.info("fedcf.flower: node %s missed a deadline; it sits out %d round(s)", n,
                     2 ** min(k - 1, MAX_BACKOFF))
        self.refusals.timed_out.clear()
        d, skip = self.directory, self.skip_until
        now = self.rejoin([n for n in self.connected() if skip.get(n, 0) <= self.refreshes])
        new = [n for n in now if n not in d.nodes and n not in self.turned_away]
        if new:
            try:
                d.admit(Directory.query(self.grid, new, self.timeout, self.refusals,
                                        d.private_floor, d.catalog if d.catalog_sent else None,
                                        d.scale),
                        self.refusals, [n for n in now if n in d.nodes])
            except RuntimeError:  # none of them answered with users: they stay out
                pass  # one the directory refused for what it said is not asked again
            self.turned_away.update(n for n in self.refusals.refused_entries()
                                    if n in new and n not in d.nodes)
        connected = np.isin(np.asarray(d.nodes, dtype=np.uint64)[d.node_of[self.users]],
                            np.asarray(now, dtype=np.uint64))
        return d.user_ids[self.users[connected]]

    def rejoin(self, now) -> list:
        """``now`` without the nodes that failed to re-join. Nodes that may have lost the run's
        state (they said so, missed a deadline, were unreachable or gone; a restarted SuperNode
        keeps its id, not its state) get the directory query, with the catalog, before they
        are asked to work. One that does not answer it sits the round out."""
        d = self.directory
        again = sorted(n for n in self.refusals.stale if n in now and n in d.nodes)
        if not (again and d.catalog_sent):
            self.refusals.stale.difference_update(again)
            return list(now)
        log.info("fedcf.flower: re-sending the catalog to node(s) %s", again)
        before = len(self.refusals.items)
        self.refusals.stale.difference_update(again)
        try:
            Directory.query(self.grid, again, self.timeout, self.refusals, d.private_floor,
                            d.catalog, d.scale)
        except RuntimeError:  # none answered with users
            pass
        failed = {r["node"] for r in self.refusals.items[before:]}
        self.refusals.stale.update(failed)  # asked again next time
        return [n for n in now if n not in failed]

    def connected(self) -> list:
        """The connected nodes; one gone since the last look may be back without its state."""
        now = {int(n) for n in self.grid.get_node_ids()}
        self.refusals.stale.update(n for n in self.seen - now if n in self.directory.nodes)
        self.seen = now
        return sorted(now)

    def ready(self) -> None:
        """Before asking the nodes outside a round (evaluation): ``rejoin`` the connected."""
        self.rejoin(self.connected())

    def new_round_stats(self, hyper: bool = False) -> None:
        """Start a round's measurements (bytes, messages). The hypergradient exchange comes
        first (``hyper=True``); the training exchange then keeps its counts under ``hyper_``
        keys."""
        carried = {f"hyper_{k}": v for k, v in self.round_stats.items()} if self.in_hyper else {}
        self.round_stats, self.in_hyper = carried, hyper

    def node_clients(self, cohort) -> dict:
        """Flower node id -> the cohort's clients (dense ids) that node holds."""
        node = self.directory.node_of[self.users[cohort.clients]]
        return {int(self.directory.nodes[k]): cohort.clients[node == k] for k in np.unique(node)}

    def client_config(self, clients) -> dict:
        """What a node needs to run ``clients``: their raw ids, dense ids, the client
        parameters and μ."""
        raw = self.directory.user_ids[self.users[clients]]
        return {"users": [int(u) for u in raw], "clients": [int(c) for c in clients],
                "params": self.params_json, "mu": self.mu}

    def send(self, records: dict, kind: str, group: str, stage: str, clients: dict) -> list:
        """Send each node its records (node -> {name: record}); the accepted (node, content)
        replies (refusals under ``stage``; ``clients``: node -> its number of clients). Bytes
        and messages are added to ``round_stats``."""
        msgs = [message(r, n, kind, group) for n, r in records.items()]
        sizes = {}  # a record shared by the messages is serialized once for the count
        stats = self.round_stats
        stats["flower_bytes_down"] = stats.get("flower_bytes_down", 0) + sum(
            content_bytes(m.content, sizes) for m in msgs)
        stats["flower_messages"] = stats.get("flower_messages", 0) + len(msgs)
        before = len(self.refusals.items)
        replies = list(exchange(self.grid, msgs, self.timeout, stage, self.refusals, clients))
        lost = sorted({r["node"] for r in self.refusals.items[before:]
                       if NO_CATALOG in r["reason"]} & set(records))
        if lost and self.directory.catalog_sent:  # restarted unnoticed: catalog, then again
            resend = [message(records[n], n, kind, group) for n in self.rejoin(lost)]
            stats["flower_messages"] += len(resend)
            stats["flower_bytes_down"] += sum(content_bytes(m.content, sizes) for m in resend)
            replies += exchange(self.grid, resend, self.timeout,
                                f"{stage} (sent again with the catalog)", self.refusals, clients)
        stats["flower_bytes_up"] = stats.get("flower_bytes_up", 0) + sum(
            content_bytes(c) for _, c in replies)
        for _, content in replies:  # what the server received, by message type and record
            for name, rec in content.items():
                self.received.setdefault(kind, {}).setdefault(name, set()).update(record_fields(rec))
        return replies

    def run(self, cohort, params, ids) -> ClientOutputs:
        """Every asked client's upload, checked (``wire.decode_upload``), in cohort order."""
        Q = params["Q"]

        def decode(content, clients):
            weights, slots = (None, None) if self.counts is None else \
                self.program.layout(self.counts[clients])  # under DP: the reply's layout
            out = decode_upload(content, clients=clients, slots=slots, weights=None if
                                weights is None else weights.astype(np.float64),
                                n_items=Q.shape[0], K=Q.shape[1], dtype=Q.dtype,
                                program=self.program)
            bad = ~out.finite_clients()
            if bad.any():  # the aggregator leaves these out and counts them
                self.refusals.add(self.stage, self.node, "non-finite values from clients "
                                  f"{out.clients[bad].tolist()}: left out of the aggregate",
                                  int(bad.sum()))
            return out, upload_norms(out)[~bad]

        got = self._train(cohort, params, ids, {}, decode)
        self.round_norms = {node: upload_norms(out) for node, out, _ in got}
        if not got:
            return _no_outputs(Q)
        return ClientOutputs.concat([out for _, out, _ in got]).take(
            cohort_order(cohort, [c for _, _, c in got]))

    supports_partials = True

    def partials(self, cohort, params, ids, aggregator, hp) -> PartialSums:
        """A linear aggregate's sums, with no upload leaving a node: each node applies the
        aggregator's public recipe (``node_recipe``) to its clients and sends their sums per
        reduce group and item (``node.node_sums``); the server checks each node's sums
        against what its clients could send one by one (``wire.decode_sums``: counts, weights,
        the clip's norm bound) and adds them node by node in node-id order
        (``partials.add_nodes`` — the in-process model up to float rounding). An aggregator
        without a recipe gets the uploads."""
        recipe = aggregator.node_recipe()
        if recipe is None:
            return aggregator.partials(self.run(cohort, params, ids), hp)
        recipe = {**recipe, "exponent": float(hp.weight_exponent)}
        Q = params["Q"]

        def decode(content, clients):
            w = None
            if self.counts is not None:
                n = self.program.layout(self.counts[clients])[0].astype(np.float64)
                w = np.where(n > 0, n ** recipe["exponent"], 0.0)
            parts = decode_sums(content, clients=clients, n_items=Q.shape[0], K=Q.shape[1],
                                recipe=recipe, weights=w)
            size = np.sqrt(float(np.sum(parts.s_Q ** 2) + np.sum(parts.s_b ** 2)))
            sizes[self.node] = size / max(len(clients), 1)
            return parts, np.array([sizes[self.node]])

        sizes = {}
        got = self._train(cohort, params, ids, {"recipe": json.dumps(recipe)}, decode)
        if recipe["clip"] is None:  # nothing in the recipe bounds a node's sums
            got = self._wild_sums_refused(got, sizes)
        if not got:
            return aggregator.partials(_no_outputs(Q), hp)
        return add_nodes([parts for _, parts, _ in sorted(got, key=lambda g: g[0])])

    def _wild_sums_refused(self, got, sizes) -> list:
        """Under a recipe without a clip (the plain mean) a node's sums have no public bound:
        a node whose sums per client are more than ``NODE_BLOWUP`` times the median of the
        other accepted nodes' (two at least) is refused by name and the round goes on without
        it, instead of the aggregate (or the run) following it."""
        keep = []
        for node, parts, clients in got:
            others = [sizes[n] for n, _, _ in got if n != node]
            mid = float(np.median(others)) if len(others) >= 2 else np.inf
            if sizes[node] > NODE_BLOWUP * max(mid, 1e-30):
                self.refusals.add(self.stage, node, f"its sums have norm {sizes[node]:.3g} per "
                                  f"client, more than {NODE_BLOWUP:g} times the median "
                                  f"{mid:.3g} of the other nodes' (the plain mean has no clip "
                                  "to bound them)", len(clients))
                self.round_stats["flower_clients_refused"] += len(clients)
                continue
            keep.append((node, parts, clients))
        return keep

    def _train(self, cohort, params, ids, extra: dict, decode) -> list:
        """One training exchange: each node gets the global model and its clients' config
        (plus ``extra``); each reply goes through ``decode(content, clients)`` → (what it
        holds, norms for blame), and a ReplyError refuses the node. Returns (node, decoded,
        clients) for the accepted replies."""
        self.new_round_stats()
        glob = arrays(Q=params["Q"], b=params["b"], ids=np.asarray(ids, np.uint64))
        asked = self.node_clients(cohort)
        records = {n: {"global": glob, **self.row_record(c),
                       "config": flwr().ConfigRecord({**self.client_config(c), **extra})}
                   for n, c in asked.items()}
        back = self.local is not None and self.program.server_rows  # FedAvg's rows return
        self.stage = f"round {int(ids[1])}"
        got, pending = [], {}
        for node, content in self.send(records, flwr().MessageType.TRAIN, f"round-{int(ids[1])}",
                                       self.stage, {n: len(c) for n, c in asked.items()}):
            self.node = node
            try:
                held, norms = decode(content, asked[node])
                rows = decode_rows(content, n=len(asked[node]), K=self.local[0].shape[1],
                                   dtype=self.local[0].dtype) if back else None
            except ReplyError as e:
                self.refusals.add(self.stage, node, str(e), len(asked[node]))
                continue
            got.append((node, held, asked[node]))
            pending[node] = rows
            if len(norms) and len(self.node_norms) < NORM_ROUNDS:  # the early rounds
                self.node_norms.setdefault(int(ids[1]), {})[node] = float(norms.max())
        if 0 < len(got) < self.min_replies:  # too few nodes by the deadline: no aggregate
            self.refusals.add(self.stage, -1, f"accepted replies from {len(got)} of "
                              f"{len(asked)} nodes by the deadline, below min-replies="
                              f"{self.min_replies}: the round is not aggregated",
                              int(sum(len(c) for _, _, c in got)))
            got = []
        self.round_stats["flower_clients_refused"] = len(cohort.clients) - int(
            sum(len(c) for _, _, c in got))
        for node, _, clients in got if back else ():  # an aggregated node's rows replace its
            self.local[0][clients], self.local[1][clients] = pending[node]  # clients' rows
        return got

    supports_secure = True

    def secure_clients(self, cohort, params, ids, hp, job):
        """Secure aggregation: the nodes run their own clients and begin the aggregator's
        ``job`` on them (``secure.FlowerHalves``); only protocol messages come back."""
        from .secure import FlowerHalves

        self.new_round_stats()
        halves = FlowerHalves(self, cohort, params, ids, hp, job)
        self.round_stats["flower_clients_refused"] = len(cohort.clients) - len(halves.registry)
        self.last_halves = halves
        return halves

    def tangents(self, cohort, params, tangents, ids):
        """Hypergradient reports (hyper.py), in the clear, for a plain aggregator: each node gets
        the model, the last server step's tangents and its clients, and answers with each
        client's query loss and derivatives (``node.tangent_reports``; ``wire.decode_reports``
        checks them). The weights are the query sizes the server knows from the directory. A
        client whose node did not answer reports nothing (weight 0)."""
        self.new_round_stats(hyper=True)
        TQ, Tb = (np.asarray(t, np.float64) for t in tangents)
        clients = cohort.clients
        losses, jvp = np.full(len(clients), np.nan), np.zeros((len(clients), TQ.shape[0]))
        weights = self.program.layout(self.counts[clients])[0].astype(np.float64)
        glob = arrays(Q=params["Q"], b=params["b"], ids=np.asarray(ids, np.uint64))
        tang, asked = arrays(TQ=TQ, Tb=Tb), self.node_clients(cohort)
        records = {n: {"global": glob, "tangents": tang, **self.row_record(c),
                       "config": flwr().ConfigRecord(self.client_config(c))}
                   for n, c in asked.items()}
        stage, at = f"round {int(ids[1])} (hypergradients)", {int(c): i for i, c in
                                                             enumerate(clients)}
        answered = np.zeros(len(clients), bool)
        for node, content in self.send(records, "train.tangents", f"hyper-{int(ids[1])}", stage,
                                       {n: len(c) for n, c in asked.items()}):
            try:
                got = decode_reports(content, clients=asked[node], H=TQ.shape[0])
            except ReplyError as e:
                self.refusals.add(stage, node, str(e), len(asked[node]))
                continue
            idx = [at[int(c)] for c in asked[node]]
            (losses[idx], jvp[idx]), answered[idx] = got, True
        return losses, jvp, np.where(answered, weights, 0.0)

    def secure_reports(self, cohort, params, tangents, ids, job):
        """Hypergradient reports under secure aggregation: the nodes compute, clip, weigh and
        encode their users' reports (``secure.node_step`` with a report encoding) and mask them
        in the reports' own protocol session; only protocol messages come back."""
        from .secure import FlowerHalves

        self.new_round_stats(hyper=True)
        return FlowerHalves(self, cohort, params, ids, None, job, tangents=tangents)

    def close(self):
        pass


def _no_outputs(Q) -> ClientOutputs:
    z = np.zeros(0, np.int64)
    return ClientOutputs(np.zeros(1, np.int64), z, np.zeros((0, Q.shape[1]), Q.dtype),
                         np.zeros(0, Q.dtype), np.zeros(0), np.zeros(0), None, z)


def serve(grid, settings: Settings) -> dict:
    """The whole server program: directory, user split, the fit over the nodes (FedReconMF, or
    ``settings.model``'s estimator),
    federated ReconEval, saved model and result. Returns the result (also written to
    ``settings.result_path``); its ``received`` names every record and field the server got
    in the training replies, by message type."""
    t0 = time.perf_counter()
    refusals = Refusals()
    nodes = wait_for_nodes(grid, int(settings.min_nodes), float(settings.wait_seconds))
    est = settings.estimator()
    floor = max(int(est.min_examples), 1) if est.dp_release else None
    public = est.get_params(deep=False).get("rating_scale")  # the run's public scale, if any
    scale = None if public is None else tuple(float(v) for v in public)
    directory = Directory.query(grid, nodes, settings.reply_timeout, refusals, floor,
                                settings.catalog(), scale)
    seed = run_seed(est.random_state)
    f = float(settings.eval_fraction)
    kept = cap_node_shares(directory, float(settings.max_node_share), seed, refusals)
    train, test = user_split_indices(len(kept), (1 - f, f), seed) if f else \
        (np.arange(len(kept)), np.zeros(0, np.int64))
    train, test = kept[train], kept[test]  # positions in the directory
    pop = FlowerPopulation(directory, train, None)
    mu = est.release_mean(None if est.dp_release else pop.value_stats())
    pop.executor = FlowerExecutor(grid, directory, train, est, mu, settings.reply_timeout,
                                  refusals, min_replies=settings.min_replies)
    pop.executor.turned_away = {n for n in refusals.refused_entries()
                                if n not in directory.nodes}
    evaluate = dict(seed=seed, support_fraction=settings.eval_support_fraction,
                    timeout=settings.reply_timeout, refusals=refusals)
    callback = None
    if est.eval_every and len(test):  # federated ReconEval every eval_every rounds
        def callback(model, done):
            pop.executor.ready()
            return federated_recon_eval(grid, directory, test, model, **evaluate)
    # each round samples from the users whose node is connected now (churn: a node that left
    # is not asked; one that came back, with a new id, serves its users again)
    est.fit(pop, callback=callback, availability=lambda t: pop.executor.refresh())
    result = {"n_nodes": len(nodes), "n_train_users": len(train), "n_eval_users": len(test),
              "n_items": len(directory.catalog), "params": json.loads(client_params(est))}
    if len(test):
        pop.executor.ready()
        result["recon_eval"] = federated_recon_eval(grid, directory, test, est, **evaluate)
    if settings.model_path:
        result["model_path"] = str(est.save(settings.model_path))
    result.update(history=est.history_, refusals=refusals.items,
                  received={kind: {name: sorted(f) for name, f in recs.items()} for kind, recs
                            in pop.executor.received.items()},
                  seconds=time.perf_counter() - t0)
    if settings.result_path:
        from ..datasets import atomic_write

        atomic_write(settings.result_path,
                     lambda fh: fh.write(json.dumps(result, indent=1, default=float).encode()))
    return result
