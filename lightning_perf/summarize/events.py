"""
Kineto events as typed records
==============================

The trace analyses (:mod:`lightning_perf.summarize.operators`, :mod:`lightning_perf.summarize.step_summary`)
read a handful of fields of two kinds of events: complete events (``ph == "X"``: operators, annotations,
runtime calls, kernels, copies) and instant events (``ph == "i"``: ``[memory]`` allocations). Decoding a
trace's JSON straight into slotted records of just those fields with msgspec, which skips every other field
(call stacks, launch parameters, module hierarchy...) and every other kind of event (flows, metadata,
counters) without building Python objects for them, is about four times faster than ``json.loads`` into
dictionaries and takes less than half the memory: the 505k-event, 154 MB trace of
``benchmarks/analyze_speed.py`` decodes in 0.21 s instead of 0.9 s on the 2-core development machine, and
loading it peaks at 324 MiB instead of 809 MiB.

- :func:`decode_trace`: JSON bytes (Kineto's layout: an object with ``traceEvents``) to a :class:`KinetoTrace`;
- :func:`as_trace`: a trace loaded as dictionaries (the callback's, a test's synthetic one) to one.

Both check what the analyses rely on, and these annotations are where that is declared
(:func:`lightning_perf.readers.load_trace` decodes with them): a complete event has a string ``name``, a
number ``ts`` and a number ``dur >= 0``, and where present a string ``cat``, an object ``args`` and in it an
``External id`` (and ``correlation``) that is a number, string or null and ``flops`` a number or null; an
instant event has a number ``ts``, and where present an object ``args``; both, where present, numbers or
strings as ``pid`` and ``tid``. Otherwise they raise ``msgspec.ValidationError`` naming the field's path; an
event whose ``ph`` is absent or no phase of the format is a ``ValidationError`` too
(:func:`~lightning_perf.readers.load_trace` then drops it, and puts any other problem in words).

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import msgspec

__all__ = ["Complete", "Instant", "KinetoTrace", "ShapedKinetoTrace", "as_trace", "decode_trace", "distributed_info"]

Number = int | float
Id = int | float | str | None  # pid, tid, External id: Kineto writes integers, other Chrome traces strings
MEMORY_EVENT_NAME = "[memory]"  # the instant events of profile_memory=True
# ``args["Device Type"]`` of a [memory] event: c10::DeviceType's CPU and CUDA.
CPU_DEVICE_TYPE, CUDA_DEVICE_TYPE = 0, 1
# Event phases of the Chrome trace event format that no analysis reads: decoded as empty records.
OTHER_PHASES = "BEICbnestfPNODMVvRc()STF"


class CompleteArgs(msgspec.Struct, gc=False, frozen=True):
    """The ``args`` of a complete event that the analyses read."""

    external_id: Id = msgspec.field(default=None, name="External id")  # ties a kernel to its operator
    correlation: Id = None  # ties a kernel to its runtime call (cudaLaunchKernel)
    flops: Number | None = None
    device: Any = None  # of a kernel
    # A collective's description, on its NCCL kernels and its record_param_comms operator (summarize.collectives):
    # read as they come (a value of another type counts as absent there).
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    group_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_desc: Any = msgspec.field(default=None, name="Process Group Description")


class ShapedCompleteArgs(CompleteArgs, gc=False, frozen=True):
    """:class:`CompleteArgs` with the operators' input shapes (recorded with ``record_shapes=True``)."""

    input_dims: Any = msgspec.field(default=None, name="Input Dims")


class InstantArgs(msgspec.Struct, gc=False, frozen=True):
    """The ``args`` of a ``[memory]`` event (any type: a value that is no number counts as no bytes)."""

    device_type: Any = msgspec.field(default=None, name="Device Type")
    bytes: Any = msgspec.field(default=None, name="Bytes")
    # The device's allocator's bytes after this event. On the CPU, torch counts only what was allocated while
    # memory was profiled (a free of an older tensor leaves it as it was): its changes within a step are right.
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")


# The args of an event without any (shared: the records are read-only).
NO_ARGS, NO_SHAPED_ARGS, NO_INSTANT_ARGS = CompleteArgs(), ShapedCompleteArgs(), InstantArgs()


