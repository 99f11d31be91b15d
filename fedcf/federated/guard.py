"""The divergence guard of a run, built once from the estimator's settings (it holds no
estimator): which uploads were non-finite, when a run must stop, and which parameter to blame.

Client uploads with a non-finite value are left out of the aggregate and counted; the first such
round and the stage it failed in (reconstruction: the query loss was already non-finite; client
update: only the upload was) are remembered to name the parameter responsible. The run stops
with FloatingPointError when the global model is no longer usable: non-finite after the server
step, every upload non-finite three rounds in a row, or a mean query loss above ``usable_loss``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .._kernels.als import ridge_solve_rows
from .._kernels.layout import ridge_cfg
from .phases import RoundSummary

STAGES = ("reconstruction", "client update", "server step")


@dataclass(frozen=True)
class Diagnosis:
    """Which stage made a round's mean query loss explode, judged on the worst client (a
    simulation-only diagnosis: it reads that client's ratings here).

    Its exact ridge reconstruction on the current global model: if that fits far better than
    the kernel's, the (gradient-step) reconstruction diverged; if the client step is unstable
    for that embedding (η_u · 2(s + 1) > 2, with s the larger of ‖p‖² and the mean |p·q|: the
    curvature of the per-example loss in an item row at balanced factors), the client update;
    else the server step."""

    population: object  # holds_ratings: subset_users gives a client's ratings
    mu: float
    biases: bool
    learning_rate: float
    recon_can_diverge: bool

    def __call__(self, params: dict, summary: RoundSummary) -> str | None:
        if summary.worst_client < 0:
            return None
        sub = self.population.subset_users(np.array([summary.worst_client]))
        Q, b = params["Q"], params["b"]
        P, c = np.zeros((1, Q.shape[1]), Q.dtype), np.zeros(1, Q.dtype)
        ridge_solve_rows(sub.indptr, sub.items, sub.values, Q, b,
                         ridge_cfg(0.1, 1e-6, self.mu, self.biases), P, c)
        pred = self.mu + b[sub.items] + c[0] + Q[sub.items].astype(np.float64) @ P[0]
        exact = float(np.mean((sub.values - pred) ** 2))
        if self.recon_can_diverge and np.isfinite(exact) and exact < 1e-2 * summary.worst_loss:
            return "reconstruction"
        # SGD drifts towards balanced factors (‖p‖² ≈ |p·q|): judge the step on the larger, so
        # an item matrix that has already grown (and left p small) does not hide it
        inter_size = float(np.mean(np.abs(Q[sub.items].astype(np.float64) @ P[0])))
        curv = max(float(P[0] @ P[0]), inter_size) + float(self.biases)
        return "client update" if self.learning_rate * 2 * curv > 2 else "server step"


class DivergenceGuard:
    """Counts non-finite uploads and stops a run that is no longer usable, naming the parameter
    to change (``blame``: stage → advice). ``diagnose(params, summary)`` (a ``Diagnosis`` or
    None) names the stage of an exploding loss; ``server_is_wild(Q)`` says the server step alone
    is unstable (then the server is blamed whatever happened first).

    With ``released_only`` (a run under differential privacy) the guard stops a run only on what
    the run releases — the global parameters after the noised server step — never on the
    clients' unnoised loss or their count of non-finite uploads, which ε does not cover (it
    still counts them for the warning at the end)."""

    def __init__(self, usable_loss: float, blame: dict, diagnose=None, server_is_wild=None,
                 released_only: bool = False):
        missing = set(STAGES) - set(blame)
        if missing:
            raise ValueError(f"blame needs advice for every stage; missing {sorted(missing)}")
        self.usable_loss, self.blame = float(usable_loss), dict(blame)
        self.diagnose, self.server_is_wild = diagnose, server_is_wild
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
            diagnosed = None if self.diagnose is None else self.diagnose(params, s)
            if diagnosed is not None:
                self.first_problem = (t, diagnosed)
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
        dropped = (f" ({self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                   "non-finite before)") if self.n_nonfinite else ""
        raise FloatingPointError(f"training diverged at round {t}: {what}{dropped}; "
                                 f"{self.blame[stage]}{self.kept}")

    def warn_dropped(self):
        if self.n_nonfinite:
            t, stage = self.first_problem
            warnings.warn(f"{self.n_nonfinite} client uploads in {self.bad_rounds} rounds were "
                          f"non-finite and left out of the aggregate (first at round {t}, in the "
                          f"{stage}); {self.blame[stage]}", RuntimeWarning, stacklevel=4)
