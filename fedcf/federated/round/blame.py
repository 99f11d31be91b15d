"""Which setting made a run diverge, measured rather than guessed.

When the divergence guard stops a run that this process can replay (its ratings are here and it
is not under differential privacy), the run is replayed from its start with the same seed, and
each round, after its client work and before its server step, is examined (``Probe``):

1. the data: ratings whose square overflows the model's dtype cannot be trained on at any step
   size;
2. the clients: the round's client work is rerun as it ran and with one suspect step size
   divided by ``DAMP`` — the gradient reconstruction's, then the client update's. A stable step
   scales its output about linearly with the step size; an unstable one blows up (non-finite,
   or more than ``BLOWUP`` times what linear scaling allows);
3. the server step: from the round's finite aggregate it moves the item rows to non-finite
   values, or amplifies the clients' mean delta more than ``BLOWUP``-fold into a move as large
   as the rows themselves.

The earliest round with a finding names the cause, with what was measured. Under differential
privacy nothing is rerun on the ratings: ``noise_finding`` weighs the noise against the item
rows from public figures. When nothing is found the guard falls back to where the first
non-finite value appeared, and says that the cause was not measured.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .guard import Diverged
from .phases import BoundLocalExecutor, Cohort, GlobalDelta, RoundHyperparams, server_update

DAMP = 8.0  # a suspect step size is divided by this in a rerun
BLOWUP = 10.0  # a stable output shrinks about DAMP-fold; an unstable one BLOWUP times more
MAX_RERUN = 200  # clients of the failing round rerun (the first ones of its cohort)


@dataclass
class Finding:
    """A measured cause: ``stage`` (a key of the estimator's advice) and what was measured."""

    stage: str
    measured: str


class Blamed(Exception):
    """A replay's probe found the cause of a divergence at round ``round`` (raised by
    ``Run.round`` to end the replay)."""

    def __init__(self, round_: int, finding: Finding):
        super().__init__(f"round {round_}: {finding.stage}")
        self.round, self.finding = round_, finding


@dataclass
class RoundState:
    """A round as its client work left it, before the server step: the global parameters
    and optimizer state it started from, its cohort, client streams and hyperparameters, the
    aggregate, and (stateful estimators) the cohort's local rows before their client work."""

    params: dict
    opt_state: dict
    cohort: Cohort
    ids: np.ndarray
    hp: RoundHyperparams
    delta: GlobalDelta
    local_rows: tuple | None = None


def noise_finding(std: float, learning_rate: float, rounds: int, size: float) -> Finding | None:
    """Under differential privacy: the noise alone (std ``std`` per value, a random walk over
    ``rounds`` server steps at ``learning_rate``) against item rows of public size ``size``
    (the initial scale or the rating scale's). Public figures only: no rating is read."""
    walk = 4.0 * float(learning_rate) * float(std) * np.sqrt(max(rounds, 1))
    if walk > BLOWUP * size:
        return Finding("noise", f"the noise alone (std {std:.3g} per value, server learning "
                                f"rate {learning_rate:.3g}) moves an item value by about "
                                f"{walk:.3g} in {rounds} rounds, against item rows of size "
                                f"about {size:.3g}")
    return None


class Probe:
    """Measures the cause of a failing round (module docstring) where this process holds the
    ratings and the run is not under DP. ``est`` is the estimator whose run failed (its client
    program is rebuilt with a damped step size: ``est._damped(stage, factor)``), ``local`` the
    stateful estimators' local rows (None for FedRecon)."""

    def __init__(self, est, inter, mu: float, opt, init_scale: float, local=None):
        self.est, self.inter, self.mu, self.opt = est, inter, float(mu), opt
        self.local = local
        # the least size of an item row: the initial scale, or the factors' natural scale
        # √E[r²] (p·q is a rating); a move of BLOWUP times this in one round is a blow-up
        mean_sq = inter.value_stats()["mean_sq"] if len(inter.values) else 1.0
        self.scale = max(float(init_scale), float(np.sqrt(mean_sq)) if np.isfinite(
            mean_sq) else 1.0)

    def __call__(self, rs: RoundState) -> Finding | None:
        return (self.data(rs.params) or self.clients(rs.params, rs) or
                self.server(rs.params, rs.opt_state, rs))

    # ------------------------------------------------------------------ the three causes
    def data(self, params) -> Finding | None:
        if self.inter is None or not self.inter.holds_ratings or not len(self.inter.values):
            return None
        big = float(np.abs(self.inter.values).max())
        limit = float(np.sqrt(np.finfo(params["Q"].dtype).max))
        if big > limit / 1e3:
            return Finding("data", f"the largest |rating| is {big:.3g}; its square is beyond "
                                   f"what {params['Q'].dtype} holds (max {limit ** 2:.3g}) "
                                   "once errors are squared and summed")
        return None

    def clients(self, params, rs) -> Finding | None:
        clients = rs.cohort.clients[:MAX_RERUN]
        if not len(clients):
            return None
        base = self._rerun(self.est, params, clients, rs)
        for stage in ("reconstruction", "client update"):
            damped_est = self.est._damped(stage, DAMP)
            if damped_est is None:
                continue
            damped = self._rerun(damped_est, params, clients, rs)
            found = _compare(stage, base, damped, self._size(params["Q"]))
            if found is not None:
                return found
        return None

    def server(self, params, state, rs) -> Finding | None:
        size = self._size(params["Q"])
        if not (np.isfinite(size) and np.isfinite(rs.delta.d_Q).all() and
                np.isfinite(rs.delta.d_b).all()):
            return None
        _, after, finite = server_update(self.opt, copy.deepcopy(state),  # in place: copies
                                         {k: v.copy() for k, v in params.items()}, rs.delta,
                                         rs.hp)
        mean = float(np.abs(rs.delta.d_Q).max()) if rs.delta.d_Q.size else 0.0
        moved = float(np.max(np.abs(after["Q"].astype(np.float64) - params["Q"]))) \
            if finite and after["Q"].size else np.inf
        # the server's doing: it amplifies the clients' mean delta more than BLOWUP-fold into a
        # move as large as the rows themselves (with SGD at rate 1 a big move is the clients')
        if not finite or (moved > size and moved > BLOWUP * mean):
            what = "to non-finite values" if not finite else f"by up to {moved:.3g}"
            return Finding("server step", f"the server step ({type(self.opt).__name__}, "
                                          f"learning rate {rs.hp.server_learning_rate:.3g}) "
                                          f"moved the item rows {what} from the clients' "
                                          f"finite mean delta of at most {mean:.3g}, against "
                                          f"rows of size {size:.3g}")
        return None

    # ------------------------------------------------------------------ helpers
    def _size(self, Q) -> float:
        finite = np.isfinite(Q)
        if not finite.all():
            return float("nan")
        return max(float(np.abs(Q).max()) if Q.size else 0.0, self.scale)

    def _rerun(self, est, params, clients, rs) -> Outputs:
        program = est.client_program(self.inter, self.mu)
        local = None
        if self.local is not None:  # the cohort's rows as the round found them
            local = tuple(a.copy() for a in self.local)
            if rs.local_rows is not None:
                for a, kept in zip(local, rs.local_rows):
                    a[rs.cohort.clients] = kept
        ex = BoundLocalExecutor(program, (self.inter.indptr, self.inter.items,
                                          self.inter.values), local)
        out = ex.run(Cohort(clients, len(clients), 0, 0),
                     {k: v.copy() for k, v in params.items()}, rs.ids)
        return Outputs.of(out)


@dataclass
class Outputs:
    """What a rerun gave: non-finite clients, the largest delta and the mean query loss."""

    n: int
    nonfinite: int
    largest: float
    loss: float

    @classmethod
    def of(cls, out) -> Outputs:
        per = np.zeros(out.n_clients, bool)
        bad_slots = ~(np.isfinite(out.d_Q).all(axis=1) & np.isfinite(out.d_b))
        if bad_slots.any():
            per[np.searchsorted(out.offsets, np.flatnonzero(bad_slots), side="right") - 1] = True
        per |= ~np.isfinite(out.losses)
        ok = ~per
        largest = float(np.abs(out.d_Q[np.isfinite(out.d_Q)]).max()) if out.d_Q.size else 0.0
        w = out.weights[ok]
        loss = float(np.average(out.losses[ok], weights=w)) if ok.any() and w.sum() > 0 \
            else float("nan")
        return cls(int(out.n_clients), int(per.sum()), largest, loss)



def _compare(stage: str, base: Outputs, damped: Outputs, size: float) -> Finding | None:
    """Whether damping ``stage``'s step size cured the rerun (module docstring, step 2): the
    output blew up (non-finite, or more than linear in the step size), or the clients' deltas
    were more than ``BLOWUP`` times the rows' ``size`` and shrank with the step size."""
    if stage == "reconstruction":  # the query loss is measured after reconstruction
        cured = (not np.isfinite(base.loss) or base.loss > BLOWUP * DAMP * damped.loss) and \
            np.isfinite(damped.loss)
        what = (f"the mean query loss after reconstruction was {base.loss:.3g} and "
                f"{damped.loss:.3g} with its step size divided by {DAMP:g}")
    else:
        shrank = damped.nonfinite == 0 and damped.largest <= 2 * base.largest / DAMP
        cured = (base.nonfinite > damped.nonfinite) or (
            damped.nonfinite == 0 and base.largest > BLOWUP * DAMP * max(damped.largest, 1e-30)
        ) or (shrank and base.largest > BLOWUP * size)
        what = (f"{base.nonfinite} of {base.n} uploads were non-finite and the largest delta "
                f"{base.largest:.3g} (item rows of size {size:.3g}); with the step size "
                f"divided by {DAMP:g}: {damped.nonfinite} non-finite, largest "
                f"{damped.largest:.3g}")
    if not cured:
        return None
    return Finding(stage, f"rerunning the round's first {base.n} clients: {what}")


REPLAY_ROUNDS = 30  # a divergence that starts later than this is not replayed


def cause_of(est, inter, availability, last_round: int, run) -> Finding | None:
    """The measured cause of a divergence of ``est``'s run ``run`` seen by round
    ``last_round``: under DP from public figures, else by replaying the run from its start
    (same seed, no checkpoint, no callback) with a ``Probe`` on each round up to that one.
    None when the run cannot be replayed here (ratings elsewhere) or nothing is found."""
    if est._dp_release():
        std = run.aggregator.noise_std
        scale = est.rating_scale_ or (1.0, 1.0)
        size = max(float(est.init_scale), float(np.sqrt(max(abs(x) for x in scale))))
        return None if not std else noise_finding(std, run.hyperparams.server_learning_rate,
                                                  last_round + 1, size)
    if inter.executor is not None:  # a Flower run can name one wild node; else no replay here
        return inter.executor.node_finding()
    if not inter.holds_ratings or last_round >= REPLAY_ROUNDS:
        return None
    replay = copy.copy(est)
    replay.checkpoint_path, replay.eval_every, replay.verbose = None, 0, False
    rerun = replay._start(inter, availability)
    probe = Probe(replay, inter, replay.global_mean_, rerun.opt, est.init_scale, rerun.local)
    try:
        for t in range(last_round + 1):
            rerun.round(t, probe)
    except Blamed as b:
        return Finding(b.finding.stage, f"at round {b.round}, {b.finding.measured}")
    except Diverged:
        return None
    finally:
        rerun.executor.close()
    return None
