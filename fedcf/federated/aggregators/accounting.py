"""Privacy accounting for user-level DP (DP-FedAvg style), delegated to Google's dp-accounting.

The mechanism accounted for: every round, each client takes part independently with probability q
(Poisson sampling — the assumption of the accountant; fedcf samples that way whenever DP is on),
its whole upload is clipped to L2 norm C, and Gaussian noise N(0, σ²C²) is added to the sum. Each
round is a ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``; T rounds compose. ε(δ) comes from
dp-accounting, never from a hand-typed formula: its RDP accountant (``RdpAccountant`` here, the
default) or its privacy-loss-distribution accountant (``PldAccountant``: tighter for many rounds,
e.g. 1.58 instead of 1.97 for q = 0.01, σ = 1, 500 rounds at δ = 1e-6, and slower).
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np

from ..round.contracts import Accountant
from ..round.device import DevicePolicy


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


_CURVES: dict = {}  # (q, σ) -> (orders, one round's RDP curve), shared by every accountant
_CURVES_KEPT = 256


def rdp_curve(q: float, sigma: float):
    """(orders, RDP curve) of one Poisson-sampled Gaussian round at (q, σ), from dp-accounting,
    computed once per process: a pure function of (q, σ) that costs ~0.1 s, and a run asks for
    it every round (the server-side ε of each round's record uses a fresh accountant)."""
    key = (float(q), float(sigma))
    got = _CURVES.get(key)
    if got is None:
        dpa, rdp = _dpa()
        acc = rdp.RdpAccountant()
        with _quiet():
            acc.compose(dpa.PoissonSampledDpEvent(key[0], dpa.GaussianDpEvent(key[1])), 1)
        curve = np.asarray(acc.rdp, np.float64).copy()
        curve.setflags(write=False)
        got = (tuple(acc.orders), curve)
        if len(_CURVES) >= _CURVES_KEPT:
            _CURVES.clear()
        _CURVES[key] = got
    return got


class RdpAccountant(Accountant):
    """fedcf's ``Accountant`` on dp-accounting's RDP accountant (the one adapter to that
    library). Its state is the list of rounds composed so far, as (q, σ, rounds) events, so a
    checkpoint carries it and a resumed run (even with another σ) goes on from it.

    Each distinct (q, σ) has its per-round RDP curve computed once by dp-accounting; ε(δ) after
    the events is dp-accounting's own RDP → (ε, δ) conversion of Σ rounds · curve (composition
    of RDP mechanisms adds their curves).

    Examples
    --------
    >>> from fedcf.federated.aggregators.accounting import RdpAccountant
    >>> acc = RdpAccountant(delta=1e-5)
    >>> acc.compose(0.01, 1.1, rounds=100)
    >>> round(acc.epsilon(), 3) == round(epsilon(0.01, 1.1, 100, 1e-5), 3)
    True
    """

    def __init__(self, delta: float, events=()):
        _check(1.0, delta, 0)
        self.delta, self.events = float(delta), []
        for q, sigma, rounds in events:
            self.compose(q, sigma, rounds)

    def compose(self, q: float, noise_multiplier: float, rounds: int = 1) -> None:
        _check(q, self.delta, rounds)
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
        q, sigma = float(q), float(noise_multiplier)
        for event in self.events:  # composition does not depend on the order of the rounds
            if event[:2] == [q, sigma]:
                event[2] += int(rounds)
                return
        self.events.append([q, sigma, int(rounds)])

    def _curve(self, q: float, sigma: float):
        return rdp_curve(q, sigma)

    def epsilon(self) -> float:
        if not any(r for _, _, r in self.events):
            return 0.0
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        total, orders = 0.0, None
        for q, sigma, rounds in self.events:
            orders, curve = self._curve(q, sigma)
            total = total + curve * rounds
        with _quiet():
            return float(compute_epsilon(orders, total, self.delta)[0])

    kind = "rdp"

    def state(self) -> dict:
        return {"kind": self.kind, "delta": self.delta, "events": [list(e) for e in self.events]}

    @classmethod
    def from_state(cls, state: dict) -> RdpAccountant:
        if not isinstance(state, dict) or state.get("kind") != cls.kind:
            raise ValueError(f"not the state of an {cls.__name__}: {state!r}")
        return cls(state["delta"], state["events"])


def noise_for_epsilon(target_epsilon: float, q: float, rounds: int, delta: float,
                      accountant: str = "rdp", *, mechanisms=None) -> float:
    """The smallest σ whose ``rounds`` rounds at rate q stay within (target_epsilon, δ) by the
    ``accountant`` ("rdp" or "pld"). ``mechanisms``: each round composes several
    Poisson-sampled Gaussians, given as (rate, multiplier ÷ σ) (default [(q, 1)])."""
    _check(q, delta, rounds)
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon!r}")
    plan = [(float(q), 1.0)] if mechanisms is None else [(float(r), float(f))
                                                         for r, f in mechanisms]
    for r, _ in plan:
        _check(r, delta, rounds)
    dpa, rdp = _dpa()
    with _quiet():
        sigma = _calibrate(dpa, rdp.RdpAccountant, target_epsilon, plan, rounds, delta, 1e-3,
                           1e4)
        step = pld_interval(sigma / 4 * min(f for _, f in plan), target_epsilon,
                            rounds * len(plan))
        if accountant == "pld" and step is not None:  # tighter: below the RDP σ (bracketed)
            try:
                sigma = _calibrate(dpa, lambda: _pld_accountant(step), target_epsilon, plan,
                                   rounds, delta, sigma / 4, sigma)
            except ValueError:  # a coarse grid can be looser than RDP: RDP's σ meets the target
                pass
        return sigma


