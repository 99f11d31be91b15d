"""MovieLens loaders: parse every ratings format from a local path, or fetch into a cache.

Sources, tried in order for ``load_movielens(variant)`` when no ``path`` is given:

1. the cache (``$FEDCF_DATA`` or ``~/.cache/fedcf``), where an earlier fetch left the file;
2. the official GroupLens zip (skipped quickly when the host is unreachable);
3. for ``"100k"`` only, an offline-friendly source: the PyPI wheel ``recbole==1.2.1`` carries the real
   ML-100K as ``recbole/dataset_example/ml-100k/ml-100k.inter``. It is fetched with
   ``pip download --no-deps`` (any PyPI mirror pip is configured for works), the member is read from the
   zip and checked against a pinned sha256.

``path`` may be a ratings file (``u.data``, ``ratings.dat``, ``ratings.csv``, ``*.inter``), a directory
holding one, a GroupLens zip, or a recbole wheel; then nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from ._files import atomic_write
from ._validation import DataValidationError, integer_ids
from .interactions import Interactions

RECBOLE_WHEEL = "recbole==1.2.1"
RECBOLE_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
RECBOLE_SHA256 = "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff"
ITEM_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.item"  # item side features
ITEM_SHA256 = "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532"

# variant -> (zip url, member inside the zip, (n_ratings, n_users, n_items) or None)
_GROUPLENS = {
    "100k": ("https://files.grouplens.org/datasets/movielens/ml-100k.zip", "ml-100k/u.data",
             (100_000, 943, 1682)),
    "1m": ("https://files.grouplens.org/datasets/movielens/ml-1m.zip", "ml-1m/ratings.dat",
           (1_000_209, 6040, 3706)),
    "latest-small": ("https://files.grouplens.org/datasets/movielens/ml-latest-small.zip",
                     "ml-latest-small/ratings.csv", None),
    "latest": ("https://files.grouplens.org/datasets/movielens/ml-latest.zip",
               "ml-latest/ratings.csv", None),
}
VARIANTS = tuple(_GROUPLENS)
RATINGS_FILENAMES = ("u.data", "ratings.dat", "ratings.csv")

_COLUMNS = ["user", "item", "rating", "timestamp"]


class DataUnavailableError(RuntimeError):
    """No source could provide the dataset; the message says how to pass a local file.

    Examples
    --------
    >>> from fedcf.datasets import DataUnavailableError
    >>> issubclass(DataUnavailableError, RuntimeError)
    True
    """


# ---------------------------------------------------------------------- parsing
def detect_format(name: str, head: str) -> str:
    """Format of a ratings file from its name, then its first line.

    Returns one of ``"u.data"``, ``"ratings.dat"``, ``"ratings.csv"``, ``"inter"``.
    """
    lower = name.lower()
    if lower.endswith(".inter"):
        return "inter"
    if lower.endswith("u.data") or lower.endswith(".data"):
        return "u.data"
    if lower.endswith(".dat"):
        return "ratings.dat"
    first = head.splitlines()[0] if head else ""
    if ":token" in first or ":float" in first:
        return "inter"
    if "::" in first:
        return "ratings.dat"
    if "," in first:
        return "ratings.csv"
    if "\t" in first:
        return "u.data"
    raise DataValidationError(
        f"cannot tell the ratings format of {name!r} from its name or first line {first[:80]!r}; "
        "expected u.data (tab-separated), ratings.dat ('::'), ratings.csv (header "
        "userId,movieId,rating,timestamp) or a RecBole .inter file"
    )


def _finish(df: pd.DataFrame, source: str) -> pd.DataFrame:
    if len(df) == 0:
        raise DataValidationError(f"{source}: no ratings in the file")
    for col in ("rating", "timestamp"):
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataValidationError(
                f"{source}: column {col!r} has non-numeric value {df[col].iloc[row]!r} at data row {row}"
            )
        df[col] = vals.to_numpy(np.float64)
    return df


def _decode(data: bytes, name: str) -> str:
    """The text of a ratings file: UTF-16 and UTF-8 files with a byte-order mark are read as
    such (spreadsheet exports), anything else as Latin-1 (MovieLens' own bytes); an empty or
    blank file, or text full of NUL bytes (UTF-16 without a mark), is named."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        text = data.decode("utf-16")
    elif data[:3] == b"\xef\xbb\xbf":
        text = data[3:].decode("utf-8", errors="replace")
    else:
        text = data.decode("latin-1")
    if not text.strip():
        raise DataValidationError(f"{name} is empty (no ratings in it); check that it is the "
                                  "ratings file and that it was written completely")
    if "\x00" in text[:4096]:
        raise DataValidationError(f"{name} holds NUL bytes: probably UTF-16 text without a "
                                  "byte-order mark; save it as UTF-8 (or with a mark)")
    return text


def parse_ratings(data: bytes | str | os.PathLike, name: str | None = None) -> pd.DataFrame:
    """Parse a MovieLens/RecBole ratings file into columns user, item, rating, timestamp."""
    if isinstance(data, (str, os.PathLike)):
        name = name or str(data)
        data = Path(data).read_bytes()
    name = name or "<bytes>"
    text = _decode(data, name)
    fmt = detect_format(name, text[:4096])
    buf = io.StringIO(text)
    try:
        if fmt == "u.data":
            df = pd.read_csv(buf, sep="\t", header=None, dtype=str)
            if df.shape[1] != 4:
                fix = ("remove the extra columns" if df.shape[1] > 4 else "some fields are missing")
                raise DataValidationError(
                    f"{name}: expected 4 tab-separated fields per line (user, item, rating, "
                    f"timestamp), found {df.shape[1]}: {fix}, or load the file with pandas and "
                    "pass a DataFrame")
            df.columns = _COLUMNS
        elif fmt == "ratings.dat":
            # '::' is a multi-char separator: split in Python-free vectorized form
            lines = pd.Series(text.splitlines())
            lines = lines[lines.str.len() > 0]
            parts = lines.str.split("::", expand=True, regex=False)
            if parts.shape[1] != 4:
                raise DataValidationError(
                    f"{name}: expected 4 '::'-separated fields per line, found {parts.shape[1]}"
                )
            df = parts.set_axis(_COLUMNS, axis=1).reset_index(drop=True)
        elif fmt == "ratings.csv":
            df = pd.read_csv(buf, dtype=str)
            want = {"userId": "user", "movieId": "item", "rating": "rating", "timestamp": "timestamp"}
            missing = [c for c in want if c not in df.columns]
            if missing:
                raise DataValidationError(
                    f"{name}: column {missing[0]!r} not found; its columns are {list(df.columns)}. "
                    "A ratings .csv is read in MovieLens' form (userId,movieId,rating,timestamp): "
                    "rename its columns, or read other columns with fedcf.cli.read_table"
                )
            df = df[list(want)].rename(columns=want)
        else:
            df = pd.read_csv(buf, sep="\t", dtype=str)
            base = {c.split(":")[0]: c for c in df.columns}
            want = {"user_id": "user", "item_id": "item", "rating": "rating", "timestamp": "timestamp"}
            missing = [c for c in want if c not in base]
            if missing:
                raise DataValidationError(
                    f"{name}: field {missing[0]!r} not found in the .inter header {list(df.columns)}"
                )
            df = df[[base[c] for c in want]].set_axis(_COLUMNS, axis=1)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DataValidationError(f"{name}: cannot parse as {fmt}: {exc}") from exc
    if df.shape[1] != 4 or df.isna().any().any():
        bad = df.isna().any(axis=1).to_numpy()
        row = int(np.flatnonzero(bad)[0]) if bad.any() else 0
        raise DataValidationError(f"{name}: data row {row} has missing fields (format {fmt})")
    for col in ("user", "item"):
        df[col] = integer_ids(df[col])
    return _finish(df, name)


# ---------------------------------------------------------------------- cache and fetch
def data_home(data_home: str | os.PathLike | None = None) -> Path:
    """Cache root: the argument, else ``$FEDCF_DATA``, else ``~/.cache/fedcf``."""
    if data_home is not None:
        return Path(data_home)
    env = os.environ.get("FEDCF_DATA")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fedcf"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def read_recbole_wheel(wheel: str | os.PathLike, verify: bool = True) -> bytes:
    """Read the ML-100K ``.inter`` member out of a recbole wheel, checking its sha256."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(RECBOLE_MEMBER)
    except KeyError as exc:
        raise DataUnavailableError(f"{wheel} has no member {RECBOLE_MEMBER}") from exc
    except zipfile.BadZipFile as exc:
        raise DataUnavailableError(f"{wheel} is not a zip/wheel file: {exc}") from exc
    if verify and sha256_bytes(data) != RECBOLE_SHA256:
        raise DataUnavailableError(
            f"{wheel}: {RECBOLE_MEMBER} has sha256 {sha256_bytes(data)}, expected {RECBOLE_SHA256}"
        )
    return data


def _pip_download_recbole(timeout: float = 300.0, item_folder: Path | None = None) -> bytes:
    """The ratings member of the recbole wheel, fetched by pip; with ``item_folder`` its
    ``ml-100k.item`` (checked) is also stored there."""
    with tempfile.TemporaryDirectory(prefix="fedcf-recbole-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", tmp, RECBOLE_WHEEL]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DataUnavailableError(f"`{' '.join(cmd[2:])}` failed: {exc}") from exc
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise DataUnavailableError(f"`pip download {RECBOLE_WHEEL}` failed: {tail[0]}")
        wheels = list(Path(tmp).glob("recbole-*.whl"))
        if not wheels:
            raise DataUnavailableError(f"`pip download {RECBOLE_WHEEL}` produced no wheel")
        if item_folder is not None:
            _cache_item_member(wheels[0], Path(item_folder))
        return read_recbole_wheel(wheels[0])


def _cache_item_member(wheel, folder: Path) -> None:
    """Store the wheel's ``ml-100k.item`` in ``folder`` (checked against its sha256)."""
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(ITEM_MEMBER)
    if sha256_bytes(data) != ITEM_SHA256:
        raise DataUnavailableError(f"{wheel}: {ITEM_MEMBER} has sha256 {sha256_bytes(data)}, "
                                   f"expected {ITEM_SHA256}")
    _atomic_write(folder / "ml-100k.item", data)


def _grouplens_download(variant: str, timeout: float = 30.0) -> bytes:
    url, member, _ = _GROUPLENS[variant]
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            blob = resp.read()
        md5_expected = None
        try:
            with urllib.request.urlopen(url + ".md5", timeout=timeout) as resp:
                md5_expected = resp.read().decode().split()[0].strip()
        except OSError:
            pass
    except OSError as exc:
        raise DataUnavailableError(f"GroupLens download of {url} failed: {exc}") from exc
    if md5_expected and hashlib.md5(blob).hexdigest() != md5_expected:
        raise DataUnavailableError(f"{url}: md5 mismatch against the published {url}.md5")
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        return zf.read(member)


def _check_known_shape(df: pd.DataFrame, variant: str, source: str) -> None:
    expected = _GROUPLENS[variant][2]
    if expected is None:
        return
    got = (len(df), df["user"].nunique(), df["item"].nunique())
    if got != expected:
        raise DataValidationError(
            f"{source}: MovieLens {variant} should have (ratings, users, items) = {expected}, got {got}"
        )


def _cached_file(variant: str, home: Path) -> Path | None:
    folder = home / "movielens" / variant
    if not folder.is_dir():
        return None
    for name in (*RATINGS_FILENAMES, "ml-100k.inter"):
        cand = folder / name
        if cand.is_file():
            return cand
    return None


def _resolve_local(path: Path, variant: str | None) -> tuple[bytes, str]:
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    if path.is_dir():
        found = [path / n for n in RATINGS_FILENAMES if (path / n).is_file()]
        found += sorted(path.glob("*.inter"))
        if not found:
            raise DataUnavailableError(
                f"{path} holds none of {RATINGS_FILENAMES} or a *.inter file"
            )
        return found[0].read_bytes(), str(found[0])
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        raise DataValidationError(f"{path} starts like a zip archive but cannot be opened as "
                                  "one (damaged or truncated); download or copy it again")
    if zipfile.is_zipfile(path):
        try:
            zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise DataValidationError(f"{path}: damaged zip archive ({exc}); download or copy "
                                      "it again") from exc
        with zf:
            names = zf.namelist()
            if RECBOLE_MEMBER in names:
                return read_recbole_wheel(path), f"{path}!{RECBOLE_MEMBER}"
            cands = [n for n in names if n.rsplit("/", 1)[-1] in RATINGS_FILENAMES]
            if variant in _GROUPLENS and _GROUPLENS[variant][1] in names:
                cands = [_GROUPLENS[variant][1]]
            if not cands:
                raise DataUnavailableError(f"{path}: no ratings file ({RATINGS_FILENAMES}) inside")
            try:
                return zf.read(cands[0]), f"{path}!{cands[0]}"
            except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a damaged member
                raise DataValidationError(f"{path}!{cands[0]}: cannot be read from the archive "
                                          f"({exc}); download or copy it again") from exc
    return path.read_bytes(), str(path)


def fetch_movielens(variant: str = "100k", *, data_home_dir=None, download: bool = True,
                    sources=("cache", "grouplens", "pypi")) -> Path:
    """Make sure the ratings file of ``variant`` is in the cache and return its path.

    Raises
    ------
    DataUnavailableError
        When no source works; the message lists each failure and how to pass a local file.
    """
    if variant not in _GROUPLENS:
        raise ValueError(f"unknown MovieLens variant {variant!r}; choose one of {VARIANTS} or pass path=")
    home = data_home(data_home_dir)
    if "cache" in sources:
        cached = _cached_file(variant, home)
        if cached is not None:
            return cached
    failures = []
    if download and "grouplens" in sources:
        try:
            data = _grouplens_download(variant)
            target = home / "movielens" / variant / _GROUPLENS[variant][1].rsplit("/", 1)[-1]
            _check_known_shape(parse_ratings(data, target.name), variant, "GroupLens")
            _atomic_write(target, data)
            return target
        except (DataUnavailableError, DataValidationError, zipfile.BadZipFile, KeyError) as exc:
            failures.append(str(exc))
    if download and variant == "100k" and "pypi" in sources:
        try:
            target = home / "movielens" / variant / "ml-100k.inter"
            data = _pip_download_recbole(item_folder=target.parent)
            _atomic_write(target, data)
            return target
        except DataUnavailableError as exc:
            failures.append(str(exc))
    if not download:
        failures.append("download=False and nothing in the cache")
    hint = {
        "100k": "u.data, ml-100k.zip, or recbole-1.2.1-py3-none-any.whl",
        "1m": "ratings.dat or ml-1m.zip",
    }.get(variant, "ratings.csv or the GroupLens zip")
    raise DataUnavailableError(
        f"could not obtain MovieLens {variant}: " + "; ".join(failures)
        + f". Pass a local file instead: load_movielens({variant!r}, path='/path/to/file') "
        f"(accepts {hint}), or put it in {home / 'movielens' / variant}/ "
        "(set FEDCF_DATA to change that folder)."
    )


def load_movielens(variant: str = "100k", *, path=None, data_home_dir=None, download: bool = True,
                   as_frame: bool = False, **interaction_kwargs):
    """Load MovieLens ratings as :class:`Interactions` (or a DataFrame with ``as_frame=True``).

    Parameters
    ----------
    variant : {"100k", "1m", "latest-small", "latest"}
        Which release; with ``path`` it is only used to pick the member of a GroupLens zip and to
        check the known size of fixed releases.
    path : str or Path, optional
        Local ratings file, folder, GroupLens zip or recbole wheel. Nothing is downloaded.
    data_home_dir : optional
        Cache root (default ``$FEDCF_DATA`` or ``~/.cache/fedcf``).
    download : bool
        Allow network sources (GroupLens, then PyPI for 100k).
    """
    if path is not None:
        data, source = _resolve_local(Path(path), variant)
        df = parse_ratings(data, source.rsplit("!", 1)[-1])
    else:
        file = fetch_movielens(variant, data_home_dir=data_home_dir, download=download)
        df = parse_ratings(file)
        source = str(file)
        if variant in _GROUPLENS:
            _check_known_shape(df, variant, source)
    if as_frame:
        return df
    return Interactions.from_dataframe(df, **interaction_kwargs)


def load_ratings_file(path, **interaction_kwargs) -> Interactions:
    """Any supported ratings file, zip, folder or wheel → Interactions (format detected)."""
    return load_movielens(variant=None, path=path, **interaction_kwargs)


_CACHE_NAMES = {"u.data": "u.data", "ratings.dat": "ratings.dat", "ratings.csv": "ratings.csv",
                "inter": "ml-100k.inter"}


def import_movielens(variant: str, path, *, data_home_dir=None) -> Path:
    """Put a local copy of ``variant`` (a ratings file, folder, GroupLens zip or recbole wheel)
    into the cache after checking it parses and, for the fixed releases, has the known
    (ratings, users, items); returns the cached path. The offline way to fill the cache."""
    if variant not in _GROUPLENS:
        raise ValueError(f"unknown MovieLens variant {variant!r}; choose one of {VARIANTS}")
    data, source = _resolve_local(Path(path), variant)
    name = source.rsplit("!", 1)[-1].rsplit("/", 1)[-1]
    df = parse_ratings(data, name)
    _check_known_shape(df, variant, source)
    fmt = detect_format(name, data[:4096].decode("latin-1"))
    target = data_home(data_home_dir) / "movielens" / variant / _CACHE_NAMES[fmt]
    _atomic_write(target, data)
    return target


def verify_movielens(variant: str, *, data_home_dir=None) -> dict:
    """Check the cached copy of ``variant``: it parses, has the known shape, and (for the recbole
    copy of 100k) the pinned sha256. Returns path, sha256 and counts; raises naming the problem."""
    if variant not in _GROUPLENS:
        raise ValueError(f"unknown MovieLens variant {variant!r}; choose one of {VARIANTS}")
    file = _cached_file(variant, data_home(data_home_dir))
    if file is None:
        raise DataUnavailableError(f"MovieLens {variant} is not in the cache "
                                   f"{data_home(data_home_dir) / 'movielens' / variant}; fetch it "
                                   "first (fetch_movielens, or `fedcf data fetch`)")
    data = file.read_bytes()
    digest = sha256_bytes(data)
    if file.name == "ml-100k.inter" and digest != RECBOLE_SHA256:
        raise DataValidationError(f"{file}: sha256 {digest} differs from the pinned "
                                  f"{RECBOLE_SHA256}; remove it with clear_cache({variant!r}) "
                                  "and fetch again")
    df = parse_ratings(data, file.name)
    _check_known_shape(df, variant, str(file))
    return {"variant": variant, "path": str(file), "sha256": digest, "ratings": len(df),
            "users": int(df["user"].nunique()), "items": int(df["item"].nunique())}


def clear_cache(variant: str, data_home_dir=None) -> None:
    """Remove a cached variant (e.g. after a bad download)."""
    folder = data_home(data_home_dir) / "movielens" / variant
    if folder.is_dir():
        shutil.rmtree(folder)
