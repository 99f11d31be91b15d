"""Compile fedcf's Numba kernels ahead of use: by named code path, in this process, in worker
processes, or in the background while this process works.

Numba compiles a kernel on its first call and keeps the machine code in the cache folder
(``fedcf._numba_cache``), so only the first run on a machine pays. A *path* is a small fit and
evaluation that calls exactly the kernels (and argument types) of one kind of job; compiling it in
another process fills the shared cache, and this process then loads instead of compiling.
``python -m fedcf compile`` runs every path (e.g. once after installing, in an image build).
"""

from __future__ import annotations

import hashlib
import numbers
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from numba.core import event

from ._numba_cache import cache_dir  # noqa: F401  (public here: where the compiled kernels live)
from .federated.algorithms.client_update import ClientUpdate
from .federated.algorithms.hyper import Hypergradients
from .federated.algorithms.reconstruction import SGDReconstruction
from .federated.executors.ray_shard import InProcessShards


def _tiny():
    from fedcf.datasets import make_synthetic_ratings
    from fedcf.eval import per_user_time_split, user_split

    inter = make_synthetic_ratings(60, 40, 1200, random_state=0)
    train_t, _, test_t = per_user_time_split(inter, (0.8, 0.1, 0.1))
    train_u, _, test_u = user_split(inter, (0.7, 0.1, 0.2), random_state=0)
    return train_t, test_t, train_u, test_u


def _evaluate(model, test_t=None, test_u=None):
    from fedcf.eval import random_embedding_eval, recon_eval, standard_eval

    if test_t is not None:
        standard_eval(model, test_t, n_repeats=2)
    if test_u is not None:
        recon_eval(model, test_u, n_repeats=2)
        random_embedding_eval(model, test_u, n_repeats=2)


def _federated(cls, train, test_t, test_u, **params):
    model = cls(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0, **params)
    _evaluate(model.fit(train), test_t, test_u)


# the main job's FedRecon configurations (scripts/movielens_benchmark.py: PAPER, OURS)
_PAPER = dict(biases=False, reconstruction=SGDReconstruction(steps=3),
              client_update=ClientUpdate(steps=3, batch_size=5), split="random")
_OURS = dict(biases=True, reconstruction="als")


def _centralized(data):
    from fedcf import CentralizedMF

    train_t, test_t, train_u, test_u = data
    _evaluate(CentralizedMF(n_factors=4, solver="als", n_epochs=1).fit(train_t), test_t)
    _evaluate(CentralizedMF(n_factors=4, solver="als", n_epochs=1).fit(train_u), None, test_u)
    CentralizedMF(n_factors=4, solver="als", als_solver="cg", n_epochs=1).fit(train_t)


def _centralized_sgd(data):
    from fedcf import CentralizedMF

    _evaluate(CentralizedMF(n_factors=4, solver="sgd", n_epochs=1).fit(data[0]), data[1])


def _fedavg(data):
    """The stateful baselines, FedAvg and FURL (user rows kept between rounds)."""
    from fedcf import FURLMF, FedAvgMF

    train_t, test_t, train_u, test_u = data
    _federated(FedAvgMF, train_t, test_t, None)
    _federated(FedAvgMF, train_u, None, test_u)
    _federated(FURLMF, train_t, test_t, None)
    _federated(FURLMF, train_t, None, None,  # its tangents (a learned server rate)
               hypergradients=Hypergradients(["server_learning_rate"]))


def _fedrecon_sgd(data):
    from fedcf import FedReconMF

    _federated(FedReconMF, data[2], None, data[3], **_PAPER)


def _fedrecon_als(data):
    from fedcf import FedReconMF

    train_t, test_t, train_u, test_u = data
    _federated(FedReconMF, train_u, None, test_u, **_OURS)
    _federated(FedReconMF, train_u, None, None, executor=InProcessShards())  # Ray's sums
    _federated(FedReconMF, train_t, test_t, None, **_OURS)


def _hypergradient(data):
    from fedcf import FedReconMF

    _federated(FedReconMF, data[2], None, data[3], hypergradients=Hypergradients(),
               **_OURS)


def _fedrecon_variants(data):
    from fedcf import FedReconMF
    from fedcf.federated import TrimmedMean

    for extra in (dict(split="none"), dict(joint=True), dict(server_optimizer="adagrad"),
                  dict(aggregator=TrimmedMean()),  # the robust aggregators' row statistics
                  dict(server_optimizer="adam"), dict(server_optimizer="yogi")):
        _federated(FedReconMF, data[2], None, data[3], **{**_PAPER, **extra})


