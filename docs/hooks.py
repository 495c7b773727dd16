"""
MkDocs hooks
============

The site's generated reference (``docs/reference.py``): the build fails where an item of it has no text,
and each ``<!-- generated: ... -->`` marker of a page gets its block.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))

import reference  # noqa: E402  (docs/reference.py, beside this file)

#: A Sphinx role left in a docstring, as Markdown renders it: ``:class:<code>~lightning_perf.Schedule</code>``.
ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc):<code>(~?)([\w.]*?)(\w+)</code>")

#: A script, style sheet, image or frame loaded from another host: what a page opened offline cannot load.
REMOTE = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"")


def on_pre_build(config: Any) -> None:
    """Fails the build on any rule, threshold, CLI flag or report field without its text."""
    missing = reference.problems(DOCS)
    if missing:
        raise PluginError("The generated reference lacks text:\n  " + "\n  ".join(missing))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Each marker of the page followed by its generated block."""
    return reference.expand(markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The docstrings' Sphinx roles as plain code: ``~a.b.C`` as ``C``, ``a.b.C`` as ``a.b.C``."""
    return ROLE.sub(lambda m: f"<code>{m.group(3) if m.group(1) else m.group(2) + m.group(3)}</code>", html)


def on_post_page(output: str, page: Any, config: Any) -> str:
    """Fails the build where a page would load anything from the network (fonts, scripts, shims)."""
    if remote := REMOTE.findall(output):
        raise PluginError(f"{page.file.src_uri} loads from the network, which a site opened offline cannot: {remote}")
    return output
