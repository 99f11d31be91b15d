import importlib.util
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedcf.datasets import DataUnavailableError, make_synthetic_ratings

pytest_plugins = ["pytester"]

# Ray clusters the tests start (in-process or `ray start --head`) listen on 127.0.0.1 only: with
# this set before Ray is imported, Ray takes the loopback address as the node's (Ray 2.x binds
# every interface otherwise, whatever --node-ip-address says). Subprocesses inherit it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# and their workers run at the tests' priority: at Ray's default (nice 15) they starved beside
# the other xdist worker, and the Ray tests (one worker's whole share) ran several times longer
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_sessionstart(session):
    """A fresh clone starts with a cold Numba cache, and the tests would compile the kernels one
    by one on one core as they first meet them: compile every code path's kernels first, on
    both cores (``fedcf.warmup``), so the tests load them. A failure here only costs time."""
    if getattr(session.config, "workerinput", None) is not None:
        return
    try:
        from fedcf import warmup

        # the longest paths first: each worker takes the next path when it finishes one
        heavy = ["float64", "catalog", "neumf", "implicit", "sampled", "fedavg"]
        todo = [p for p in heavy + list(warmup.PATHS) if not warmup.is_compiled(p)]
        if todo:
            warmup.compile_kernels(todo, n_jobs=max(1, min(2, os.cpu_count() or 1)))
    except Exception as e:  # noqa: BLE001 - the tests compile what they need themselves
        import warnings

        warnings.warn(f"pre-compiling fedcf's kernels failed ({e}); the tests compile them "
                      "as they go", stacklevel=1)


COMPILES = pytest.StashKey()  # this process's CompileClock, from configure to session end


def pytest_configure(config):
    """Count the Numba compilations each test process makes (a cache load is not one): after
    the warm-up the workers should load every kernel, and the run's summary says what they
    compiled instead (``pytest_terminal_summary``)."""
    from fedcf.warmup import CompileClock

    config.stash[COMPILES] = CompileClock().__enter__()
    config.stash[WORKER_COMPILES] = {}


WORKER_COMPILES = pytest.StashKey()  # the controller's: what each worker reported


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand its compilations to the controller
        clock = session.config.stash[COMPILES]
        workeroutput["fedcf_compiles"] = {"seconds": clock.seconds, "kernels": clock.kernels,
                                          "signatures": clock.signatures}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", None) or {}
    if "fedcf_compiles" in out:
        node.config.stash[WORKER_COMPILES][node.gateway.id] = out["fedcf_compiles"]


def pytest_terminal_summary(terminalreporter, config):
    """One line: the Numba compilations the test processes made and their seconds."""
    runs = dict(config.stash[WORKER_COMPILES])
    if not runs:  # no workers (-n 0): this process ran the tests
        clock = config.stash[COMPILES]
        runs = {"main": {"seconds": clock.seconds, "kernels": clock.kernels,
                         "signatures": clock.signatures}}
    kernels: dict[str, int] = {}  # kernel -> how many processes compiled it
    for r in runs.values():
        for k in r["kernels"]:
            kernels[k] = kernels.get(k, 0) + 1
    seconds = sum(r["seconds"] for r in runs.values())
    count = sum(n for r in runs.values() for n in r["kernels"].values())
    again = sorted(k for k, n in kernels.items() if n > 1)
    log = os.environ.get("FEDCF_COMPILE_LOG")
    if log:  # every compilation's kernel and argument types, per test process
        Path(log).write_text("".join(f"{name} {sec:.2f} {sig}\n" for name, r in sorted(runs.items())
                                     for sig, sec in r.get("signatures", [])))
    terminalreporter.write_line(
        f"fedcf: {count} Numba compilations of {len(kernels)} kernels in {len(runs)} test "
        f"process(es), {seconds:.1f} s" + (f"; compiled in more than one process: "
                                            f"{', '.join(again[:8])}" if again else ""))


# The suite runs on pytest-xdist workers (pyproject: ``-n auto --dist loadgroup``). The tests that
# start Ray (a local instance, a head node, Flower's simulation engine) carry the ``ray`` marker and
# share one group, so they run one after another on one worker: two Ray sessions never race for
# the machine's cores or its session files (``ray_current_cluster``).


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most four (each holds its own Numba and Ray imports)."""
    return max(1, min(4, os.cpu_count() or 1))


def _starts_ray(item) -> bool:
    return item.get_closest_marker("ray") is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups off the markers
def pytest_collection_modifyitems(config, items):
    """Group the tests that start Ray, and put them first: the group is the longest unit of
    work, so it starts at once on one worker while the other workers share the rest."""
    for item in items:
        if _starts_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=lambda item: not _starts_ray(item))  # stable: modules stay contiguous


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Tests marked ``network`` fetch real data from a package registry: when no source can be
    reached (DataUnavailableError) they are skipped, not failed."""
    if pyfuncitem.get_closest_marker("network") is None:
        return None
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
    try:
        pyfuncitem.obj(**args)
    except DataUnavailableError as exc:
        pytest.skip(f"real data unreachable (offline?): {exc}")
    return True


@pytest.fixture(scope="session")
def small_population():
    """A small low-rank population with truth (400 users, 120 items)."""
    return make_synthetic_ratings(400, 120, 12_000, n_factors=4, noise=0.2, random_state=1,
                                  return_truth=True)


@pytest.fixture
def tiny_df():
    return pd.DataFrame({
        "user": ["a", "a", "b", "b", "b", "c"],
        "item": [10, 20, 10, 30, 20, 30],
        "rating": [4.0, 3.0, 5.0, 1.0, 2.0, 4.0],
        "timestamp": [3, 1, 2, 2, 1, 9],
    })


@pytest.fixture
def custom_estimator():
    """examples/custom_estimator.py's NormalInitMF, registered while the test runs (the
    registry's list is as before afterwards)."""
    from fedcf import registry

    path = Path(__file__).resolve().parents[1] / "examples" / "custom_estimator.py"
    spec = importlib.util.spec_from_file_location("custom_estimator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module.NormalInitMF
    finally:
        registry.unregister("estimator", "normal-init-mf")


def load_script(name):
    """Import scripts/<name>.py as a module (the scripts are not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"fedcf_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