def _implicit(data):
    from fedcf import FedReconImplicitMF, ImplicitMF

    train = data[2]
    ImplicitMF(n_factors=4, n_epochs=1).fit(train).recommend(train.user_ids[:3], n=5)
    for full, executor in ((False, None), (True, None), (False, InProcessShards())):
        FedReconImplicitMF(n_factors=4, n_rounds=2, clients_per_round=8, full_negatives=full,
                           random_state=0, executor=executor).fit(train)


def _binary(data):
    from fedcf.datasets import Interactions

    t = data[2]
    return Interactions(t.indptr, t.items, t.values * 0 + 1, None, t.user_ids, t.item_ids)


def _sampled(data):
    """The sampled-negative baselines (FedMF, PFedRec): training, scores, new users."""
    from fedcf.federated import FedMF, PFedRec

    train = _binary(data)
    for cls in (FedMF, PFedRec):
        model = cls(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0).fit(train)
        model.user_scores([0, 1])
        model.score_new_users(train.subset_users([2, 3]))


def _neumf(data):
    """FedNCF and centralized NCF (the NeuMF network)."""
    from fedcf import NCF
    from fedcf.federated import FedNCF

    train = _binary(data)
    model = FedNCF(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0).fit(train)
    model.user_scores([0, 1])
    model.score_new_users(train.subset_users([2, 3]))  # new devices' rows (fold-in)
    NCF(n_factors=4, n_epochs=1, random_state=0).fit(train).user_scores([0, 1])


def _catalog(data):
    """Items outside the catalog: UNK, hashed local rows, a learned default."""
    from fedcf import FedReconMF
    from fedcf.federated import OpenCatalog

    space = OpenCatalog(0.5, unknown_item_row=True, local_item_buckets=4, learned_default=True)
    model = FedReconMF(n_factors=4, n_rounds=2, clients_per_round=8, item_space=space,
                       random_state=0).fit(data[2])
    model.recon_predict(data[3], data[3])


def _ope(data):  # the slate off-policy study (fedcf.eval.ope_study)
    from fedcf.eval.ope_study import warm_up
    warm_up()


def _float64(data):
    """``dtype="float64"``: the same kernels compiled for double precision (FedRecon with both
    reconstructions and hypergradients, FedAvg with hypergradients, FURL, implicit, centralized)."""
    from fedcf import FURLMF, CentralizedMF, FedAvgMF, FedReconImplicitMF, FedReconMF, ImplicitMF

    train_t, test_t, train_u, test_u = data
    f64 = dict(dtype="float64")
    for solver in ("als", "sgd"):
        _evaluate(CentralizedMF(n_factors=4, solver=solver, n_epochs=1, **f64).fit(train_t),
                  test_t)
    CentralizedMF(n_factors=4, als_solver="cg", n_epochs=1, **f64).fit(train_t)
    _federated(FedReconMF, train_u, None, test_u, **_PAPER, **f64)
    _federated(FedReconMF, train_t, test_t, None, **_OURS, **f64)
    _federated(FedReconMF, train_u, None, test_u, hypergradients=Hypergradients(), **_OURS, **f64)
    _federated(FedAvgMF, train_t, test_t, None, hypergradients=Hypergradients(), **f64)
    _federated(FURLMF, train_t, test_t, None, **f64)
    ImplicitMF(n_factors=4, n_epochs=1, **f64).fit(train_u).recommend(train_u.user_ids[:3], n=5)
    for full in (False, True):
        FedReconImplicitMF(n_factors=4, n_rounds=2, clients_per_round=8, full_negatives=full,
                           random_state=0, **f64).fit(train_u)


# in the order the main job (scripts/movielens_benchmark.py) first needs them; then what only
# the other estimators use
PATHS = {"centralized": _centralized, "fedavg": _fedavg, "fedrecon-sgd": _fedrecon_sgd,
         "fedrecon-als": _fedrecon_als, "hypergradient": _hypergradient,
         "fedrecon-variants": _fedrecon_variants, "centralized-sgd": _centralized_sgd,
         "implicit": _implicit, "sampled": _sampled, "neumf": _neumf, "catalog": _catalog,
         "ope": _ope, "float64": _float64}


# the path of each estimator class whose kernels do not depend on its settings
_PATH_OF = {"ImplicitMF": "implicit", "FedReconImplicitMF": "implicit", "FedAvgMF": "fedavg",
            "FURLMF": "fedavg", "FedMF": "sampled", "PFedRec": "sampled", "FedNCF": "neumf",
            "NCF": "neumf"}


def path_of(estimator) -> str:
    """The compile path whose kernels ``estimator`` runs (a subclass: its nearest known
    ancestor's)."""
    path = _float32_path_of(estimator)
    if str(estimator.get_params(deep=False).get("dtype")) == "float64" and path in _IN_FLOAT64:
        return "float64"
    return path


