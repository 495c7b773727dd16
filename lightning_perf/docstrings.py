"""
Docstrings as text
==================

Our docstrings, read for users: a rule's first line and its ``Notes:`` explain it on the documentation site and on
the report page, so both say what the code says. Sphinx's roles become single-backtick code spans, which the site
(Markdown) and the page (:func:`~lightning_perf.report.html.findings_html.rich_text`) both show as code.
"""

from __future__ import annotations

import inspect
import re


def plain_roles(text: str) -> str:
    """Sphinx's roles and double backticks as single-backtick code spans: ``:func:`~a.b``` -> `` `b` ``."""
    text = re.sub(r":\w+:`~[\w.]*\.(\w+)`", r"`\1`", text)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def summary_and_notes(doc: str | None) -> tuple[str, list[str]]:
    """A docstring's first line, and its ``Notes:`` items (numbered ``1.``, ``2.``...), each on one line, both
    with :func:`plain_roles`."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary = lines[0].strip() if lines else ""
    notes: list[str] = []
    if "Notes:" in lines:
        for line in lines[lines.index("Notes:") + 1 :]:
            if line and not line.startswith(" "):
                break
            if match := re.match(r"^ {4}\d+\. (.*)$", line):
                notes.append(match.group(1).strip())
            elif line.strip() and notes:
                notes[-1] += " " + line.strip()
    return plain_roles(summary), [plain_roles(note) for note in notes]
