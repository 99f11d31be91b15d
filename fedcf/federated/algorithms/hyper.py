"""Learned round hyperparameters by federated hypergradient descent (Rush, Charles, Garrett et al.,
"Federated Automatic Differentiation", Algorithm 2 in its parallel form, Fig. 5).

Round t's server step makes the new global model x_{t+1}(θ) from the hyperparameters θ it used.
The server keeps the tangent ∂x_{t+1}/∂z of that step (forward mode through the server optimizer,
the momentum buffer included) for each learned hyperparameter, in its raw coordinate z:

    z = log η_s              ∂x/∂z = η_s ∂x/∂η_s      (SGD: η_s Δ̄;  momentum: −η_s v_{t+1})
    z = logit β (momentum)   ∂x/∂z = β(1−β) (−η_s v_t)
    z = α (weight exponent)  ∂x/∂z = η_s ∂Δ̄/∂α,  ∂Δ̄/∂α = Σ w_i (ln n_i − L̄) Δ_i / Σ w_i
                             with w_i = n_i^α and L̄ = Σ w_i ln n_i / Σ w_i (a sum over clients)

The clients of round t+1 receive the tangent rows of the items they hold with the global rows,
compute their query loss at x_{t+1} (after reconstruction) and its derivative along each tangent
(``fedrecon_tangent_clients``), and send the H derivatives up; the server's hypergradient is their
mean weighted by query size (the empirical risk, whatever α is) and one hyper-optimizer step (Adam
or SGD on z) sets θ for round t+1. The derivative is that of one round (x_t and the clients' deltas
held fixed), as in the paper.

Only broadcasts and sums are used, as in the paper: the reports' mean is a ratio of sums, which
the round's aggregator computes as it protects the update (``Aggregator.report_mean``,
reports.py) — masked under secure aggregation, clipped, noised and accounted under differential
privacy — and ∂Δ̄/∂α = Σ w_i (ln n_i − L̄) Δ_i / Σ w_i is Σ w_i ln n_i Δ_i / Σ w_i − L̄·Δ̄, sums
the plain mean has and that secure aggregation masks beside the update (``Encoding.exponent``).
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..._kernels.server import sum_sorted_runs
from ..._validation import NoneOr
from ..aggregators.weighted import WeightedMean, entries
from ..round.contracts import phase_rule
from ..round.optimizers import SGD, Adam, ServerOptimizer
from ..round.params import Params, check_number
from ..round.phases import ClientOutputs, GlobalDelta, RoundHyperparams, Selector

LEARNABLE = ("server_learning_rate", "momentum", "weight_exponent")


class Hypergradients(Params):
    """Learn round hyperparameters during training by federated hypergradient descent: each
    round's clients also report the derivative of their query loss (after reconstruction) along
    the last server step's tangents, H numbers each, and a hyper-optimizer steps on them.

    Parameters
    ----------
    learn : sequence of {"server_learning_rate", "momentum", "weight_exponent"}
        What to learn. Needs server optimizer ``SGD`` or ``Momentum`` (``Momentum`` for the
        momentum) and a summing aggregator: the weighted mean (``aggregator=None``),
        ``SecureAggregation`` or ``DifferentialPrivacy`` (robust statistics are refused: one
        client could steer the reports' mean). "weight_exponent" is α in w_i = n_i^α, starting
        from ``client_weighting`` (1 by examples, 0 uniform); not under DP, which weighs
        clients by their clipped uploads, not by n_i^α. Under secure aggregation each client
        also masks s'_i·Δ_i and s'_i (s_i = min(n_i^α, W)/W, s' = ∂s/∂α), doubling its
        upload, and the server forms ∂Δ̄/∂α from the sums.
    learning_rate : float > 0, default 0.01
        Step of the hyper-optimizer on log η_s, logit β and α.
    optimizer : {"adam", "sgd"}, default "adam"
        The hyper-optimizer on the raw values. "sgd" is the paper's (its Section 5): its step
        is proportional to the hypergradient, which is large when the loss explodes, so it
        pulls back starts that diverge with fixed values. "adam" moves each value by about
        ``learning_rate`` per round whatever the hypergradient's size: it cannot rescue a
        start that diverges within a few rounds, and one noisy report (under DP) cannot throw
        a value far. It is the default because, on the starts that train, its runs ended
        better in eval/HYPER.md's stability study (``scripts/report.py`` checks both halves
        of this against the results).
    bounds : dict or None, default None
        The range each learned value is kept in, {name: (low, high)} in natural units;
        unnamed ones keep the defaults: server_learning_rate (1e-4, 1e3), momentum
        (3.4e-4, 0.99966) (logit ±8), weight_exponent (-2, 4). A starting value outside its
        range is refused; rounds that end at a bound list it in ``hyper_at_bound``, and a fit
        that ends with a value held at its bound for a quarter of its rounds warns.
    holdout : float in [0, 0.9] or None, default None
        This share of the users never trains: each round a cohort of them (validation clients,
        as in the paper's appendix A.2) reports the derivatives, so the hyperparameters follow
        the loss of users the model has not fitted. 0 uses the round's own training cohort (the
        paper's parallel form). None: 0.1 for FedReconMF, 0 for FedAvgMF/FURLMF (their clients
        report the loss of stored user rows, which held-out users never train). Under DP the
        held-out users are drawn per user (a hash of the user id and the seed), so adding or
        removing one user leaves every other user's side unchanged.
    clip_norm : float > 0, default 1
        Under secure aggregation and DP, each client's report (its H derivatives) is clipped to
        this L2 norm before it is summed (the fixed-point sum and the DP sensitivity need a
        bound); the plain mean uses the reports as they are.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import Hypergradients
    >>> model = FedReconMF(hypergradients=Hypergradients(["server_learning_rate"]))
    >>> model.get_params()["hypergradients__holdout"] is None
    True
    """

    def __init__(self, learn=("server_learning_rate",), *, learning_rate=0.01, optimizer="adam",
                 holdout=None, bounds=None, clip_norm=1.0):
        self.learn = tuple(learn) if isinstance(learn, (list, tuple)) else learn
        self.learning_rate = learning_rate
        self.clip_norm = clip_norm
        self.optimizer = optimizer
        self.holdout = holdout
        self.bounds = bounds
        self.validate()

    def ranges(self) -> dict:
        """(low, high) of each learnable value in natural units (``bounds`` over defaults)."""
        return {**DEFAULT_BOUNDS, **{k: tuple(float(x) for x in v)
                                     for k, v in (self.bounds or {}).items()}}

    def validate(self):
        learn = self.learn
        if isinstance(learn, list):
            learn = self.learn = tuple(learn)
        if not isinstance(learn, tuple) or not learn or any(n not in LEARNABLE for n in learn):
            raise ValueError(f"learn must be a non-empty list of {list(LEARNABLE)}, got "
                             f"{learn!r}")
        if len(set(learn)) != len(learn):
            raise ValueError(f"learn={list(learn)!r} names a hyperparameter twice")
        check_number("learning_rate", self.learning_rate, 0.0, low_open=True)
        check_number("clip_norm", self.clip_norm, 0.0, low_open=True)
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        h = self.holdout
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float, np.number))
                              or not 0.0 <= h <= 0.9):
            raise ValueError(f"holdout must be None or a number in [0, 0.9], got {h!r}")
        self._validate_bounds()

    def _validate_bounds(self):
        b = self.bounds
        if b is None:
            return
        if not isinstance(b, dict) or any(k not in LEARNABLE for k in b):
            raise ValueError(f"bounds must be a dict keyed by {list(LEARNABLE)}, got {b!r}")
        for k, v in b.items():
            ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(
                isinstance(x, numbers.Real) and not isinstance(x, bool) and np.isfinite(x)
                for x in v) and v[0] < v[1]
            if ok and k == "server_learning_rate":
                ok = v[0] > 0
            if ok and k == "momentum":
                ok = 0 < v[0] and v[1] < 1
            if not ok:
                raise ValueError(f"bounds[{k!r}] must be (low, high) with low < high"
                                 + (" and low > 0" if k == "server_learning_rate" else
                                    " inside (0, 1)" if k == "momentum" else "")
                                 + f", got {v!r}")

    def holdout_share(self, stateful: bool) -> float:
        """The held-out share of users (``holdout``, or the estimator's default)."""
        return (0.0 if stateful else 0.1) if self.holdout is None else float(self.holdout)


def hyper_holdout(hg, stateful: bool, eligible, seed, aggregator, inter, clients_per_round):
    """With a hypergradient holdout > 0, that share of the eligible users never trains: they
    are the validation population whose loss derivatives drive the learned hyperparameters (a
    ``Selector`` of their own, Poisson and secret under DP); else (None) the round's own cohort
    reports them. Under DP each user's side is a hash of its id and the seed, so one user more
    or less leaves every other user's side as it was. Returns (eligible users that train, that
    Selector or None)."""
    frac = 0.0 if hg is None else hg.holdout_share(stateful)
    if not frac:
        return eligible, None
    dp = aggregator.sampling == "poisson"
    if dp:
        key = f"{seed & (2 ** 64 - 1):016x}"[-16:]
        h = pd.util.hash_array(np.asarray(inter.user_ids[eligible], dtype=object), hash_key=key)
        held = h < np.uint64(frac * 2.0 ** 64)
    else:
        rng = np.random.default_rng([seed, 0x4E7A])
        held = np.zeros(len(eligible), bool)
        held[rng.permutation(len(eligible))[:max(1, int(round(frac * len(eligible))))]] = True
    if held.all() or not held.any():
        raise ValueError(f"hypergradients__holdout={frac} leaves no user to "
                         f"{'train on; lower it' if held.any() else 'report; raise it'}")
    return eligible[~held], Selector(seed ^ 0x5A5A, eligible[held], clients_per_round,
                                     poisson=dp, secret=aggregator.secret_sampling)


HYPER_CONSTRAINTS = {"hypergradients": NoneOr(phase_rule("hypergradients", Hypergradients))}
DEFAULT_BOUNDS = {"server_learning_rate": (1e-4, 1e3),
                  "momentum": (1.0 / (1.0 + np.exp(8.0)), 1.0 / (1.0 + np.exp(-8.0))),
                  "weight_exponent": (-2.0, 4.0)}


def warn_pinned(history: list, start: int, values: dict) -> None:
    """Warn when a learned value ended this fit at a bound where it had sat for at least a
    quarter of the fit's rounds (and 3): its hypergradient kept pushing it out of range, so
    the run trained with the bound, not with a learned value."""
    rounds = [h.get("hyper_at_bound", []) for h in history[start:] if "hyper_at_bound" in h]
    for name in rounds[-1] if rounds else ():
        run = next((i for i, at in enumerate(reversed(rounds)) if name not in at), len(rounds))
        if run >= max(3, len(rounds) / 4):
            warnings.warn(
                f"the learned {name} sat at a bound of its range for the last {run} of "
                f"{len(rounds)} rounds (now {values.get(name, float('nan')):.4g}): the fit "
                f"trained with the bound, not a learned value; lower Hypergradients' "
                f"learning_rate, change the starting {name}, or widen "
                f"Hypergradients(bounds={{{name!r}: (low, high)}})", UserWarning, stacklevel=3)


def _to_z(name: str, value: float) -> float:
    """A natural value in the hyper-optimizer's coordinate (log η, logit β, α)."""
    return float(np.log(value)) if name == "server_learning_rate" else \
        _logit(value) if name == "momentum" else float(value)


def _logit(p):
    return float(np.log(p / (1.0 - p)))


def _sigmoid(z):
    return float(1.0 / (1.0 + np.exp(-z)))


@dataclass
class HyperLearner:
    """The learned hyperparameters of a run, their hyper-optimizer (a server optimizer over the
    raw coordinates z: ``Adam`` or ``SGD``), and the last step's tangents."""

    names: tuple
    optimizer: ServerOptimizer
    z: np.ndarray  # raw coordinates, in ``names`` order
    state: dict = None  # the hyper-optimizer's
    t: int = 0
    tangents: tuple | None = None  # (TQ (H, n_items, K), Tb (H, n_items)) float64
    last_grad: np.ndarray = field(default=None)
    zbounds: np.ndarray = field(default=None)  # (H, 2) low and high of each z
    initial: dict = field(default_factory=dict)  # exact starting values (no exp/log round trip)
    clip: float = 1.0  # L2 bound of one report under secure aggregation and DP

    @classmethod
    def of(cls, hg, hp: RoundHyperparams):
        """The learner of a ``Hypergradients`` setting from the run's initial hyperparameters
        (None for None: the round keeps its fixed hyperparameters)."""
        if hg is None:
            return None
        return cls.start(hg.learn, hp, float(hg.learning_rate), hg.optimizer, hg.ranges(),
                         float(hg.clip_norm))

    @classmethod
    def start(cls, names, hp: RoundHyperparams, learning_rate: float, optimizer: str,
              ranges: dict | None = None, clip: float = 1.0):
        """From the run's initial hyperparameters, which must lie in the learnable ``ranges``
        ({name: (low, high)}, natural units; ``Hypergradients.ranges``)."""
        ranges = {**DEFAULT_BOUNDS, **(ranges or {})}
        given = {"server_learning_rate": hp.server_learning_rate,
                 "momentum": hp.server_options.get("momentum", 0.9),
                 "weight_exponent": hp.weight_exponent}
        for n in names:
            lo, hi = ranges[n]
            if not lo <= given[n] <= hi:
                raise ValueError(f"{n}={given[n]:g} starts outside its learnable range "
                                 f"[{lo:g}, {hi:g}]; start inside it or widen "
                                 f"Hypergradients(bounds={{{n!r}: (low, high)}})")
        z = np.array([_to_z(n, given[n]) for n in names], np.float64)
        opt = Adam(learning_rate, epsilon=1e-8) if optimizer == "adam" else SGD(learning_rate)
        learner = cls(tuple(names), opt, z, opt.init({"z": z}))
        learner.zbounds = np.array([[_to_z(n, ranges[n][0]), _to_z(n, ranges[n][1])]
                                    for n in names])
        learner.initial = {n: float(given[n]) for n in names}  # exact, no exp/log round trip
        learner.clip = float(clip)
        return learner

    def values(self) -> dict:
        if self.t == 0 and self.initial:
            return {**self._values(), **self.initial}
        return self._values()

    def _values(self) -> dict:
        out = {}
        for n, z in zip(self.names, self.z):
            out[n] = float(np.exp(z)) if n == "server_learning_rate" else \
                _sigmoid(z) if n == "momentum" else float(z)
        return out

    def hyperparams(self, base: RoundHyperparams) -> RoundHyperparams:
        v = self.values()
        options = dict(base.server_options)
        if "momentum" in v:
            options["momentum"] = v["momentum"]
        return replace(base, server_learning_rate=v.get("server_learning_rate",
                                                        base.server_learning_rate),
                       server_options=options,
                       weight_exponent=v.get("weight_exponent", base.weight_exponent))

    # ------------------------------------------------------------------ the hypergradient
    def update(self, g: np.ndarray | None) -> dict:
        """One hyper-optimizer step from the reporting cohort's mean derivative ``g`` (the
        aggregator's ``report_mean``; None: no report counted, no step). Returns the round's
        record entries."""
        if g is None or not np.isfinite(g).all():
            return {}
        g = np.asarray(g, np.float64)
        self.last_grad = g
        self.t += 1
        self.state, new = self.optimizer.step(self.state, {"z": self.z}, {"z": -g})
        lo, hi = self.zbounds[:, 0], self.zbounds[:, 1]
        self.z = np.clip(new["z"], lo, hi)
        at = [n for n, z, a, b in zip(self.names, self.z, lo, hi) if z <= a or z >= b]
        return {**{f"hypergrad_{n}": float(x) for n, x in zip(self.names, g)},
                "hyper_at_bound": at}

    # ------------------------------------------------------------------ the tangents
    def after_step(self, opt: ServerOptimizer, state_before: dict, state_after: dict,
                   delta: GlobalDelta, out: ClientOutputs, hp: RoundHyperparams, shape):
        """Tangents of the new global model with respect to each z, for the next round: the
        server optimizer's own (``opt.tangent``), and the weight exponent's through the mean."""
        n_items, K = shape
        eta = hp.server_learning_rate
        H = len(self.names)
        TQ, Tb = np.zeros((H, n_items, K)), np.zeros((H, n_items))
        for h, name in enumerate(self.names):
            if name == "weight_exponent":
                items, dQ, db = delta.exponent_terms if delta.exponent_terms is not None \
                    else exponent_derivative(out, hp)
                TQ[h, items], Tb[h, items] = eta * dQ, eta * db
            else:
                TQ[h], Tb[h] = opt.tangent(name, state_before, state_after, delta, eta,
                                           hp.server_options, shape)
        self.tangents = (TQ, Tb)


def exponent_derivative(out: ClientOutputs, hp: RoundHyperparams):
    """∂Δ̄/∂α of the weighted mean Δ̄ = Σ w_i Δ_i / Σ w_i with w_i = n_i^α: the mean of the
    deltas weighted by w_i (ln n_i − L̄) (rows, dQ, db), summed in the aggregator's order."""
    K = out.d_Q.shape[1]
    _, w, _, owner, valid, order = entries(out, hp)
    if order is None:
        return np.zeros(0, np.int64), np.zeros((0, K)), np.zeros(0)
    logn = np.log(np.where(w > 0, out.weights, 1.0))
    mean_log = float(w @ logn / w.sum())
    scale = np.where(valid, (w * (logn - mean_log))[owner] / w.sum(), 0.0)
    n_valid = int(valid.sum())
    dq, db, items = np.empty((n_valid, K)), np.empty(n_valid), np.empty(n_valid, np.int64)
    m = sum_sorted_runs(order, out.items, out.d_Q, out.d_b, scale, dq, db, items)
    return items[:m], dq[:m], db[:m]


def check_learnable(est, hg: Hypergradients, stateful: bool) -> None:
    """The combinations learned hyperparameters need, with the parameter to change."""
    opt = est._server_optimizer()
    for name in hg.learn:
        if name not in opt.learnable:
            raise ValueError(f"hypergradients differentiate through the server step: "
                             f"server_optimizer={opt!r} can learn {list(opt.learnable) or 'none'}"
                             f", not {name!r} (SGD and Momentum have tangents; 'momentum' needs "
                             "Momentum)")
    agg = est._aggregator()
    plain = type(agg) is WeightedMean
    if not (plain or agg.secure or agg.sampling == "poisson"):
        raise ValueError(f"hypergradients need a summing aggregator (aggregator=None, "
                         f"SecureAggregation or DifferentialPrivacy), got aggregator={agg!r}: the "
                         "reports' mean and the server step's tangents are those of the weighted "
                         "mean (and next to a robust statistic, one client could steer the "
                         "reports' mean)")
    if "weight_exponent" in hg.learn and not (plain or (agg.secure and
                                                        agg.sampling != "poisson")):
        raise ValueError(f"learning weight_exponent needs the weighted mean (aggregator=None) "
                         f"or SecureAggregation, got aggregator={agg!r}: DP weighs each client "
                         "by its clipped upload (and capped query size), not by n_i^α")
    if hg.holdout and stateful:
        raise ValueError(f"hypergradients__holdout={hg.holdout} needs FedReconMF: FedAvg/FURL "
                         "clients report the loss of their stored user rows, which held-out "
                         "users never train; leave holdout=None (0 here)")
    if est.checkpoint_path is not None:
        raise ValueError("hypergradients cannot be combined with checkpoint_path yet (the "
                         "hyper-optimizer's state is not checkpointed); use one or the other")
