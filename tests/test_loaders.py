import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedcf.datasets import (
    DataUnavailableError,
    DataValidationError,
    fetch_movielens,
    load_movielens,
    load_ratings_file,
    make_synthetic_ratings,
)
from fedcf.datasets import movielens as ml
from fedcf.datasets.movielens import detect_format, parse_ratings, read_recbole_wheel

ROWS = [(1, 10, 4, 100), (1, 20, 3, 50), (2, 10, 5, 70)]


def write_formats(tmp_path):
    files = {}
    files["u.data"] = "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ROWS)
    files["ratings.dat"] = "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in ROWS)
    files["ratings.csv"] = "userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{r},{t}\n" for u, i, r, t in ROWS)
    files["ml.inter"] = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + "".join(
        f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ROWS)
    paths = {}
    for name, text in files.items():
        p = tmp_path / name
        p.write_text(text)
        paths[name] = p
    return paths


@pytest.mark.parametrize("name", ["u.data", "ratings.dat", "ratings.csv", "ml.inter"])
def test_every_format_parses_to_the_same_ratings(tmp_path, name):
    path = write_formats(tmp_path)[name]
    df = parse_ratings(path)
    assert df[["user", "item", "rating", "timestamp"]].values.tolist() == [list(map(float, r)) for r in ROWS]
    inter = load_ratings_file(path)
    assert (inter.n_users, inter.n_items, inter.nnz) == (2, 2, 3)
    # user 1 reads oldest first: item 20 (t=50) then item 10 (t=100)
    assert list(inter.item_ids[inter.items[:2]]) == [20, 10]


def test_format_detection_from_content():
    assert detect_format("x", "1::2::3::4") == "ratings.dat"
    assert detect_format("x", "userId,movieId,rating,timestamp") == "ratings.csv"
    assert detect_format("x", "1\t2\t3\t4") == "u.data"
    assert detect_format("x", "user_id:token\titem_id:token") == "inter"
    with pytest.raises(DataValidationError, match="cannot tell the ratings format"):
        detect_format("x", "1 2 3 4")


def test_bad_files_give_clear_errors(tmp_path):
    p = tmp_path / "ratings.csv"
    p.write_text("userId,movieId,score\n1,2,3\n")
    with pytest.raises(DataValidationError, match="column 'rating' not found"):
        parse_ratings(p)
    p = tmp_path / "u.data"
    p.write_text("1\t2\tfive\t100\n")
    with pytest.raises(DataValidationError, match="'rating' has non-numeric value 'five' at data row 0"):
        parse_ratings(p)
    p.write_text("1\t2\t3\n")
    with pytest.raises(DataValidationError, match="fields are missing|missing fields"):
        parse_ratings(p)


def test_zip_folder_and_wheel_paths(tmp_path):
    paths = write_formats(tmp_path)
    z = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.write(paths["u.data"], "ml-100k/u.data")
    assert load_movielens("100k", path=z, duplicates="error").nnz == 3
    folder = tmp_path / "only"
    folder.mkdir()
    (folder / "ratings.dat").write_text(paths["ratings.dat"].read_text())
    assert load_ratings_file(folder).nnz == 3
    # a wheel whose member does not match the pinned checksum is refused, naming both hashes
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(ml.RECBOLE_MEMBER, paths["ml.inter"].read_text())
    with pytest.raises(DataUnavailableError, match="expected " + ml.RECBOLE_SHA256):
        load_movielens("100k", path=wheel)
    assert parse_ratings(read_recbole_wheel(wheel, verify=False), "x.inter").shape == (3, 4)


def test_cache_env_and_offline_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCF_DATA", str(tmp_path / "cache"))
    with pytest.raises(DataUnavailableError) as err:
        fetch_movielens("1m", download=False)
    msg = str(err.value)
    assert "load_movielens('1m', path='/path/to/file')" in msg and str(tmp_path / "cache") in msg
    # a file placed in the cache folder is used without any download
    target = tmp_path / "cache" / "movielens" / "latest-small"
    target.mkdir(parents=True)
    (target / "ratings.csv").write_text(write_formats(tmp_path)["ratings.csv"].read_text())
    assert load_movielens("latest-small", download=False).nnz == 3
    with pytest.raises(ValueError, match="unknown MovieLens variant"):
        fetch_movielens("20m")


def test_known_release_size_is_checked(tmp_path):
    import pandas as pd

    df = pd.DataFrame(ROWS, columns=["user", "item", "rating", "timestamp"])
    with pytest.raises(DataValidationError, match="should have"):
        ml._check_known_shape(df, "100k", "test")