class Complete(msgspec.Struct, gc=False, tag="X", tag_field="ph"):
    """A complete event: a span of ``dur`` microseconds from ``ts`` on a thread or a device stream."""

    name: str
    ts: float
    dur: Annotated[float, msgspec.Meta(ge=0)]
    cat: str = ""
    pid: Id = None
    tid: Id = None
    args: CompleteArgs = NO_ARGS


class ShapedComplete(Complete, gc=False, tag="X"):
    args: ShapedCompleteArgs = NO_SHAPED_ARGS


class Instant(msgspec.Struct, gc=False, tag="i", tag_field="ph"):
    """An instant event (the ``[memory]`` events of ``profile_memory=True``)."""

    ts: float
    name: Any = ""  # any type: only "[memory]" is read
    pid: Id = None
    tid: Id = None
    args: InstantArgs = NO_INSTANT_ARGS


_OTHERS = tuple(msgspec.defstruct(f"Phase{ord(ph)}", [], tag=ph, tag_field="ph", gc=False) for ph in OTHER_PHASES)
_EVENTS, _SHAPED_EVENTS = (Complete, Instant, *_OTHERS), (ShapedComplete, Instant, *_OTHERS)
if TYPE_CHECKING:  # a union built from a tuple is beyond a type checker: any event
    _Event: TypeAlias = Any
    _ShapedEvent: TypeAlias = Any
else:  # an event, by its phase: Complete | Instant | Phase66 | ...
    _Event, _ShapedEvent = (functools.reduce(operator.or_, events) for events in (_EVENTS, _SHAPED_EVENTS))


class KinetoTrace(msgspec.Struct, dict=True):
    """A Kineto trace: its events, and the top-level fields the analyses read. (``dict=True``: the analyses
    keep what they sorted out of the events on it, for the next analysis of the same trace.)"""

    traceEvents: list[_Event]
    deviceProperties: list[Any] | None = None
    distributedInfo: Any = None
    profile_memory: Any = msgspec.UNSET  # present in traces recorded with profile_memory=True
    lightning_perf: dict[str, Any] = msgspec.field(default_factory=dict)  # this package's notes (traces.py)


class ShapedKinetoTrace(KinetoTrace):
    traceEvents: list[_ShapedEvent]


_DECODERS = {shapes: msgspec.json.Decoder(ShapedKinetoTrace if shapes else KinetoTrace) for shapes in (False, True)}


def decode_trace(data: bytes | str, *, shapes: bool = False) -> KinetoTrace:
    """A Kineto trace's JSON (an object with ``traceEvents``) decoded into typed events.

    Args:
        data: The JSON text, decompressed.
        shapes: Also decode the operators' ``Input Dims`` (a :class:`ShapedKinetoTrace`).

    Raises:
        msgspec.DecodeError: The data is not JSON.
        msgspec.ValidationError: Not a trace, or a field the analyses read is wrong; the message names its
            path (``Expected `float`, got `str` - at `$.traceEvents[12].dur```).
    """
    return _DECODERS[shapes].decode(data)


def as_trace(trace: KinetoTrace | Mapping[str, Any], *, shapes: bool = False) -> KinetoTrace:
    """``trace`` itself if it is typed already, else converted to typed events.

    Args:
        trace: A :class:`KinetoTrace`, or a trace loaded as dictionaries (``{"traceEvents": [...], ...}``).
        shapes: Keep the operators' input shapes when converting (a typed trace has them only if it was
            decoded with ``shapes=True``).

    Raises:
        msgspec.ValidationError: As :func:`decode_trace`.
    """
    if isinstance(trace, KinetoTrace):
        return trace
    return msgspec.convert(trace, ShapedKinetoTrace if shapes else KinetoTrace)


def distributed_info(trace: KinetoTrace | Mapping[str, Any]) -> dict[str, Any]:
    """A trace's ``distributedInfo`` (rank, world size, backend), or ``{}``."""
    info = trace.distributedInfo if isinstance(trace, KinetoTrace) else trace.get("distributedInfo")
    return info if isinstance(info, dict) else {}
