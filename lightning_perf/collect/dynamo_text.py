"""
Dynamo's words
==============

What torch's compiler logs, as the user reads it: the place and reason of a graph break (at the user's line
when the break is inside a library), a failed guard on one line, the function Dynamo's recompile-limit warning
names, and paths relative to the working directory. Dynamo's texts change between torch releases: each reader
returns what it can recognize and ``None`` or the text as it is otherwise, never an error (torch 2.13's words
are in the tests).
"""

from __future__ import annotations

import os
import re

# A graph break's record: "Graph break in user code at FILE:LINE\nGraph Break Reason: ...", or the same with
# "(user stack suppressed due to duplicate graph break)".
BREAK_AT = re.compile(r"Graph break(?: \([^)]*\))? in user code at (?P<location>.+?:\d+)\s*\nGraph Break Reason: ")
# Dynamo's warning at the recompile limit: the limit, the function, the last failed guard.
LIMIT = re.compile(r"hit config\.\w+")
LIMIT_FUNCTION = re.compile(r"function: '(?P<name>[^']*)' \((?P<where>[^)]*)\)")
LIMIT_REASON = re.compile(r"last reason: (?P<reason>[^\n]*)")
# Dynamo prefixes a break's reason with what it was tracing: not the reason.
_TRACING_PREAMBLE = "Encountered graph break when attempting to trace"
# The innermost frame Dynamo appends to a guard's source, often torch's own, e.g.
# `(_dynamo/variables/tensor.py:2606 in evaluate_expr)`: the user's line is already named before it.
_INNER_FRAME = re.compile(r"\s*\([^()]*\.py:\d+ in [^()]*\)")


def guard_text(reason: str) -> str:
    """A failed guard as Dynamo words it (``0/0: n == 1   # for _ in range(n): ...  # model.py:21 in g (...)``),
    on one line: the guard, then the source it guards in parentheses (without torch's own frames)."""
    line = reason.strip().split("\n", 1)[0]
    line = re.sub(r"^\d+/\d+: ", "", line)
    guard, *source = (part.strip() for part in line.split("#"))
    guard = re.sub(r"\s+", " ", guard)
    source = [re.sub(r"\s+", " ", re.sub(_INNER_FRAME, "", s)).strip() for s in source]
    source = [s for s in source if s]
    return f"{guard} ({'; '.join(source)})" if source else guard


def break_reason(text: str) -> str:
    """A graph break's reason, its first line that is not Dynamo's preamble of what it was tracing."""
    lines = [line.strip() for line in text.split("\n")]
    meaningful = [line for line in lines if line and not line.startswith(_TRACING_PREAMBLE)]
    return meaningful[0] if meaningful else first_line(text)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


_FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\n]+)')
# Where installed packages live: a path under one of these is a library's, not the user's.
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/", "\\site-packages\\")


def in_library(location: str) -> bool:
    return any(marker in location for marker in _LIBRARY_DIRS) or location.startswith("<")


def user_line(text: str, location: str) -> tuple[str, str] | None:
    """From a graph break's "User code traceback" (outermost frame first), the innermost frame outside the
    libraries (``"path:line"``), and the library function the break is in (``"lightning `log`"``)."""
    frames = [(m.group("file"), m.group("line"), m.group("function").strip()) for m in _FRAME_LINE.finditer(text)]
    user = [f"{file}:{line}" for file, line, _ in frames if not in_library(file)]
    if not user:
        return None
    inner = next((f for f in reversed(frames) if f"{f[0]}:{f[1]}" == location), frames[-1] if frames else None)
    owner = package(inner[0]) if inner else "a library"
    return user[-1], f"{owner} `{inner[2]}`" if inner else owner


def package(path: str) -> str:
    """The installed package a file belongs to (``lightning``, ``torch``), from its path."""
    for marker in _LIBRARY_DIRS:
        if marker in path:
            return re.split(r"[/\\]", path.split(marker, 1)[1])[0]
    return "a library"


def shown_path(location: str) -> str:
    """``path:line`` relative to the working directory when the file is under it (as a user names it)."""
    path, sep, line = location.rpartition(":")
    if not sep or not path:
        return location
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return location
    return f"{relative}:{line}" if not relative.startswith("..") else location
