"""Installs in a fresh environment: a regular install runs and uninstalls cleanly (a Numba cache
written into site-packages used to survive `pip uninstall` and shadow a later editable install as
an empty namespace package); then README's two commands in order, in one environment, compile
the kernels once."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, env, cwd):
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        out = res.stdout + res.stderr
        if any(s in out for s in ("No matching distribution", "Could not find a version",
                                  "NewConnectionError", "Temporary failure in name resolution")):
            pytest.skip("package registry unreachable: cannot build in a fresh environment")
        raise AssertionError(f"{' '.join(map(str, cmd))} failed:\n{out[-3000:]}")
    return res.stdout


@pytest.mark.cluster
def test_install_run_uninstall_then_editable_import(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     os.environ, tmp_path).strip())
    # dependencies come from this interpreter's site-packages (a path in a .pth file: its own
    # .pth files, such as the editable install running these tests, are not processed)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for k in ("NUMBA_CACHE_DIR", "FEDCF_NUMBA_CACHE", "XDG_CACHE_HOME", "PYTHONPATH"):
        env.pop(k, None)
    work = tmp_path / "elsewhere"
    work.mkdir()
    src = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache"))
    _run([py, "-m", "pip", "install", "-q", "--no-deps", str(src)], env, work)
    job = ("import numpy as np, fedcf; from fedcf._kernels.rng import stream_keys; "
           "stream_keys(np.uint64(1), np.uint64(2), np.arange(3, dtype=np.uint64)); "
           "print(fedcf.__file__)")
    assert str(site) in _run([py, "-c", job], env, work)
    assert not list((site / "fedcf").rglob("*.nbi")), "Numba cache written into site-packages"
    assert list((tmp_path / "home" / ".cache" / "fedcf" / "numba").rglob("*.nbi"))
    _cli_from_the_installed_package(env_dir, env, work)
    _run([py, "-m", "pip", "uninstall", "-y", "-q", "fedcf"], env, work)
    assert not (site / "fedcf").exists(), "uninstall left a fedcf folder behind"
    _readme_order_compiles_once(py, env, work, src, job)
    assert sys.executable  # the outer interpreter is untouched


def _readme_order_compiles_once(py, env, work, src, job):
    """README's commands: an editable install and the job, then the test extras' editable
    install of the same checkout. The second install reuses the first one's kernels (nothing
    is recompiled), and the uninstalled copy's kernels are gone from the cache."""
    cache = Path(env["HOME"]) / ".cache" / "fedcf" / "numba"
    folders = {f.name for f in cache.glob("_kernels_*")}
    for _ in range(2):
        _run([py, "-m", "pip", "install", "-q", "--no-deps", "-e", str(src)], env, work)
        assert str(src / "fedcf" / "__init__.py") in _run([py, "-c", job], env, work)
        cached = {f: f.stat().st_mtime_ns for f in cache.rglob("*.nbi")}
        if _ == 0:
            first = cached
    assert cached == first, "the second install recompiled the kernels"
    new = {f.name for f in cache.glob("_kernels_*")}
    assert len(new) == 1 and not new & folders, "the uninstalled copy's kernels were kept"
    out = _run([py, "-c", "import fedcf, fedcf.datasets; print(fedcf.FedReconMF)"], env, work)
    assert "FedReconMF" in out


def _cli_from_the_installed_package(env_dir, env, work):
    """The console script of a fresh (non-editable) install: train → recommend → evaluate, and
    the benchmark scripts importable as fedcf.benchmarks."""
    from fedcf.datasets import make_synthetic_ratings

    df = make_synthetic_ratings(120, 40, 2000, n_factors=2, random_state=0).to_dataframe()
    df.to_csv(work / "r.csv", index=False)
    fedcf = str(env_dir / "bin" / "fedcf")
    _run([fedcf, "train", "--data", "r.csv", "--model", "fedrecon", "--rounds", "3",
          "--factors", "2", "--out", "m.npz"], env, work)
    items = [str(i) for i in df["item"].unique()[:2]]
    assert "rank" in _run([fedcf, "recommend", "--model", "m.npz", "--items", *items,
                           "--ratings", "5", "1"], env, work)
    assert "rmse" in _run([fedcf, "evaluate", "--model", "m.npz", "--data", "r.csv"], env, work)
    py = str(env_dir / "bin" / "python")
    _run([py, "-c", "import fedcf.benchmarks.movielens_benchmark"], env, work)
