"""What every document generator shares: the paths, the result files (``results_file``),
templates, tables, provenance lines and the registered claims the prose states."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "eval" / "templates"
_LOADER = []  # report.py's ``load`` (set_loader), so a test that patches it patches every read


def set_loader(fn) -> None:
    _LOADER[:] = [fn]


def results_file(name):
    """A committed result through report.py's ``load`` (None when missing)."""
    return _LOADER[0](name)


def render(template: str, values: dict) -> str:
    """Replace every {{name}}; a name without a value is an error (no silent blanks)."""
    def sub(m):
        if m.group(1) not in values:
            raise KeyError(f"template placeholder {{{{{m.group(1)}}}}} has no value")
        return str(values[m.group(1)])
    return re.sub(r"\{\{(\w+)\}\}", sub, template)


def provenance(meta: dict, name: str) -> str:
    v = meta.get("versions") or {}
    extra = ", ".join(f"{k} {x}" for k, x in v.items() if x and k not in ("numpy", "fedcf"))
    return (f"Measured {meta['date'][:10]} on {meta['machine']} (Python {meta['python']}, "
            f"numpy {meta['numpy']}{', ' + extra if extra else ''}); JSON: "
            f"`eval/results/{name}`, written by `{meta['command']}`.")


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x, digits=1) -> str:
    return f"{x * 100:.{digits}f} %"


def signed_pct(x) -> str:
    return f"{x * 100:+.1f} %"


def ms(s) -> str:
    return "" if s is None else (f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms")


def rmse_acc(r) -> str:
    return f"RMSE {r['rmse']:.3f} / accuracy {pct(r['accuracy'])}"


CLAIMS: list = []  # (document, the comparison its prose states, whether the JSON bears it out)


def claim(doc: str, text: str, holds) -> None:
    """Register a comparison that ``doc``'s prose states in words, with whether the result JSON
    bears it out; ``main`` fails on one that does not (prose cannot go stale silently)."""
    CLAIMS.append((doc, text, bool(holds)))


def _script(script: str):
    """One of the scripts beside this one, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{script}", ROOT / "scripts" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench_constant(name, script="hypergradient_benchmark"):
    """A setting of one of the benchmark scripts (not a measured figure)."""
    return vars(_script(script))[name]


def _dig(r, path):
    for p in path:
        r = r.get(p) if isinstance(r, dict) else None
    return r


def _f(v, digits=4):
    return "" if v is None else f"{v:.{digits}f}"


def fill_blocks(text: str, blocks: dict) -> str:
    def sub(m):
        name = m.group(1)
        if name not in blocks:
            raise KeyError(f"generated block {name!r} has no generator")
        return f"<!-- begin generated: {name} -->\n{blocks[name]}\n<!-- end generated: {name} -->"
    return re.sub(r"<!-- begin generated: (\w+) -->.*?<!-- end generated: \1 -->", sub, text,
                  flags=re.S)


def seed_interval(values) -> tuple[float, float, float]:
    """Mean and 95 % t-interval of the mean over seeds."""
    from scipy import stats

    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)
