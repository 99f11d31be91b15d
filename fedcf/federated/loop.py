"""The federated round loop: a short composition of the phases in phases.py (DESIGN §10)."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np

from .checkpoint import load_checkpoint, save_checkpoint
from .optimizers import state_to_arrays
from .phases import Cohort, GlobalDelta, RoundSummary, server_update

_STAGES = ("reconstruction", "client update", "server step")


class RoundFinisher:
    """Phase 5: the guards, the history record, the callback and the checkpoint.

    Client uploads with a non-finite value are left out of the aggregate and counted; the first
    such round and the stage it failed in (reconstruction: the query loss was already non-finite;
    client update: only the upload was) are remembered to name the parameter responsible. The
    run stops with FloatingPointError when the global model is no longer usable: non-finite
    after the server step, every upload non-finite three rounds in a row, or a mean query loss
    above ``usable_loss``.
    """

    def __init__(self, run):
        self.run = run
        self.all_bad_rounds = 0
        self.n_nonfinite = 0
        self.bad_rounds = 0
        self.first_problem = None  # (round, stage)

    def check_clients(self, t: int, s: RoundSummary):
        """Before the server step (the global model is still intact for a diagnosis)."""
        if s.n_nonfinite:
            self.n_nonfinite += s.n_nonfinite
            self.bad_rounds += 1
            if self.first_problem is None:
                stage = "reconstruction" if s.n_nonfinite_recon else "client update"
                self.first_problem = (t, stage)
        self.all_bad_rounds = self.all_bad_rounds + 1 if (s.n_nonfinite and s.n_used == 0) else 0
        if self.all_bad_rounds >= 3:
            self.stop(t, "every client upload was non-finite for 3 rounds in a row")
        loss = s.loss
        if np.isfinite(loss) and loss > self.run.usable_loss:
            diagnosed = self.run.est._diagnose(self.run, s)
            if diagnosed is not None:
                self.first_problem = (t, diagnosed)
            self.stop(t, f"the mean client query loss reached {loss:.3g} (more than 10^4 times "
                         f"the loss of predicting zero, {self.run.usable_loss / 1e4:.3g})")

    def check_server(self, t: int, finite: bool):
        if not finite:
            self.stop(t, "the global parameters became non-finite after the server step")

    def stop(self, t: int, what: str):
        stage = self.first_problem[1] if self.first_problem else "server step"
        if self.run.est._server_is_wild(self.run.params["Q"]):
            stage = "server step"
        dropped = (f" ({self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                   "non-finite before)") if self.n_nonfinite else ""
        raise FloatingPointError(f"training diverged at round {t}: {what}{dropped}; "
                                 f"{self.run.blame(stage)}{self.run.kept_note()}")

    def record(self, t, cohort: Cohort, delta: GlobalDelta, seconds: float,
               server_seconds: float) -> dict:
        est, s = self.run.est, delta.summary
        K, n_items = self.run.params["Q"].shape[1], self.run.params["Q"].shape[0]
        return {"round": t, "loss": s.loss, "clients_sampled": cohort.n_sampled,
                "clients_used": s.n_used, "clients_dropped": cohort.n_dropped,
                "clients_surplus": cohort.n_surplus, "clients_nonfinite": s.n_nonfinite,
                "clients_empty": s.n_empty, "items_updated": int(len(delta.items)),
                "values_up": delta.values_up + est._values_up_local(s.n_used, K),
                "values_down": est._values_down(n_items, K, s.n_clients),
                "server_seconds": server_seconds, "seconds": seconds,
                **self.run.timing, **self.run.privacy_record(t + 1),
                **self.run.aggregator.round_stats, **self.run.executor.round_stats}

    def after(self, done: int, rec: dict, callback):
        run, est = self.run, self.run.est
        if callback is not None and est.eval_every and done % est.eval_every == 0:
            est._set_globals(run.params)
            est.history_ = run.history
            result = callback(est, done)
            if isinstance(result, dict):
                rec["eval"] = result
        if est.checkpoint_path is not None and (done % est.checkpoint_every == 0
                                                or done == est.n_rounds):
            run.save(done)

    def warn_dropped(self):
        if self.n_nonfinite:
            t, stage = self.first_problem
            warnings.warn(f"{self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                          f"non-finite and left out of the aggregate (first at round {t}, in the "
                          f"{stage}); {self.run.blame(stage)}", RuntimeWarning, stacklevel=4)


class Run:
    """The state of one fit: global parameters, optimizer state, history, and the phases."""

    def __init__(self, est, inter, *, seed, params, opt, local, select, executor, aggregator,
                 hyperparams, fingerprint, run_params, usable_loss, hyper=None,
                 hyper_select=None):
        self.est, self.inter, self.seed = est, inter, seed
        self.params, self.opt, self.local = params, opt, local
        self.opt_state = opt.init(params)
        self.select, self.executor, self.aggregator = select, executor, aggregator
        self.hyperparams = hyperparams  # RoundHyperparams: the one place a round reads them from
        self.hyper = hyper  # HyperLearner (learned hyperparameters) or None
        self.hyper_select = hyper_select  # Selector of held-out hypergradient clients, or None
        self.fingerprint, self.run_params = fingerprint, run_params
        self.usable_loss = usable_loss
        self.history: list[dict] = []
        self.start = 0
        self.last_saved = None
        self.finisher = RoundFinisher(self)
        self.timing: dict = {}  # this round's seconds of client work and of the reduce

    # ------------------------------------------------------------------ checkpoints
    def resume(self, path):
        if not os.path.exists(path):
            return
        expect = {"Q": (self.params["Q"].shape, self.params["Q"].dtype),
                  "b": (self.params["b"].shape, self.params["b"].dtype)}
        expect.update({k: (v.shape, v.dtype) for k, v in
                       state_to_arrays(self.opt_state).items() if v.ndim})
        if self.local is not None:
            expect["P"] = (self.local[0].shape, self.local[0].dtype)
            expect["c"] = (self.local[1].shape, self.local[1].dtype)
        params, state, local, history, done = load_checkpoint(
            path, cls=type(self.est).__name__, run_params=self.run_params,
            fingerprint=self.fingerprint, n_rounds=self.est.n_rounds, expect=expect)
        self.params, self.opt_state, self.history, self.start = params, state, history, done
        self.last_saved = done
        if local is not None:
            self.local[0][...], self.local[1][...] = local

    def save(self, done: int):
        save_checkpoint(self.est.checkpoint_path, cls=type(self.est).__name__, params=self.params,
                        opt_state=self.opt_state, local=self.local, done=done,
                        history=self.history, fingerprint=self.fingerprint,
                        run_params=self.run_params)
        self.last_saved = done

    def epsilon(self, rounds: int):
        """ε(δ) of the released model after ``rounds`` rounds, or None without DP."""
        return self.aggregator.epsilon(rounds)

    def privacy_record(self, rounds: int) -> dict:
        e = self.epsilon(rounds)
        return {} if e is None else {"epsilon": e}

    def kept_note(self) -> str:
        if self.est.checkpoint_path is None or self.last_saved is None:
            return ""
        return (f" (the checkpoint of round {self.last_saved} is kept in "
                f"{self.est.checkpoint_path})")

    def blame(self, stage: str) -> str:
        return self.est._blame(stage)

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
            losses, jvp, w = self.executor.tangents(cohort, self.params, self.hyper.tangents, ids)
            rec = self.hyper.update(losses, jvp, w)
            H, K = jvp.shape[1], self.params["Q"].shape[1]
            held = int(self.executor.counts[cohort.clients].sum())  # rows the clients hold
            rec.update(hyper_values_down=H * held * (K + 1), hyper_values_up=H * len(w))
        self.hyperparams = self.hyper.hyperparams(self.hyperparams)
        return {**self.hyper.values(), **rec}

    def client_work(self, cohort, ids, hp, t):
        """Phases 2 and 3: (per-client outputs or None, the aggregate). On a cluster (an
        executor with ``partials``), a linear aggregator is reduced from the shards' partial
        sums: no single upload travels to the driver. The others, learning the
        client-weighting exponent (its derivative needs every upload), and an executor whose
        outputs are here anyway give the aggregator the per-client outputs (the same bits)."""
        t0 = time.perf_counter()
        if self.executor.supports_partials and self.aggregator.linear and not (
                self.hyper is not None and "weight_exponent" in self.hyper.names):
            outputs = None
            parts = self.executor.partials(cohort, self.params, ids, self.aggregator, hp)
            t1 = time.perf_counter()
            delta = self.aggregator.reduce(parts, t)
        else:
            outputs = self.executor.run(cohort, self.params, ids)
            t1 = time.perf_counter()
            delta = self.aggregator(outputs, hp, t)
        self.timing = {"work_seconds": t1 - t0, "reduce_seconds": time.perf_counter() - t1}
        return outputs, delta

    def round(self, t: int, callback=None) -> dict:
        """Algorithm 1, one round: select → client work → aggregate → server update → finish."""
        t0 = time.perf_counter()
        cohort = self.select(t)
        ids = np.array([self.seed, t], np.uint64)
        learned = self.learn_hyperparams(cohort, ids)
        hp = self.hyperparams
        outputs, delta = self.client_work(cohort, ids, hp, t)
        self.finisher.check_clients(t, delta.summary)
        ts = time.perf_counter()
        state, params, finite = server_update(self.opt, self.opt_state, self.params, delta, hp)
        ts = time.perf_counter() - ts
        self.finisher.check_server(t, finite)
        if self.hyper is not None:
            self.hyper.after_step(self.opt_state, state, delta, outputs, hp, params["Q"].shape)
        self.opt_state, self.params = state, params
        rec = self.finisher.record(t, cohort, delta, time.perf_counter() - t0, ts)
        rec.update(learned)
        self.history.append(rec)
        self.finisher.after(t + 1, rec, callback)
        return rec
