"""What every command shares: usage errors in one line, reading a ratings file, notes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..datasets import (
    DataUnavailableError,
    DataValidationError,
    load_movielens,
)
from ..federated import FedReconImplicitMF
from ..models import ImplicitMF

# implicit-feedback estimators: ranking metrics, no ratings needed
IMPLICIT = (ImplicitMF, FedReconImplicitMF)
USER_ERRORS = (ValueError, TypeError, KeyError, OSError, DataUnavailableError, MemoryError,
               FloatingPointError, ImportError)
# shortcut flag -> estimator parameter


SHORTCUTS = {"factors": "n_factors", "rounds": "n_rounds", "epochs": "n_epochs",
             "clients": "clients_per_round", "seed": "random_state"}


COLUMNS = {"user": ("user", "userId", "user_id", "userID"),
           "item": ("item", "movieId", "item_id", "itemId", "movie"),
           "rating": ("rating", "ratings", "score"), "timestamp": ("timestamp", "time", "ts")}


class UsageError(Exception):
    """A bad command line: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def read_table(path, *, user_col=None, item_col=None, rating_col=None, time_col=None,
               sep=None) -> pd.DataFrame:
    """A ratings file as a DataFrame with user, item[, rating][, timestamp] columns.

    MovieLens/RecBole formats (u.data, ratings.dat, .inter, a GroupLens zip or recbole wheel, a
    folder) are detected; any other CSV/TSV with a header is read with the named columns (or
    the usual names: user/userId, item/movieId, rating, timestamp)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    named = any(c is not None for c in (user_col, item_col, rating_col, time_col, sep))
    if not named and (path.is_dir() or path.suffix in (".inter", ".data", ".dat", ".zip", ".whl")):
        return load_movielens(None, path=path, as_frame=True)
    if sep is None:
        with open(path, encoding="latin-1") as fh:
            first = fh.readline()
        sep = "\t" if path.suffix in (".tsv", ".tab") or "\t" in first else ","
    try:
        df = pd.read_csv(path, sep=sep)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataValidationError(f"{path}: cannot read it as a table: {exc}") from exc
    given = {"user": user_col, "item": item_col, "rating": rating_col, "timestamp": time_col}
    if rating_col == "none":  # implicit feedback from a file that has ratings: ignore them
        given["rating"] = None
        df = df.drop(columns=[c for c in COLUMNS["rating"] if c in df.columns])
    keep = {}
    for role, name in given.items():
        if name is not None and name not in df.columns:
            raise DataValidationError(f"{path}: column {name!r} (--{_flag(role)}) not found; its "
                                      f"columns are {list(df.columns)}")
        found = name or next((c for c in COLUMNS[role] if c in df.columns), None)
        if found is None and role in ("user", "item"):
            raise DataValidationError(f"{path}: no {role} column (looked for {COLUMNS[role]}); "
                                      f"its columns are {list(df.columns)}; name it with "
                                      f"--{_flag(role)}")
        if found is not None:
            keep[found] = role
    return df[list(keep)].rename(columns=keep)


def _flag(role: str) -> str:
    return {"timestamp": "time-col"}.get(role, f"{role}-col")


def _read(args, path) -> pd.DataFrame:
    return read_table(path, user_col=args.user_col, item_col=args.item_col,
                      rating_col=args.rating_col, time_col=args.time_col, sep=args.sep)


def _say(args, text):
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def _as_model_ids(values, ids: np.ndarray, what: str) -> list:
    """Command-line strings as the model's raw ids (ints when its ids are ints)."""
    if ids.dtype.kind not in "iu":
        return list(values)
    try:
        return [int(v) for v in values]
    except ValueError as exc:
        raise UsageError(f"{what} ids of this model are integers; got {exc.args[0]}") from exc


def _data_options(p):
    g = p.add_argument_group("data file columns (MovieLens/RecBole formats are detected)")
    g.add_argument("--user-col", help="user column of a CSV/TSV (default: user, userId, ...)")
    g.add_argument("--item-col", help="item column (default: item, movieId, ...)")
    g.add_argument("--rating-col", help="rating column (default: rating); 'none' ignores "
                   "the ratings (implicit feedback, strength 1 per row)")
    g.add_argument("--time-col", help="timestamp column (default: timestamp, if present)")
    g.add_argument("--sep", help="field separator (default: tab for .tsv or tabbed files, else ,)")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError("plots need matplotlib: pip install 'fedcf[plot]'") from exc
    return plt
