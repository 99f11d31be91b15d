"""Off-policy estimators for slates: several positions shown together, one reward per position.

Slate log — a DataFrame with one row per position of a logged slate:

======================  =========================================================================
column                  meaning
======================  =========================================================================
``slate_id``            the logged slate the row belongs to (rows of one slate share it)
``position``            the row's position; within a slate, positions are distinct and their
                        order is the order a user scans them
``action``, ``reward``  the item shown there and its reward (1 = click)
``propensity``          π0(a_k | x, k): the logging policy's *marginal* probability of showing
                        this action at this position
``slate_propensity``    optional: π0(s | x), of the whole slate (standard slate IPS)
``cascade_propensity``  optional: π0(a_1..a_k | x), of the slate's positions up to and including
                        this one (RIPS, cascade DR)
``context``             optional: the user / context id
======================  =========================================================================

A logging policy that draws each position independently (``factored=True``) needs no joint
columns: they are the products of the per-position propensities. The target is given the same
way, per row: ``target_probs`` π_e(a_k | x, k), and for a target that is not factored
``target_cascade`` π_e(a_1..a_k | x) and ``target_slate`` π_e(s | x).

Every estimate is a CTR (mean reward per shown position), i.e. the slate value divided by the
slate length L. With w_k = π_e(a_k)/π0(a_k), w_{1:k} the prefix ratio and w_s the slate ratio:

- ``iips``  independent IPS (Li et al. 2018): mean over slates of (1/L) Σ_k w_k r_k. Unbiased when
  a position's reward depends only on its own action (a position-based click model).
- ``rips``  reward-interaction IPS (McInerney et al. 2020): (1/L) Σ_k w_{1:k} r_k. Unbiased when a
  position's reward depends on the positions above it (cascade).
- ``sips``  standard slate IPS, the whole slate as one action: w_s (1/L) Σ_k r_k. Unbiased for any
  reward, with the largest variance ("plain IPS" on slates).
- ``pi``    pseudo-inverse (Swaminathan et al. 2017) for a factored logging policy:
  (Σ_k w_k − L + 1)(1/L) Σ_k r_k. Unbiased for rewards additive over positions.
- ``cascade_dr``  cascade doubly robust (Kiyohara et al. 2022):
  (1/L) Σ_k [w_{1:k} (r_k − q̂_k) + w_{1:k−1} q̄_k], q̂_k the reward model at the logged action
  (``q_logged``), q̄_k its expectation under the target at that position (``q_target``).
- ``dros``  doubly robust with optimistic shrinkage (Su et al. 2020), per position:
  (1/L) Σ_k [q̄_k + ŵ_k (r_k − q̂_k)], ŵ = λw/(w² + λ); λ from ``shrinkage`` or, by default,
  the value of a grid that minimises the estimated MSE (bias² + variance / n).

Intervals are normal (mean ± z·sd/√n over slates, so positions of a slate are not treated as
independent) or, with ``interval="bootstrap"``, percentile intervals over resampled slates.
Every estimate carries the diagnostics of the weights it uses: effective sample size
ESS = (Σw)²/Σw², the largest weight and the share of non-zero weights; an ``OverlapWarning`` is
raised when the ESS is below ``min_ess``.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import pandas as pd

from ..datasets import DataValidationError
from .offline import OverlapWarning, validate_log, warn_overlap, weight_diagnostics

SLATE_ESTIMATORS = ("iips", "rips", "sips", "pi", "cascade_dr", "dros")
_NEEDS = {"rips": "cascade", "cascade_dr": "cascade", "sips": "slate"}
SHRINKAGE_GRID = tuple(10.0 ** np.arange(-2, 6.5, 0.5))


def _name_rows(mask, labels, what="row") -> str:
    bad = np.flatnonzero(mask)
    shown = ", ".join(str(labels[i]) for i in bad[:5])
    return f"{what}s {shown}" + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")


def integer_positions(position: pd.Series, what: str) -> pd.Series:
    """Slate positions as integers: they are ranks, and the estimators order a slate by them
    (text would sort "10" before "2"). Integral floats are taken; anything else is refused,
    naming the row."""
    values = position.to_numpy()
    if values.dtype.kind in "iu":
        return position
    if values.dtype.kind == "f" and np.isfinite(values).all() and (values == np.round(values)).all():
        return position.astype(np.int64)
    bad = next(i for i, v in enumerate(values) if isinstance(v, (bool, np.bool_)) or not (
        isinstance(v, (numbers.Integral, np.integer)) or (isinstance(v, (float, np.floating))
                                                          and float(v).is_integer())))
    raise DataValidationError(
        f"{what} column 'position' must hold integer ranks, got {values[bad]!r} "
        f"({type(values[bad]).__name__}) at row {bad}: positions order a slate, and text would "
        f"sort '10' before '2'; convert with {what}['position'] = {what}['position'].astype(int)")


def _check_slates(log: pd.DataFrame) -> pd.DataFrame:
    """Sort by (slate_id, position); distinct positions per slate (else the slate is named)."""
    if "slate_id" not in log.columns:
        raise DataValidationError(
            "slate estimators need column 'slate_id' (which logged slate each row belongs to); "
            f"the log has {list(log.columns)}. A log of single impressions can only be "
            "evaluated by estimate_ctr")
    for col in ("slate_id", "position"):
        if log[col].isna().any():
            row = int(np.flatnonzero(log[col].isna().to_numpy())[0])
            raise DataValidationError(f"log column {col!r} is missing at row {row}")
    out = log.reset_index(drop=True)
    out["position"] = integer_positions(out["position"], "log")
    out = out.iloc[np.lexsort((out["position"].to_numpy(), pd.factorize(out["slate_id"])[0]))]
    dup = out.duplicated(["slate_id", "position"]).to_numpy()
    if dup.any():
        where = _name_rows(dup, out["slate_id"].to_numpy(), "slate")
        raise DataValidationError(f"a slate shows two actions at one position: {where}")
    return out


def _joint_column(log, col, factored, what):
    """The log's ``col`` (slate or cascade propensities), or their products when factored."""
    prop = log["propensity"].to_numpy(np.float64)
    sid = pd.factorize(log["slate_id"])[0]
    derived = _cumprod_by(prop, sid)
    if col == "slate_propensity":
        derived = _last_by(derived, sid)
    if col not in log.columns:
        if not factored:
            raise DataValidationError(
                f"{what} needs column {col!r} (or factored=True when the logging policy draws "
                "each position independently, so it is the product of the propensities)")
        return derived
    given = pd.to_numeric(log[col], errors="coerce").to_numpy(np.float64)
    bad = ~((given > 0) & (given <= 1))
    if bad.any():
        raise DataValidationError(f"log column {col!r} is not in (0, 1] at "
                                  f"{_name_rows(bad, log.index.to_numpy())}")
    if col == "slate_propensity":
        varies = given != _last_by(given, sid)
        above = given > _last_by(pd.Series(prop).groupby(sid).transform("min").to_numpy(), sid) \
            * (1 + 1e-9)
        if (varies | above).any():
            raise DataValidationError(
                "log column 'slate_propensity' must be one value per slate, no larger than any of "
                "its positions' propensities; it is not at "
                f"{_name_rows(varies | above, log['slate_id'].to_numpy(), 'slate')}")
    if factored:
        off = ~np.isclose(given, derived, rtol=1e-6, atol=0)
        if off.any():
            raise DataValidationError(
                f"log column {col!r} is not the product of the slate's per-position propensities "
                f"(factored=True) at {_name_rows(off, log['slate_id'].to_numpy(), 'slate')}")
    return given


