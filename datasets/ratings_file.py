"""A ratings file that the workers of a cluster read themselves: what a Ray shard loads from a
path (shared storage) instead of receiving the ratings from the driver.

``RatingsFile(path)`` is a spec of a few bytes: ``fit`` on a ``RayExecutor`` sends it to the
shard actors, each reads the file (any format ``load_ratings_file`` reads), checks it is the
file the driver named (its sha256), and keeps only the users of its reduce groups; the driver
never reads a rating (it learns the raw ids, each user's count and the sums a fit needs from the
shards). Elsewhere (the local executor) it is simply read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .interactions import Interactions

BLOCKS = 64  # = fedcf.federated.round.partials.REDUCE_GROUPS: user u is in block u % 64

_LOADED: dict = {}  # (path, sha256) -> Interactions, one file per process


def file_sha256(path) -> str:
    """The sha256 of a file, read in 1 MiB chunks (a large file is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class RatingsFile:
    """A ratings file read where it is needed (a Ray shard reads it and keeps its own users).

    Parameters
    ----------
    path : str or Path
        A ratings file ``load_ratings_file`` reads (MovieLens u.data, ratings.dat, ratings.csv,
        a zip or folder holding one), reachable at the same path from every worker.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from fedcf.datasets import RatingsFile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "ratings.csv").write_text("userId,movieId,rating,timestamp\\n1,10,4,0\\n2,10,3,0\\n")
    >>> RatingsFile(d / "ratings.csv").to_interactions().n_users
    2
    """

    path: str
    sha256: str = field(default="", init=False, repr=False)  # of the file, read at creation

    remote_vocabulary = True  # the raw ids are learned from a worker, not read here
    known_users = None  # the number of users is known once a worker has read the file

    def __post_init__(self):
        p = Path(str(self.path)).expanduser()
        try:
            digest = file_sha256(p)
        except OSError as e:
            raise ValueError(f"RatingsFile path {str(p)!r} cannot be read ({e}); give a ratings "
                             "file every worker reaches at this path") from None
        object.__setattr__(self, "path", str(p.resolve()))
        object.__setattr__(self, "sha256", digest)

    def to_interactions(self) -> Interactions:
        """The whole file, read in this process (checked to be the file this spec named,
        before and after parsing it, each time by a streamed hash: a file replaced while it
        was parsed is refused too)."""
        key = (self.path, self.sha256)
        if key not in _LOADED:
            from .movielens import load_ratings_file

            self._check()
            inter = load_ratings_file(self.path)
            self._check()
            _LOADED.clear()
            _LOADED[key] = inter
        return _LOADED[key]

    def _check(self) -> None:
        if file_sha256(self.path) != self.sha256:
            raise ValueError(f"{self.path!r} changed since the run named it (sha256 "
                             f"{self.sha256[:12]}…); every worker must read the same file")

    def vocabulary(self) -> tuple[np.ndarray, np.ndarray]:
        """(raw user ids, raw item ids) in dense order."""
        inter = self.to_interactions()
        return np.asarray(inter.user_ids), np.asarray(inter.item_ids)

    def build_rows(self, blocks=None):
        """(users, indptr, items, values): the users of ``blocks`` (dense id % 64), ascending,
        in a CSR over them only — what a shard keeps."""
        inter = self.to_interactions()
        blocks = range(BLOCKS) if blocks is None else blocks
        keep = np.zeros(BLOCKS, bool)
        keep[[int(b) for b in blocks if 0 <= int(b) < BLOCKS]] = True
        users = np.flatnonzero(keep[np.arange(inter.n_users) % BLOCKS])
        sub = inter.subset_users(users)
        return users, sub.indptr, sub.items, sub.values

    def describe(self) -> dict:
        return {"kind": type(self).__name__, "path": self.path, "sha256": self.sha256}
