"""The divergence guard of a run, built once from the estimator's settings (it holds no
estimator): which uploads were non-finite, when a run must stop, and which parameter to blame.

Client uploads with a non-finite value are left out of the aggregate and counted; the first such
round and the stage it failed in (reconstruction: the query loss was already non-finite; client
update: only the upload was) are remembered. The run stops with ``Diverged`` (a
FloatingPointError) when the global model is no longer usable: non-finite after the server
step, every upload non-finite three rounds in a row, or a mean query loss above ``usable_loss``.
The estimator then measures the cause (blame.py) and words the error with ``message``.
"""

from __future__ import annotations

import warnings

import numpy as np

from .phases import RoundSummary

STAGES = ("reconstruction", "client update", "server step", "data", "noise", "node")


class Diverged(FloatingPointError):
    """The guard stopped a run at ``round`` (``what`` happened); ``stage`` is where the first
    non-finite value appeared (a fallback when no cause could be measured, see blame.py)."""

    def __init__(self, message: str, round_: int, what: str, stage: str):
        super().__init__(message)
        self.round, self.what, self.stage = round_, what, stage


class DivergenceGuard:
    """Counts non-finite uploads and stops a run that is no longer usable, naming the parameter
    to change (``blame``: stage → advice). Without a measured cause, ``server_is_wild(Q)``
    (the server step alone is unstable) blames the server, else the stage of the first
    non-finite upload does.

    With ``released_only`` (a run under differential privacy) the guard stops a run only on what
    the run releases — the global parameters after the noised server step — never on the
    clients' unnoised loss or their count of non-finite uploads, which ε does not cover (it
    still counts them for the warning at the end)."""

    def __init__(self, usable_loss: float, blame: dict, server_is_wild=None,
                 released_only: bool = False):
        missing = set(STAGES) - set(blame)
        if missing:
            raise ValueError(f"blame needs advice for every stage; missing {sorted(missing)}")
        self.usable_loss, self.blame = float(usable_loss), dict(blame)
        self.server_is_wild = server_is_wild
        self.released_only = released_only
        self.all_bad_rounds = self.n_nonfinite = self.bad_rounds = 0
        self.first_problem = None  # (round, stage)
        self.kept = ""  # where the last checkpoint is, for the error message

    def check_clients(self, t: int, s: RoundSummary, params: dict):
        """Before the server step (the global model is still intact for a diagnosis)."""
        if s.n_nonfinite:
            self.n_nonfinite += s.n_nonfinite
            self.bad_rounds += 1
            if self.first_problem is None:
                stage = "reconstruction" if s.n_nonfinite_recon else "client update"
                self.first_problem = (t, stage)
        if self.released_only:
            return
        self.all_bad_rounds = self.all_bad_rounds + 1 if (s.n_nonfinite and s.n_used == 0) else 0
        if self.all_bad_rounds >= 3:
            self.stop(t, "every client upload was non-finite for 3 rounds in a row", params)
        if np.isfinite(s.loss) and s.loss > self.usable_loss:
            self.stop(t, f"the mean client query loss reached {s.loss:.3g} (more than 10^4 "
                         f"times the loss of predicting zero, {self.usable_loss / 1e4:.3g})",
                      params)

    def check_server(self, t: int, finite: bool, params: dict):
        if not finite:
            self.stop(t, "the global parameters became non-finite after the server step",
                      params)

    def stop(self, t: int, what: str, params: dict):
        stage = self.first_problem[1] if self.first_problem else "server step"
        if self.server_is_wild is not None and self.server_is_wild(params["Q"]):
            stage = "server step"
        raise Diverged(self.message(t, what, stage), t, what, stage)

    def message(self, t: int, what: str, stage: str, measured: str | None = None) -> str:
        """The error's text: what happened, the advice for ``stage`` and what was measured
        (or that the cause is the stage where the first non-finite value appeared)."""
        dropped = (f" ({self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                   "non-finite before)") if self.n_nonfinite else ""
        why = f" — measured: {measured}" if measured else ""
        return (f"training diverged at round {t}: {what}{dropped}; {self.blame[stage]}{why}"
                f"{self.kept}")

    def warn_dropped(self, cause=None):
        """The warning at the end of a run that left non-finite uploads out; ``cause(round)``
        (blame.py) measures what made them, else the stage where they first appeared is
        named."""
        if self.n_nonfinite:
            t, stage = self.first_problem
            found = None if cause is None else cause(t)
            advice = self.blame[found.stage if found else stage] + (
                f" — measured: {found.measured}" if found else "")
            warnings.warn(f"{self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                          f"non-finite and left out of the aggregate (first at round {t}); "
                          f"{advice}", RuntimeWarning, stacklevel=4)


def warn_if_nothing_trained(history: list, start: int) -> None:
    """Say so when no round of this fit aggregated a single client: the model is then the one
    it started from, whatever the fit returned. The reason is the rounds' own (secure
    aggregation's abort, the cohort below its minimum, nobody reachable)."""
    rounds = history[start:]
    if not rounds or any(h.get("clients_used", 0) > 0 for h in rounds):
        return
    last = rounds[-1]
    why = last.get("secagg_abort") or (
        "the cohort was below SecureAggregation's min_cohort"
        if last.get("secagg_below_min_cohort") else
        "no client was reachable or had data" if not last.get("clients_sampled") else
        "every sampled client's update was empty or non-finite")
    warnings.warn(f"none of the {len(rounds)} rounds of this fit aggregated a client ({why}); "
                  "the model is its initial state — check the population size against "
                  "clients_per_round and the aggregator's thresholds", RuntimeWarning,
                  stacklevel=3)