def _cumprod_by(x, group):
    """Running product of x within consecutive groups."""
    out = np.empty_like(x)
    acc, prev = 1.0, None
    for i, g in enumerate(group):
        acc = x[i] if g != prev else acc * x[i]
        out[i], prev = acc, g
    return out


def _last_by(x, group):
    """Each row gets the value of its group's last row (groups consecutive)."""
    ends = np.r_[np.flatnonzero(np.diff(group)), len(group) - 1]
    return np.repeat(x[ends], np.diff(np.r_[-1, ends]))


def _check_cascade(log, casc):
    """Prefix probabilities cannot grow down a slate and start at the first position's."""
    sid = pd.factorize(log["slate_id"])[0]
    first = np.r_[True, sid[1:] != sid[:-1]]
    prop = log["propensity"].to_numpy(np.float64)
    grow = np.r_[False, (casc[1:] > casc[:-1] * (1 + 1e-9)) & ~first[1:]]
    start = first & ~np.isclose(casc, prop, rtol=1e-6, atol=0)
    bad = grow | start | (casc > prop * (1 + 1e-9))
    if bad.any():
        raise DataValidationError(
            "log column 'cascade_propensity' is inconsistent (it must equal the first position's "
            "propensity, never exceed the row's own propensity and never grow down the slate) at "
            f"{_name_rows(bad, log['slate_id'].to_numpy(), 'slate')}")


