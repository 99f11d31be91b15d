"""The manual's pictures of the architecture, drawn from the code (not by hand): the rooms of
``fedcf.federated`` with the imports measured between them, and one round as ``Run.round``
composes it (``scripts/report.py`` writes them into docs/guide/architecture.md; its ``--check`` compares).

    python scripts/architecture.py          # print the block
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FED = ROOT / "fedcf" / "federated"
LOOP = FED / "round" / "loop.py"

# who the round talks to, by the attribute of ``Run`` that holds it (or the function it calls)
PARTIES = {"select": "Selector", "hyper": "HyperLearner", "hyper_select": "Selector",
           "executor": "Executor", "aggregator": "Aggregator", "server_update": "ServerOptimizer",
           "opt": "ServerOptimizer", "guard": "Guard", "accountant": "Accountant",
           "checkpointer": "Checkpointer", "observe": "Callback"}
INLINE = {"client_work", "learn_hyperparams", "report_mean", "account"}  # Run's own steps


def rooms() -> list[str]:
    return sorted(p.name for p in FED.iterdir() if p.is_dir() and not p.name.startswith("__"))


def room_edges() -> list[tuple[str, str]]:
    """(importer, imported) rooms, measured from every module's imports (deferred ones too)."""
    edges = set()
    for room in rooms():
        for path in sorted((FED / room).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                    target = node.module.split(".")[0]
                    if target in rooms() and target != room:
                        edges.add((room, target))
    return sorted(edges)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name)


def _party(call: ast.Call):
    """(party, what) of a call the round makes on another phase, or None."""
    f = call.func
    if isinstance(f, ast.Name) and f.id in PARTIES:
        return PARTIES[f.id], f"{f.id}(...)"
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and \
            isinstance(f.value.value, ast.Name) and f.value.value.id == "self" and \
            f.value.attr in PARTIES:
        return PARTIES[f.value.attr], f.attr
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" \
            and f.attr in PARTIES:
        return PARTIES[f.attr], f"{f.attr}(...)"
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
            f.value.id == "agg":  # report_mean's alias of self.aggregator
        return "Aggregator", f.attr
    return None


def _text(node) -> str:
    out = ast.unparse(node).replace("self.", "").replace('"', "'")
    return out if len(out) <= 60 else out[:57] + "..."


def sequence(run: ast.ClassDef) -> list[str]:
    """Mermaid lines of Run.round, Run's own steps inlined, branches as alt/else/end (a branch
    in which the round talks to no other phase is left out)."""

    def calls(node):
        found = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        return sorted(found, key=lambda n: (n.lineno, n.col_offset))

    def talks(lines):
        return any("->>" in line for line in lines)

    def branch(st: ast.If, depth) -> list[str]:
        arms, rest = [(f"alt {_text(st.test)}", emit(st.body, depth))], st.orelse
        while len(rest) == 1 and isinstance(rest[0], ast.If):
            arms.append((f"else {_text(rest[0].test)}", emit(rest[0].body, depth)))
            rest = rest[0].orelse
        if rest:
            arms.append(("else", emit(rest, depth)))
        if not any(talks(body) for _, body in arms):
            return []
        return [line for head, body in arms for line in (head, *body)] + ["end"]

    def emit(stmts, depth) -> list[str]:
        lines: list[str] = []
        for st in stmts:
            if isinstance(st, ast.If):
                lines += branch(st, depth)
                continue
            if isinstance(st, ast.For):
                lines += messages(st.iter, depth)
                body = emit(st.body, depth)
                lines += [f"loop each {_text(st.target)}", *body, "end"] if talks(body) else []
                continue
            lines += messages(st, depth)
        return lines

    def messages(node, depth) -> list[str]:
        lines = []
        for call in calls(node):
            f = call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                    f.value.id == "self" and f.attr in INLINE and depth < 2:
                lines += [f"Note over Run: {f.attr}", *emit(_method(run, f.attr).body,
                                                             depth + 1)]
                continue
            party = _party(call)
            if party is not None:
                lines.append(f"Run->>{party[0]}: {party[1]}")
                if party == ("Aggregator", "client_round"):
                    lines += aggregator_round()
        return lines

    def aggregator_round() -> list[str]:
        """How the aggregator takes the client work (the contract's ``client_round``): its
        branches and what it asks of the executor."""
        return sequence_of(_method(_contract("Aggregator"), "client_round").body)

    return emit(_method(run, "round").body, 0)


def _contract(name: str) -> ast.ClassDef:
    tree = ast.parse((FED / "round" / "contracts.py").read_text())
    return next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == name)


def sequence_of(stmts) -> list[str]:
    """Mermaid lines of an aggregator method: its calls on the executor (and on itself, as
    notes), branches as alt/else/end."""
    lines = []
    for st in stmts:
        if isinstance(st, ast.If):
            lines += [f"alt {_text(st.test)}", *sequence_of(st.body)]
            if st.orelse:
                lines += ["else", *sequence_of(st.orelse)]
            lines.append("end")
            continue
        for call in sorted((n for n in ast.walk(st) if isinstance(n, ast.Call)),
                           key=lambda n: (n.lineno, n.col_offset)):
            f = call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == "executor":
                    lines.append(f"Aggregator->>Executor: {f.attr}")
                elif f.value.id == "self":
                    lines.append(f"Note over Aggregator: {f.attr}")
            elif isinstance(f, ast.Name) and f.id == "self":
                lines.append("Note over Aggregator: aggregate the uploads")
    return lines


def block() -> str:
    tree = ast.parse(LOOP.read_text())
    run = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Run")
    graph = ["```mermaid", "flowchart LR", *(f"    {a} --> {b}" for a, b in room_edges()),
             "```"]
    seq = ["```mermaid", "sequenceDiagram", "    participant Run",
           *(f"    {line}" for line in sequence(run)), "```"]
    return "\n".join([
        "The rooms of `fedcf/federated/` and the imports between them, measured from the code "
        "(an arrow: the room imports from the other):", "", *graph, "",
        "One round, as `round/loop.py`'s `Run.round` composes it (read from its code; `alt` "
        "marks the branches it takes by the phases' declared properties):", "", *seq])


if __name__ == "__main__":
    print(block())
