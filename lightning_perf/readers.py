"""
Readers of untrusted files
==========================

The offline CLI reads files a user points it at: Kineto traces (``.json`` or ``.json.gz``) and
``perf_report.json`` files. :func:`load_trace` and :func:`load_report` read them, check the structure the
analyses rely on, and turn every problem (a missing file, a truncated gzip, invalid UTF-8 or JSON, a field
of the wrong type) into an :class:`InputError` whose message names the file and what is wrong with it, ready
to print as ``lightning-perf: error: <message>``. Nothing else escapes them: no ``KeyError`` or
``TypeError`` deep inside an analysis later on.

The report's expected fields come from the record dataclasses (:class:`~lightning_perf.records.EpochSummary`
and the others), so that a field added there is checked here without a second list to keep in step.

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from lightning_perf.diagnose.model import SEVERITIES, Finding, RunFacts
from lightning_perf.layout import REPORT_SCHEMA_VERSION as SCHEMA_VERSION
from lightning_perf.records import EpochSummary, RankSummary, TraceSummary, WindowRecord
from lightning_perf.summarize.events import MEMORY_EVENT_NAME, OTHER_PHASES, KinetoTrace, as_trace, decode_trace
from lightning_perf.traces import METADATA_KEY, gunzip

__all__ = ["InputError", "load_kineto", "load_report", "load_trace"]

GZIP_MAGIC = b"\x1f\x8b"
# Event phases of the Chrome trace event format (Kineto writes X, i, M, s, f); events of other phases are
# dropped. Only X and i events are read by the analyses, so only they are checked beyond their common fields.
TRACE_PHASES = frozenset(OTHER_PHASES) | {"X", "i"}
# Run facts that perf_report.json keeps per stage under run["dataloaders"][stage]; the rest are run-level.
DATALOADER_FACTS = frozenset({"num_workers", "pin_memory", "persistent_workers", "batch_size"})
SHOWN_CHARS = 60  # a bad value is shown as its repr, cut to this length
INT_LIMIT = 2**63  # integers beyond a 64-bit range are not portable JSON, and overflow float conversions


class InputError(ValueError):
    """A file the user pointed at is missing, unreadable or not what it claims to be.

    The message's first line is ``<file>: <what is wrong>``; a second line, where present, says what to do.
    """


class _Invalid(Exception):
    """A structural problem, reported without the file's name (the loader adds it)."""


# --- Messages ------------------------------------------------------------------------------------------------

_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int to isinstance
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut to :data:`SHOWN_CHARS`, and its JSON type."""
    text = repr(value)
    if len(text) > SHOWN_CHARS:
        text = text[: SHOWN_CHARS - 3] + "..."
    kind = "null" if value is None else next((name for t, name in _JSON_TYPES if isinstance(value, t)), "?")
    return f"{text} ({kind})"


def _must(field: str, expected: str, value: Any) -> _Invalid:
    """``field X must be Z, got W``."""
    return _Invalid(f"field {field} must be {expected}, got {_shown(value)}")


def _missing(field: str, hint: str = "") -> _Invalid:
    return _Invalid(f"field {field} is missing{hint}")


def _at(parent: str, key: str | int) -> str:
    """The path of ``parent[key]`` in messages: ``stages.train.epochs[2]``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    shown = repr(key) if len(repr(key)) <= SHOWN_CHARS else repr(key)[: SHOWN_CHARS - 3] + "..."
    return f"{parent}[{shown}]"


# --- Value kinds ---------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# kind -> (what a message calls it, test); the kinds of the records' annotations.
_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", _is_int),
    "float": ("a number", _is_number),
    "bool": ("a boolean", lambda value: isinstance(value, bool)),
    "str": ("a string", lambda value: isinstance(value, str)),
}


def _expected(kinds: Iterable[str], nullable: bool) -> str:
    words = [_KINDS[kind][0] for kind in kinds]
    if "a number" in words and "an integer" in words:
        words.remove("an integer")
    return " or ".join([*words, "null"] if nullable else words)