def check_propensity_sums(log: pd.DataFrame, *, tol: float = 1e-9) -> None:
    """Propensities that cannot come from one policy: the same (context, position, action)
    logged with different propensities, or distinct actions at one (context, position) whose
    propensities add up to more than 1. Raises DataValidationError naming the rows."""
    keys = ["context", "position"] if "context" in log.columns else ["position"]
    frame = log[keys + ["action", "propensity"]].reset_index(drop=True)
    spread = frame.groupby(keys + ["action"])["propensity"].transform(lambda p: p.max() - p.min())
    bad = spread.to_numpy() > tol
    if bad.any():
        raise DataValidationError(
            f"the same {'(context, position, action)' if len(keys) == 2 else '(position, action)'}"
            f" is logged with different propensities at {_name_rows(bad, frame.index)}; a "
            "policy that changed over time needs a context that tells its versions apart")
    first = frame.drop_duplicates(keys + ["action"])
    total = first.groupby(keys)["propensity"].sum()
    over = total[total > 1 + tol]
    if len(over):
        key = over.index[0]
        rows = frame.index[(frame.set_index(keys).index == key)]
        raise DataValidationError(
            f"distinct actions logged at {dict(zip(keys, np.atleast_1d(key)))} have propensities "
            f"summing to {over.iloc[0]:.6g} > 1 (rows {', '.join(map(str, rows[:5]))}); "
            "propensities must be the logging policy's probability of the shown action")


def validate_slate_log(log: pd.DataFrame, *, estimators=SLATE_ESTIMATORS, factored: bool = False,
                       check_sums: bool = True) -> tuple[pd.DataFrame, dict]:
    """Check a slate log for ``estimators`` and return (the log sorted by slate and position,
    the propensity arrays {"marginal", "cascade", "slate"} they need, aligned with it)."""
    unknown = set(estimators) - set(SLATE_ESTIMATORS)
    if unknown:
        raise ValueError(f"unknown slate estimators {sorted(unknown)}; choose from "
                         f"{list(SLATE_ESTIMATORS)}")
    log = _check_slates(validate_log(log))
    if check_sums:
        check_propensity_sums(log)
    props = {"marginal": log["propensity"].to_numpy(np.float64)}
    for name in estimators:
        need = _NEEDS.get(name)
        if need and need not in props:
            col = f"{need}_propensity"
            props[need] = _joint_column(log, col, factored, f"estimator {name!r}")
            if need == "cascade":
                _check_cascade(log, props[need])
    if "pi" in estimators and not factored:
        raise DataValidationError(
            "estimator 'pi' (pseudo-inverse) is derived for a logging policy that draws each "
            "position independently; pass factored=True if yours does, or leave 'pi' out")
    return log, props


def _per_row(name, values, n, order):
    """A per-row target / model array, checked and put in the sorted log's order."""
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{name} must have one value per logged row ({n}), got shape {a.shape}")
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{name} has a non-finite value at row {int(np.flatnonzero(bad)[0])}")
    return a[order]


def _target(name, given, marginal, sid, factored_target):
    """The target's cascade or slate probabilities: given, or products when factored."""
    if given is not None:
        return given
    if not factored_target:
        raise ValueError(f"target_{name} is needed (or factored_target=True when the target "
                         "draws each position independently)")
    casc = _cumprod_by(marginal, sid)
    return casc if name == "cascade" else _last_by(casc, sid)


def _slate_sum(x, sid, n_slates):
    return np.bincount(sid, weights=x, minlength=n_slates)


