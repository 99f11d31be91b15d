"""Offline (off-policy) CTR evaluation from logged impressions.

Log format — a pandas DataFrame, one row per impression (one slate position shown once):

=============  ==============================================================================
column         meaning
=============  ==============================================================================
``action``     the item shown (any hashable id)
``position``   slate position (integer; any numbering, used as a key)
``reward``     1 if clicked, else 0 (any finite number is accepted for non-binary rewards)
``propensity`` the logging policy's probability of showing ``action`` at ``position`` for this
               context, in (0, 1]
``context``    optional: a user / context id, used by reward models and context-aware targets
=============  ==============================================================================

A *target policy* is given as ``target_probs``: for every logged row, the probability that the
target shows the logged action at the logged position in that row's context (π_e(a_i | x_i, k_i)).
For a deterministic target this is 0 or 1. The Direct Method and Doubly Robust also need a reward
model: ``q_logged`` (its prediction for the logged action) and ``q_target`` (its expected reward
under the target at that row's position and context, Σ_a π_e(a | x, k) q̂(x, a, k)).

Estimators of the target's CTR (mean reward per impression), with w = π_e / π_0:

- replay  : Σ π_e r / Σ π_e   (Li et al. 2011: the plain mean reward over the logged rows whose
            action the target would have taken — no propensity weighting; for a stochastic
            target each row counts with the target's probability of its action). Unbiased only
            when the logging policy is uniform over the actions: a log whose propensities
            differ warns (``ReplayBiasWarning``); use snips or ips there.
- ips     : mean(w r)
- snips   : Σ w r / Σ w
- dm      : mean(q_target)
- dr      : mean(q_target + w (r − q_logged))

Rows with propensity 0 cannot be reweighted: they are refused (``zero_propensity="error"``, the
default, naming the row) or dropped and counted (``"drop"``). Intervals are percentile bootstrap
intervals over rows or (``interval="normal"``, what large logs need) normal intervals, SNIPS's by
the delta method; the reward model is held fixed, so DM's interval only reflects row sampling,
not the model's own error (it is far too narrow on small logs). Rows are treated as
independent: for slates, where rows of one slate share a user, use ``estimate_slate_ctr``.

Every estimate carries the diagnostics of the importance weights: effective sample size
(Σw)²/Σw², its share of the rows, the largest weight and the share of rows the target could have
produced (w > 0). An ``OverlapWarning`` says when the ESS is below ``min_ess``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..datasets import DataValidationError
from ..datasets._validation import show

LOG_COLUMNS = ("action", "position", "reward", "propensity")
ESTIMATORS = ("replay", "ips", "snips", "dm", "dr")


class ReplayBiasWarning(UserWarning):
    """replay was asked of a log whose logging policy is not uniform: it is biased there.

    Raised (as a warning) with the range of the log's propensities.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from fedcf.eval import ReplayBiasWarning, estimate_ctr
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = estimate_ctr(np.ones(4), np.array([0.9, 0.1, 0.9, 0.1]), np.full(4, 0.5),
    ...                      n_bootstrap=0, estimators=("replay",))
    >>> caught[0].category is ReplayBiasWarning
    True
    """


def warn_if_replay_biased(propensity: np.ndarray, estimators) -> None:
    """replay ignores the propensities, which is right only for uniform logging (the same
    propensity on every row of a context-free log): say so when they differ."""
    if "replay" not in estimators or not len(propensity):
        return
    low, high = float(propensity.min()), float(propensity.max())
    if high > low * (1 + 1e-9):
        warnings.warn(f"replay assumes a uniform logging policy, but the log's propensities "
                      f"range from {low:.4g} to {high:.4g}: its estimate is biased toward what "
                      "the logging policy favoured; read snips or ips instead",
                      ReplayBiasWarning, stacklevel=3)


class OverlapWarning(UserWarning):
    """The logging and target policies overlap too little for an estimate to mean much.

    Raised (as a warning) with the effective sample size, the largest weight and the share of
    matched rows, or with the target's mass on actions the log never shows.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from fedcf.eval import OverlapWarning, estimate_ctr
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = estimate_ctr(np.ones(50), np.full(50, 0.5), np.r_[1.0, np.zeros(49)],
    ...                      n_bootstrap=0, estimators=("ips",))
    >>> caught[0].category is OverlapWarning
    True
    """


def _unit(x: np.ndarray) -> tuple[np.ndarray, float]:
    """(x / max |x|, max |x|), or (x, 1) for an empty or all-zero x: sums of squares of the
    scaled values cannot overflow however large the weights."""
    top = float(np.max(np.abs(x))) if len(x) else 0.0
    return (x / top, top) if top > 0 else (x, 1.0)


def weight_diagnostics(w) -> dict:
    """ESS = (Σw)²/Σw², its share of the weights, the largest absolute weight, the share of
    non-zero weights."""
    w = np.asarray(w, np.float64)
    u, top = _unit(w)  # ESS is scale-free: no overflow for weights near 1e300
    ss = float(np.sum(u * u))
    ess = float(np.sum(u) ** 2 / ss) if ss > 0 else 0.0
    return {"ess": ess, "ess_share": ess / len(w) if len(w) else 0.0,
            "max_weight": float(np.max(np.abs(w))) if len(w) else 0.0,
            "matched_share": float(np.mean(w != 0)) if len(w) else 0.0}


def warn_overlap(diag: dict, n: int, min_ess: float, what: str, name: str | None = None):
    """An ``OverlapWarning`` with the numbers when ``diag``'s ESS is below ``min_ess``."""
    if diag["ess"] < min_ess:
        warnings.warn(f"{f'estimator {name!r}: ' if name else ''}effective sample size "
                      f"{diag['ess']:.1f} of {n} {what} (largest weight "
                      f"{diag['max_weight']:.4g}, {diag['matched_share']:.1%} non-zero) is below "
                      f"min_ess={min_ess}: the logging policy rarely shows what the target "
                      "would, so the estimate rests on a few impressions", OverlapWarning,
                      stacklevel=3)