def epsilons(accountant: RdpAccountant) -> dict:
    """ε of the same events by both accountants: {"rdp": ..., "pld": ...}."""
    return {cls.kind: cls(accountant.delta, accountant.events).epsilon()
            for cls in (RdpAccountant, PldAccountant)}


PLD_DISCRETIZATION = 1e-3  # dp-accounting's value_discretization_interval (its pessimistic bound)
PLD_POINTS = 2e5  # most grid points one Gaussian's loss distribution may take (~2 s, ~0.5 GB)
PLD_MAX_INTERVAL = 100.0  # dp-accounting needs exp(step) to stay finite
PLD_MAX_COMPOSED = 1e8  # most points the composed rounds' grid may span (else RDP's bound)


def pld_interval(sigma: float, epsilon_bound: float = 0.0, rounds: int = 1) -> float | None:
    """The PLD grid step for noise multiplier ``sigma``: ``PLD_DISCRETIZATION``, coarser where
    the loss distribution is wide (a small σ: its support grows as 20/σ + 1/σ²) or the ε
    large (``epsilon_bound``, e.g. the RDP ε of the same events), so that no accounting call
    takes more than seconds and a fraction of a GB. A coarser step is still a pessimistic
    discretization: ε stays a valid upper bound, only less tight. None: no step keeps the
    ``rounds`` composed within bounds (σ far below 1e-3): use the RDP bound instead."""
    width = 20.0 / sigma + 1.0 / sigma ** 2
    step = max(PLD_DISCRETIZATION, width / PLD_POINTS, epsilon_bound / (PLD_POINTS / 10))
    step = min(step, PLD_MAX_INTERVAL)
    return None if max(rounds, 1) * width / step > PLD_MAX_COMPOSED else step


def _pld_accountant(interval: float = PLD_DISCRETIZATION):
    from dp_accounting import pld

    return pld.PLDAccountant(value_discretization_interval=interval)


