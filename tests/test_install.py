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


def _package_files() -> set[str]:
    """Every file of the source's ``fedcf`` folder (modules, py.typed) and every module of
    the folders pyproject.toml maps into the package (``fedcf.benchmarks`` is scripts/,
    ``fedcf.datasets`` datasets/, ``fedcf.eval`` eval/), as paths inside the installed
    ``fedcf`` folder: read from the tree, so a package left out of pyproject.toml's list is
    missed by the install and caught here."""
    import tomllib

    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    out = {str(f.relative_to(ROOT / "fedcf")) for f in (ROOT / "fedcf").rglob("*")
           if f.is_file() and "__pycache__" not in f.parts}
    for pkg, folder in mapped.items():
        out |= {str(Path(*pkg.split(".")[1:]) / f.name) for f in (ROOT / folder).glob("*.py")}
    assert len(out) > 100 and "benchmarks/bench.py" in out and "py.typed" in out
    return out


def _cli_from_the_installed_package(env_dir, env, work):
    """A fresh (non-editable) install holds every file of the package (modules and data, the
    benchmark scripts as fedcf.benchmarks), imports every module, and its console script
    answers each command. The commands' own work is tested in process (tests/test_cli.py);
    compiling from an installed copy is the job above (its kernel cache goes to ~/.cache)."""
    py = str(env_dir / "bin" / "python")
    listing = ("import pathlib, fedcf; root = pathlib.Path(fedcf.__file__).parent; "
               "print('\\n'.join(sorted(str(p.relative_to(root)) for p in root.rglob('*') "
               "if p.is_file() and '__pycache__' not in p.parts)))")
    installed = set(_run([py, "-c", listing], env, work).split())
    missing = _package_files() - installed
    assert not missing, f"files of the package missing from a regular install: {missing}"
    walk = ("import importlib, pkgutil, fedcf; "
            "names = [m.name for m in pkgutil.walk_packages(fedcf.__path__, 'fedcf.') "
            "if not m.name.endswith('__main__')]; "
            "[importlib.import_module(n) for n in names]; print(len(names))")
    assert int(_run([py, "-c", walk], env, work)) > 50
    fedcf = str(env_dir / "bin" / "fedcf")
    for command in ("train", "evaluate", "recommend", "benchmark", "data", "compile", "plot"):
        assert "usage: fedcf " + command in _run([fedcf, command, "--help"], env, work)
