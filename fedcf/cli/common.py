"""What every command shares: usage errors in one line, reading a ratings file, notes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# Nothing heavy at import: a command's parser (and its --help) needs only this module and the
# command's own; numpy, pandas and the estimators load when a command runs.

SUMMARY = {"train": "train a model on a ratings file and save it",
           "evaluate": "score a saved model on held-out data",
           "recommend": "top-n items for a new user's history or a known user",
           "benchmark": "run a benchmark script's job with its flags",
           "data": "the dataset cache (fetch, verify, where) and splits",
           "compile": "compile the Numba kernels now (e.g. after installing)",
           "plot": "plot a saved model's training history"}


def is_implicit(model) -> bool:
    """Implicit-feedback estimators: ranking metrics, no ratings needed."""
    from ..models.base import RankingScoreMixin

    return isinstance(model, RankingScoreMixin)


def user_errors() -> tuple:
    """Errors that a bad input raises: reported in one line with exit code 2."""
    from ..datasets import DataUnavailableError

    return (UsageError, ValueError, TypeError, KeyError, OSError, DataUnavailableError,
            MemoryError, FloatingPointError, ImportError)


# shortcut flag -> estimator parameter
SHORTCUTS = {"factors": "n_factors", "rounds": "n_rounds", "epochs": "n_epochs",
             "clients": "clients_per_round", "seed": "random_state"}


COLUMNS = {"user": ("user", "userId", "user_id", "userID"),
           "item": ("item", "movieId", "item_id", "itemId", "movie"),
           "rating": ("rating", "ratings", "score"), "timestamp": ("timestamp", "time", "ts")}


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse names the flag when this refuses)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; give an integer >= 1")
    return value


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
    import pandas as pd

    from ..datasets import DataValidationError, load_movielens

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
    df.attrs["header_table"] = True  # row r is the (r + 2)-th non-blank line
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


def output_path(path, flag: str) -> Path:
    """An output file's path, checked before any work: its folder must exist (one rule for
    every command's outputs; a mistyped folder is an error, not a new folder)."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag} {str(out)!r} is a folder; give a file name inside it")
    if not out.parent.is_dir():
        raise UsageError(f"{flag} {str(out)!r}: folder {str(out.parent)!r} does not exist; "
                         f"create it first (mkdir -p {str(out.parent)!r})")
    return out


def _flag(role: str) -> str:
    return {"timestamp": "time-col"}.get(role, f"{role}-col")


def _read(args, path) -> pd.DataFrame:
    """``read_table`` with the command's column flags; a CSV/TSV read is recorded on ``args``
    so that an error naming a row can name the file's line (``with_lines``)."""
    df = read_table(path, user_col=args.user_col, item_col=args.item_col,
                    rating_col=args.rating_col, time_col=args.time_col, sep=args.sep)
    if df.attrs.get("header_table"):
        args.__dict__.setdefault("tables_read", []).append((str(path), len(df)))
    return df


def with_lines(msg: str, tables) -> str:
    """An error's "row N" (a 0-based position in the table) as "row N (line L of FILE)", for a
    CLI user who opens the file. The file is the one the message names, else the only one
    read; nothing is changed when its non-blank lines do not match its rows one to one."""
    import re

    named = [t for t in tables if t[0] in msg] or (tables if len(tables) == 1 else [])
    if not named or not re.search(r"\brows? \d", msg):
        return msg
    path, n_rows = named[0]
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [i for i, line in enumerate(fh, 1) if line.strip()]
    except OSError:
        return msg
    if len(lines) != n_rows + 1:  # quoted line breaks or a comment: no safe mapping
        return msg

    def at(r: str) -> str:
        return f"{r} (line {lines[int(r) + 1]} of {Path(path).name})" if int(r) < n_rows else r

    return re.sub(r"\b(rows? )(\d+)(?:( and )(\d+))?\b", lambda m: m.group(1) + at(m.group(2))
                  + (m.group(3) + at(m.group(4)) if m.group(3) else ""), msg)


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