def _check(field: str, value: Any, kinds: tuple[str, ...], *, nullable: bool = False) -> None:
    """Raises unless ``value`` is of one of ``kinds`` (or ``None``, where ``nullable``); numbers must be
    finite and within 64 bits."""
    if value is None and nullable:
        return
    if not any(_KINDS[kind][1](value) for kind in kinds):
        raise _must(field, _expected(kinds, nullable), value)
    if isinstance(value, float) and not math.isfinite(value):
        raise _must(field, "a finite number", value)
    if _is_int(value) and not -INT_LIMIT <= value < INT_LIMIT:
        raise _must(field, "a number between -2**63 and 2**63", value)


@dataclass(frozen=True)
class _Field:
    """One field of a record as perf_report.json writes it."""

    name: str
    kinds: tuple[str, ...]
    nullable: bool
    required: bool  # no default in the dataclass: every writer of this schema version wrote it
    default: Any = None


def _fields_of(
    cls: type, *, skip: Iterable[str] = (), annotations: Mapping[str, str] | None = None
) -> tuple[_Field, ...]:
    """The checkable fields of a record dataclass, from its annotations (``"int"``, ``"float | None"``...).

    ``annotations`` replaces the annotation of the fields it names (for a type alias such as ``Severity``).

    Raises:
        TypeError: At import, for an annotation this module cannot check: a programming error, caught by
            the tests, rather than a field silently left unchecked.
    """
    skip, annotations = set(skip), dict(annotations or {})
    result = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        annotation = annotations.get(f.name, f.type)
        if not isinstance(annotation, str):  # the records' module without ``from __future__ import annotations``
            annotation = annotation.__name__ if isinstance(annotation, type) else str(annotation)
        parts = [part.strip() for part in annotation.split("|")]
        kinds = tuple(part for part in parts if part != "None")
        if not kinds or any(kind not in _KINDS for kind in kinds):
            raise TypeError(f"{cls.__name__}.{f.name}: cannot check the annotation {annotation!r}")
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        result.append(_Field(f.name, kinds, "None" in parts, not has_default, default if has_default else None))
    return tuple(result)


EPOCH_FIELDS = _fields_of(EpochSummary)
RANK_FIELDS = _fields_of(RankSummary)
FINDING_FIELDS = _fields_of(Finding, annotations={"severity": "str"})
WINDOW_FIELDS = _fields_of(WindowRecord, skip=("operators", "summary"))  # as the report writes a window
TRACE_SUMMARY_FIELDS = _fields_of(TraceSummary)
RUN_FIELDS = _fields_of(RunFacts, skip=DATALOADER_FACTS)
DATALOADER_FIELDS = tuple(f for f in _fields_of(RunFacts) if f.name in DATALOADER_FACTS)


def _check_record(record: Any, fields: Iterable[_Field], where: str, *, fill: bool = True) -> dict[str, Any]:
    """Checks one record object field by field; fills in, where ``fill``, the defaults of absent optional
    fields (written by every current writer, perhaps not by an older one of the same schema version)."""
    if not isinstance(record, dict):
        raise _must(where, "an object", record)
    for field in fields:
        if field.name not in record:
            if field.required:
                raise _missing(_at(where, field.name))
            if fill:
                record[field.name] = field.default
            continue
        _check(_at(where, field.name), record[field.name], field.kinds, nullable=field.nullable)
    return record


def _list(container: dict[str, Any], key: str, where: str, *, default: list[Any] | None = None) -> list[Any]:
    field = _at(where, key)
    if key not in container:
        if default is None:
            raise _missing(field)
        container[key] = default
    value = container[key]
    if not isinstance(value, list):
        raise _must(field, "an array", value)
    return value


# --- Files ---------------------------------------------------------------------------------------------------


