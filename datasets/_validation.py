"""Input checks for interaction data. Every failure names the column, the row and the value."""

from __future__ import annotations

import numpy as np
import pandas as pd


class DataValidationError(ValueError):
    """Raised when interaction data is malformed (missing column, NaN rating, duplicate pair, ...).

    Examples
    --------
    >>> import pandas as pd
    >>> from fedcf.datasets import DataValidationError, Interactions
    >>> try:
    ...     Interactions.coerce(pd.DataFrame({"user": [1], "item": [2], "rating": [float("nan")]}))
    ... except DataValidationError as e:
    ...     print("refused")
    refused
    """


def show(value) -> str:
    """repr of a value as a user wrote it (no ``np.float64(...)`` wrapper)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_same_length(**arrays) -> int:
    """All arrays given (None skipped) must have the same length; returns it."""
    lengths = {name: len(a) for name, a in arrays.items() if a is not None}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{name} has {n} entries" for name, n in lengths.items())
        raise DataValidationError(f"mismatched lengths: {desc}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise DataValidationError("no interactions: the input is empty")
    return n


def check_ids(values, column: str) -> np.ndarray:
    """Raw ids may be any hashable; missing ids (None/NaN) are rejected."""
    arr = np.asarray(values) if not isinstance(values, pd.Series) else values.to_numpy()
    if arr.ndim != 1:
        raise DataValidationError(f"column {column!r} must be one-dimensional, got shape {arr.shape}")
    missing = pd.isna(arr)
    if np.any(missing):
        row = _first_bad(missing)
        raise DataValidationError(f"column {column!r} has a missing id at row {row}")
    if arr.dtype.kind == "f":
        # float ids such as 3.0 come from CSV readers; keep them only when integral and exact
        if not np.all(np.isfinite(arr)):
            row = _first_bad(~np.isfinite(arr))
            raise DataValidationError(f"column {column!r} has non-finite id {show(arr[row])} at row {row}")
        if np.all(arr == np.round(arr)):
            big = np.abs(arr) > 2**53
            if np.any(big):
                row = _first_bad(big)
                raise DataValidationError(
                    f"column {column!r} has float id {show(arr[row])} at row {row}, beyond 2**53 "
                    "where floats cannot tell neighbouring integers apart (two users could merge); "
                    "pass the ids as int or str")
            arr = arr.astype(np.int64)
    elif arr.dtype == object:
        ints = np.array([isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in arr])
        if ints.all():
            arr = integer_ids(arr)
    return arr


def integer_ids(values) -> np.ndarray:
    """Ids as int64 when every one is an integer that fits, as uint64 when they are non-negative
    and fit there, else as str (never wrapped or rounded: 20-digit ids stay distinct)."""
    raw = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    if raw.dtype.kind in "iu":
        return raw
    as_int = pd.to_numeric(pd.Series(raw, copy=False), errors="coerce")
    if as_int.isna().any() or as_int.dtype.kind not in "iu":
        return raw.astype(str) if raw.dtype == object and all(isinstance(x, str) for x in raw) \
            else raw
    return as_int.to_numpy()


def check_numeric(values, column: str, what: str = "value") -> np.ndarray:
    """Convert to float64, naming the first non-numeric or non-finite entry."""
    raw = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    if raw.dtype.kind in "biuf":
        out = raw.astype(np.float64)
    else:
        coerced = pd.to_numeric(pd.Series(raw, copy=False), errors="coerce").to_numpy(np.float64)
        bad = np.isnan(coerced) & ~pd.isna(raw)
        if np.any(bad):
            row = _first_bad(bad)
            raise DataValidationError(
                f"column {column!r} is not numeric: row {row} has {what} {show(raw[row])}"
            )
        out = coerced
    finite = np.isfinite(out)
    if not np.all(finite):
        row = _first_bad(~finite)
        raise DataValidationError(
            f"column {column!r} has a non-finite {what} {show(out[row])} at row {row}"
        )
    return out


def check_scale(ratings: np.ndarray, rating_scale, column: str) -> None:
    if rating_scale is None:
        return
    lo, hi = rating_scale
    if not lo <= hi:
        raise DataValidationError(f"rating_scale must be (low, high) with low <= high, got {rating_scale}")
    bad = (ratings < lo) | (ratings > hi)
    if np.any(bad):
        row = _first_bad(bad)
        raise DataValidationError(
            f"column {column!r} has value {show(ratings[row])} at row {row}, "
            f"outside rating_scale ({lo}, {hi})"
        )
