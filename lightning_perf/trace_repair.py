"""
Repairing torch's trace export
==============================

torch writes a trace's JSON by formatting strings, not with a JSON writer, and it does not escape every
string it writes: torch 2.13's ``export_chrome_trace`` writes a double quote in an event name as it is, so
``record_function('load "shard-3"')`` gives the line ``"name": "load "shard-3"",`` and the whole trace is
invalid JSON (earlier Kineto versions wrote backslashes as they are on Linux, ``Invalid \\escape``, and
control characters are as much a defect). The damage is local: Kineto writes an event's fields a line or a
few at a time, and a name never spans lines (it drops newlines), so :func:`repair_json` re-escapes, line
by line, the string values that are not valid JSON, and leaves every other byte as it was.

Used only where the strict parse failed (the window close, :func:`lightning_perf.readers.load_trace`), so a
valid trace costs nothing. Imports neither torch nor lightning.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from lightning_perf.validation import cut

# A string value begins after a key: `"key": "`.
_VALUE_START = re.compile(r'"\s*:\s*"')
# ... and ends at a double quote that the line's layout says closes it: one followed by the next `, "key":`,
# by the end of the line (an optional comma before it), or by the end of an object or array.
_VALUE_END = re.compile(r'"(?=\s*,\s*"[^"\n]*"\s*:|\s*,?\s*$|\s*[}\]])')
# What a JSON string holds between its quotes (RFC 8259, section 7).
_VALID_CONTENT = re.compile(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_SPECIAL = re.compile(r'["\\\x00-\x1f]')
_CONTROL = re.compile(r"[\x00-\x1f]")
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

# What was wrong in a value torch did not escape, in words, and the test for it.
_DEFECTS = (
    ("an unescaped double quote", lambda value: '"' in value),
    ("an unescaped backslash", lambda value: "\\" in value),
    ("a raw control character", lambda value: _CONTROL.search(value) is not None),
)


@dataclass(frozen=True, kw_only=True)
class Repair:
    """What :func:`repair_json` changed.

    Attributes:
        data: The repaired text (UTF-8), every line but those in ``lines`` as it was.
        lines: The numbers (from 1) of the lines whose string values were re-escaped, in order.
        values: How many string values were re-escaped.
        first: The first of them, as it reads once repaired (e.g. ``load "shard-3"``).
        defects: What was wrong in them: ``"an unescaped double quote"``, ``"an unescaped backslash"``,
            ``"a raw control character"``, in that order, each once.
    """

    data: bytes
    lines: tuple[int, ...]
    values: int
    first: str
    defects: tuple[str, ...]

    @property
    def description(self) -> str:
        """What was wrong, in words: ``1 string value held an unescaped double quote ('load "shard-3"')``."""
        *most, last = self.defects
        held = f"{', '.join(most)} and {last}" if most else last
        return f"{self.values} string value{'' if self.values == 1 else 's'} held {held} ({cut(repr(self.first))})"


def repair_json(data: bytes) -> Repair | None:
    """``data`` with the string values that torch's exporter left unescaped re-escaped; ``None`` where no value
    needed it (valid JSON, or damage of another kind: the caller's parse then says what is wrong).

    Args:
        data: A trace's JSON text as torch exported it (UTF-8, not gzipped).

    Notes:
        1. The text is read line by line; a line without ``": "`` holds no string value of a key and is kept.
        2. On a line, each string value starts after ``"key": "`` and ends at the first double quote followed
           by the line's next ``, "key":``, by the end of the line (after an optional comma), or by ``}`` or
           ``]``: Kineto's layout, whatever the value holds.
        3. A value that is valid JSON string content is kept as it is (a valid file's lines are untouched,
           escapes included). Any other value is taken as the literal text torch meant, as torch escapes
           nothing: each ``"``, ``\\`` and control character in it is escaped.
        4. What this cannot repair is left as it was: a string in an array (``"Input type": ["a"b"]``), a
           value containing ``", "key":`` (read as two values), a value that torch split over two lines.
           A literal ``\\n`` in a name is valid JSON and is read as a newline: the text cannot tell.
        5. Bytes that are not UTF-8 are carried through unchanged (``surrogateescape``).
    """
    lines = data.decode("utf-8", errors="surrogateescape").split("\n")
    changed: list[int] = []
    repaired: list[str] = []
    for number, line in enumerate(lines):
        if '"' not in line or ":" not in line:  # no value of a key: most of a trace's lines, at a glance
            continue
        fixed, values = _repaired_line(line)
        if values:
            lines[number] = fixed
            changed.append(number + 1)
            repaired += values
    if not changed:
        return None
    return Repair(
        data="\n".join(lines).encode("utf-8", errors="surrogateescape"),
        lines=tuple(changed),
        values=len(repaired),
        first=repaired[0],
        defects=tuple(kind for kind, test in _DEFECTS if any(test(value) for value in repaired)),
    )


T = TypeVar("T")


def parse_or_repair(
    data: bytes, parse: Callable[[bytes], T], invalid: type[Exception] | tuple[type[Exception], ...]
) -> tuple[T, Repair | None]:
    """``parse(data)``; where it raises ``invalid``, ``parse`` of :func:`repair_json`'s repaired text, with the
    :class:`Repair`. The one way both readers of torch's exports (the window close's
    :func:`~lightning_perf.traces.finish_trace` and :func:`~lightning_perf.readers.load_trace`) try the repair.

    Raises:
        The first error of ``parse``: the text is invalid and the repair does not make it valid (its line and
        column are the file's own).
    """
    try:
        return parse(data), None
    except invalid as err:
        repair = repair_json(data)
        if repair is None:
            raise
        try:
            return parse(repair.data), repair
        except invalid:
            raise err from None


def _repaired_line(line: str) -> tuple[str, list[str]]:
    """``line`` with its invalid string values escaped (Notes 2 and 3 of :func:`repair_json`), and those
    values as they were."""
    parts: list[str] = []
    repaired: list[str] = []
    copied = scanned = 0  # copied: what of `line` is in `parts`; scanned: where the next value may start
    while (start := _VALUE_START.search(line, scanned)) is not None:
        end = _VALUE_END.search(line, start.end())
        if end is None:
            break
        value = line[start.end() : end.start()]
        if not _VALID_CONTENT.fullmatch(value):
            parts += (line[copied : start.end()], _SPECIAL.sub(_escape, value))
            copied = end.start()
            repaired.append(value)
        scanned = end.end()
    if not repaired:
        return line, []
    parts.append(line[copied:])
    return "".join(parts), repaired


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"
