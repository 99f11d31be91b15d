"""Every exported class documents its parameters and shows an example, and every example in
the package's docstrings runs (doctest)."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import fedcf

PACKAGES = ["fedcf", "fedcf.federated", "fedcf.eval", "fedcf.datasets", "fedcf.model_selection",
            "fedcf.flower"]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def exported_classes():
    for name in PACKAGES:
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj):
                yield f"{name}.{attr}", obj


def takes_parameters(cls) -> bool:
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return False
    return any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values())


@pytest.mark.parametrize("name,cls", sorted(exported_classes()), ids=lambda v: str(v))
def test_exported_class_has_parameters_and_examples(name, cls):
    doc = inspect.getdoc(cls) or ""
    assert "Examples\n--------" in doc, f"{name}: no Examples section"
    if takes_parameters(cls) and not issubclass(cls, Exception):
        assert "Parameters\n----------" in doc or "Attributes\n----------" in doc, \
            f"{name}: no Parameters section"


def modules():
    yield from ("fedcf.datasets", "fedcf.eval")
    for info in pkgutil.walk_packages(fedcf.__path__, "fedcf."):
        if not info.name.startswith(("fedcf.benchmarks", "fedcf.__main__", "fedcf._kernels")):
            yield info.name
    for sub in ("fedcf.datasets", "fedcf.eval"):
        for info in pkgutil.iter_modules(importlib.import_module(sub).__path__, sub + "."):
            yield info.name


@pytest.mark.parametrize("module", sorted(set(modules())))
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=FLAGS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {module}"
