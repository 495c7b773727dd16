"""
Docstrings as text
==================

Our docstrings, read for users: a rule's first line and its ``Notes:`` explain it on the documentation site and on
the report page, so both say what the code says. Sphinx's roles become single-backtick code spans, which the site
(Markdown) and the page (:func:`~lightning_perf.report.html.findings_html.rich_text`) both show as code. An ``Args:``
entry is an option's help, on the site and in ``lightning-perf run --help``.
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


def doc_entries(doc: str | None, section: str) -> dict[str, str]:
    """A Google-style docstring section's entries (``Args:``, ``Attributes:``), each name with its text.

    Notes:
        1. An entry is a line indented once, ``name: text`` or ``name, other: text`` (several names share
           one text); the lines indented deeper continue it.
        2. The section ends at the next line that is not indented (the next section).
    """
    entries: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = lines.index(f"{section}:") + 1
    except ValueError:
        return entries
    names: list[str] = []
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break
        if match := re.match(r"^ {4}(\w+(?:, \w+)*): ?(.*)$", line):
            names = match.group(1).split(", ")
            for name in names:
                entries[name] = match.group(2).strip()
        elif line.startswith(" " * 8) and names:
            for name in names:
                entries[name] += " " + line.strip()
    return entries
