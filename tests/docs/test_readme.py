"""The README stays a five-minute read, and its links lead to files that exist (the site checks its own)."""

from __future__ import annotations

import re

from markdown_blocks import ROOT

#: The most lines the README may have: what it is, install, usage, where files go, links (issue 47).
README_LINES = 250


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; put reference text in a page of docs/"


def test_readme_links_lead_to_files() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if not re.match(r"\w+://", target)]
    assert local, "the README links to no page"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