def _read_json(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """The file's name for messages and its parsed JSON, gunzipped first where it is gzip (by its name
    ending in ``.gz`` or by its first bytes)."""
    name, data, compressed = _read_bytes(path)
    return name, _parse_json(name, data, compressed)


def _read_bytes(path: str | os.PathLike[str]) -> tuple[str, bytes, bool]:
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


def _parse_json(name: str, data: bytes, compressed: bool) -> Any:
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


# --- Traces --------------------------------------------------------------------------------------------------


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a Kineto (Chrome trace format) JSON trace, gzipped or not, and checks what the analyses use.

    Notes:
        1. The top level is an object with a ``traceEvents`` array, or an array of events (which the Chrome
           trace format allows): returned as ``{"traceEvents": [...]}``.
        2. Every event is an object. Events whose ``ph`` is not a phase of the format (or is absent) are
           dropped, the others kept in order.
        3. Complete events (``ph == "X"``) have a string ``name``, a finite number ``ts`` and a finite
           number ``dur >= 0``; instant events (``"i"``, ``"I"``) a finite number ``ts``.
        4. Where present: ``args`` is an object, ``cat`` a string, ``pid`` and ``tid`` numbers or strings;
           in ``args``, ``External id`` a number, string or null, ``flops`` a number or null, and a
           ``[memory]`` event's ``Bytes`` a number.
        5. Where present at the top level: ``deviceProperties`` is an array or null, ``lightning_perf`` (this
           package's own notes) an object.

    Raises:
        InputError: Naming the file and the problem (for a field: its path, e.g. ``traceEvents[12].dur``).
    """
    name, data = _read_json(path)
    try:
        return _checked_trace(data)
    except _Invalid as err:
        raise InputError(f"{name}: {err}") from None


def load_kineto(path: str | os.PathLike[str], *, shapes: bool = False) -> KinetoTrace:
    """Reads a Kineto trace as :func:`load_trace` does, into the typed events the analyses read.

    A valid trace is decoded straight from its JSON into the records of :mod:`lightning_perf.summarize.events`
    (complete and instant events, the others as empty records), 4 times faster than :func:`load_trace` (what
    the offline CLI's speed rests on); any file that decoding refuses goes through :func:`load_trace`'s
    checks, for the same messages, and its events of unknown phases are dropped as there.

    Args:
        path: A ``.json`` or ``.json.gz`` trace.
        shapes: Also read the operators' input shapes (``record_shapes=True`` traces).

    Notes:
        1. What the analyses read is checked as :func:`load_trace` checks it; the rest is not read at all,
           so a few things :func:`load_trace` refuses pass here (a wrongly typed ``cat`` or ``args`` field of
           an instant event, a ``[memory]`` event's ``Bytes`` that is no number, which then counts none).
        2. Every trace :func:`load_trace` reads, this reads too, into the same summaries (fuzzed).

    Raises:
        InputError: Naming the file and the problem.
    """
    name, data, compressed = _read_bytes(path)
    try:
        return decode_trace(data, shapes=shapes)
    except (msgspec.MsgspecError, RecursionError):
        pass  # not JSON, a top-level array, a field of the wrong type...: the careful reader says what
    try:
        trace = _checked_trace(_parse_json(name, data, compressed))
    except _Invalid as err:
        raise InputError(f"{name}: {err}") from None
    try:
        return as_trace(trace, shapes=shapes)
    except msgspec.ValidationError as err:  # a field the checks above leave alone
        raise InputError(f"{name}: {err}".replace(" - at `$.", " at `")) from None


def _checked_trace(data: Any) -> dict[str, Any]:
    if isinstance(data, list):
        data = {"traceEvents": data}
    elif not isinstance(data, dict):
        raise _Invalid(f"not a trace: the top level must be an object or an array, got {_shown(data)}")
    if "traceEvents" not in data:
        raise _missing("traceEvents", " (not a Kineto or Chrome trace?)")
    events = data["traceEvents"]
    if not isinstance(events, list):
        raise _must("traceEvents", "an array", events)
    if data.get("deviceProperties") is not None and not isinstance(data["deviceProperties"], list):
        raise _must("deviceProperties", "an array or null", data["deviceProperties"])
    if METADATA_KEY in data and not isinstance(data[METADATA_KEY], dict):
        raise _must(METADATA_KEY, "an object", data[METADATA_KEY])
    data["traceEvents"] = [event for i, event in enumerate(events) if _checked_event(event, i)]
    return data


def _checked_event(event: Any, i: int) -> bool:
    """Checks event ``i``; ``False`` for one to drop (a phase the format does not know).

    The common case (every field right) runs on plain type tests, a trace holding 10^5 events; a field's
    path is built only for a message.
    """
    if not isinstance(event, dict):
        raise _must(f"traceEvents[{i}]", "an object", event)
    ph = event.get("ph")
    if not isinstance(ph, str) or ph not in TRACE_PHASES:
        return False
    for key in ("pid", "tid"):
        if key in event and type(event[key]) not in (int, str):
            _check(f"traceEvents[{i}].{key}", event[key], ("float", "str"))
    if "cat" in event and not isinstance(event["cat"], str):
        raise _must(f"traceEvents[{i}].cat", "a string", event["cat"])
    args = event.get("args")
    if args is None and "args" not in event:
        args = {}
    elif not isinstance(args, dict):
        raise _must(f"traceEvents[{i}].args", "an object", args)
    elif args:
        for key in ("External id", "correlation"):  # as summarize.events.CompleteArgs types them
            if key in args and type(args[key]) not in (int, str):
                _check(f"traceEvents[{i}].args[{key!r}]", args[key], ("float", "str"), nullable=True)
        if "flops" in args:
            _check(f"traceEvents[{i}].args.flops", args["flops"], ("float",), nullable=True)
    if ph == "X":
        dur = event.get("dur")
        if not (type(event.get("name")) is str and _plain_number(event.get("ts")) and _plain_number(dur) and dur >= 0):
            _explain_complete_event(event, i)
    elif ph in ("i", "I"):
        if "ts" not in event:
            raise _missing(f"traceEvents[{i}].ts", " (an instant event, ph 'i', needs ts)")
        _check(f"traceEvents[{i}].ts", event["ts"], ("float",))
        if event.get("name") == MEMORY_EVENT_NAME and "Bytes" in args:
            _check(f"traceEvents[{i}].args.Bytes", args["Bytes"], ("float",))
    return True


def _plain_number(value: Any) -> bool:
    """The fast test of :func:`_check` for ``("float",)``: what the JSON parser returns for a good number."""
    kind = type(value)
    return (kind is float and math.isfinite(value)) or (kind is int and -INT_LIMIT <= value < INT_LIMIT)


def _explain_complete_event(event: dict[str, Any], i: int) -> None:
    """Raises the precise message for a complete event that failed the fast test."""
    for key, kinds in (("name", ("str",)), ("ts", ("float",)), ("dur", ("float",))):
        if key not in event:
            raise _missing(f"traceEvents[{i}].{key}", " (a complete event, ph 'X', needs name, ts and dur)")
        _check(f"traceEvents[{i}].{key}", event[key], kinds)
    raise _must(f"traceEvents[{i}].dur", "a number >= 0", event["dur"])


# --- Reports -------------------------------------------------------------------------------------------------


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a ``perf_report.json`` and checks it against its schema (see
    :mod:`lightning_perf.report.json_report`).

    Notes:
        1. ``version`` is :data:`~lightning_perf.report.json_report.SCHEMA_VERSION`; a newer one is refused
           with the lightning-perf release that wrote it, before anything else is read.
        2. ``run`` is an object; the facts the rules use (``device``, ``world_size``... and per stage under
           ``dataloaders``: ``num_workers``, ``pin_memory``...) have the types of
           :class:`~lightning_perf.diagnose.model.RunFacts` where present.
        3. ``stages`` maps each stage to ``{"epochs": [...]}``; every epoch has the fields of
           :class:`~lightning_perf.records.EpochSummary` with their annotated types (``int``, ``float``
           (an integer is a number too), ``| None``: or null), its ``stage`` is the stage it is listed
           under, and its ``findings`` and ``ranks`` are arrays of
           :class:`~lightning_perf.diagnose.model.Finding` and :class:`~lightning_perf.records.RankSummary`
           objects (a finding's ``severity`` one of ``info``, ``warning``, ``critical``).
        4. ``windows`` is an array of :class:`~lightning_perf.records.WindowRecord` objects (less their
           operators), each ``summary`` null or a :class:`~lightning_perf.records.TraceSummary` object.
        5. Numbers are finite. Keys the schema does not name are allowed (a newer writer's additions).
        6. A record's field that has a default in its dataclass may be absent: it is filled in with that
           default (so ``EpochSummary(**fields)`` works on what is returned); one without is required.

    Raises:
        InputError: Naming the file and the problem (for a field: its path, e.g.
            ``stages.train.epochs[2].step_time_p50``).
    """
    name, data = _read_json(path)
    try:
        return _checked_report(data)
    except _Invalid as err:
        raise InputError(f"{name}: {err}") from None


def _checked_report(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _Invalid(f"not a perf_report.json: the top level must be an object, got {_shown(data)}")
    _check_version(data)
    if "generated_by" in data:
        _check("generated_by", data["generated_by"], ("str",))

    if "run" not in data:
        raise _missing("run")
    run = _check_record(data["run"], RUN_FIELDS, "run", fill=False)
    loaders = run.get("dataloaders", {})
    if not isinstance(loaders, dict):
        raise _must("run.dataloaders", "an object", loaders)
    for stage, loader in loaders.items():
        if loader is not None:  # None: the stage had no DataLoader to inspect
            _check_record(loader, DATALOADER_FIELDS, _at("run.dataloaders", stage), fill=False)

    if "stages" not in data:
        raise _missing("stages")
    stages = data["stages"]
    if not isinstance(stages, dict):
        raise _must("stages", "an object", stages)
    for stage, entry in stages.items():
        where = _at("stages", stage)
        if not isinstance(entry, dict):
            raise _must(where, "an object", entry)
        for i, epoch in enumerate(_list(entry, "epochs", where)):
            _check_epoch(epoch, stage, _at(_at(where, "epochs"), i))

    for i, window in enumerate(_list(data, "windows", "")):
        where = _at("windows", i)
        _check_record(window, WINDOW_FIELDS, where)
        summary = window.setdefault("summary", None)
        if summary is not None:
            _check_record(summary, TRACE_SUMMARY_FIELDS, _at(where, "summary"))
    return data


def _check_version(data: dict[str, Any]) -> None:
    if "version" not in data:
        raise _missing("version", " (not a perf_report.json?)")
    version = data["version"]
    if not _is_int(version):
        raise _must("version", "an integer", version)
    if version > SCHEMA_VERSION:
        writer = data.get("generated_by")
        known = isinstance(writer, str) and re.fullmatch(r"lightning-perf [\w.+-]{1,40}", writer)
        by = f"It was written by {writer}: read it with that release or a newer one" if known else (
            "Read it with the lightning-perf release that wrote it or a newer one"
        )
        raise _Invalid(
            f"report schema version {version} is newer than this lightning-perf reads (version {SCHEMA_VERSION})"
            f"\n{by} (pip install -U lightning-perf)."
        )
    if version != SCHEMA_VERSION:
        raise _Invalid(f"unknown report schema version {version} (this lightning-perf reads version {SCHEMA_VERSION})")


def _check_epoch(epoch: Any, stage: str, where: str) -> None:
    _check_record(epoch, EPOCH_FIELDS, where)
    if epoch["stage"] != stage:
        shown = _shown(epoch["stage"])
        raise _Invalid(f"field {_at(where, 'stage')} is {shown}, but the epoch is listed under {stage!r}")
    for i, finding in enumerate(_list(epoch, "findings", where, default=[])):
        at = _at(_at(where, "findings"), i)
        _check_record(finding, FINDING_FIELDS, at)
        if finding["severity"] not in SEVERITIES:
            raise _must(_at(at, "severity"), "one of " + ", ".join(map(repr, SEVERITIES)), finding["severity"])
    for i, rank in enumerate(_list(epoch, "ranks", where, default=[])):
        _check_record(rank, RANK_FIELDS, _at(_at(where, "ranks"), i))
