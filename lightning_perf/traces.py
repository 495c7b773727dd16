"""
Kineto traces
=============

What this package does to Kineto (Chrome trace JSON) traces as dictionaries, before they are written
(:func:`finish_trace`, from torch's export of a window): the ``ProfilerStep#N`` spans it keeps
(:func:`step_number` reads ``N``, for every reader of a step's name), a cut to a size, gzipped atomic
writes, and the small rewrite that makes TensorBoard's PyTorch Profiler tab (torch-tb-profiler 0.4.3) read
traces of current torch right. Traces are read for analysis by
:func:`lightning_perf.readers.load_trace`, into typed events.

Why a rewrite: torch-tb-profiler maps event categories through a fixed table written for the Kineto of
2021. On traces of current torch it

1. drops ``user_annotation`` events other than ``ProfilerStep#N``, among them the DataLoader's
   ``enumerate(DataLoader)#...__next__`` spans, so its Overview shows DataLoader 0% for a run that
   spends most of each step waiting for data;
2. does not know the ``cuda_runtime`` and ``cuda_driver`` categories, so on GPU its Overview shows
   Runtime 0% and kernels cannot be tied to the operators that launched them.

:func:`tensorboard_compatible` gives the DataLoader spans the ``cpu_op`` category (both are CPU-side
operator ranges to Holistic Trace Analysis and Perfetto, so nothing else changes for them) and the runtime
and driver calls Kineto's own former category name ``Runtime``, which the tab understands. The trace stays
valid Kineto JSON; what was renamed is listed under the top-level key ``lightning_perf`` so that a reader
can tell, and :func:`standard_categories` undoes it for tools that key on ``cuda_runtime`` (HTA's critical
path analysis does; its breakdown, kernel, communication and queue analyses key on names and correlation
ids and are unaffected).

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import gzip
import json
import os
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from lightning_perf.layout import write_atomically
from lightning_perf.summarize.events import Complete, KinetoTrace, as_trace, decode_trace
from lightning_perf.trace_repair import parse_or_repair

try:  # Intel's ISA-L (a dependency where it has wheels): gzip 2-3x (inflate) and 8x (fastest level) faster than zlib
    from isal import igzip, isal_zlib
except ImportError:  # without its wheels: zlib
    igzip = isal_zlib = None  # type: ignore[assignment]

DATALOADER_PREFIX = "enumerate(DataLoader)#"
DATALOADER_SUFFIX = ".__next__"
PROFILER_STEP_PREFIX = "ProfilerStep#"
METADATA_KEY = "lightning_perf"

# category -> the category torch-tb-profiler 0.4.3 understands (see its profiler/trace.py EventTypeMap).
_RUNTIME_CATEGORIES = {"cuda_runtime": "Runtime", "cuda_driver": "Runtime"}


def is_dataloader_next(name: object) -> bool:
    """Whether ``name`` is a DataLoader ``__next__`` span's (``enumerate(DataLoader)#...__next__``)."""
    return isinstance(name, str) and name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX)


def tensorboard_compatible(trace: dict[str, Any]) -> dict[str, Any]:
    """Rewrites, in place, the event categories torch-tb-profiler 0.4.3 misreads; returns ``trace``.

    Notes:
        1. ``user_annotation`` DataLoader ``__next__`` spans become ``cpu_op``.
        2. ``cuda_runtime`` and ``cuda_driver`` events become ``Runtime``.
        3. Only complete events (``ph == "X"``) are rewritten: Kineto writes spans and runtime calls so.
        4. The renames are recorded under ``trace["lightning_perf"]["renamed_categories"]``.
    """
    renamed: dict[str, str] = {}
    for event in trace.get("traceEvents", ()):
        if event.get("ph") == "X" and (category := _tensorboard_category(event.get("cat"), event.get("name"))):
            _rename(event, category, renamed)
    if renamed:
        trace.setdefault(METADATA_KEY, {})["renamed_categories"] = renamed
    return trace


def _tensorboard_category(cat: object, name: object) -> str | None:
    """The category torch-tb-profiler 0.4.3 reads right for an event of category ``cat`` named ``name``; ``None``
    where ``cat`` is one it reads right."""
    if cat == "user_annotation" and is_dataloader_next(name):
        return "cpu_op"
    return _RUNTIME_CATEGORIES.get(cat) if isinstance(cat, str) else None


