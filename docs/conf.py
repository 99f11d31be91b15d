"""Sphinx configuration of fedcf's documentation site.

Build: ``python -m sphinx -W docs docs/_build`` (``pip install -e ".[docs]"`` first). The
tutorials are ``examples/*.py``, run by sphinx-gallery at build time; ``-D plot_gallery=0``
builds the pages without running them (the tests run the scripts on their own).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))  # site helpers beside this file

import fedcf  # noqa: E402

project = "fedcf"
author = "the fedcf developers"
copyright = "2026, the fedcf developers"
release = version = fedcf.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "sphinxcontrib.mermaid",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_templates", "**/GALLERY_HEADER.rst"]
templates_path = ["_templates"]
root_doc = "index"
nitpicky = False

# The API reference: one page per public class and function (docs/api/*.rst list them;
# tests/test_site.py fails when a public name is in no list).
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# MyST: the user guide and the generated results documents (eval/*.md) are Markdown.
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 4
myst_fence_as_directive = ["mermaid"]
suppress_warnings = ["myst.header"]

# The gallery: examples/*.py, executed at build time (plot_gallery=0 to skip).
sphinx_gallery_conf = {
    "examples_dirs": [str(DOCS.parent / "examples")],
    "gallery_dirs": ["tutorials"],
    # FEDCF_DOCS_SKIP_RAY=1 shows the Ray tutorial without running it (the test suite runs it
    # on its own, beside the other tests that start Ray)
    "filename_pattern": r"/(?!ray_)[^/]*\.py$" if os.environ.get("FEDCF_DOCS_SKIP_RAY")
    else r"\.py$",
    "plot_gallery": os.environ.get("FEDCF_DOCS_RUN", "True"),
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "abort_on_example_error": True,
    "min_reported_time": 10**9,
}

html_theme = "pydata_sphinx_theme"
html_title = f"fedcf {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
}
html_static_path: list[str] = []
html_show_sourcelink = False
