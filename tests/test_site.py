"""The documentation site builds with warnings as errors and runs every tutorial; every public
name has a reference page; every code block in the README and the site runs; the README is a
front door whose links resolve."""

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PUBLIC = ["fedcf", "fedcf.federated", "fedcf.model_selection", "fedcf.datasets", "fedcf.eval",
          "fedcf.flower", "fedcf.testing"]
# what each tutorial prints when it ran to its end
TUTORIALS = {"quickstart.py": "ReconEval on", "federated_checkpoints.py": "uninterrupted one: True",
             "tune_on_unseen_users.py": "best:", "implicit_recommend.py": "ndcg@10",
             "offline_ctr.py": "true CTR", "custom_phases.py": "custom phases: ok",
             "custom_estimator.py": "custom estimator: ok", "slate_ope.py": "exact CTR of the target",
             "paper_tables.py": "server optimizer yogi",
             "privacy.py": "when the server asks for σ 0.5: [0, 0, 0]",
             "ray_scale_out.py": "identical item factors: True",
             "flower_deployment.py": "in process: 3 rounds"}
RAY_TUTORIALS = {"ray_scale_out.py"}  # run beside the other tests that start Ray


def sphinx(src: Path, out: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           *extra, str(src), str(out)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "MPLBACKEND": "Agg", **(env or {})})


def public_objects():
    """Each public object once, under the first public module that exports it."""
    seen = {}
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if attr != "__version__" and id(obj) not in seen:
                seen[id(obj)] = (name, attr, obj)
    return list(seen.values())


def reference_entries():
    """(module, name) for every entry of the API reference's autosummary lists."""
    entries = []
    for rst in sorted((DOCS / "api").glob("*.rst")):
        module = None
        for line in rst.read_text().splitlines():
            if m := re.match(r"\.\. currentmodule:: (\S+)", line):
                module = m.group(1)
            elif module and (m := re.match(r"   ([A-Za-z_]\w*)$", line)):
                entries.append((module, m.group(1)))
    return entries


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    res = sphinx(DOCS, out, env={"FEDCF_DOCS_SKIP_RAY": "1"})
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return out


def test_site_builds_with_warnings_as_errors_and_runs_every_tutorial(built):
    assert (built / "index.html").exists()
    for name, expect in TUTORIALS.items():
        page = built / "tutorials" / name.replace(".py", ".html")
        assert page.exists(), f"tutorial {name} has no page"
        if name in RAY_TUTORIALS:
            continue
        assert expect in page.read_text(), \
            f"tutorial {name} did not print {expect!r}: it did not run to its end"
    for module, name, _ in public_objects():
        assert (built / "api" / "generated" / f"{module}.{name}.html").exists(), \
            f"{module}.{name} has no reference page"


@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(RAY_TUTORIALS))
def test_the_ray_tutorials_run(name, tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert TUTORIALS[name] in res.stdout


def test_every_tutorial_is_listed():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(TUTORIALS)


def test_every_public_name_has_a_reference_entry():
    listed = {id(getattr(importlib.import_module(m), n)) for m, n in reference_entries()}
    missing = [f"{m}.{n}" for m, n, obj in public_objects() if id(obj) not in listed]
    assert not missing, f"public names with no page in docs/api/*.rst: {missing}"
    for module, name in reference_entries():
        assert hasattr(importlib.import_module(module), name), f"docs/api lists {module}.{name}"


def test_a_broken_reference_or_page_fails_the_build(tmp_path):
    """The build the test above runs fails on a reference to a page that does not exist, and on
    a page that no table of contents reaches."""
    conf = (DOCS / "conf.py").read_text()
    conf = conf.replace('DOCS = Path(__file__).resolve().parent', f'DOCS = Path({str(DOCS)!r})')
    (tmp_path / "conf.py").write_text(conf.replace('"sphinx_gallery.gen_gallery",', ""))
    (tmp_path / "index.md").write_text("# x\n\nSee {doc}`no_such_page`.\n")
    res = sphinx(tmp_path, tmp_path / "out")
    assert res.returncode != 0 and "no_such_page" in res.stderr, res.stderr[-2000:]
    (tmp_path / "index.md").write_text("# x\n\nSee {doc}`other`.\n")
    (tmp_path / "other.md").write_text("# other\n")
    res = sphinx(tmp_path, tmp_path / "out2")  # the same page, with its target: builds
    assert res.returncode != 0 and "toctree" in res.stderr  # a page in no toctree fails too


# ----------------------------------------------------------------- code blocks on the pages
def pages():
    found = [ROOT / "README.md"]
    for path in sorted(DOCS.rglob("*.md")):
        if not {"_build", "tutorials", "results"} & set(path.relative_to(DOCS).parts):
            found.append(path)
    return [p for p in found if "```python\n" in p.read_text()]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


def page_param(path):
    code = "\n".join(python_blocks(path))
    marks = [pytest.mark.ray] if "RayExecutor(" in code else []
    if "load_movielens(" in code:
        marks.append(pytest.mark.network)
    return pytest.param(path, marks=marks, id=str(path.relative_to(ROOT)))


@pytest.mark.parametrize("path", [page_param(p) for p in pages()])
def test_every_code_block_on_a_page_runs(path, tmp_path, monkeypatch):
    """A page's Python blocks run in order in one fresh namespace, as a reader pasting them
    one after another would, with the values they show (a block that uses a name no earlier
    block of the page imported or defined fails here)."""
    monkeypatch.chdir(tmp_path)
    code = "\n\n".join(python_blocks(path))
    try:
        exec(compile(code, str(path), "exec"), {"__name__": "__main__"})  # noqa: S102
    except Exception as exc:
        if type(exc).__name__ == "DataUnavailableError":
            raise
        raise AssertionError(f"{path.name}: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------- the README
def test_readme_is_a_front_door_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    first = [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)[:2]]
    assert first == [
        "python -m pip install -e . && python scripts/movielens_benchmark.py --json results.json",
        'python -m pip install -e ".[test]" && python -m pytest -q']
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_block_of_the_site_and_readme_is_a_known_language():
    """A block meant to run says ``python``; other blocks say what they are (bash, console,
    text, ...), so no Python block escapes the test above by a missing language."""
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        if "_build" in path.parts:
            continue
        for lang in re.findall(r"^```([^\n]*)\n", path.read_text(), re.M)[::2]:
            assert lang, f"{path.relative_to(ROOT)} has a code block with no language"


def test_public_docstrings_have_a_summary_line():
    for module, name, obj in public_objects():
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (inspect.getdoc(obj) or "").strip(), f"{module}.{name} has no docstring"