def _rename(event: dict[str, Any], category: str, renamed: dict[str, str]) -> None:
    """Gives ``event`` ``category``, keeps its own in its ``args``, and notes the rename in ``renamed``."""
    own = event["cat"]
    event["cat"] = category
    event.setdefault("args", {})[f"{METADATA_KEY}.category"] = own
    renamed["user_annotation:" + DATALOADER_PREFIX + "*" if own == "user_annotation" else own] = category


def standard_categories(trace: dict[str, Any]) -> dict[str, Any]:
    """Undoes :func:`tensorboard_compatible`, in place; returns ``trace``."""
    key = f"{METADATA_KEY}.category"
    for event in trace.get("traceEvents", ()):
        args = event.get("args")
        if args and key in args:
            event["cat"] = args.pop(key)
    trace.get(METADATA_KEY, {}).pop("renamed_categories", None)
    return trace


def keep_steps(trace: dict[str, Any], batches: Collection[int]) -> dict[str, Any]:
    """Keeps, in place, the last ``ProfilerStep#N`` span of each ``N`` in ``batches``; returns ``trace``.

    Drops the spans of other batches (a span opened for a batch that never came, when an epoch of
    unknown length ended) and all but the last span of a step (a training window paused for a
    validation run closes the span it had just opened and opens it again when training resumes).
    """
    events = trace.get("traceEvents", [])
    last: dict[int, int] = {}
    step_events: set[int] = set()
    for i, e in enumerate(events):
        step = _step_of(e)
        if step is not None:
            step_events.add(i)
            if step in batches:
                last[step] = i
    keep = set(last.values())
    trace["traceEvents"] = [e for i, e in enumerate(events) if i not in step_events or i in keep]
    return trace


def step_number(name: object) -> int | None:
    """``N`` of a ``ProfilerStep#N`` span's name (what torch's profiler and :mod:`lightning_perf.collect.profiler`
    name a step), else ``None``: for any other name, and for a ``ProfilerStep#`` name whose rest is no integer.

    Example::

        step_number("ProfilerStep#12")  # 12
        step_number("ProfilerStep#x")  # None
    """
    if isinstance(name, str) and name.startswith(PROFILER_STEP_PREFIX):
        try:
            return int(name[len(PROFILER_STEP_PREFIX) :])
        except ValueError:
            return None
    return None


def _step_of(event: dict[str, Any]) -> int | None:
    """``N`` of a complete event (``ph == "X"``) named ``ProfilerStep#N``, else ``None``."""
    return step_number(event.get("name")) if event.get("ph") == "X" else None


def cut_to_fraction(trace: dict[str, Any], fraction: float) -> int:
    """Keeps, in place, the first whole steps holding at most ``fraction`` of the trace's events (at least
    one step), and the events before the first step; returns how many steps are kept."""
    steps = sorted(profiler_steps(trace), key=lambda step: step[1])
    events = trace.get("traceEvents", [])
    if not steps:
        return 0
    budget = max(int(len(events) * fraction), 1)
    starts = sorted(float(e["ts"]) for e in events if isinstance(e.get("ts"), (int, float)))
    kept, end = 1, steps[0][2]
    for number, (_, _, step_end) in enumerate(steps[1:], start=2):
        if bisect.bisect_right(starts, step_end) > budget:
            break
        kept, end = number, step_end
    trace["traceEvents"] = [e for e in events if not isinstance(e.get("ts"), (int, float)) or float(e["ts"]) <= end]
    trace.setdefault(METADATA_KEY, {})["cut_to_steps"] = kept
    return kept


def profiler_steps(trace: dict[str, Any]) -> Iterator[tuple[int, float, float]]:
    """``(N, start_us, end_us)`` for each ``ProfilerStep#N`` span, in trace order."""
    for e in trace.get("traceEvents", ()):
        step = _step_of(e)
        if step is not None:
            yield step, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))


