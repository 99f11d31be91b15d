"""The Open Bandit Dataset sample (ZOZOTOWN fashion recommendations), as logged impressions.

The small sample ships inside the source archive of the PyPI package ``obp==0.5.7`` (there is no
wheel, and it declares Python < 3.11, so it is fetched with
``pip download --no-deps --ignore-requires-python``; the archive's sha256 is pinned). It is read
with ``tarfile``, never installed. ``path`` may instead point at that archive, at one of its CSVs,
or at a folder laid out like ``obd/{random,bts}/{campaign}/{campaign}.csv``.

Each CSV has 10,000 impressions with columns timestamp, item_id, position (1-3), click,
propensity_score, user features and user-item affinities. ``load_open_bandit`` returns them in
fedcf's log format (``fedcf.eval.offline``): action, position, reward, propensity, plus the
original columns.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from ._validation import DataValidationError
from .movielens import DataUnavailableError, _atomic_write, data_home, sha256_bytes

OBP_SDIST = "obp==0.5.7"
OBP_FILE = "obp-0.5.7.tar.gz"
OBP_SHA256 = "3060d67fedfcfadf1e7a6f2608987f74412b5eb74d2c567edeb147595c68f2a0"
POLICIES = ("random", "bts")
CAMPAIGNS = ("all", "men", "women")


def _member(policy: str, campaign: str) -> str:
    return f"obp-0.5.7/obp/dataset/obd/{policy}/{campaign}/{campaign}.csv"


def _check_choice(policy, campaign):
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if campaign not in CAMPAIGNS:
        raise ValueError(f"campaign must be one of {CAMPAIGNS}, got {campaign!r}")


def fetch_open_bandit(*, data_home_dir=None, download: bool = True, timeout: float = 300.0) -> Path:
    """Return the cached ``obp-0.5.7.tar.gz`` (verified), fetching it from PyPI if needed."""
    target = data_home(data_home_dir) / "open_bandit" / OBP_FILE
    if target.is_file():
        if sha256_bytes(target.read_bytes()) == OBP_SHA256:
            return target
        target.unlink()  # a corrupt cache entry is replaced, never trusted
    if not download:
        raise DataUnavailableError(
            f"the Open Bandit sample is not in the cache ({target}) and download=False. Pass "
            "path='/path/to/obp-0.5.7.tar.gz' (from `pip download --no-deps "
            "--ignore-requires-python obp==0.5.7`), or a CSV from it")
    with tempfile.TemporaryDirectory(prefix="fedcf-obp-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
               "--disable-pip-version-check", "-q", "-d", tmp, OBP_SDIST]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DataUnavailableError(f"`pip download {OBP_SDIST}` failed: {exc}") from exc
        files = list(Path(tmp).glob("obp-0.5.7*.tar.gz"))
        if proc.returncode != 0 or not files:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no archive"]
            raise DataUnavailableError(
                f"`pip download --no-deps --ignore-requires-python {OBP_SDIST}` failed: {tail[0]}. "
                "Pass path='/path/to/obp-0.5.7.tar.gz' or a CSV from it instead")
        blob = files[0].read_bytes()
    if sha256_bytes(blob) != OBP_SHA256:
        raise DataUnavailableError(f"{OBP_FILE} has sha256 {sha256_bytes(blob)}, expected {OBP_SHA256}")
    _atomic_write(target, blob)
    return target


def _read_csv_bytes(data: bytes, source: str) -> pd.DataFrame:
    """An Open Bandit CSV, checked: the columns fedcf reads, numeric clicks and propensities."""
    if not data.strip():
        raise DataValidationError(f"{source} is empty; an Open Bandit log has a header and one "
                                  "row per impression")
    try:
        df = pd.read_csv(io.BytesIO(data), index_col=0)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataValidationError(f"{source}: not a readable Open Bandit CSV ({exc}); expected "
                                  "a header with item_id, position, click, propensity_score"
                                  ) from exc
    need = ["item_id", "position", "click", "propensity_score"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataValidationError(f"{source}: column {missing[0]!r} not found; columns are "
                                  f"{list(df.columns)[:8]}...")
    for col in ("click", "propensity_score", "position"):
        bad = pd.to_numeric(df[col], errors="coerce").isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataValidationError(f"{source}: column {col!r} has a non-numeric or missing "
                                      f"value at data row {row} ({df[col].iloc[row]!r})")
    df = df.reset_index(drop=True)
    df.insert(0, "action", df["item_id"].to_numpy())
    df.insert(1, "reward", df["click"].to_numpy(dtype=float))
    df.insert(2, "propensity", df["propensity_score"].to_numpy(dtype=float))
    df.attrs["source"] = source
    return df


def load_open_bandit(policy: str = "random", campaign: str = "all", *, path=None,
                     data_home_dir=None, download: bool = True) -> pd.DataFrame:
    """One Open Bandit log as a DataFrame in fedcf's log format (plus the original columns).

    Rows keep the file's order. Propensities are the logging policy's, as recorded; some rows of
    ``bts/women`` have propensity 0 — ``fedcf.eval.offline.validate_log`` refuses or drops them.
    """
    _check_choice(policy, campaign)
    member = _member(policy, campaign)
    if path is None:
        archive = fetch_open_bandit(data_home_dir=data_home_dir, download=download)
    else:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no such file or directory: {p}")
        if p.is_dir():
            for cand in (p / policy / campaign / f"{campaign}.csv",
                         p / "obd" / policy / campaign / f"{campaign}.csv"):
                if cand.is_file():
                    return _read_csv_bytes(cand.read_bytes(), str(cand))
            raise DataUnavailableError(f"{p} has no {policy}/{campaign}/{campaign}.csv")
        if p.suffix == ".csv":
            return _read_csv_bytes(p.read_bytes(), str(p))
        archive = p
    try:
        with tarfile.open(archive, "r:*") as tf:
            f = tf.extractfile(member)
            if f is None:
                raise KeyError(member)
            data = f.read()
    except KeyError as exc:
        raise DataUnavailableError(f"{archive} has no member {member}") from exc
    except tarfile.TarError as exc:
        raise DataUnavailableError(f"{archive} is not a readable tar archive: {exc}") from exc
    return _read_csv_bytes(data, f"{archive}!{member}")


def context_free_action_probs(log: pd.DataFrame) -> pd.DataFrame:
    """A context-free policy's action distribution per position, estimated from its own log:
    the share of impressions at each position that showed each action (columns position, action,
    prob). Valid for the OBD logging policies, whose probabilities do not depend on the user."""
    counts = log.groupby(["position", "action"]).size().rename("n").reset_index()
    counts["prob"] = counts["n"] / counts.groupby("position")["n"].transform("sum")
    return counts[["position", "action", "prob"]]