def _contributions(name, a, lam=None):
    """(per-slate values, the weights this estimator uses) for one estimator; ``a`` holds the
    sorted arrays (see ``estimate_slate_ctr``)."""
    sid, ns, L, r = a["sid"], a["n_slates"], a["L"], a["reward"]
    w = a["pe"] / a["p0"]
    sum_r = _slate_sum(r, sid, ns)
    if name == "iips":
        return _slate_sum(w * r, sid, ns) / L, w
    if name in ("rips", "cascade_dr"):
        W = a["cascade_e"] / a["cascade_0"]
        if name == "rips":
            return _slate_sum(W * r, sid, ns) / L, W
        W_prev = np.where(a["first"], 1.0, np.r_[1.0, W[:-1]])
        terms = W * (r - a["q_logged"]) + W_prev * a["q_target"]
        return _slate_sum(terms, sid, ns) / L, W
    if name == "sips":
        Ws = a["slate_e"][a["ends"]] / a["slate_0"][a["ends"]]
        return Ws * sum_r / L, Ws
    if name == "pi":
        Wpi = _slate_sum(w, sid, ns) - L + 1
        return Wpi * sum_r / L, Wpi
    wh = w if lam is None else lam * w / (w * w + lam)
    return _slate_sum(a["q_target"] + wh * (r - a["q_logged"]), sid, ns) / L, wh


def _choose_shrinkage(a, grid):
    """λ of the grid minimising (mean(v_λ − v_DR))² + var(v_λ)/n (DR, λ = ∞, is unbiased)."""
    v_dr = _contributions("dros", a)[0]
    n = len(v_dr)

    def mse(lam):
        v = _contributions("dros", a, lam)[0]
        return np.mean(v - v_dr) ** 2 + v.var(ddof=1) / n if n > 1 else np.inf
    scores = [mse(lam) for lam in grid]
    return float(grid[int(np.argmin(scores))])


def _interval(v, kind, alpha, n_bootstrap, rng):
    from scipy.stats import norm

    n = len(v)
    sd = float(v.std(ddof=1)) / np.sqrt(n) if n > 1 else float("nan")
    if kind == "normal":
        z = norm.ppf(1 - alpha / 2)
        return float(v.mean() - z * sd), float(v.mean() + z * sd), sd
    b = v[rng.integers(0, n, size=(n_bootstrap, n))].mean(axis=1)
    return float(np.quantile(b, alpha / 2)), float(np.quantile(b, 1 - alpha / 2)), float(b.std())


def _default_estimators(factored, has_model):
    names = ["iips", "rips", "sips"] + (["pi"] if factored else [])
    return tuple(names + (["cascade_dr", "dros"] if has_model else []))


def _slate_arrays(log, estimators, factored, check_sums, target_probs, target_cascade,
                  target_slate, factored_target, model):
    """The validated log as the arrays ``_contributions`` reads, sorted by slate and position."""
    srt, props = validate_slate_log(log, estimators=estimators, factored=factored,
                                    check_sums=check_sums)
    order, n = srt.index.to_numpy(), len(log)
    sid = pd.factorize(srt["slate_id"])[0]
    a = {"sid": sid, "n_slates": int(sid.max()) + 1, "reward": srt["reward"].to_numpy(np.float64),
         "p0": props["marginal"], "pe": _per_row("target_probs", target_probs, n, order),
         "first": np.r_[True, sid[1:] != sid[:-1]],
         "ends": np.r_[np.flatnonzero(np.diff(sid)), n - 1],
         "L": np.bincount(sid).astype(np.float64)}
    bad = (a["pe"] < 0) | (a["pe"] > 1)
    if bad.any():
        row = int(order[np.flatnonzero(bad)[0]])
        raise ValueError(f"target_probs must be probabilities in [0, 1]; row {row} has "
                         f"{float(a['pe'][np.flatnonzero(bad)[0]])!r}")
    for need, given in (("cascade", target_cascade), ("slate", target_slate)):
        if need in props:
            a[f"{need}_0"] = props[need]
            a[f"{need}_e"] = _target(need, None if given is None else
                                     _per_row(f"target_{need}", given, n, order),
                                     a["pe"], sid, factored_target)
    if model is not None:
        a["q_logged"] = _per_row("q_logged", model[0], n, order)
        a["q_target"] = _per_row("q_target", model[1], n, order)
    return a


