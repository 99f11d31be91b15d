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
            name = f"fedcf.{layer}" + ("" if path.stem == "__init__" else f".{path.stem}")
            yield layer, name, path
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
