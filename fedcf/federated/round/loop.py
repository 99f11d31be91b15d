"""The federated round loop: a short composition of the phases in phases.py."""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np

from .blame import Blamed, RoundState
from .checkpoint import load_checkpoint, save_checkpoint
from .optimizers import state_to_arrays
from .phases import Cohort, GlobalDelta, server_update
from .reports import Reports


def check_writable(path) -> None:
    """Refuse, before the first round, a checkpoint path whose folder is missing or read-only
    (else the run would fail at its first checkpoint, its rounds lost)."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint_path={str(path)!r} is a folder; name a file in it, "
                                "e.g. folder/checkpoint.npz")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint_path={str(path)!r}: its folder {folder!r} does not "
                                "exist; create it or choose another checkpoint_path")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"checkpoint_path={str(path)!r}: its folder {folder!r} is not "
                              "writable; choose another checkpoint_path")


class Checkpointer:
    """Saves a run's state atomically every ``every`` rounds and at the end, and resumes only
    into the run that wrote it (same class name, parameters ``run_params`` and data
    ``fingerprint``)."""

    def __init__(self, path, every: int, *, cls: str, fingerprint: dict, run_params: dict,
                 n_rounds: int):
        self.path, self.every, self.cls, self.n_rounds = path, every, cls, n_rounds
        self.fingerprint, self.run_params = fingerprint, run_params
        self.last_saved = None
        check_writable(path)

    def due(self, done: int) -> bool:
        return done % self.every == 0 or done == self.n_rounds

    @property
    def ledger(self) -> str:
        """The release ledger beside the checkpoint: one line per DP round released."""
        return f"{os.fspath(self.path)}.released"

    def releasing(self, run: Run, t: int) -> None:
        """Under DP, write ahead (fsync'ed) that round ``t`` is about to be released, with
        its mechanisms: a crash after the release and before the next checkpoint leaves the
        round on record, and a resumed run composes it again (releases count, not
        checkpoints)."""
        if run.accountant is None:
            return
        entry = {"data": self.fingerprint["sha256"], "round": int(t),
                 "mechanisms": [[float(q), float(s)] for q, s in
                                run.aggregator.round_mechanisms()]}
        with open(self.ledger, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def compose_orphans(self, run: Run, done: int) -> None:
        """Compose the rounds the ledger says were released on this data at or after round
        ``done`` (the run resumes there: the checkpoint's accountant does not hold them)."""
        if run.accountant is None or not os.path.exists(self.ledger):
            return
        n = 0
        with open(self.ledger) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:  # a line cut by a crash while it was written
                    continue
                if e.get("data") == self.fingerprint["sha256"] and e.get("round", -1) >= done:
                    for q, sigma in e["mechanisms"]:
                        run.accountant.compose(q, sigma)
                    n += 1
        run.orphans += n  # their cohorts are not on record: every user counts them
        if n:
            warnings.warn(f"{n} rounds were released before a crash and are run again: the "
                          "accountant composes them twice (the release ledger "
                          f"{self.ledger!r})", UserWarning, stacklevel=2)

    def save(self, run: Run, done: int):
        save_checkpoint(self.path, cls=self.cls, params=run.params, opt_state=run.opt_state,
                        local=run.local, done=done, history=run.history,
                        fingerprint=self.fingerprint, run_params=self.run_params,
                        accountant=None if run.accountant is None else run.accountant.state(),
                        aggregator=run.aggregator.state(),
                        participations=None if run.accountant is None else np.append(
                            run.participations + run.orphans, run.orphans),
                        extra=None if run.validation is None else run.validation.arrays())
        self.last_saved = done
        run.guard.kept = f" (the checkpoint of round {done} is kept in {self.path})"

    def resume(self, run: Run):
        if not os.path.exists(self.path):
            self.compose_orphans(run, 0)  # rounds released before a crash that left no checkpoint
            return
        expect = {k: (run.params[k].shape, run.params[k].dtype) for k in ("Q", "b")}
        expect.update({k: (v.shape, v.dtype) for k, v in
                       state_to_arrays(run.opt_state).items() if v.ndim})
        if run.local is not None:
            expect["P"] = (run.local[0].shape, run.local[0].dtype)
            expect["c"] = (run.local[1].shape, run.local[1].dtype)
        params, state, local, history, done, spent, agg_state, seen, best = load_checkpoint(
            self.path, cls=self.cls, run_params=self.run_params, fingerprint=self.fingerprint,
            n_rounds=self.n_rounds, expect=expect)
        run.params, run.opt_state, run.history, run.start = params, state, history, done
        if run.validation is not None:
            run.validation.resume(run, history, best, self.path)
        if run.accountant is not None:  # the privacy already spent, as it was spent
            if spent is None:
                raise ValueError(f"checkpoint {str(self.path)!r} has no privacy accountant state "
                                 "(written without DP); it is left untouched — use another "
                                 "checkpoint_path")
            run.accountant = type(run.accountant).from_state(spent)
            run.participations = np.zeros(0, np.int64) if seen is None else \
                np.asarray(seen, np.int64)
            run.aggregator.check_resume(run.accountant)
            self.compose_orphans(run, done)
        run.aggregator.load_state(agg_state)
        self.last_saved = done
        run.guard.kept = f" (the checkpoint of round {done} is kept in {self.path})"
        if local is not None:
            run.local[0][...], run.local[1][...] = local


class Run:
    """The state of one fit and the phases it composes; it holds no estimator.

    ``program`` is the client program (for communication accounting), ``guard`` the
    DivergenceGuard, ``checkpointer`` a Checkpointer or None, ``observe(done, params,
    history)`` is called after every round and may return a dict for the round's record.
    """

    def __init__(self, *, seed, params, opt, local, select, executor, aggregator, program,
                 hyperparams, guard, checkpointer=None, observe=None, hyper=None,
                 hyper_select=None, validation=None):
        self.seed, self.params, self.opt, self.local = seed, params, opt, local
        self.validation = validation  # early stopping on held-out users (Validation) or None
        self.opt_state = opt.init(params)
        self.select, self.executor, self.aggregator = select, executor, aggregator
        self.program, self.guard, self.checkpointer = program, guard, checkpointer
        self.observe = observe
        self.hyperparams = hyperparams  # RoundHyperparams: the one place a round reads them from
        self.hyper = hyper  # HyperLearner (learned hyperparameters) or None
        self.hyper_select = hyper_select  # Selector of held-out hypergradient clients, or None
        self.accountant = aggregator.accountant  # composed after every round, checkpointed
        self.history: list[dict] = []
        self.start = 0
        self.orphans = 0  # rounds released before a crash and run again (release ledger)
        self.participations = np.zeros(0, np.int64)  # rounds per user (dense id), under DP
        self.timing: dict = {}  # this round's seconds of client work and of the reduce
        if checkpointer is not None:
            checkpointer.resume(self)

    def epsilon(self):
        """ε(δ) of the released model after the rounds so far, or None without DP."""
        if self.accountant is None or not self.aggregator.guarantee:
            return None
        return self.accountant.epsilon()

    def took_part(self, clients) -> None:
        """Count a round for each of ``clients`` (dense ids)."""
        need = int(clients.max(initial=-1)) + 1
        if need > len(self.participations):
            self.participations = np.concatenate([self.participations, np.zeros(
                need - len(self.participations), np.int64)])
        self.participations[clients] += 1

    def server_epsilon(self):
        """ε(δ) against a server that knows each cohort (no amplification by sampling): every
        mechanism of a round at q = 1, composed over the participations of the user who took
        part most. None without DP."""
        if self.accountant is None or not self.aggregator.guarantee:
            return None
        k = int(self.participations.max(initial=0)) + self.orphans
        if k == 0:
            return 0.0
        acc = type(self.accountant)(self.accountant.delta)
        for _, sigma in self.aggregator.round_mechanisms():
            acc.compose(1.0, sigma, k)
        return acc.epsilon()

    def account(self):
        """Compose this round's mechanisms into the accountant (DP aggregators only)."""
        if self.accountant is not None:
            for q, sigma in self.aggregator.round_mechanisms():
                self.accountant.compose(q, sigma)

    def record(self, t, cohort: Cohort, delta: GlobalDelta, seconds: float,
               server_seconds: float) -> dict:
        """The round's history record: the phases' measurements, merged."""
        s, (n_items, K) = delta.summary, self.params["Q"].shape
        eps = self.epsilon()
        eps_server = None if eps is None else self.server_epsilon()
        return {"round": t, "loss": s.loss, "clients_sampled": cohort.n_sampled,
                "clients_used": s.n_used, "clients_dropped": cohort.n_dropped,
                "clients_surplus": cohort.n_surplus, "clients_nonfinite": s.n_nonfinite,
                "clients_empty": s.n_empty, "items_updated": int(len(delta.items)),
                "values_up": delta.values_up + self.program.values_up_local(s.n_used, K),
                "values_down": self.program.values_down(n_items, K, s.n_clients),
                "server_seconds": server_seconds, "seconds": seconds, **self.timing,
                **({} if eps is None else {"epsilon": eps, "epsilon_server": eps_server}),
                **self.aggregator.round_stats, **self.executor.round_stats,
                **self.executor.attribute(self.aggregator.round_stats)}

    # ------------------------------------------------------------------ one round
    def learn_hyperparams(self, cohort, ids) -> dict:
        """Federated hypergradient step (hyper.py): this round's clients report their loss
        derivatives along the last server step's tangents; the learned values then set this
        round's ``RoundHyperparams``. Returns the record entries (values and hypergradients)."""
        if self.hyper is None:
            return {}
        rec = {}
        if self.hyper.tangents is not None:
            if self.hyper_select is not None:
                cohort = self.hyper_select(int(ids[1]))
            rec = self.hyper.update(self.report_mean(cohort, ids))
            rec.update(self.aggregator.report_stats)
            if self.accountant is None:  # under DP the cohort's size is not released
                H, K = len(self.hyper.names), self.params["Q"].shape[1]
                held = int(self.executor.counts[cohort.clients].sum())  # rows the clients hold
                rec.update(hyper_values_down=H * held * (K + 1),
                           hyper_values_up=H * len(cohort.clients))
        self.hyperparams = self.hyper.hyperparams(self.hyperparams)
        return {**self.hyper.values(), **rec}

    def report_mean(self, cohort, ids):
        """The reporting cohort's mean derivative, as the aggregator protects it: masked where
        the clients run (a cluster's shards under secure aggregation), else from their
        reports (reports.py); None when no report counted."""
        agg, tangents, t = self.aggregator, self.hyper.tangents, int(ids[1])
        if self.executor.supports_secure and agg.secure:
            return agg.remote_reports(self.executor, cohort, self.params, tangents, ids,
                                      self.hyper.clip, t)
        losses, jvp, w = self.executor.tangents(cohort, self.params, tangents, ids)
        return agg.report_mean(Reports(cohort.clients, losses, jvp, w), self.hyper.clip, t)

    def client_work(self, cohort, ids, hp, t):
        """Phases 2 and 3: (per-client outputs or None, the aggregate), as the aggregator takes
        its inputs (``Aggregator.client_round``: masked or summed where the clients ran, or
        every upload). Learning the client-weighting exponent needs the uploads (its
        derivative is a sum the partial sums do not carry yet)."""
        t0 = time.perf_counter()
        learns_exponent = self.hyper is not None and "weight_exponent" in self.hyper.names
        outputs, delta, work = self.aggregator.client_round(
            self.executor, cohort, self.params, ids, hp, t, uploads=learns_exponent)
        self.timing = {"work_seconds": work, "reduce_seconds": time.perf_counter() - t0 - work}
        return outputs, delta

    def round(self, t: int, probe=None) -> dict:
        """Algorithm 1, one round: select → client work → aggregate → server update → finish.
        ``probe`` (blame.py, a replay that looks for the cause of a divergence) examines the
        round before its server step; a finding stops the replay (``Blamed``)."""
        t0 = time.perf_counter()
        if self.checkpointer is not None and probe is None:
            self.checkpointer.releasing(self, t)
        cohort = self.select(t)
        if self.accountant is not None:
            self.took_part(cohort.clients)
        ids = np.array([self.seed, t], np.uint64)
        learned = self.learn_hyperparams(cohort, ids)
        hp = self.hyperparams
        local_rows = None if probe is None or self.local is None else \
            tuple(a[cohort.clients].copy() for a in self.local)
        outputs, delta = self.client_work(cohort, ids, hp, t)
        if probe is not None:
            finding = probe(RoundState(self.params, self.opt_state, cohort, ids, hp, delta,
                                       local_rows))
            if finding is not None:
                raise Blamed(t, finding)
        self.guard.check_clients(t, delta.summary, self.params)
        ts = time.perf_counter()
        state, params, finite = server_update(self.opt, self.opt_state, self.params, delta, hp)
        ts = time.perf_counter() - ts
        self.guard.check_server(t, finite, params)
        if self.hyper is not None:
            self.hyper.after_step(self.opt, self.opt_state, state, delta, outputs, hp,
                                  params["Q"].shape)
        self.opt_state, self.params = state, params
        self.account()
        rec = self.record(t, cohort, delta, time.perf_counter() - t0, ts)
        rec.update(learned)
        if self.validation is not None:  # (in a replay too: its rounds follow the same path)
            rec.update(self.validation.check(self, t + 1))
        self.history.append(rec)
        if self.observe is not None:
            result = self.observe(t + 1, self.params, self.history)
            if isinstance(result, dict):
                rec["eval"] = result
        if self.checkpointer is not None and self.checkpointer.due(t + 1):
            self.checkpointer.save(self, t + 1)
        return rec
