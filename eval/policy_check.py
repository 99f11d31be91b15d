"""The Open Bandit protocol: a context-free target policy's CTR estimated from another policy's
log by every estimator (per-row and slate), against the target's own on-policy CTR."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..datasets import context_free_action_probs
from .offline import (
    OverlapWarning,
    PositionActionRewardModel,
    estimate_ctr,
    relative_errors,
    validate_log,
)
from .slate import estimate_slate_ctr


def off_policy_check(logging_log: pd.DataFrame, target_log: pd.DataFrame, *,
                     n_bootstrap: int = 500, random_state=0, zero_propensity: str = "error",
                     prior_strength: float = 20.0, slate_estimators: bool = False) -> dict:
    """Estimate a context-free target policy's CTR from another policy's log, and compare with the
    target's own on-policy CTR (the Open Bandit protocol: BTS estimated from the random log).

    The target's action distribution per position is estimated from its own log; the reward model
    for DM / DR is ``PositionActionRewardModel`` fitted on the logging log. Returns a dict with
    ``estimates`` (DataFrame with relative errors), ``truth`` (on-policy CTR of ``target_log``
    with a bootstrap interval) and the row counts used. With ``slate_estimators`` the slate
    estimators are added, each logged row its own slate when the log has no ``slate_id``
    (then RIPS, slate IPS and PI equal IPS, and cascade DR equals DR).
    """
    logged = validate_log(logging_log, zero_propensity=zero_propensity)
    target = validate_log(target_log, zero_propensity="drop")
    pi_t = context_free_action_probs(target)
    key = pd.MultiIndex.from_arrays([logged["position"].to_numpy(), logged["action"].to_numpy()])
    pe = pi_t.set_index(["position", "action"])["prob"].reindex(key).fillna(0.0).to_numpy()
    model = PositionActionRewardModel(prior_strength).fit(logged)
    q_logged = model.predict(logged["action"], logged["position"])
    q_target = model.expected(pi_t, logged["position"])
    est = estimate_ctr(logged["reward"].to_numpy(float), logged["propensity"].to_numpy(float), pe,
                       q_logged=q_logged, q_target=q_target, n_bootstrap=n_bootstrap,
                       random_state=random_state)
    if slate_estimators:
        est = pd.concat([est, _slate_rows(logged, pe, q_logged, q_target, n_bootstrap,
                                          random_state)])
    r = target_log["reward"].to_numpy(float)
    truth = float(r.mean())
    rng = np.random.default_rng(random_state)
    boots = r[rng.integers(0, len(r), size=(n_bootstrap, len(r)))].mean(axis=1) if n_bootstrap else r[:0]
    est["relative_error"] = relative_errors(est, truth)
    return {"estimates": est, "truth": truth,
            "truth_low": float(np.quantile(boots, 0.025)) if len(boots) else float("nan"),
            "truth_high": float(np.quantile(boots, 0.975)) if len(boots) else float("nan"),
            "n_logged": int(len(logged)), "n_target": int(len(target_log)),
            "dropped_zero_propensity": int(logged.attrs.get("dropped_zero_propensity", 0))}


def _slate_rows(logged, pe, q_logged, q_target, n_bootstrap, random_state):
    """The slate estimators on a log (its own ``slate_id`` or one slate per row)."""
    log = logged if "slate_id" in logged.columns else \
        logged.assign(slate_id=np.arange(len(logged)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverlapWarning)  # the rows above carry the diagnostics
        out = estimate_slate_ctr(log, pe, q_logged=q_logged, q_target=q_target, factored=True,
                                 factored_target=True, interval="bootstrap",
                                 n_bootstrap=max(n_bootstrap, 1), random_state=random_state)
    return out.rename(columns={"n_slates": "n"})