class PldAccountant(RdpAccountant):
    """As ``RdpAccountant`` (the same events and state), with ε from dp-accounting's
    privacy-loss-distribution accountant (``pld.PLDAccountant``, pessimistic discretization of
    ``PLD_DISCRETIZATION``): a tighter bound for many rounds.

    Examples
    --------
    >>> from fedcf.federated.aggregators.accounting import PldAccountant, RdpAccountant
    >>> pld, rdp = PldAccountant(1e-6), RdpAccountant(1e-6)
    >>> for acc in (pld, rdp):
    ...     acc.compose(0.01, 1.0, rounds=500)
    >>> bool(pld.epsilon() < rdp.epsilon())
    True
    """

    kind = "pld"

    def __init__(self, delta: float, events=()):
        self._curves: dict = {}  # the last events' ε
        super().__init__(delta, events)

    def epsilon(self) -> float:
        if not any(r for _, _, r in self.events):
            return 0.0
        key = tuple(tuple(e) for e in self.events)
        if self._curves.get("eps_key") != key:
            dpa, _ = _dpa()
            bound = RdpAccountant(self.delta, self.events).epsilon()  # cheap: sizes the grid
            step = pld_interval(min(s for _, s, _ in self.events), bound,
                                sum(r for _, _, r in self.events))
            if step is None:  # too wide for any bounded grid: RDP's bound holds too
                self._curves.update(eps_key=key, eps=bound)
                return bound
            acc = _pld_accountant(step)
            with _quiet():
                for q, sigma, rounds in self.events:
                    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), rounds)
                self._curves.update(eps_key=key, eps=float(acc.get_epsilon(self.delta)))
        return self._curves["eps"]


def _calibrate(dpa, make_accountant, target_epsilon, plan, rounds, delta, low, high):
    def event(s):
        parts = [dpa.PoissonSampledDpEvent(r, dpa.GaussianDpEvent(s * f)) for r, f in plan]
        one = parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)
        return dpa.SelfComposedDpEvent(one, int(rounds))

    def eps_at(s):
        acc = make_accountant()
        acc.compose(event(s))
        return acc.get_epsilon(delta)

    low = low / min(f for _, f in plan)
    if eps_at(low) <= target_epsilon:  # the smallest σ calibrated already meets the target
        return float(low)
    if eps_at(high) > target_epsilon:
        raise ValueError(f"target_epsilon={target_epsilon:g} cannot be met with a noise "
                         f"multiplier up to {high:g} over {rounds} rounds at δ={delta:g}; allow "
                         "a larger target_epsilon, or sample fewer clients or rounds")
    return float(dpa.calibrate_dp_mechanism(
        make_accountant, event, target_epsilon, delta,
        bracket_interval=dpa.ExplicitBracketInterval(low, high), tol=1e-4))


def device_budget(epsilon_budget: float, delta: float, noise_multiplier: float,
                  **policy) -> DevicePolicy:
    """A ``DevicePolicy`` that keeps each of a device's clients within ``epsilon_budget`` at
    ``delta`` against a server that knows every cohort (no amplification): its DP rule (noise
    multiplier σ) and the most rounds k whose composition at q = 1 stays within the budget
    (``max_participations``); ``policy``: its other fields.

    Examples
    --------
    >>> from fedcf.federated import device_budget
    >>> device_budget(8.0, 1e-6, 2.0).max_participations
    8
    """
    if not (isinstance(epsilon_budget, (int, float)) and np.isfinite(epsilon_budget)
            and epsilon_budget > 0):
        raise ValueError(f"epsilon_budget must be a finite number > 0, got {epsilon_budget!r}")
    DevicePolicy(noise_multiplier=noise_multiplier)  # names a bad noise_multiplier

    def eps(k):
        acc = RdpAccountant(delta)
        acc.compose(1.0, float(noise_multiplier), k)
        return acc.epsilon()

    if eps(1) > epsilon_budget:
        raise ValueError(f"one round at noise multiplier {noise_multiplier:g} already spends "
                         f"ε {eps(1):.3g} > epsilon_budget={epsilon_budget:g} at δ={delta:g}; "
                         "raise the budget or the noise multiplier")
    lo, hi = 1, 2
    while eps(hi) <= epsilon_budget:  # doubling, then bisection: ε grows with k
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) <= epsilon_budget else (lo, mid)
    return DevicePolicy(**{**policy, "noise_multiplier": float(noise_multiplier),
                           "max_participations": lo})
