"""Sphinx configuration: the API reference of mxoid, built from its NumPy-style docstrings."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxoid  # noqa: E402

project = "mxoid"
author = "the mxoid developers"
release = version = mxoid.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "numpydoc"]
autosummary_generate = True
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()
default_role = "py:obj"
nitpicky = False
html_theme = "alabaster"
exclude_patterns = ["_build"]
suppress_warnings = ["ref.python"]
