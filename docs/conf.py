"""Sphinx configuration of the django-debounce manual (``scripts/docs`` builds it).

Pages are Markdown (MyST). The API reference is generated from the docstrings with autodoc,
so Django is set up here with a minimal settings module (``docs/django_settings.py``: an
in-memory SQLite database, no server) and the app's models import.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS)]
os.environ["DJANGO_SETTINGS_MODULE"] = "django_settings"

import django  # noqa: E402

django.setup()

from django_debounce import __version__  # noqa: E402

project = "django-debounce"
author = "django-debounce developers"
copyright = "django-debounce developers"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "django_settings.py", "conf.py"]

# MyST: GitHub-style pipe tables and fenced code are core; these add heading anchors (so
# links such as ``modes.md#semantics`` resolve) and ``{term}``-free definition lists.
myst_enable_extensions = ["deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"django-debounce {release}"
html_static_path: list[str] = []