def write_trace(trace: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Writes a trace atomically: to a temporary name first, then renamed into place; gzipped when ``path``
    ends in ``.gz``.

    TensorBoard's profiler plugin loads a run directory once, as soon as it holds a ``*.pt.trace.json*``
    file; the rename makes sure it never sees a half-written one.
    """
    # msgspec: the same bytes as json.dumps(trace, separators=(",", ":")), 5 times faster (35 ms for 29 MB).
    _write_json(msgspec.json.encode(trace), path)


def _write_json(data: bytes, path: str | os.PathLike[str]) -> None:
    """:func:`write_trace` of a trace's JSON text."""
    path = os.fspath(path)
    write_atomically(gzip_bytes(data) if path.endswith(".gz") else data, path)


# A window's trace is gzipped on a background thread that shares the GIL with training. ISA-L's level 1 does it 8 times
# faster than zlib's level 5, for files about 10% larger (a 29 MB CPU trace: 13 ms and 2.2 MB, against
# 104 ms and 1.75 MB); without ISA-L, zlib's level 5 is within a few % of level 9's size at a third of its time.
ISAL_GZIP_LEVEL = 1
ZLIB_GZIP_LEVEL = 5
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream (zlib's convention)


def finish_trace(
    export_path: str,
    path: str,
    *,
    steps: Collection[int],
    tensorboard_compat: bool,
    max_bytes: int | None = None,
    shapes: bool = False,
) -> FinishedTrace:
    """Turns torch's export of a window (:meth:`lightning_perf.collect.profiler.ProfilerWindow.export`) into the
    window's trace: keeps the ``ProfilerStep#N`` spans of ``steps`` only, cuts a trace whose export is over
    ``max_bytes`` to its first steps that fit, rewrites it for TensorBoard (``tensorboard_compat``), and writes
    it to ``path`` atomically, gzipped if ``path`` ends in ``.gz``. Removes ``export_path`` once done, whatever
    happens (a process killed meanwhile leaves it, for another to redo the work).

    An export that is not valid JSON because torch left a string unescaped (a ``record_function`` name
    holding a double quote) is repaired (:func:`~lightning_perf.trace_repair.repair_json`); the trace is
    written as valid JSON.

    Args:
        shapes: Decode the returned trace's operators' input shapes (``record_shapes=True`` windows).

    Notes:
        1. The common case (no cut, valid JSON) changes the export where it must, event by event: its events
           are decoded once into typed records (what the analyses read, returned) and once as raw JSON texts
           (what is written); the few to change (step spans to drop, categories to rewrite) are re-encoded,
           every other event is written as torch wrote it. No event becomes a dictionary: on the 32,513-event
           window of ``benchmarks/forecaster.py`` this is about 0.1 s of CPU instead of 0.16 s.
        2. Otherwise the whole trace is read as dictionaries and changed with :func:`keep_steps`,
           :func:`cut_to_fraction` and :func:`tensorboard_compatible`: the same trace (a test holds them equal).

    Returns:
        The trace as written, typed, how many steps it keeps when it was cut, and what was repaired.

    Raises:
        json.JSONDecodeError: The export is invalid JSON that the repair does not make valid (its own error).
        msgspec.ValidationError: A field the analyses read is wrong (:func:`~lightning_perf.summarize.events.as_trace`).
    """
    try:
        with open(export_path, "rb") as f:
            data = f.read()
        finished = None
        if max_bytes is None or len(data) <= max_bytes:
            finished = _changed_in_place(data, path, steps, tensorboard_compat, shapes)
        if finished is None:
            finished = _changed_as_dicts(data, path, steps, tensorboard_compat, max_bytes, shapes)
    finally:
        os.remove(export_path)
    return finished


@dataclass(frozen=True)
class FinishedTrace:
    """What :func:`finish_trace` wrote.

    Attributes:
        trace: The trace as written, as the analyses read it.
        cut_to: How many steps it keeps, when it was cut to ``max_bytes`` (else ``None``).
        repaired: What was repaired in torch's export, in words (else ``None``).
    """

    trace: KinetoTrace
    cut_to: int | None = None
    repaired: str | None = None


_RAW_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])


