"""Compiling kernels ahead of use (fedcf.warmup, ``fedcf compile``), and that its paths cover
the main job: after they ran, the main job compiles nothing."""

import subprocess
import sys
import time

import pytest
from conftest import load_script
from numba import njit

from fedcf import warmup as _warmup
from fedcf.cli import main as cli
from fedcf.warmup import BackgroundCompile, CompileClock, check_paths, compile_kernels


def test_paths_are_checked_by_name():
    assert check_paths(None) == list(_warmup.PATHS)
    assert check_paths("fedavg,centralized,fedavg") == ["fedavg", "centralized"]
    with pytest.raises(ValueError, match=r"unknown compile path\(s\) \['nope'\]"):
        check_paths(["fedavg", "nope"])
    with pytest.raises(ValueError, match="no compile path given"):
        check_paths(",")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_jobs must be a positive integer"):
            compile_kernels(["centralized"], n_jobs=bad)
        with pytest.raises(ValueError, match="n_workers must be a positive integer"):
            BackgroundCompile(["centralized"], n_workers=bad)


def test_cli_compile_refuses_bad_flags(capsys):
    assert cli(["compile", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert cli(["compile", "--paths", "centralized,typo"]) == 2
    assert "unknown compile path(s) ['typo']" in capsys.readouterr().err


def test_compile_clock_counts_compilations_not_calls():
    @njit
    def twice(x):
        return 2 * x

    with CompileClock() as clock:
        twice(1.0)
        twice(2.0)  # same types: no second compilation
        twice(3)  # int: a second one
    assert clock.count == 2 and clock.seconds > 0
    assert clock.kernels == {"test_compile_clock_counts_compilations_not_calls.<locals>.twice": 2}
    with CompileClock() as again:
        twice(4.0)
    assert again.count == 0 and again.seconds == 0


def test_main_job_compiles_nothing_after_its_paths():
    """The paths call the main job's kernels with its argument types: a drift (a new kernel, a
    new dtype) shows up here as a compilation."""
    bench = load_script("movielens_benchmark")
    compile_kernels(bench.BACKGROUND)
    with CompileClock() as clock:
        rows = bench.main(["--dataset", "synthetic", "--quick", "--no-progress",
                           "--no-background-compile"])
    assert clock.count == 0, clock.count
    used = {bench.compile_path(getattr(bench, r["model"]), r["params"]) for r in rows}
    assert used == set(bench.BACKGROUND)


def test_worker_processes_compile_and_report(tmp_path):
    seconds = compile_kernels(["centralized-sgd", "centralized"], n_jobs=2)
    assert set(seconds) == {"centralized-sgd", "centralized"}
    assert all(s > 0 for s in seconds.values())
    assert cli(["-q", "compile", "--paths", "centralized-sgd"]) == 0


def test_workers_take_the_next_path_when_they_finish_one(monkeypatch):
    """Paths are handed out one at a time (a worker that finished asks for the next), every
    path runs once, and a path whose worker died is named, not waited for."""
    paths = ["centralized-sgd", "fedrecon-variants", "centralized"]
    seconds = compile_kernels(paths, n_jobs=2)
    assert list(seconds) == paths and all(s > 0 for s in seconds.values())

    def dying(paths, *, nice=0):
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    monkeypatch.setattr(_warmup, "_worker", dying)
    with pytest.raises(RuntimeError, match="compiling failed for .*centralized-sgd"):
        compile_kernels(paths, n_jobs=2)


def test_background_compile_waits_for_its_paths_and_stops(monkeypatch):
    monkeypatch.setattr(_warmup, "is_compiled", lambda path: False)
    with BackgroundCompile(["centralized-sgd"], n_workers=1) as bg:
        t0 = time.perf_counter()
        assert bg.wait("implicit") < 1.0  # not one of its paths: no wait
        assert time.perf_counter() - t0 < 1.0
        bg.wait("centralized-sgd")
        assert "centralized-sgd" in bg.done and not bg.failed
    with pytest.raises(ValueError, match="unknown compile path"):
        bg.wait("nope")


def test_background_compile_does_not_hang_when_a_worker_dies(monkeypatch):
    def dying(paths, *, nice=0):
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"],
                                stdout=subprocess.PIPE, text=True)

    monkeypatch.setattr(_warmup, "_worker", dying)
    monkeypatch.setattr(_warmup, "is_compiled", lambda path: False)
    bg = BackgroundCompile(["fedavg", "implicit"], n_workers=2)
    bg.wait("fedavg")
    bg.wait("implicit")
    assert bg.done == {}
    bg.close()
    bg.close()  # twice is fine


def test_a_failing_path_is_reported_not_raised_in_a_worker(monkeypatch, capsys):
    monkeypatch.setitem(_warmup.PATHS, "centralized-sgd", lambda data: 1 / 0)
    _warmup._main(["centralized-sgd"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("failed centralized-sgd ") and "ZeroDivisionError" in line
    assert _warmup._parse(line)[0] == "centralized-sgd"
    with pytest.raises(ZeroDivisionError):
        compile_kernels(["centralized-sgd"])


def test_compiled_paths_are_marked_in_the_cache_folder_and_skipped(monkeypatch, tmp_path):
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    assert not _warmup.is_compiled("fedavg")
    _warmup._mark("fedavg")
    assert _warmup.is_compiled("fedavg") and not _warmup.is_compiled("implicit")
    monkeypatch.setattr("numba.__version__", "0.0.0")  # another Numba: the marks are stale
    assert not _warmup.is_compiled("fedavg")
    monkeypatch.undo()
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    started = []
    monkeypatch.setattr(_warmup, "_worker", lambda paths, nice=0: started.append(paths) or
                        subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE,
                                         text=True))
    with BackgroundCompile(["fedavg", "implicit"], n_workers=2) as bg:
        assert bg.cached == ["fedavg"] and started == [["implicit"]]
        assert bg.wait("fedavg") < 0.5
    monkeypatch.setattr(config, "CACHE_DIR", "")
    assert not _warmup.is_compiled("fedavg")  # no cache folder: nothing is marked
    _warmup._mark("fedavg")
    with pytest.raises(ValueError, match="unknown compile path"):
        _warmup.is_compiled("nope")


def test_each_registered_estimator_names_a_path_that_trains_its_class(monkeypatch):
    """``fedcf train`` marks ``path_of(model)`` compiled after a fit: that path must train an
    estimator of the model's class (with its settings' kernels), or the note "compiling ..."
    would be skipped for kernels that were never compiled."""
    from fedcf import registry
    from fedcf.warmup import path_of

    fitted = []
    estimators = [registry.lookup("estimator", n) for n in registry.names("estimator")]
    def spying(fit):
        def spy(self, *a, **k):
            fitted.append(type(self))
            return fit(self, *a, **k)
        return spy

    for cls in {c for e in estimators for c in e.__mro__ if "fit" in vars(c)}:
        monkeypatch.setattr(cls, "fit", spying(vars(cls)["fit"]))
    trained = {}
    for name, run in _warmup.PATHS.items():
        fitted.clear()
        run(_warmup._tiny())
        trained[name] = list(fitted)
    for name in registry.names("estimator"):
        est = registry.lookup("estimator", name)()
        classes = set(trained[path_of(est)])
        assert type(est) in classes, (name, path_of(est), classes)
    sgd = registry.lookup("estimator", "fedrecon")(reconstruction="sgd")
    assert path_of(sgd) == "fedrecon-sgd" and path_of(registry.lookup(
        "estimator", "centralized")(solver="sgd")) == "centralized-sgd"


def test_the_suite_time_script_runs_pytest_idle_and_beside_busy_neighbours(tmp_path,
                                                                           monkeypatch):
    """scripts/suite_time.py: a run per number of CPU-bound neighbours, pytest's summary and
    the test processes' compile line read back, and every neighbour stopped afterwards."""
    import json
    import subprocess as sp

    mod = load_script("suite_time")
    started = []
    real = sp.Popen

    def popen(*a, **k):
        started.append(real(*a, **k))
        return started[-1]

    monkeypatch.setattr(mod.subprocess, "Popen", popen)
    rows = mod.main(["--hogs", "0", "1", "--reference-rounds", "2", "--json",
                     str(tmp_path / "s.json"), "--",
                     "tests/test_state.py", "-k", "inverse", "-n", "0", "-p", "no:cacheprovider"])
    assert [r["hogs"] for r in rows] == [0, 1]
    assert rows[0]["reference_fit_seconds"] > 0  # one reference fit, read beside each run
    assert rows[1]["reference_fit_seconds"] == rows[0]["reference_fit_seconds"]
    for r in rows:
        assert r["returncode"] == 0 and r["passed"] == 1 and r["pytest_seconds"] > 0
        assert r["failures"] == []
        assert r["compiled"].startswith("fedcf: ") and "Numba compilations" in r["compiled"]
    hogs = [p for p in started if p.args[1:] == ["-c", mod.HOG]]
    assert len(hogs) == 1 and hogs[0].poll() is not None  # the neighbour was stopped
    assert json.loads((tmp_path / "s.json").read_text())[1]["hogs"] == 1
    with pytest.raises(SystemExit):
        mod.main(["--hogs", "-1"])  # a negative count is named, not run as zero
    with pytest.raises(SystemExit):
        mod.main(["--reference-rounds", "-5"])


def test_the_suite_time_script_can_start_each_run_from_an_empty_cache(monkeypatch):
    """``--cold``: pytest runs with a Numba cache folder of its own, empty at the start (as a
    fresh clone's), removed afterwards; the row says so."""
    import os
    import subprocess as sp

    mod = load_script("suite_time")
    seen = []

    def run(cmd, **kw):
        cache = kw["env"]["FEDCF_NUMBA_CACHE"]
        seen.append((cache, os.listdir(cache)))
        return sp.CompletedProcess(cmd, 1, "fedcf: 3 Numba compilations of 2 kernels in 1 test "
                                           "process(es), 1.0 s\nFAILED tests/test_x.py::test_y - "
                                           "AssertionError\n== 1 failed, 1 passed in 1.00s ==\n",
                                   "")

    monkeypatch.setattr(mod.subprocess, "run", run)
    rows = mod.main(["--cold", "--hogs", "0", "--reference-rounds", "0"])
    assert rows[0]["cold"] and rows[0]["passed"] == 1 and rows[0]["failed"] == 1
    assert rows[0]["failures"] == ["tests/test_x.py::test_y"]  # named, to look into
    assert seen[0][1] == [] and not os.path.exists(seen[0][0])
    assert seen[0][0] != os.environ.get("FEDCF_NUMBA_CACHE")
