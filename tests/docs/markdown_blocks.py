"""The fenced code blocks of the README and the site's pages, for the tests that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The Markdown a user reads: the README and the site's pages.
PAGES: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: The comment that marks the block after it as not run, with the reason: ``<!-- not run: needs a GPU -->``.
NOT_RUN = re.compile(r"^\s*<!-- not run: (.*?) -->\s*$")
#: Blocks of these languages show output, trees or tables: nothing to run.
SHOWN = frozenset({"text"})


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its code, and why it is not run (``None``: run)."""

    page: Path
    line: int
    language: str
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order; a block indented in a list has its indentation removed."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if match := re.match(r"^(\s*)```(\S*)\s*$", lines[i]):
            indent, language, start = match.group(1), match.group(2), i
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            previous = next((line for line in reversed(lines[:start]) if line.strip()), "")
            reason = match_.group(1) if (match_ := NOT_RUN.match(previous)) else None
            found.append(Block(page, start + 1, language, "\n".join(body) + "\n", reason))
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]