def _changed_in_place(
    data: bytes, path: str, steps: Collection[int], tensorboard_compat: bool, shapes: bool
) -> FinishedTrace | None:
    """:func:`finish_trace` in its common case (Notes 1); ``None`` where it does not apply (invalid JSON, no
    ``traceEvents``, a field the typed decode refuses)."""
    try:
        trace = decode_trace(data, shapes=shapes)
        top = _RAW_TOP.decode(data)
        texts = _RAW_EVENTS.decode(top["traceEvents"])
    except (msgspec.MsgspecError, KeyError):
        return None
    events = trace.traceEvents
    last: dict[int, int] = {}
    spans: list[int] = []
    renames: list[tuple[int, Complete, str]] = []
    for i, event in enumerate(events):
        # Operators, most of the events, are neither step spans (user annotations) nor renamed: passed at once.
        if not isinstance(event, Complete) or event.cat == "cpu_op":
            continue
        if (step := step_number(event.name)) is not None:
            spans.append(i)
            if step in steps:
                last[step] = i
        if tensorboard_compat and (category := _tensorboard_category(event.cat, event.name)) is not None:
            renames.append((i, event, category))
    dropped = set(spans) - set(last.values())
    renamed: dict[str, str] = {}
    for i, event, category in renames:
        as_dict = msgspec.json.decode(texts[i])
        _rename(as_dict, category, renamed)
        texts[i] = msgspec.Raw(msgspec.json.encode(as_dict))
        event.cat = category
    if renamed:
        notes = msgspec.json.decode(top[METADATA_KEY]) if METADATA_KEY in top else {}
        top[METADATA_KEY] = msgspec.Raw(msgspec.json.encode({**notes, "renamed_categories": renamed}))
        trace.lightning_perf["renamed_categories"] = renamed
    if dropped:
        texts = [text for i, text in enumerate(texts) if i not in dropped]
        trace.traceEvents = [event for i, event in enumerate(events) if i not in dropped]
    _write_json(msgspec.json.encode({**top, "traceEvents": texts}), path)  # each text as it is
    return FinishedTrace(trace)


def _changed_as_dicts(
    data: bytes, path: str, steps: Collection[int], tensorboard_compat: bool, max_bytes: int | None, shapes: bool
) -> FinishedTrace:
    """:func:`finish_trace` through dictionaries (Notes 2)."""
    trace, repair = parse_or_repair(data, _parsed, json.JSONDecodeError)
    keep_steps(trace, steps)
    cut_to = None
    if max_bytes is not None and len(data) > max_bytes:
        cut_to = cut_to_fraction(trace, max_bytes / len(data))
    if tensorboard_compat:
        tensorboard_compatible(trace)
    write_trace(trace, path)
    return FinishedTrace(as_trace(trace, shapes=shapes), cut_to, repair.description if repair is not None else None)


def _parsed(data: bytes) -> Any:
    """JSON text as dicts, lists and numbers, as ``json.loads`` gives them."""
    try:
        return msgspec.json.decode(data)  # the same as json.loads, a few times faster
    except msgspec.MsgspecError:  # what only Python's reader takes (NaN, Infinity, a number out of range)
        return json.loads(data)


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzipped, with ISA-L where installed."""
    if igzip is not None:
        return igzip.compress(data, compresslevel=ISAL_GZIP_LEVEL)
    return gzip.compress(data, compresslevel=ZLIB_GZIP_LEVEL)


def gunzip(data: bytes) -> bytes:
    """``gzip.decompress(data)``, with ISA-L where installed for the common case (a whole, valid, single-member
    file); anything else (several members, a truncated or corrupt file) goes through ``gzip`` itself, for its
    result or its error."""
    if isal_zlib is not None:
        inflater = isal_zlib.decompressobj(_GZIP_WBITS)
        try:
            inflated = inflater.decompress(data)
        except Exception:  # isal's own error types; gzip says what is wrong
            pass
        else:
            if inflater.eof and not inflater.unused_data:
                return inflated
    return gzip.decompress(data)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector waits meanwhile (process-wide): reading a trace builds many small acyclic
    objects, over which it would run again and again for nothing (5% of an offline analysis; half the time
    on large traces when they were decoded as dicts)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
