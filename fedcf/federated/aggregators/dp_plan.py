"""The public figures of a run under differential privacy, fixed before its first round: δ
against the population, the mechanisms each round composes (the update's and the
hypergradient reports'), and whether the noise leaves any signal."""

from __future__ import annotations

import warnings

import numpy as np

from ..round.contracts import RunContext


def check_delta(delta: float, n: int) -> None:
    """Refuse δ ≥ 1/n (it allows leaking one of the n users outright); warn above 1/(10·n)."""
    if delta >= 1.0 / n:
        raise ValueError(f"delta={delta} must be below 1/n = {1.0 / n:.3g} for the "
                         f"{n} clients (a delta of 1/n allows leaking one user outright)")
    if delta > 0.1 / n:
        warnings.warn(f"delta={delta} is above 1/(10·n) = {0.1 / n:.3g} for the {n} "
                      "clients: with probability delta the mechanism may fail for some user; "
                      "the usual choice is well below 1/n", UserWarning, stacklevel=3)


def report_plan(context: RunContext, q: float) -> tuple[list, float]:
    """(each round's mechanisms as (sampling rate, multiplier ÷ σ), the expected number of
    reporting clients) for the run's hypergradient reports (``RunContext.reports``)."""
    if context.reports is None:
        return [(q, 1.0)], 0.0
    expected = q * context.n_eligible
    if context.reports == "cohort":
        return [(q, 2.0 ** -0.5)], expected
    q_h = min(1.0, context.clients_per_round / max(context.n_holdout, 1))
    return [(q, 1.0), (q_h, 1.0)], q_h * context.n_holdout


# noise norm of a round's mean update, in units of the largest mean update the clipped clients
# can send (its norm is at most the clip), above which a model is mostly noise: warn
NOISE_SWAMP = 100.0


def warn_if_noise_swamps(bound, context) -> None:
    """Warn before training when each round's noise is ``NOISE_SWAMP`` times the largest signal
    (σ·√d / the expected cohort, public figures only): the fit would return a noise model."""
    d = context.n_items * (context.n_factors + 1)
    ratio = bound.update_sigma_ * np.sqrt(d) / bound.denominator_
    if ratio > NOISE_SWAMP:
        warnings.warn(
            f"the DP noise swamps the signal: each round's noise has about {ratio:.3g} times the "
            f"norm of the largest mean update the clipped clients can send (noise multiplier "
            f"{bound.sigma_:.4g}, about {bound.denominator_:.4g} clients per round, {d} "
            "values), so the model will be mostly noise; allow a larger target_epsilon, take "
            "more clients_per_round or fewer n_rounds", UserWarning, stacklevel=3)