def validate_log(log: pd.DataFrame, *, actions=None, zero_propensity: str = "error"
                 ) -> pd.DataFrame:
    """Check a log and return it (rows with propensity 0 removed when ``zero_propensity="drop"``;
    the number dropped is in ``result.attrs["dropped_zero_propensity"]``).

    Errors name the column, the row and the value: a missing column, a non-finite reward, a
    propensity outside [0, 1] (0 only with "drop"), an action outside ``actions``.
    """
    if not isinstance(log, pd.DataFrame):
        raise TypeError(f"the log must be a pandas DataFrame, got {type(log).__name__}")
    missing = [c for c in LOG_COLUMNS if c not in log.columns]
    if missing:
        raise DataValidationError(
            f"log column {missing[0]!r} not found; a log needs {list(LOG_COLUMNS)} "
            f"(optional 'context'), it has {list(log.columns)}")
    if len(log) == 0:
        raise DataValidationError("the log is empty")
    if zero_propensity not in ("error", "drop"):
        raise ValueError(f"zero_propensity must be 'error' or 'drop', got {zero_propensity!r}")
    for col in ("reward", "propensity"):
        vals = pd.to_numeric(log[col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(vals)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataValidationError(
                f"log column {col!r} has non-numeric or non-finite value "
                f"{show(log[col].iloc[row])} at row {row}")
    prop = log["propensity"].to_numpy(np.float64)
    bad = (prop < 0) | (prop > 1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataValidationError(
            f"log column 'propensity' has value {show(prop[row])} at row {row}, outside [0, 1]")
    zero = prop == 0
    out = log
    if zero.any():
        if zero_propensity == "error":
            row = int(np.flatnonzero(zero)[0])
            raise DataValidationError(
                f"log column 'propensity' is 0 at row {row} ({int(zero.sum())} rows in all): such "
                "impressions cannot be reweighted; pass zero_propensity='drop' to leave them out")
        out = log.loc[~zero].copy()
    if actions is not None:
        known = pd.Index(pd.unique(np.asarray(list(actions), dtype=object)))
        pos = known.get_indexer(pd.Index(out["action"].to_numpy(dtype=object)))
        if np.any(pos < 0):
            row = int(np.flatnonzero(pos < 0)[0])
            raise DataValidationError(
                f"log column 'action' has unknown action {show(out['action'].iloc[row])} at row {row}")
    out.attrs["dropped_zero_propensity"] = int(zero.sum())
    return out


def _arrays(n, reward, propensity, target_probs, q_logged=None, q_target=None):
    arrs = {"reward": reward, "propensity": propensity, "target_probs": target_probs,
            "q_logged": q_logged, "q_target": q_target}
    out = {}
    for k, v in arrs.items():
        if v is None:
            continue
        a = np.asarray(v, dtype=np.float64)
        if a.shape != (n,):
            raise ValueError(f"{k} must have one value per logged row ({n}), got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            row = int(np.flatnonzero(~np.isfinite(a))[0])
            raise ValueError(f"{k} has a non-finite value {show(a[row])} at row {row}")
        out[k] = a
    bad = (out["propensity"] <= 0) | (out["propensity"] > 1)
    if np.any(bad):
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"propensity is {show(out['propensity'][row])} at row {row}, outside (0, 1]; "
                         "validate the log with validate_log(..., zero_propensity='drop') first")
    if np.any((out["target_probs"] < 0) | (out["target_probs"] > 1)):
        row = int(np.flatnonzero((out["target_probs"] < 0) | (out["target_probs"] > 1))[0])
        raise ValueError(f"target_probs[{row}] = {show(out['target_probs'][row])} is not a probability")
    with np.errstate(over="ignore"):
        huge = ~np.isfinite(out["target_probs"] / out["propensity"])
    if huge.any():
        row = int(np.flatnonzero(huge)[0])
        raise ValueError(f"propensity is {show(out['propensity'][row])} at row {row}: its "
                         "importance weight overflows float64; a logging probability this small "
                         "is a logging error (drop or fix the row)")
    return out


def _point(name, a, idx=None):
    r = a["reward"] if idx is None else a["reward"][idx]
    p0 = a["propensity"] if idx is None else a["propensity"][idx]
    pe = a["target_probs"] if idx is None else a["target_probs"][idx]
    w = pe / p0
    if name == "ips":
        return float(np.mean(w * r))
    if name == "snips":  # scale-free too: divide by the largest weight first
        u = _unit(w)[0]
        s = u.sum()
        return float(np.sum(u * r) / s) if s > 0 else float("nan")
    if name == "replay":
        s = pe.sum()
        return float(np.sum(pe * r) / s) if s > 0 else float("nan")
    qt = a["q_target"] if idx is None else a["q_target"][idx]
    if name == "dm":
        return float(np.mean(qt))
    ql = a["q_logged"] if idx is None else a["q_logged"][idx]
    return float(np.mean(qt + w * (r - ql)))


def _influence(name, a):
    """Per-row terms whose mean is the estimate (SNIPS: its delta-method influence)."""
    w = a["target_probs"] / a["propensity"]
    r = a["reward"]
    if name == "ips":
        return w * r
    if name == "snips":
        est = np.sum(w * r) / np.sum(w)
        return est + (w * r - est * w) / np.mean(w)
    if name == "replay":
        pe = a["target_probs"]
        est = np.sum(pe * r) / np.sum(pe)
        return est + (pe * r - est * pe) / np.mean(pe)
    if name == "dm":
        return a["q_target"]
    return a["q_target"] + w * (r - a["q_logged"])


def _normal(name, a, alpha):
    from scipy.stats import norm

    if name in ("snips", "replay") and not np.any(a["target_probs"] > 0):
        return (float("nan"),) * 3
    v = _influence(name, a)
    u, top = _unit(v)  # the spread of v / top, rescaled: no overflow near 1e300
    sd = float(top * u.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    z = norm.ppf(1 - alpha / 2)
    return _point(name, a) - z * sd, _point(name, a) + z * sd, sd


def _bootstrap(name, a, boots, alpha):
    samples = np.array([_point(name, a, b) for b in boots])
    samples = samples[np.isfinite(samples)]
    if not len(samples):
        return (float("nan"),) * 3
    lo, hi = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi), float(samples.std())


def estimate_ctr(reward, propensity, target_probs, *, q_logged=None, q_target=None,
                 estimators=None, n_bootstrap: int = 500, alpha: float = 0.05,
                 interval: str = "bootstrap", min_ess: float = 100.0,
                 random_state=0) -> pd.DataFrame:
    """Estimates of the target policy's CTR with intervals and weight diagnostics.

    Returns a DataFrame indexed by estimator with columns estimate, low, high, std (of the
    estimate), n (rows), ess, ess_share, max_weight, matched_share. ``estimators``: names
    from ``ESTIMATORS``; None (default) runs all of them, DM and DR only when reward model
    predictions (``q_logged`` and ``q_target``) are given (naming them without one is an
    error).
    ``interval``: "bootstrap" (``n_bootstrap`` resamples of rows; 0 for none) or "normal".
    """
    n = len(np.asarray(reward))
    if n == 0:
        raise ValueError("estimate_ctr needs at least one logged row")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (0.05 gives a 95 % interval), got {alpha!r}")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) \
            or n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be an integer >= 0, got {n_bootstrap!r}")
    if interval not in ("bootstrap", "normal"):
        raise ValueError(f"interval must be 'bootstrap' or 'normal', got {interval!r}")
    a = _arrays(n, reward, propensity, target_probs, q_logged, q_target)
    if estimators is None:
        estimators = tuple(e for e in ESTIMATORS if e not in ("dm", "dr")
                           or ("q_logged" in a and "q_target" in a))
    if isinstance(estimators, str):
        raise TypeError(f"estimators must be a list of names, got the string {estimators!r}; "
                        f"wrap one name in a list: [{estimators!r}]")
    unknown = set(estimators) - set(ESTIMATORS)
    if unknown:
        raise ValueError(f"unknown estimators {sorted(unknown)}; choose from {list(ESTIMATORS)}")
    need_model = {"dm", "dr"} & set(estimators)
    if need_model and ("q_logged" not in a or "q_target" not in a):
        raise ValueError(f"{sorted(need_model)} need a reward model: pass q_logged and q_target")
    warn_if_replay_biased(a["propensity"], estimators)
    boots = None
    if interval == "bootstrap" and n_bootstrap:
        boots = np.random.default_rng(random_state).integers(0, n, size=(n_bootstrap, n))
    diag = weight_diagnostics(a["target_probs"] / a["propensity"])
    rows = []
    for name in estimators:
        if interval == "normal":
            lo, hi, sd = _normal(name, a, alpha)
        elif boots is not None:
            lo, hi, sd = _bootstrap(name, a, boots, alpha)
        else:
            lo = hi = sd = float("nan")
        rows.append({"estimator": name, "estimate": _point(name, a), "low": float(lo),
                     "high": float(hi), "std": sd, "n": n, **diag})
    if set(estimators) - {"dm"}:
        warn_overlap(diag, n, min_ess, "rows")
    return pd.DataFrame(rows).set_index("estimator")


def relative_errors(estimates: pd.DataFrame, truth: float) -> pd.Series:
    """The absolute error relative to the truth, abs(estimate − truth) / truth, for each estimator."""
    if not truth > 0:
        raise ValueError(f"truth must be positive to form relative errors, got {truth!r}")
    return (estimates["estimate"] - truth).abs() / truth


class PositionActionRewardModel:
    """A simple reward model for context-free logs: smoothed click rate per (action, position).

    q̂(a, k) = (clicks(a, k) + m · ctr(k)) / (shows(a, k) + m), where ctr(k) is the position's
    mean; ``m`` (prior strength) shrinks rarely shown pairs to their position's mean.

    Parameters
    ----------
    prior_strength : float, default 20
        m, the pseudo-count of the position's mean click rate.

    Examples
    --------
    >>> from fedcf.eval import PositionActionRewardModel
    >>> PositionActionRewardModel(prior_strength=5.0).prior_strength
    5.0
    """

    def __init__(self, prior_strength: float = 20.0):
        self.prior_strength = prior_strength

    def fit(self, log: pd.DataFrame):
        g = log.groupby(["action", "position"])["reward"].agg(["sum", "count"])
        pos_ctr = log.groupby("position")["reward"].mean()
        self.pos_ctr_ = pos_ctr
        m = self.prior_strength
        prior = pos_ctr.reindex(g.index.get_level_values("position")).to_numpy()
        self.table_ = pd.Series((g["sum"].to_numpy() + m * prior) / (g["count"].to_numpy() + m),
                                index=g.index)
        return self

    def predict(self, actions, positions) -> np.ndarray:
        idx = pd.MultiIndex.from_arrays([np.asarray(actions), np.asarray(positions)])
        q = self.table_.reindex(idx).to_numpy()
        fallback = self.pos_ctr_.reindex(np.asarray(positions)).to_numpy()
        q = np.where(np.isnan(q), fallback, q)
        return np.where(np.isnan(q), float(self.pos_ctr_.mean()), q)

    def expected(self, action_probs: pd.DataFrame, positions) -> np.ndarray:
        """Σ_a π(a | k) q̂(a, k) per row, for a context-free target given as a DataFrame with
        columns position, action, prob."""
        tab = action_probs.copy()
        tab["q"] = self.predict(tab["action"], tab["position"])
        per_pos = (tab["prob"] * tab["q"]).groupby(tab["position"]).sum()
        return per_pos.reindex(np.asarray(positions)).to_numpy()
