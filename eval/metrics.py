"""Rating and ranking metrics, pooled and per user."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._ranking import ranking_metrics  # noqa: F401  (re-exported)


def _pair(y_true, y_pred):
    y = np.asarray(y_true, dtype=np.float64)
    p = np.asarray(y_pred, dtype=np.float64)
    if y.shape != p.shape:
        raise ValueError(f"y_true has shape {y.shape} but y_pred has shape {p.shape}")
    if y.size == 0:
        raise ValueError("no ratings to score")
    for name, a in (("y_true", y), ("y_pred", p)):
        bad = ~np.isfinite(a)
        if bad.any():
            raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) (the first at "
                             f"position {int(np.argmax(bad))}: {a[bad][0]}); a metric over them "
                             "would be NaN or count them as misses — find where they come from "
                             "(a diverged model, missing ratings) or drop them")
    return y, p


def rmse(y_true, y_pred) -> float:
    """Root mean squared error of the predictions; the arrays must have the same length and be
    finite.

    Examples
    --------
    >>> from fedcf.eval import rmse
    >>> rmse([1, 2, 3], [1, 2, 5])
    1.1547005383792515
    """
    y, p = _pair(y_true, y_pred)
    return float(np.sqrt(np.mean((y - p) ** 2)))


def mae(y_true, y_pred) -> float:
    """Mean absolute error of the predictions.

    Examples
    --------
    >>> from fedcf.eval import mae
    >>> mae([1, 2, 3], [1, 2, 5])
    0.6666666666666666
    """
    y, p = _pair(y_true, y_pred)
    return float(np.mean(np.abs(y - p)))


def round_to_scale(y_pred, rating_scale=None, step: float = 1.0) -> np.ndarray:
    """Clip to the scale and round half up to the nearest multiple of ``step``."""
    p = np.asarray(y_pred, dtype=np.float64)
    if rating_scale is not None:
        p = np.clip(p, *rating_scale)
    return np.floor(p / step + 0.5) * step


def rounded_accuracy(y_true, y_pred, rating_scale=None, step: float = 1.0) -> float:
    """Share of predictions that, clipped and rounded to the rating grid, equal the rating.

    The paper's "accuracy" (an absolute error of at most 0.5 after rounding) for integer 1-5 ratings.
    """
    y, p = _pair(y_true, y_pred)
    return float(np.mean(np.abs(round_to_scale(p, rating_scale, step) - y) < 1e-9))


def rating_metrics(y_true, y_pred, rating_scale=None) -> dict:
    """RMSE, MAE and the rounded accuracy (predictions clipped to ``rating_scale`` and rounded),
    as a dict.

    Examples
    --------
    >>> from fedcf.eval import rating_metrics
    >>> rating_metrics([1, 2, 3], [1.2, 2.0, 4.0], (1, 5))["accuracy"]
    0.6666666666666666
    """
    return {"rmse": rmse(y_true, y_pred), "mae": mae(y_true, y_pred),
            "accuracy": rounded_accuracy(y_true, y_pred, rating_scale)}


def per_user_rating_metrics(users, y_true, y_pred, rating_scale=None) -> pd.DataFrame:
    """One row per user: n, rmse, mae, accuracy (for distributions, not only pooled means)."""
    y, p = _pair(y_true, y_pred)
    hit = np.abs(round_to_scale(p, rating_scale) - y) < 1e-9
    df = pd.DataFrame({"user": np.asarray(users), "se": (y - p) ** 2, "ae": np.abs(y - p),
                       "hit": hit})
    g = df.groupby("user", sort=True)
    out = pd.DataFrame({"n": g.size(), "rmse": np.sqrt(g["se"].mean()), "mae": g["ae"].mean(),
                        "accuracy": g["hit"].mean()})
    return out.reset_index()
