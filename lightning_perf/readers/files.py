"""
What the readers share: the error a bad input file raises, how a problem in it is put in words (one format,
:mod:`lightning_perf.validation`'s), and reading the file itself (gzip recognized by name or content, UTF-8,
JSON). Imports neither torch nor lightning.
"""

from __future__ import annotations

import functools
import json
import os
import re
import zlib
from typing import Any

from lightning_perf.traces import gunzip
from lightning_perf.validation import (
    BOOLEAN,
    FINITE,
    INT64,
    INTEGER,
    NUMBER,
    STRING,
    Kind,
    bad_value,
    cut,
    one_of,
)
from lightning_perf.validation import is_int as _is_int

GZIP_MAGIC = b"\x1f\x8b"


class InputError(ValueError):
    """A file the user pointed at is missing, unreadable or not what it claims to be.

    The message's first line is ``<file>: <what is wrong>``; a second line, where present, says what to do.
    """


class Invalid(Exception):
    """A structural problem, reported without the file's name (the loader adds it)."""


# --- Messages ------------------------------------------------------------------------------------------------
# One format for a bad value, :mod:`lightning_perf.validation`'s: ``field X must be Z, got W (type)``.


def must(field: str, expected: str, value: Any) -> Invalid:
    """``field X must be Z, got W (type)``."""
    return Invalid(bad_value(f"field {field}", value, expected))


def missing(field: str, hint: str = "") -> Invalid:
    return Invalid(f"field {field} is missing{hint}")


def at(parent: str, key: str | int) -> str:
    """The path of ``parent[key]`` in messages: ``stages.train.epochs[2]``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{cut(repr(key))}]"


# --- Value kinds ---------------------------------------------------------------------------------------------

# The kinds of the records' annotations.
KINDS: dict[str, Kind] = {"int": INTEGER, "float": NUMBER, "bool": BOOLEAN, "str": STRING}


@functools.cache
def _kind(kinds: tuple[str, ...], nullable: bool) -> Kind:
    """The kind of a value of any of ``kinds`` (annotation names), or null where ``nullable``."""
    chosen = [KINDS[kind] for kind in kinds if not (kind == "int" and "float" in kinds)]  # a number covers it
    kind = one_of(*chosen) if len(chosen) > 1 else chosen[0]
    return kind.or_none("null") if nullable else kind


def check(field: str, value: Any, kinds: tuple[str, ...], *, nullable: bool = False) -> None:
    """Raises unless ``value`` is of one of ``kinds`` (or ``None``, where ``nullable``); numbers must be
    finite and within 64 bits."""
    kind = _kind(kinds, nullable)
    if not kind.accepts(value):
        raise must(field, kind.allowed, value)
    if isinstance(value, float) and not FINITE.accepts(value):
        raise must(field, FINITE.allowed, value)
    if _is_int(value) and not INT64.accepts(value):
        raise must(field, INT64.allowed, value)


# --- Files ---------------------------------------------------------------------------------------------------


def read_json(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """The file's name for messages and its parsed JSON, gunzipped first where it is gzip (by its name
    ending in ``.gz`` or by its first bytes)."""
    name, data, compressed = read_bytes(path)
    return name, parse_json(name, data, compressed)


def read_bytes(path: str | os.PathLike[str]) -> tuple[str, bytes, bool]:
    """The file's name for messages, its content (gunzipped where it is gzip) and whether it was."""
    name = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as err:
        raise InputError(f"{name}: no such file") from err
    except IsADirectoryError as err:
        raise InputError(f"{name}: is a directory, not a file") from err
    except PermissionError as err:
        raise InputError(f"{name}: permission denied") from err
    except OSError as err:
        raise InputError(f"{name}: cannot read it ({err.strerror or err})") from err
    except ValueError as err:  # e.g. a NUL byte in the path
        raise InputError(f"{name}: not a valid path ({err})") from err
    if not data:
        raise InputError(f"{name}: is empty")

    compressed = name.endswith(".gz") or data.startswith(GZIP_MAGIC)
    if compressed:
        try:
            data = gunzip(data)
        except EOFError as err:
            raise InputError(f"{name}: not a valid gzip file (truncated?)") from err
        except (OSError, zlib.error, ValueError) as err:  # gzip.BadGzipFile is an OSError
            raise InputError(f"{name}: not a valid gzip file ({err})") from err
        if not data:
            raise InputError(f"{name}: is empty once decompressed")
    return name, data, compressed


def parse_json(name: str, data: bytes, compressed: bool) -> Any:
    after = " once decompressed" if compressed else ""

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{name}: not UTF-8 text{after} (byte {data[err.start]:#04x} at offset {err.start}; a binary file?)"
        ) from err
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some Windows editors write
    if not text.strip():
        raise InputError(f"{name}: holds only whitespace{after}, no JSON")

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        ends_early = " (the file ends early: truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise InputError(
            f"{name}: invalid JSON{after} at line {err.lineno}, column {err.colno}: {err.msg}{ends_early}"
        ) from err
    except RecursionError as err:
        raise InputError(f"{name}: invalid JSON{after}: nested too deeply to read") from err
    except ValueError as err:  # an integer of more digits than Python converts
        raise InputError(f"{name}: invalid JSON{after}: {str(err).split(';')[0]}") from err
