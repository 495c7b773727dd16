"""
Reading a Kineto trace: the one reader, :func:`load_trace`, decodes a trace straight into the typed events
the analyses read; the field-by-field checks here only put into words why a file would not decode.
Imports neither torch nor lightning.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeGuard

import msgspec

from lightning_perf.readers.files import InputError, Invalid, check, missing, must, parse_json, read_bytes
from lightning_perf.summarize.events import MEMORY_EVENT_NAME, OTHER_PHASES, KinetoTrace, as_trace, decode_trace
from lightning_perf.trace_repair import parse_or_repair
from lightning_perf.traces import METADATA_KEY
from lightning_perf.validation import INT_LIMIT
from lightning_perf.validation import shown as _shown

# Event phases of the Chrome trace event format (Kineto writes X, i, M, s, f); events of other phases are
# dropped. Only X and i events are read by the analyses, so only they are checked beyond their common fields.
TRACE_PHASES = frozenset(OTHER_PHASES) | {"X", "i"}


def load_trace(
    path: str | os.PathLike[str], *, shapes: bool = False, on_repair: Callable[[str], None] | None = None
) -> KinetoTrace:
    """Reads a Kineto (Chrome trace format) JSON trace, gzipped or not, into the typed events the analyses read.

    The file is decoded straight from its JSON into the records of :mod:`lightning_perf.summarize.events`
    (complete and instant events, the others as empty records), whose annotations say what the analyses read
    and check it. Only a file that decoding refuses is parsed again, with ``json``, and checked field by field
    (:func:`_checked_trace`), to say what is wrong with it; two variants of the format that decoding does not
    take pass that way too: a top-level array of events, and events of no known phase (dropped). A file that
    is not valid JSON because torch's exporter left a string unescaped (a ``record_function`` name holding a
    double quote) is read repaired (:func:`~lightning_perf.trace_repair.repair_json`), and says so.

    Args:
        path: A ``.json`` or ``.json.gz`` trace (gzip is also recognized by its first bytes).
        shapes: Also read the operators' input shapes (``record_shapes=True`` traces): a
            :class:`~lightning_perf.summarize.events.ShapedKinetoTrace`.
        on_repair: Told, once, that the file was read repaired and why (a message naming the file);
            ``None``: a ``UserWarning``.

    Notes:
        1. The top level is an object with a ``traceEvents`` array, or an array of events (which the Chrome
           trace format allows).
        2. Every event is an object. Events whose ``ph`` is not a phase of the format (or is absent) are
           dropped, the others kept in order.
        3. Complete events (``ph == "X"``) have a string ``name``, a finite number ``ts`` and a finite
           number ``dur >= 0``; instant events (``"i"``) a finite number ``ts``.
        4. Where present: ``args`` is an object, ``cat`` a string, ``pid`` and ``tid`` numbers or strings;
           in ``args``, ``External id`` and ``correlation`` a number, string or null, ``flops`` a number or
           null.
        5. Where present at the top level: ``deviceProperties`` is an array or null, ``lightning_perf`` (this
           package's own notes) an object.
        6. What no analysis reads is not read: a few things the field-by-field checks refuse pass when the
           file decodes (an instant event's ``cat``, the fields of events of the phases no analysis reads,
           ``M``, ``s``, ``I``..., a ``[memory]`` event's ``Bytes`` that is no number, which then counts none).
        7. Invalid JSON is repaired only where the repair makes it valid; else the error is the file's own
           (its line and column as on disk).

    Raises:
        InputError: Naming the file and the problem (for a field: its path, e.g. ``traceEvents[12].dur``).
    """
    name, data, compressed = read_bytes(path)
    try:
        return decode_trace(data, shapes=shapes)
    except (msgspec.MsgspecError, RecursionError):
        pass  # not JSON, a top-level array, a field of the wrong type...: the field-by-field checks say what
    parsed, repair = parse_or_repair(data, lambda text: parse_json(name, text, compressed), InputError)
    if repair is not None:
        (on_repair or _warn)(
            f"{name}: invalid JSON, repaired: {repair.description}, first on line {repair.lines[0]}"
            f"{' once decompressed' if compressed else ''} (torch's trace exporter does not escape them); read as"
            " if escaped"
        )
    try:
        trace = _checked_trace(parsed)
    except Invalid as err:
        raise InputError(f"{name}: {err}") from None
    try:
        return as_trace(trace, shapes=shapes)
    except msgspec.ValidationError as err:  # a field the checks above leave alone
        raise InputError(f"{name}: {err}".replace(" - at `$.", " at `")) from None


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=4)  # at the caller of load_trace


def _checked_trace(data: Any) -> dict[str, Any]:
    """A trace that decoding refused, as parsed by ``json``, checked field by field: raises :class:`Invalid`
    saying what is wrong, else returns it for :func:`~lightning_perf.summarize.events.as_trace` to convert, a
    top-level array of events wrapped as ``{"traceEvents": [...]}`` and its events of unknown phases dropped.
    What the analyses read is declared once, by :mod:`lightning_perf.summarize.events`' annotations; these
    checks put a problem in words (a fuzz test holds that decoding reads every trace they accept, into the
    same summaries)."""
    if isinstance(data, list):
        data = {"traceEvents": data}
    elif not isinstance(data, dict):
        raise Invalid(f"not a trace: the top level must be an object or an array, got {_shown(data)}")
    if "traceEvents" not in data:
        raise missing("traceEvents", " (not a Kineto or Chrome trace?)")
    events = data["traceEvents"]
    if not isinstance(events, list):
        raise must("traceEvents", "an array", events)
    if data.get("deviceProperties") is not None and not isinstance(data["deviceProperties"], list):
        raise must("deviceProperties", "an array or null", data["deviceProperties"])
    if METADATA_KEY in data and not isinstance(data[METADATA_KEY], dict):
        raise must(METADATA_KEY, "an object", data[METADATA_KEY])
    data["traceEvents"] = [event for i, event in enumerate(events) if _checked_event(event, i)]
    return data


def _checked_event(event: Any, i: int) -> bool:
    """Checks event ``i``; ``False`` for one to drop (a phase the format does not know).

    The common case (every field right) runs on plain type tests, a trace holding 10^5 events; a field's
    path is built only for a message.
    """
    if not isinstance(event, dict):
        raise must(f"traceEvents[{i}]", "an object", event)
    ph = event.get("ph")
    if not isinstance(ph, str) or ph not in TRACE_PHASES:
        return False
    for key in ("pid", "tid"):
        if key in event and type(event[key]) not in (int, str):
            check(f"traceEvents[{i}].{key}", event[key], ("float", "str"))
    if "cat" in event and not isinstance(event["cat"], str):
        raise must(f"traceEvents[{i}].cat", "a string", event["cat"])
    args = event.get("args")
    if args is None and "args" not in event:
        args = {}
    elif not isinstance(args, dict):
        raise must(f"traceEvents[{i}].args", "an object", args)
    elif args:
        for key in ("External id", "correlation"):  # as summarize.events.CompleteArgs types them
            if key in args and type(args[key]) not in (int, str):
                check(f"traceEvents[{i}].args[{key!r}]", args[key], ("float", "str"), nullable=True)
        if "flops" in args:
            check(f"traceEvents[{i}].args.flops", args["flops"], ("float",), nullable=True)
    if ph == "X":
        dur = event.get("dur")
        if not (type(event.get("name")) is str and _plain_number(event.get("ts")) and _plain_number(dur) and dur >= 0):
            _explain_complete_event(event, i)
    elif ph in ("i", "I"):
        if "ts" not in event:
            raise missing(f"traceEvents[{i}].ts", " (an instant event, ph 'i', needs ts)")
        check(f"traceEvents[{i}].ts", event["ts"], ("float",))
        if event.get("name") == MEMORY_EVENT_NAME and "Bytes" in args:
            check(f"traceEvents[{i}].args.Bytes", args["Bytes"], ("float",))
    return True


def _plain_number(value: Any) -> TypeGuard[float]:
    """The fast test of :func:`check` for ``("float",)``: what the JSON parser returns for a good number."""
    kind = type(value)
    return (kind is float and math.isfinite(value)) or (kind is int and -INT_LIMIT <= value < INT_LIMIT)


def _explain_complete_event(event: dict[str, Any], i: int) -> None:
    """Raises the precise message for a complete event that failed the fast test."""
    for key, kinds in (("name", ("str",)), ("ts", ("float",)), ("dur", ("float",))):
        if key not in event:
            raise missing(f"traceEvents[{i}].{key}", " (a complete event, ph 'X', needs name, ts and dur)")
        check(f"traceEvents[{i}].{key}", event[key], kinds)
    raise must(f"traceEvents[{i}].dur", "a number >= 0", event["dur"])