@pytest.mark.network
def test_real_movielens_100k_through_offline_pypi_source(tmp_path, monkeypatch):
    """The real ML-100K, fetched from the recbole wheel on PyPI (the only reachable source here)."""
    monkeypatch.setenv("FEDCF_DATA", str(tmp_path))
    path = fetch_movielens("100k", sources=("pypi",))
    assert path.name == "ml-100k.inter"
    inter = load_movielens("100k")  # now from the cache
    assert (inter.nnz, inter.n_users, inter.n_items) == (100_000, 943, 1682)
    assert set(np.unique(inter.values)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert inter.timestamps is not None and inter.counts().min() >= 20


def test_synthetic_population_is_heavy_tailed_and_seeded():
    a, truth = make_synthetic_ratings(3000, 400, 60_000, random_state=3, return_truth=True)
    b = make_synthetic_ratings(3000, 400, 60_000, random_state=3)
    assert np.array_equal(a.items, b.items) and np.array_equal(a.values, b.values)
    counts = a.counts()
    assert abs(a.nnz - 60_000) / 60_000 < 0.1
    assert (counts <= 5).mean() > 0.1 and counts.max() > 10 * np.median(counts)
    item_counts = np.bincount(a.items, minlength=400)
    top = np.sort(item_counts)[::-1]
    assert top[:40].sum() > 0.3 * a.nnz  # top 10% of items carry a large share
    assert set(np.unique(a.values)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert np.all(np.diff(a.timestamps)[np.diff(a.user_index()) == 0] >= 0)
    with pytest.raises(ValueError, match="n_users must be a positive integer"):
        make_synthetic_ratings(0, 10, 5)


def test_network_tests_skip_when_no_source_is_reachable(pytester):
    """A test marked ``network`` whose data fetch finds no source is skipped, not failed."""
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    pytester.makeconftest(conftest)
    pytester.makeini("[pytest]\nmarkers =\n    network: needs a registry\n")
    pytester.makepyfile("""
        import pytest
        from fedcf.datasets import DataUnavailableError

        @pytest.mark.network
        def test_offline():
            raise DataUnavailableError("no route to any source")

        @pytest.mark.network
        def test_real_failure_still_fails():
            assert False
    """)
    res = pytester.runpytest_inprocess("-q")
    res.assert_outcomes(skipped=1, failed=1)


def test_empty_encoded_and_damaged_files_are_named(tmp_path):
    """An empty or blank file, a damaged zip, a UTF-16 export and a garbage Open Bandit CSV:
    each error names the file and what is wrong with it (before: pandas' EmptyDataError
    without a path, a format guess from 'PK…', columns full of NUL bytes)."""
    from fedcf.datasets.open_bandit import load_open_bandit

    p = tmp_path / "u.data"
    for blank in ("", "  \n \n"):
        p.write_text(blank)
        with pytest.raises(DataValidationError, match=r"u.data is empty \(no ratings in it\)"):
            load_movielens("100k", path=p)
    z = tmp_path / "ml-100k.zip"
    z.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataValidationError, match="starts like a zip archive but cannot be "
                                                  "opened"):
        load_ratings_file(z)
    csv = tmp_path / "ratings.csv"
    text = "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r},{t}\n"
                                                         for u, i, r, t in ROWS)
    csv.write_text(text, encoding="utf-16")  # with a byte-order mark: read as such
    assert load_ratings_file(csv).nnz == len(ROWS)
    csv.write_bytes(text.encode("utf-16-le"))  # no mark: NUL bytes, named
    with pytest.raises(DataValidationError, match="NUL bytes: probably UTF-16"):
        load_ratings_file(csv)
    ob = tmp_path / "ob.csv"
    ob.write_text(",item_id,position,click,propensity_score\n0,1,1,yes,0.5\n")
    with pytest.raises(DataValidationError, match="column 'click' has a non-numeric or missing "
                                                  "value at data row 0 .'yes'."):
        load_open_bandit(path=ob)
    ob.write_text("")
    with pytest.raises(DataValidationError, match="ob.csv is empty"):
        load_open_bandit(path=ob)


def test_the_tests_that_start_ray_run_on_one_worker(pytester, monkeypatch):
    """The conftest's ``ray`` group holds under pytest-xdist: every test marked ``ray`` runs on
    one worker, so two Ray sessions never race (the group was once set after xdist had read the
    markers, and the Ray tests ran on both workers at once)."""
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    pytester.makeconftest(conftest)
    pytester.makeini("[pytest]\nmarkers =\n    ray: starts Ray\n    network: registry\n")
    pytester.makepyfile("""
        import os
        import pytest

        def record(kind):
            with open(os.path.join(os.environ["WHERE"], kind), "a") as f:
                f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

        @pytest.mark.ray
        @pytest.mark.parametrize("i", range(6))
        def test_ray(i):
            record("ray")

        @pytest.mark.parametrize("i", range(6))
        def test_other(i):
            record("other")
    """)
    where = pytester.mkdir("where")
    monkeypatch.setenv("WHERE", str(where))
    from numba.core import config

    if config.CACHE_DIR:  # pytester moves HOME: keep the session's compiled kernels in reach,
        monkeypatch.setenv("FEDCF_NUMBA_CACHE", config.CACHE_DIR)  # or its warm-up recompiles
    res = pytester.runpytest_subprocess("-q", "-n", "2", "--dist", "loadgroup", "-p", "xdist")
    res.assert_outcomes(passed=12)
    workers = (where / "ray").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1 and workers[0].startswith("gw"), workers
