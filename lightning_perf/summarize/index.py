"""
The event index
===============

What both trace analyses (:mod:`lightning_perf.summarize.operators`' operator table and
:mod:`lightning_perf.summarize.step_summary`' step summary) read of a trace's events, sorted out once per
trace (:class:`TraceIndex`): host spans per thread sorted by start, also as numpy columns (:class:`Columns`),
the ``ProfilerStep#N`` spans apart; device activity and ``[memory]`` events in trace order. Names and
categories are held as codes (:func:`codes`): the analyses work out what a name means once per distinct name,
not once per span.

This module imports neither torch nor lightning; numpy holds the columns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from lightning_perf.summarize.events import MEMORY_EVENT_NAME, Complete, Instant, KinetoTrace, ShapedComplete
from lightning_perf.traces import step_number

# Host-side operator ranges (torch's ``record_function`` spans are ``user_annotation``), and the device
# runtime and driver calls they make (``Runtime`` is what :func:`lightning_perf.traces.tensorboard_compatible`
# renames those to). Runtime calls are rows of their own, as in ``key_averages()``, and count as their
# operator's children; device time is only ever attributed to operators.
OPERATOR_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
HOST_OP_CATEGORIES = OPERATOR_CATEGORIES | RUNTIME_CATEGORIES
HOST_CATEGORIES = sorted(HOST_OP_CATEGORIES)  # a host span's category, as a code: its index here
_HOST_CATEGORY_CODE = {category: code for code, category in enumerate(HOST_CATEGORIES)}
# Device activity launched by a host operator, tied to it by ``args["External id"]``.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

Thread = tuple[Any, Any]  # (pid, tid)
# Fields of events, as functions (``map`` over 10^5 events).
TS_OF, DUR_OF, NAME_OF, CAT_OF = attrgetter("ts"), attrgetter("dur"), attrgetter("name"), attrgetter("cat")
COMPLETE_TYPES = (Complete, ShapedComplete)


@dataclass
class TraceIndex:
    """What both analyses read of a trace's events, sorted out once: host spans per thread (sorted by start,
    the longer of two first, then in trace order; also as numpy columns), the ``ProfilerStep#N`` spans apart;
    device activity and ``[memory]`` events in trace order. Built once per trace (:meth:`of` keeps it on the
    trace)."""

    host: dict[Thread, list[Complete]]  # complete events of HOST_OP_CATEGORIES but ProfilerStep#N spans
    steps: dict[Thread, list[Complete]]  # the ProfilerStep#N spans, sorted as host
    device: list[Complete]  # kernels, copies, memsets
    memory: dict[Thread, list[Instant]]  # [memory] instants
    columns: dict[Thread, Columns]  # host as arrays

    @classmethod
    def of(cls, trace: KinetoTrace) -> TraceIndex:
        cached = trace.__dict__.get("_index")
        if cached is None:
            cached = trace.__dict__["_index"] = cls._build(trace)
        return cached

    @classmethod
    def _build(cls, trace: KinetoTrace) -> TraceIndex:
        # A trace holds 10^5 events, and each pass over them costs: list comprehensions with type tests (twice
        # as fast as isinstance; faster than one loop sorting the events out with appends).
        events = trace.traceEvents
        complete: list[Complete] = [e for e in events if type(e) in COMPLETE_TYPES]
        threads = _by_thread([e for e in complete if e.cat in HOST_OP_CATEGORIES])
        host, steps, columns = {}, {}, {}
        for thread, spans in threads.items():
            host[thread], thread_steps, columns[thread] = _sorted(spans)
            if thread_steps:
                steps[thread] = thread_steps
        return cls(
            host=host,
            steps=steps,
            device=[e for e in complete if e.cat in DEVICE_CATEGORIES],
            memory=_by_thread([e for e in events if type(e) is Instant and e.name == MEMORY_EVENT_NAME]),
            columns=columns,
        )


@dataclass(frozen=True)
class Columns:
    """One thread's host spans (as sorted in :class:`TraceIndex`) as numpy arrays: times in microseconds, names
    as codes into the list of the distinct ones (in order of first appearance), categories as indices into
    :data:`HOST_CATEGORIES`. What the operator table and the step summary read of a thread's spans, taken from
    the events once for both."""

    starts: Any
    durations: Any
    ends: Any
    name_code: Any
    names: list[str]
    category_code: Any

    @classmethod
    def empty(cls) -> Columns:
        nothing = np.zeros(0)
        return cls(nothing, nothing, nothing, np.zeros(0, dtype=np.intp), [], np.zeros(0, dtype=np.intp))

    def named(self, names: Container[str]) -> Any:
        """Whether each span's name is one of ``names``."""
        return by_code([name in names for name in self.names], self.name_code)

    def of_category(self, categories: Container[str]) -> Any:
        return by_code([category in categories for category in HOST_CATEGORIES], self.category_code)


