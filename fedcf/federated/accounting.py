"""Privacy accounting for user-level DP (DP-FedAvg style), delegated to Google's dp-accounting.

The mechanism accounted for: every round, each client takes part independently with probability q
(Poisson sampling — the assumption of the accountant; fedcf samples that way whenever DP is on),
its whole upload is clipped to L2 norm C, and Gaussian noise N(0, σ²C²) is added to the sum. Each
round is a ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``; T rounds compose. ε(δ) comes from the
RDP accountant (``dp_accounting.rdp.RdpAccountant``), never from a hand-typed formula.
"""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def _quiet():
    """dp-accounting logs through absl each RDP order it must skip at small σ (one line per order
    and call); the skipped orders only make ε more conservative, so keep those lines out."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _dpa():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("differential privacy needs the dp-accounting package: "
                          "pip install 'fedcf[privacy]'") from exc
    return dp_accounting, rdp


def _check(q, delta, rounds):
    if not 0 < q <= 1:
        raise ValueError(f"the sampling rate q must be in (0, 1], got {q!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if int(rounds) != rounds or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")


def epsilon(q: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε after ``rounds`` Poisson-sampled Gaussian rounds at (q, σ), for this δ (RDP accountant)."""
    _check(q, delta, rounds)
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    dpa, rdp = _dpa()
    acc = rdp.RdpAccountant()
    with _quiet():
        acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(noise_multiplier)),
                    int(rounds))
        return float(acc.get_epsilon(delta))


class RoundAccountant:
    """ε(δ) after t rounds of one (q, σ), for t = 1, 2, ...: the per-round RDP curve is computed
    once and scaled by t (composition of identical RDP mechanisms adds their curves), then
    converted with dp-accounting's own RDP → (ε, δ) conversion. Falls back to a fresh
    accountant per call if that library's internals change."""

    def __init__(self, q: float, noise_multiplier: float, delta: float):
        _check(q, delta, 0)
        self.q, self.sigma, self.delta = q, noise_multiplier, delta
        dpa, rdp = _dpa()
        acc = rdp.RdpAccountant()
        with _quiet():
            acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(noise_multiplier)), 1)
        self._orders, self._rdp = getattr(acc, "_orders", None), getattr(acc, "_rdp", None)

    def epsilon(self, rounds: int) -> float:
        if rounds == 0:
            return 0.0
        if self._rdp is None:
            return epsilon(self.q, self.sigma, rounds, self.delta)
        import numpy as np
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return float(compute_epsilon(self._orders, np.asarray(self._rdp) * rounds, self.delta)[0])


def noise_for_epsilon(target_epsilon: float, q: float, rounds: int, delta: float) -> float:
    """The smallest σ whose ``rounds`` rounds at rate q stay within (target_epsilon, δ)."""
    _check(q, delta, rounds)
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon!r}")
    dpa, rdp = _dpa()
    with _quiet():
        return _calibrate(dpa, rdp, target_epsilon, q, rounds, delta)


def _calibrate(dpa, rdp, target_epsilon, q, rounds, delta):
    return float(dpa.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda s: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)),
                                          int(rounds)),
        target_epsilon, delta, bracket_interval=dpa.ExplicitBracketInterval(1e-3, 1e4),
        tol=1e-4))