def estimate_slate_ctr(log: pd.DataFrame, target_probs, *, target_cascade=None,
                       target_slate=None, q_logged=None, q_target=None, estimators=None,
                       factored: bool = False, factored_target: bool = False, shrinkage=None,
                       interval: str = "normal", n_bootstrap: int = 500, alpha: float = 0.05,
                       min_ess: float = 100.0, check_sums: bool = True,
                       random_state=0) -> pd.DataFrame:
    """Slate estimators of the target policy's CTR, with intervals and weight diagnostics.

    ``target_probs`` (and the optional target / reward-model arrays) have one value per row of
    ``log`` in its order. Returns a DataFrame indexed by estimator with columns estimate, low,
    high, std, n_slates, ess, ess_share, max_weight, matched_share and shrinkage (DRos's λ).
    Warns (``OverlapWarning``) when an estimator's ESS is below ``min_ess``.
    """
    if interval not in ("normal", "bootstrap"):
        raise ValueError(f"interval must be 'normal' or 'bootstrap', got {interval!r}")
    if interval == "bootstrap" and (isinstance(n_bootstrap, bool) or not isinstance(
            n_bootstrap, (int, np.integer)) or n_bootstrap < 1):
        raise ValueError(f"n_bootstrap must be an integer >= 1 for bootstrap intervals, got "
                         f"{n_bootstrap!r}")
    if shrinkage is not None and not (isinstance(shrinkage, (int, float, np.floating))
                                      and not isinstance(shrinkage, bool)
                                      and np.isfinite(shrinkage) and shrinkage > 0):
        raise ValueError(f"shrinkage (DRos's λ) must be a finite number > 0, or None to choose "
                         f"it from the data; got {shrinkage!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (0.05 gives a 95 % interval), got {alpha!r}")
    has_model = q_logged is not None and q_target is not None
    estimators = tuple(estimators or _default_estimators(factored, has_model))
    if {"cascade_dr", "dros"} & set(estimators) and not has_model:
        raise ValueError("cascade_dr and dros need a reward model: pass q_logged and q_target")
    a = _slate_arrays(log, estimators, factored, check_sums, target_probs, target_cascade,
                      target_slate, factored_target, (q_logged, q_target) if has_model else None)
    rng = np.random.default_rng(random_state)
    rows = []
    for name in estimators:
        lam = None
        if name == "dros":
            lam = float(shrinkage) if shrinkage is not None else \
                _choose_shrinkage(a, SHRINKAGE_GRID)
        v, w = _contributions(name, a, lam)
        lo, hi, sd = _interval(v, interval, alpha, n_bootstrap, rng)
        diag = weight_diagnostics(w)
        rows.append({"estimator": name, "estimate": float(v.mean()), "low": lo, "high": hi,
                     "std": sd, "n_slates": a["n_slates"], **diag,
                     "shrinkage": lam if lam is not None else float("nan")})
        warn_overlap(diag, len(w), min_ess, "weights", name)
    return pd.DataFrame(rows).set_index("estimator")


def target_support(log: pd.DataFrame, target: pd.DataFrame, *, tol: float = 1e-12,
                   warn: bool = True) -> pd.DataFrame:
    """The target's probability mass on actions the log never shows at a position (and
    context, when both have one): there importance weighting sees nothing, and every
    estimator but DM misses that mass. ``target`` has columns position, action, prob
    (+ context). Returns the missing mass per position / context, largest first; warns
    naming the actions when any is above ``tol``."""
    need = ["position", "action", "prob"]
    missing = [c for c in need if c not in target.columns]
    if missing:
        raise DataValidationError(f"target column {missing[0]!r} not found; it needs {need} "
                                  f"(optional 'context'), it has {list(target.columns)}")
    target = target.assign(position=integer_positions(target["position"], "target"))
    if "position" not in log.columns:
        raise DataValidationError(f"log column 'position' not found; it has {list(log.columns)}")
    log = log.assign(position=integer_positions(log["position"], "log"))
    keys = ["context", "position"] if "context" in target.columns and "context" in log.columns \
        else ["position"]
    logged = pd.MultiIndex.from_frame(log[keys + ["action"]].drop_duplicates())
    idx = pd.MultiIndex.from_frame(target[keys + ["action"]])
    unseen = ~idx.isin(logged) & (target["prob"].to_numpy(np.float64) > tol)
    lost = target.loc[unseen].groupby(keys)["prob"].sum().sort_values(ascending=False)
    if warn and len(lost):
        acts = target.loc[unseen].sort_values("prob", ascending=False)
        shown = ", ".join(f"{r.action!r} at position {r.position}" for r in acts.head(5).itertuples())
        warnings.warn(f"the target puts probability on actions never logged ({shown}"
                      f"{' …' if len(acts) > 5 else ''}); up to {lost.iloc[0]:.3g} of its mass "
                      f"at one {' / '.join(keys)} is invisible to importance weighting",
                      OverlapWarning, stacklevel=2)
    return lost.rename("missing_mass").reset_index()
