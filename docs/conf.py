"""Sphinx configuration of the documentation site: the Markdown pages in docs/ read by MyST.

`make docs` builds it with warnings as errors (`-W --keep-going`); `.readthedocs.yaml` builds it the same way.
The pages are plain Markdown that also reads well on GitHub, so only MyST features GitHub shows are used.
"""

from __future__ import annotations

import json
from pathlib import Path

project = "tfgpu_magic"
author = "tfgpu_magic contributors"
# The version is written once, in labextension/package.json (pyproject.toml's [tool.hatch.version] reads it
# there too); read from the file so the site builds without installing the package.
release = json.loads((Path(__file__).parent.parent / "labextension" / "package.json").read_text(encoding="utf-8"))["version"]

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
# `page.md#a-heading` links, as GitHub makes them, for headings down to level 3.
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "tfgpu_magic"