def distinct_codes(code: Any) -> Any:
    """The distinct values of an array of codes (integers from 0), ascending, as ``np.unique`` gives them,
    without ``np.unique``'s import of numpy's masked arrays (numpy 2: at its first call)."""
    return np.flatnonzero(np.bincount(code)) if len(code) else np.zeros(0, dtype=np.intp)


def by_code(flags: list[bool], codes: Any) -> Any:
    """Each code's flag, as a boolean array (``flags``: one per distinct value)."""
    return np.array(flags, dtype=bool)[codes] if flags else np.zeros(len(codes), dtype=bool)


def codes(values: list[Any]) -> tuple[Any, list[Any]]:
    """Each value's position among the distinct values (in order of first appearance), and those."""
    distinct = list(dict.fromkeys(values))
    code_of = {value: i for i, value in enumerate(distinct)}
    return np.fromiter(map(code_of.__getitem__, values), dtype=np.intp, count=len(values)), distinct


def _first_appearance(code: Any, values: list[Any]) -> tuple[Any, list[Any]]:
    """``code`` (codes into ``values``) renumbered as :func:`codes` numbers them: the values they hold, in
    order of first appearance."""
    first = np.full(len(values), len(code), dtype=np.intp)  # each value's first position in code
    np.minimum.at(first, code, np.arange(len(code)))
    held = np.flatnonzero(first < len(code))
    held = held[np.argsort(first[held])]
    renumbered = np.zeros(len(values), dtype=np.intp)
    renumbered[held] = np.arange(len(held))
    return renumbered[code], [values[i] for i in held.tolist()]


def _by_thread(events: list[Any]) -> dict[Thread, list[Any]]:
    """``events`` by ``(pid, tid)``, in order."""
    groups: dict[Thread, list[Any]] = defaultdict(list)
    for event in events:
        groups[(event.pid, event.tid)].append(event)
    return dict(groups)


def _sorted(spans: list[Complete]) -> tuple[list[Complete], list[Complete], Columns]:
    """A thread's host spans sorted by start, the longer of two starting together first, then in trace order
    (stable sorts of the arrays), the ``ProfilerStep#N`` spans apart, and the others' columns."""
    n = len(spans)
    starts = np.fromiter(map(TS_OF, spans), dtype=np.float64, count=n)
    durations = np.fromiter(map(DUR_OF, spans), dtype=np.float64, count=n)
    name_code, names = codes(list(map(NAME_OF, spans)))
    category_code = np.fromiter(map(_HOST_CATEGORY_CODE.__getitem__, map(CAT_OF, spans)), dtype=np.intp, count=n)
    order = np.argsort(starts, kind="stable")  # quick on a nearly sorted trace; then the ties: longer first
    ordered = starts[order]
    tied = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(tied):
        runs = distinct_codes(np.concatenate((tied, tied + 1)))  # the positions of the runs of equal starts
        order[runs] = order[runs][np.lexsort((-durations[order[runs]], ordered[runs]))]
    is_step = by_code([step_number(name) is not None for name in names], name_code[order])
    steps, order = order[is_step], order[~is_step]
    name_code, names = _first_appearance(name_code[order], names)
    starts, durations = starts[order], durations[order]
    return (
        list(map(spans.__getitem__, order.tolist())),
        list(map(spans.__getitem__, steps.tolist())),
        Columns(starts, durations, starts + durations, name_code, names, category_code[order]),
    )
