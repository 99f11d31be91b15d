"""Imports flow one way: _kernels <- models <- federated <- eval <- flower <- scripts; datasets is a
leaf."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"datasets": 0, "_kernels": 1, "models": 2, "federated": 3, "eval": 4, "flower": 5}
FOLDERS = {"datasets": ROOT / "datasets", "_kernels": ROOT / "fedcf" / "_kernels",
           "models": ROOT / "fedcf" / "models", "federated": ROOT / "fedcf" / "federated",
           "eval": ROOT / "eval", "flower": ROOT / "fedcf" / "flower"}


def layer_of_import(module: str):
    parts = module.split(".")
    for p in parts:
        if p in LAYERS:
            return p
    return None


def resolve(node: ast.ImportFrom, layer: str, file: Path) -> str:
    if node.level == 0:
        return node.module or ""
    pkg = {"datasets": "fedcf.datasets", "_kernels": "fedcf._kernels", "models": "fedcf.models",
           "federated": "fedcf.federated", "eval": "fedcf.eval",
           "flower": "fedcf.flower"}[layer].split(".")
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_no_upward_imports():
    bad = []
    for layer, folder in FOLDERS.items():
        for file in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                mods = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    mods = [resolve(node, layer, file)]
                for mod in mods:
                    if not mod.startswith("fedcf") and not mod.startswith(("datasets", "eval")):
                        continue
                    target = layer_of_import(mod)
                    if target is None and mod in ("fedcf",):
                        target = "eval"  # the top-level package re-exports everything
                    if target is not None and LAYERS[target] > LAYERS[layer]:
                        bad.append(f"{file.relative_to(ROOT)} imports {mod}")
    assert not bad, bad
