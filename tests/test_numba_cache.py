"""The Numba cache folder stays tidy: kernels of source folders that are gone, and entries of
kernel files edited since they were cached, are removed; what a live source folder can load is
kept (fedcf._numba_cache.tidy)."""

import os
import shutil
import time

from fedcf._numba_cache import NOTE, UNKNOWN_AGE, _folder, tidy


def _source(tmp_path, name):
    src = tmp_path / name / "_kernels"
    src.mkdir(parents=True)
    (src / "als.py").write_text("x = 1\n")
    return src


def _cached(root, src, entries=("als.solve-10.py311",)):
    folder = _folder(root, src)
    folder.mkdir(parents=True, exist_ok=True)
    for e in entries:
        for suffix in (".nbi", ".1.nbc", ".2.nbc"):
            (folder / f"{e}{suffix}").write_bytes(b"k")
    return folder


def test_tidy_removes_what_no_fedcf_can_load_and_keeps_the_rest(tmp_path):
    root = tmp_path / "cache"
    live, gone, other = (_source(tmp_path, n) for n in ("live", "gone", "other"))
    tidy(root, gone)  # an install that was later removed
    tidy(root, other)  # another live install sharing the cache
    old_unknown, new_unknown = root / "_kernels_aaa", root / "_kernels_bbb"
    for f in (old_unknown, new_unknown):
        f.mkdir()
        (f / "m.f-1.py311.nbi").write_bytes(b"k")
    past = time.time() - UNKNOWN_AGE - 60
    os.utime(old_unknown / "m.f-1.py311.nbi", (past, past))
    gone_folder, other_folder = _cached(root, gone), _cached(root, other)
    shutil.rmtree(gone.parent)
    own = _cached(root, live, ("als.solve-10.py311", "als.solve-3.py311", "rng.keys-5.py311"))
    later = time.time() + 5
    os.utime(live / "als.py", (later, later))  # als.py edited after its kernels were cached
    (live / "rng.py").write_text("y = 2\n")
    for f in own.glob("rng.*"):
        os.utime(f, (later + 5, later + 5))  # rng's entries are newer than rng.py
    assert tidy(root, live)
    assert not gone_folder.exists() and not old_unknown.exists()
    assert other_folder.exists() and new_unknown.exists()
    assert sorted(f.name for f in own.iterdir()) == sorted(
        [NOTE, "rng.keys-5.py311.nbi", "rng.keys-5.py311.1.nbc", "rng.keys-5.py311.2.nbc"])
    assert not tidy(root, live)  # nothing changed: one read, no walk
    (live / "als.py").write_text("x = 22\n")
    assert tidy(root, live)  # an edit is noticed
