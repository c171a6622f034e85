"""Sphinx configuration for the cuforge site (``make docs``).

The pages are the Markdown files in this folder (MyST); the API reference is
autodoc over the real objects -- ``cuforge``, ``cuforge.utils``, ``cuforge.compile``,
``cuforge.storage`` resolve names lazily through module ``__getattr__``, so every
name is imported here, never parsed from source. The build runs with ``-W -n``: a
broken link, a missing page anchor or an unresolved cross-reference fails it. Two
checks of our own (``_apiref``) fail it too: a public name (in a module's
``__all__``) that no API page documents, and a reference to a name that is not public.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))  # the checkout, even without install
sys.path.insert(0, HERE)  # _apiref

import cuforge  # noqa: E402

project = "cuforge"
author = "the cuforge authors"
copyright = "the cuforge authors"
release = version = cuforge.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "_apiref",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}  # API pages: rST (autodoc)
root_doc = "index"
# _generated: plot captions, pulled into performance.md by {include}.
exclude_patterns = ["_build", "_generated"]

# Markdown: `#` headings get anchors (docs/x.md#section links are checked), and the
# usual extras.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# Strict: unresolved references are errors (with -W).
nitpicky = True

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True, "undoc-members": True}
autodoc_preserve_defaults = True
python_use_unqualified_type_names = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"cuforge {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
