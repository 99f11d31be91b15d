"""Guards that keep the architecture from eroding: the round's machinery reads only what its
contracts declare (no probes for undeclared members), every member it uses on a phase object
is declared on that phase's contract, and no source file of the package grows past 500 lines."""

import ast
from collections import Counter
from pathlib import Path

import pytest

from fedcf.federated.round.contracts import Aggregator, RoundExecutor

ROOT = Path(__file__).resolve().parents[1]
PROBES = ("getattr", "hasattr", "vars")  # calls; and any use of ``__dict__``

# Probes the round's machinery (fedcf/federated, fedcf/flower) may hold, each with its reason.
ROUND_ALLOWED = {
    ("fedcf/federated/round/params.py", "Params._param_values", "getattr"):
        "reads the constructor's own parameter names (scikit-learn's get_params)",
    ("fedcf/federated/__init__.py", "__getattr__", "getattr"):
        "lazy public names: a process that runs clients only does not import the estimators",
    ("fedcf/federated/round/partials.py", "PartialSums.arrays", "getattr"):
        "reads the dataclass's declared fields by name",
    ("fedcf/flower/runtime.py", "set_message_id", "__dict__"):
        "a pulled Flower message's id: Flower's Metadata has no setter; flwr-clientapp sets it "
        "so too",
}
ROUND_LIMIT = 5

# The rest of the package: duck typing of foreign inputs (pandas, numpy, argparse), lazy
# module attributes and the one helper that reads declared fitted state. A new probe fails.
PACKAGE_ALLOWED = {
    ("fedcf/__init__.py", "__getattr__", "getattr"): "lazy top-level names",
    ("fedcf/cli/__init__.py", "__getattr__", "getattr"): "lazy command modules",
    ("fedcf/registry.py", "lookup", "getattr"): "a registered 'module:attr' target",
    ("fedcf/registry.py", "encode", "hasattr"): "numpy scalars and phase objects in a spec",
    ("fedcf/registry.py", "encode", "getattr"): "an array's ndim in a spec",
    ("fedcf/_validation.py", "raw_ids", "hasattr"): "a pandas Index or Series as ids",
    ("fedcf/_validation.py", "check_rating_scale", "hasattr"): "any sized pair as a scale",
    ("fedcf/_validation.py", "check_params", "getattr"): "the declared parameter rules",
    ("fedcf/provenance.py", "_default", "hasattr"): "numpy values in a JSON record",
    ("fedcf/warmup.py", "_worker", "hasattr"): "os.nice exists on POSIX only",
    ("fedcf/models/persistence.py", "_plain", "hasattr"): "numpy values in the metadata",
    ("fedcf/models/persistence.py", "Persistence._fitted", "getattr"):
        "the one read of declared fitted state that may find none",
    ("fedcf/models/base.py", "atomic_fit.wrapper", "vars"):
        "a failed fit restores the fitted attributes it found",
    ("fedcf/models/base.py", "MFEstimatorBase.__init_subclass__", "__dict__"):
        "whether a subclass defines its own __init__",
    ("fedcf/models/base.py", "MFEstimatorBase.set_params", "__dict__"):
        "a phase parameter's current value (scikit-learn's set_params)",
    ("fedcf/models/prediction.py", "_as_pairs", "getattr"): "a bad input's shape in an error",
    ("fedcf/cli/app.py", "_with_flag", "getattr"): "argparse namespace of any command",
    ("fedcf/cli/app.py", "main", "getattr"): "argparse namespace; the command's function",
    ("fedcf/cli/common.py", "_read", "__dict__"): "argparse namespace: tables read so far",
    ("fedcf/cli/common.py", "_say", "getattr"): "argparse namespace of any command",
    ("fedcf/cli/train.py", "build_estimator", "getattr"): "argparse shortcut flags",
    ("fedcf/testing.py", "AggregatorContract.test_linear_means_reducible_from_partial_sums_in_any_split",
     "getattr"): "compares a delta's arrays field by field",
    ("fedcf/testing.py", "ExecutorContract.test_runs_a_cohort_as_the_local_executor_does",
     "getattr"): "compares ClientOutputs field by field (dataclasses.fields)",
    ("fedcf/testing.py", "_run_checks", "getattr"): "the contract's test_* methods by name",
}


def probes(path: Path, root: Path = ROOT) -> Counter:
    """(path, enclosing function, probe) → count, for one source file."""
    found: Counter = Counter()
    rel = str(path.relative_to(root))

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and \
                    child.func.id in PROBES:
                found[(rel, inner, child.func.id)] += 1
            if isinstance(child, ast.Attribute) and child.attr == "__dict__":
                found[(rel, inner, "__dict__")] += 1
            walk(child, inner)

    walk(ast.parse(path.read_text()), "")
    return found


def package_probes() -> Counter:
    total: Counter = Counter()
    for path in sorted((ROOT / "fedcf").rglob("*.py")):
        total.update(probes(path))
    return total


