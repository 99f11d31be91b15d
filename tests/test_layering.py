"""Imports flow one way: datasets <- the leaf utilities <- _kernels (and its twins) <- models <-
federated <- eval <- model_selection, flower <- the command line; and no module imports a module
that imports it back (no import circle, deferred or not)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"datasets": 0, "registry": 0.5, "_validation": 0.5, "_io": 0.5, "_numba_cache": 0.5, "_topk": 0.5,
          "provenance": 0.5, "_ranking": 0.6, "_kernels": 1, "_reference": 1.5, "models": 2,
          "federated": 3, "_registry": 3.5, "eval": 4, "model_selection": 4.5, "flower": 5,
          "warmup": 6, "cli": 7}
FOLDERS = {"datasets": ROOT / "datasets", "_kernels": ROOT / "fedcf" / "_kernels",
           "_reference": ROOT / "fedcf" / "_reference", "models": ROOT / "fedcf" / "models",
           "federated": ROOT / "fedcf" / "federated", "eval": ROOT / "eval",
           "flower": ROOT / "fedcf" / "flower", "cli": ROOT / "fedcf" / "cli"}
MODULES = ("registry", "_validation", "_io", "_numba_cache", "_topk", "provenance", "_ranking", "_registry",
           "model_selection", "warmup")


def files():
    """(layer, module name, path) of every source file of the package."""
    for layer, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield layer, ".".join(("fedcf", layer, *parts)), path
    for layer in MODULES:
        yield layer, f"fedcf.{layer}", ROOT / "fedcf" / f"{layer}.py"


def imports(name: str, path: Path, node_iter):
    """Absolute module names imported by the given nodes of module ``name``."""
    package = name.split(".") if path.stem == "__init__" else name.split(".")[:-1]
    for node in node_iter:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if node.module:  # `from .. import x` imports the module x, not the package
                yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)  # `from . import x` of a module


def layer_of(module: str):
    parts = module.split(".")
    if parts[0] != "fedcf":
        return None
    if len(parts) == 1:
        return "eval"  # the top-level package re-exports everything
    return parts[1] if parts[1] in LAYERS else None


def test_no_upward_imports():
    bad = []
    for layer, name, path in files():
        for mod in imports(name, path, ast.walk(ast.parse(path.read_text()))):
            target = layer_of(mod)
            if target is not None and LAYERS[target] > LAYERS[layer]:
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, bad


def test_no_import_circles():
    """Imports between modules, also those deferred into a function to dodge a circle (package
    __init__ files re-export and are left out), form no cycle."""
    known = {name: path for _, name, path in files() if path.stem != "__init__"}
    graph = {name: sorted({m for m in imports(name, path, ast.walk(ast.parse(path.read_text())))
                           if m in known and m != name})
             for name, path in known.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


# The rooms of fedcf.federated: each may import only the rooms listed (and itself). The round
# knows no algorithm, aggregator or executor; an executor knows nothing of secure aggregation
# (it carries the aggregator's client job); aggregators know no algorithm or executor.
ROOMS = {"round": set(), "aggregators": {"round"}, "executors": {"round"},
         "algorithms": {"round", "aggregators"}}


def room_of(module: str):
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["fedcf", "federated"] else None


def test_federated_rooms_import_only_the_rooms_below():
    bad = []
    for layer, name, path in files():
        room = room_of(name)
        if layer != "federated" or room is None:
            continue
        for mod in imports(name, path, ast.walk(ast.parse(path.read_text()))):
            target = room_of(mod)
            if target is not None and target != room and target not in ROOMS[room]:
                bad.append(f"{path.relative_to(ROOT)} ({room}) imports {mod} ({target})")
    assert not bad, bad


def test_every_federated_module_lives_in_a_room():
    loose = [p.name for p in (ROOT / "fedcf" / "federated").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside the rooms of fedcf.federated: {loose}"
    assert {p.name for p in (ROOT / "fedcf" / "federated").iterdir() if p.is_dir()
            and not p.name.startswith("__")} == set(ROOMS)