_IN_FLOAT64 = ("centralized", "centralized-sgd", "fedavg", "fedrecon-sgd", "fedrecon-als",
               "implicit")  # the paths _float64 runs in double precision too


def _float32_path_of(estimator) -> str:
    for cls in type(estimator).__mro__:
        if cls.__name__ in _PATH_OF:
            return _PATH_OF[cls.__name__]
    params = estimator.get_params(deep=False)
    if "solver" in params:  # CentralizedMF
        return "centralized-sgd" if params["solver"] == "sgd" else "centralized"
    if type(params.get("item_space")).__name__ == "OpenCatalog":
        return "catalog"
    sgd = "sgd" in str(params.get("reconstruction", "als")).lower()
    return "fedrecon-sgd" if sgd else "fedrecon-als"


def check_paths(paths) -> list[str]:
    """The named paths as a list (None = all), or a ValueError naming the unknown ones."""
    if paths is None:
        return list(PATHS)
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p]
    paths = list(paths)
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        raise ValueError(f"unknown compile path(s) {unknown} (choose from {list(PATHS)})"
                         if unknown else f"no compile path given (choose from {list(PATHS)})")
    return list(dict.fromkeys(paths))


def _stamp() -> str:
    """Changes whenever Numba's cached kernels go stale: the kernel sources' modification times
    and sizes (what Numba's own cache index checks), Numba, Python and the CPU."""
    import llvmlite.binding as ll
    import numba

    from fedcf import _kernels

    parts = [numba.__version__, sys.version, ll.get_host_cpu_name()]
    for f in sorted(Path(_kernels.__file__).parent.glob("*.py")):
        st = f.stat()
        parts.append(f"{f.name} {st.st_mtime_ns} {st.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _marker(path: str) -> Path | None:
    """The file that records "path compiled into this cache folder" (None: Numba has no cache
    folder of its own here)."""
    from numba.core import config

    if not config.CACHE_DIR:
        return None
    return Path(config.CACHE_DIR) / "fedcf-paths" / f"{path}-{_stamp()}"


def is_compiled(path: str) -> bool:
    """Whether the path's kernels were compiled into the cache folder by this fedcf and Numba
    (a later run loads them instead of compiling)."""
    marker = _marker(check_paths([path])[0])
    return marker is not None and marker.exists()


def _mark(path: str) -> None:
    marker = _marker(path)
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:  # a read-only cache folder only costs later runs a background compile
            pass


def _run_paths(paths, report=None, data=None) -> dict[str, float]:
    """Run each path here; report(path, seconds, error) after each."""
    data = _tiny() if data is None else data
    seconds = {}
    for path in paths:
        t0 = time.perf_counter()
        try:
            PATHS[path](data)
            _mark(path)
            error = None
        except Exception as exc:  # a failing path must not stop the others (reported)
            if report is None:
                raise
            error = f"{type(exc).__name__}: {exc}"
        seconds[path] = time.perf_counter() - t0
        if report is not None:
            report(path, seconds[path], error)
    return seconds


def _worker(paths, *, nice: int = 0) -> subprocess.Popen:
    """A process that compiles ``paths``; with ``paths == ["-"]``, each path written to its
    stdin in turn (one per line, until stdin closes)."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    preexec = (lambda: os.nice(nice)) if nice and hasattr(os, "nice") else None
    return subprocess.Popen([sys.executable, "-m", "fedcf.warmup", *paths], env=env,
                            stdin=subprocess.PIPE if paths == ["-"] else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=preexec)


def _parse(line: str):
    """A worker's report line "done <path> <seconds>" or "failed <path> <seconds> <error>":
    (path, seconds, error or None)."""
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) < 3 or parts[0] not in ("done", "failed"):
        return None
    error = (parts[3] if len(parts) > 3 else "failed") if parts[0] == "failed" else None
    return parts[1], float(parts[2]), error


def compile_kernels(paths=None, *, n_jobs: int = 1) -> dict[str, float]:
    """Compile (or load from the cache) the kernels of the named paths (None = all of ``PATHS``).

    ``n_jobs`` > 1 runs the paths in that many worker processes, each taking the next path in
    order when it finishes one (compilation is single threaded, so this is how a second core
    helps). Returns the seconds each path took; raises RuntimeError naming a path that failed.
    """
    paths = check_paths(paths)
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, numbers.Integral) or n_jobs < 1:
        raise ValueError(f"n_jobs must be a positive integer, got {n_jobs!r}")
    if n_jobs == 1:
        return _run_paths(paths)
    todo, lock = list(reversed(paths)), threading.Lock()
    seconds, failed = {}, {}

    def serve(proc):
        while True:
            with lock:
                path = todo.pop() if todo else None
            if path is None:
                break
            proc.stdin.write(path + "\n")
            proc.stdin.flush()
            parsed = _parse(proc.stdout.readline())
            if parsed is None:  # the worker died: its path is missing below
                break
            seconds[parsed[0]] = parsed[1]
            if parsed[2] is not None:
                failed[parsed[0]] = parsed[2]
        proc.stdin.close()

    workers = [_worker(["-"]) for _ in range(min(n_jobs, len(paths)))]
    threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t, w in zip(threads, workers):
        t.join()
        w.wait()
    missing = [p for p in paths if p not in seconds]
    if failed or missing:
        raise RuntimeError(f"compiling failed for {failed or missing}")
    return {p: seconds[p] for p in paths}


class BackgroundCompile:
    """Compile paths in low-priority worker processes while this process works.

    Paths already compiled into the cache folder (``is_compiled``; listed in ``cached``) are
    skipped; the others are dealt to ``n_workers`` workers in turn (give them in the order the
    work needs them). Call ``wait(path)`` before the work that needs a path: it returns once a worker has
    finished it (this process then loads the kernels from the cache instead of compiling them),
    at once if no worker compiles that path or its worker has died, and gives the seconds waited.
    Workers are stopped by ``close()``, at the end of a ``with`` block, or when this object is
    garbage collected.
    """

    def __init__(self, paths, *, n_workers: int = 2, nice: int = 10):
        self.paths = check_paths(paths)
        if isinstance(n_workers, bool) or not isinstance(n_workers, numbers.Integral) or \
                n_workers < 1:
            raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
        self.done: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.waited = 0.0
        self._cond = threading.Condition()
        self.cached = [p for p in self.paths if is_compiled(p)]
        todo = [p for p in self.paths if p not in self.cached]
        shares = [todo[j::n_workers] for j in range(min(n_workers, len(todo)))]
        self._owner = {p: j for j, share in enumerate(shares) for p in share}
        self._ended: set[int] = set()
        procs = [_worker(share, nice=nice) for share in shares]
        self._finalizer = weakref.finalize(self, _stop, procs)
        for j, proc in enumerate(procs):
            threading.Thread(target=self._read, args=(j, proc), daemon=True).start()

    def _read(self, j, proc):
        for line in proc.stdout:
            parsed = _parse(line)
            if parsed:
                with self._cond:
                    self.done[parsed[0]] = parsed[1]
                    if parsed[2] is not None:
                        self.failed[parsed[0]] = parsed[2]
                    self._cond.notify_all()
        with self._cond:
            self._ended.add(j)
            self._cond.notify_all()

    def wait(self, path: str) -> float:
        check_paths([path])
        t0 = time.perf_counter()
        if path in self._owner:
            with self._cond:
                self._cond.wait_for(lambda: path in self.done or self._owner[path] in self._ended)
        waited = time.perf_counter() - t0
        self.waited += waited
        return waited

    def close(self):
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class CompileClock(event.Listener):
    """Seconds this process spends compiling Numba kernels (outermost compilations only; loads
    from the cache are not compilations): ``with CompileClock() as clock: ...; clock.seconds``."""

    def __init__(self):
        self.seconds, self.count, self._depth, self._t0, self._sig = 0.0, 0, 0, 0.0, ""
        self.kernels: dict[str, int] = {}  # compilations per kernel (its qualified name)
        self.signatures: list[tuple[str, float]] = []  # ("kernel(argument types)", seconds)

    def on_start(self, ev):
        if self._depth == 0:
            self._t0 = time.perf_counter()
            name = ev.data["dispatcher"].py_func.__qualname__
            self.kernels[name] = self.kernels.get(name, 0) + 1
            self._sig = f"{name}{tuple(ev.data['args'])}"
        self._depth += 1

    def on_end(self, ev):
        self._depth -= 1
        if self._depth == 0:
            seconds = time.perf_counter() - self._t0
            self.seconds += seconds
            self.count += 1
            self.signatures.append((self._sig, seconds))

    def __enter__(self):
        event.register("numba:compile", self)
        return self

    def __exit__(self, *exc):
        event.unregister("numba:compile", self)


def _main(argv):
    def report(path, seconds, error):
        print(f"{'failed' if error else 'done'} {path} {seconds:.3f}"
              + (f" {error}" if error else ""), flush=True)

    if argv == ["-"]:  # paths from stdin, one per line, each run when it arrives
        data = _tiny()
        for line in sys.stdin:
            _run_paths(check_paths([line.strip()]), report, data)
        return
    _run_paths(check_paths(argv), report)


if __name__ == "__main__":
    _main(sys.argv[1:])