def is_round(key) -> bool:
    return key[0].startswith(("fedcf/federated/", "fedcf/flower/"))


def test_round_machinery_probes_nothing_undeclared():
    found = {k: n for k, n in package_probes().items() if is_round(k)}
    assert sum(found.values()) <= ROUND_LIMIT, found
    unlisted = {k: n for k, n in found.items() if k not in ROUND_ALLOWED}
    assert not unlisted, (f"new probes in the round's machinery: {unlisted}; declare the member "
                          "on its contract (contracts.py) and read it there")


def test_package_probes_stay_listed():
    found = {k: n for k, n in package_probes().items() if not is_round(k)}
    unlisted = {k: n for k, n in found.items() if k not in PACKAGE_ALLOWED}
    assert not unlisted, f"new getattr/hasattr/__dict__ probes: {unlisted}"
    stale = set(PACKAGE_ALLOWED) - set(found)
    assert not stale, f"allowed probes that are gone (drop them from the list): {stale}"


def test_probe_counter_sees_each_kind(tmp_path):
    """The counter finds every kind of probe, in its function (else the guards above could
    pass on nothing)."""
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def f(self, x):\n        getattr(x, 'a', 0); hasattr(x, 'b')\n"
                   "        vars(x); x.__dict__\n")
    assert probes(src, tmp_path) == Counter({("m.py", "A.f", k): 1 for k in
                                             ("getattr", "hasattr", "vars", "__dict__")})


# --------------------------------------------------------------------- declared members
# Modules that handle any aggregator or any round executor (not one concrete class), and the
# names under which they hold them.
AGGREGATOR_USERS = ("federated/round/loop.py", "federated/round/blame.py",
                    "federated/algorithms/base.py", "federated/algorithms/hyper.py",
                    "federated/aggregators/secagg.py", "federated/executors/ray_executor.py",
                    "flower/server.py", "flower/node.py")
EXECUTOR_USERS = ("federated/round/loop.py", "federated/round/blame.py",
                  "federated/algorithms/base.py", "federated/algorithms/hyper.py",
                  "federated/aggregators/secagg.py")
AGGREGATOR_NAMES = {"aggregator", "agg"}
EXECUTOR_NAMES = {"executor"}


def used_members(path: Path, holders: set) -> set:
    """Names read on an object held as ``x``, ``self.x`` or ``run.x`` with x in ``holders``."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        held = (isinstance(v, ast.Name) and v.id in holders) or \
            (isinstance(v, ast.Attribute) and v.attr in holders)
        if held:
            used.add(node.attr)
    return used


def declared(cls) -> set:
    names = set(dir(cls))
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize("contract, users, holders", [
    (Aggregator, AGGREGATOR_USERS, AGGREGATOR_NAMES),
    (RoundExecutor, EXECUTOR_USERS, EXECUTOR_NAMES)], ids=["aggregator", "executor"])
def test_members_used_on_a_phase_are_declared(contract, users, holders):
    missing = {}
    for rel in users:
        extra = used_members(ROOT / "fedcf" / rel, holders) - declared(contract)
        if extra:
            missing[rel] = sorted(extra)
    assert not missing, f"members used but not declared on {contract.__name__}: {missing}"


def test_member_check_sees_an_undeclared_member(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f(run):\n    run.aggregator.fancy_new_thing()\n    "
                   "run.aggregator.secure\n")
    assert used_members(src, AGGREGATOR_NAMES) - declared(Aggregator) == {"fancy_new_thing"}


# --------------------------------------------------------------------- file sizes
MAX_LINES = 500


def test_no_source_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "fedcf").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (at most {MAX_LINES} lines each): {long}"


def test_every_package_folder_is_installed():
    """A folder of the package missing from pyproject's list would be left out of a wheel (an
    editable install hides it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fedcf").rglob(
        "__init__.py")}
    assert found <= listed, f"add to pyproject's packages: {sorted(found - listed)}"


def test_one_list_of_estimators():
    """The registry's estimators are the package's: each is exported at the top level and
    takes the federated vocabulary when it is federated; every estimator class exported at
    the top level is registered (load_model and the command line read the registry)."""
    import inspect

    import fedcf
    from fedcf import registry
    from fedcf.federated.algorithms.base import FederatedMFBase
    from fedcf.models.base import MFEstimatorBase

    registered = {registry.lookup("estimator", n) for n in registry.names("estimator")}
    registered = {c for c in registered if c.__module__.startswith("fedcf.")}  # fedcf's own
    exported = {getattr(fedcf, n) for n in fedcf.__all__ if n[0].isupper()}
    assert registered <= exported
    assert {c for c in exported if inspect.isclass(c) and issubclass(c, MFEstimatorBase)} \
        == registered
    for cls in registered:
        if issubclass(cls, FederatedMFBase):
            params = set(inspect.signature(cls).parameters)
            assert {"client_update", "server_optimizer", "aggregator", "executor"} <= params, \
                cls.__name__
