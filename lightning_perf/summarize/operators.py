"""
Operator statistics
===================

The operator table of a window: per-operator numbers from its Kineto trace (:func:`operator_stats`), and the
top rows of it (:func:`top_operators`).

:func:`operator_stats` gives the numbers ``torch.profiler``'s ``key_averages()`` gives (calls, self/total CPU
time, self/total device time, self memory, input shapes) without building its ``FunctionEvent`` objects,
which take seconds on a trace of tens of thousands of events. It nests each thread's host spans (sorted out
once per trace by :class:`~lightning_perf.summarize.index.TraceIndex`) one of two ways, which give the same
table (a property test holds them equal): on numpy arrays for large threads (:func:`_nest_arrays`), or one
span at a time on a stack (:func:`_nest`), for small threads, threads with ``[memory]`` events, and spans
that do not nest.

This module imports neither torch nor lightning.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from lightning_perf.records import OperatorStat
from lightning_perf.summarize.events import CUDA_DEVICE_TYPE, Complete, Instant, KinetoTrace, as_trace
from lightning_perf.summarize.index import (
    NAME_OF,
    OPERATOR_CATEGORIES,
    RUNTIME_CATEGORIES,
    Columns,
    TraceIndex,
    codes,
)

# Threads with at least this many host spans are nested on arrays (_nest_arrays), the others one by one
# (_nest). Measured on the 2-core development machine: arrays take about
# 0.2 us per span and 40 us per thread, the stack 0.6 us per span, so arrays win from about 100 spans on.
ARRAY_MIN_OPERATORS = 100
_EXTERNAL_ID_OF, _FLOPS_OF = attrgetter("args.external_id"), attrgetter("args.flops")
Key = tuple[str, str | None]  # an operator row: its name, and its input shapes where grouped by them


def default_sort_key(device: str) -> str:
    """Self device time when a device was profiled (that is where the time goes), else self CPU time."""
    return "self_device_time" if device == "cuda" else "self_cpu_time"


def top_operators(stats: Iterable[OperatorStat], *, sort_by: str, row_limit: int) -> list[OperatorStat]:
    """The ``row_limit`` operators with the largest ``sort_by`` value, largest first; ties by name.

    Operators without a value for ``sort_by`` (device time on a CPU run, memory when it was not
    profiled) sort last.
    """

    def key(stat: OperatorStat) -> tuple[float, str]:
        value = getattr(stat, sort_by)
        return (-(value if value is not None else float("-inf")), stat.name)

    return sorted(stats, key=key)[:row_limit]


def operator_stats(
    trace: KinetoTrace | Mapping[str, Any], *, group_by_input_shape: bool = False
) -> tuple[OperatorStat, ...]:
    """Per-operator statistics of a Kineto trace, like ``key_averages()``.

    Args:
        trace: A Kineto trace, typed (:func:`~lightning_perf.summarize.events.decode_trace`) or as loaded
            by ``json`` (``{"traceEvents": [...], ...}``).
        group_by_input_shape: One row per operator and input shapes, as ``key_averages(group_by_input_shape=True)``
            (a typed trace has them only if it was decoded with ``shapes=True``).

    Notes:
        1. Host operators (``cpu_op`` and ``user_annotation`` spans, but not ``ProfilerStep#N``) and runtime
           calls are nested per thread by time; an operator's self time is its duration minus its direct
           children's.
        2. Kernels, copies and memsets add their duration to the self device time of the host operator
           that launched them (:class:`_Launches`); device total time adds up self device time over an
           operator and its descendants.
        3. ``[memory]`` events add their bytes to the innermost operator running on their thread.
        4. Device columns are ``None`` when the trace has no device activity, memory columns when it was
           recorded without ``profile_memory``.
    """
    shapes = group_by_input_shape
    trace = as_trace(trace, shapes=shapes)
    index = TraceIndex.of(trace)
    launches = _Launches.of(index.device)

    totals: dict[Key, _Row] = {}
    for thread, ops in index.host.items():
        memory = index.memory.get(thread)
        if memory:  # by start; at one time an operator before a memory event; then as sorted
            events: list[Complete | Instant] = [*ops, *memory]
            order = {id(e): seq for seq, e in enumerate(events)}
            _nest(sorted(events, key=lambda e: (e.ts, type(e) is Instant, order[id(e)])), launches, shapes, totals)
        elif not _on_arrays(len(ops)) or not _nest_arrays(ops, index.columns[thread], launches, shapes, totals):
            _nest(ops, launches, shapes, totals)  # a small thread, or spans that do not nest

    has_device = bool(index.device)
    has_memory = bool(index.memory) or trace.profile_memory is not msgspec.UNSET
    return tuple(
        OperatorStat(
            name=name,
            calls=row.calls,
            self_cpu_time=row.self_cpu,
            cpu_time=row.cpu,
            self_device_time=row.self_device if has_device else None,
            device_time=row.device if has_device else None,
            self_cpu_memory=row.cpu_memory if has_memory else None,
            self_device_memory=row.device_memory if has_memory and has_device else None,
            input_shapes=shapes,
            flops=row.flops or None,
        )
        for (name, shapes), row in totals.items()
    )


@dataclass(frozen=True)
class _Launches:
    """Device time (kernels, copies, memsets) by the ``External id`` of what launched it.

    Current traces give device activity the ``External id`` of the operator that launched it (the runtime
    call in between carries it too). Older ones (torch 1.x; four of the six GPU traces of the fixtures) give
    it the correlation id of the runtime call (``cudaLaunchKernel``...), as the call's own ``External id``:
    there the time goes to the operator the call runs in (``by_runtime``), as torch-tb-profiler does.
    """

    time: Mapping[Any, float]
    by_runtime: bool

    @classmethod
    def of(cls, device: Iterable[Complete]) -> _Launches:
        time: dict[Any, float] = defaultdict(float)
        by_runtime = True
        for event in device:
            args = event.args
            if args.external_id is not None:
                time[args.external_id] += event.dur
                by_runtime = by_runtime and args.external_id == args.correlation
        return cls(time=dict(time), by_runtime=by_runtime and bool(time))


def _on_arrays(spans: int) -> bool:
    """Whether a thread of ``spans`` host spans is nested on arrays."""
    return spans >= ARRAY_MIN_OPERATORS


@dataclass(slots=True, eq=False)
class _Row:
    """An operator row's totals, added up over its calls (slots: updated as fast as a list's items)."""

    calls: int
    self_cpu: float
    cpu: float
    self_device: float
    device: float
    cpu_memory: int
    device_memory: int
    flops: Any  # the trace's numbers as they are (torch writes integers)


# An operator open on the stack of _nest: a list (a trace has 10^5 operators, and a list is created faster than
# any record with named fields: those made nesting on the stack 10-25% slower), indexed by these.
(_KEY, _NAME, _END, _DURATION, _CHILDREN_TIME, _DEVICE_TIME, _OWN_DEVICE, _SELF_DEVICE, _CPU_MEMORY,
 _DEVICE_MEMORY, _CHILDREN, _LAST_CHILD, _SELF_CPU, _FLOPS) = range(14)  # fmt: skip
# _KEY, _NAME: its row (name and shapes) and name; _END, _DURATION: its span; _CHILDREN_TIME: its direct
# children's durations; _DEVICE_TIME: its descendants' device time, its own added when it finishes;
# _OWN_DEVICE: the device time it launched itself; _SELF_DEVICE: that, with what its runtime calls launched
# and what a folded child had; _CPU_MEMORY, _DEVICE_MEMORY: bytes allocated while it was innermost;
# _CHILDREN, _LAST_CHILD: its direct children, the last one; _SELF_CPU: set when it finishes; _FLOPS.
Open = list[Any]


_SENTINEL = Complete(name="", ts=float("inf"), dur=0.0)


def _nest(
    events: Sequence[Complete | Instant],
    launches: _Launches,
    group_by_input_shape: bool,
    totals: dict[Key, _Row],
) -> None:
    """Adds one thread's operators, sorted, to ``totals``.

    Each operator is pushed on a stack when it starts and finished when an event starts at or after its end
    (a sentinel at infinity finishes the last ones): its self time is its duration less its direct
    children's, its device time what it launched (``launches``) plus its children's.
    """
    stack: list[Open] = []
    event: Any  # Complete or Instant, told apart by their type (faster than isinstance, which mypy would follow)
    for event in (*events, _SENTINEL):
        ts = event.ts
        if type(event) is Instant:  # memory: to the innermost operator open at its time (not ending at it)
            while stack and stack[-1][_END] < ts:
                _finish(stack.pop(), stack, totals)
            memory = event.args
            if stack and type(memory.bytes) in (int, float):
                if memory.device_type == CUDA_DEVICE_TYPE:
                    stack[-1][_DEVICE_MEMORY] += int(memory.bytes)
                else:
                    stack[-1][_CPU_MEMORY] += int(memory.bytes)
            continue
        while stack and stack[-1][_END] <= ts:
            _finish(stack.pop(), stack, totals)
        if event is _SENTINEL:
            break
        args = event.args
        name, own_device = event.name, 0.0
        if args.external_id is not None and launches.time:
            if not launches.by_runtime:
                if event.cat in OPERATOR_CATEGORIES:
                    own_device = launches.time.get(args.external_id, 0.0)
            elif stack and event.cat in RUNTIME_CATEGORIES:  # to the operator the call runs in
                launched = launches.time.get(args.external_id, 0.0)
                stack[-1][_OWN_DEVICE] += launched
                stack[-1][_SELF_DEVICE] += launched
        shapes = getattr(args, "input_dims", None) if group_by_input_shape else None
        key = (name, None if shapes is None else str(shapes))
        # key, name, end, duration, children_time, device_time, own_device, self_device, cpu_memory, device_memory,
        # children, last_child, self_cpu, flops
        dur = event.dur
        stack.append([key, name, ts + dur, dur, 0.0, 0.0, own_device, own_device, 0, 0, 0, None, 0.0, args.flops])


def _finish(op: Open, stack: list[Open], totals: dict[Key, _Row]) -> None:
    """Adds a finished operator to its row and to its parent (the new top of the stack)."""
    child = op[_LAST_CHILD]
    if op[_CHILDREN] == 1 and child[_NAME] == op[_NAME]:
        # Like torch's EventList._remove_dup_nodes: an op whose only child has its own name (an overload
        # calling another) counts once, with the child's self time, device time and memory folded in.
        folded = totals[child[_KEY]]
        folded.calls -= 1
        folded.cpu -= child[_DURATION]
        folded.self_cpu -= child[_SELF_CPU]
        folded.self_device -= child[_SELF_DEVICE]
        folded.device -= child[_DEVICE_TIME]
        folded.cpu_memory -= child[_CPU_MEMORY]
        folded.device_memory -= child[_DEVICE_MEMORY]
        op[_CHILDREN_TIME] -= child[_SELF_CPU]
        op[_SELF_DEVICE] += child[_SELF_DEVICE]
        op[_CPU_MEMORY] += child[_CPU_MEMORY]
        op[_DEVICE_MEMORY] += child[_DEVICE_MEMORY]
    duration = op[_DURATION]
    self_cpu = op[_SELF_CPU] = max(duration - op[_CHILDREN_TIME], 0.0)
    device_time = op[_DEVICE_TIME] = op[_DEVICE_TIME] + op[_OWN_DEVICE]
    row = totals.get(op[_KEY])
    if row is None:
        totals[op[_KEY]] = _Row(
            1, self_cpu, duration, op[_SELF_DEVICE], device_time, op[_CPU_MEMORY], op[_DEVICE_MEMORY], op[_FLOPS] or 0
        )
    else:
        row.calls += 1
        row.cpu += duration
        row.self_cpu += self_cpu
        row.self_device += op[_SELF_DEVICE]
        row.device += device_time
        row.cpu_memory += op[_CPU_MEMORY]
        row.device_memory += op[_DEVICE_MEMORY]
        row.flops += op[_FLOPS] or 0
    if stack:
        parent = stack[-1]
        parent[_CHILDREN_TIME] += duration
        parent[_DEVICE_TIME] += device_time
        parent[_CHILDREN] += 1
        parent[_LAST_CHILD] = op


def _nest_arrays(
    ops: list[Complete],
    columns: Columns,
    launches: _Launches,
    group_by_input_shape: bool,
    totals: dict[Key, _Row],
) -> bool:
    """What :func:`_nest` adds to ``totals`` for one thread's operators (sorted, no memory events), computed
    on arrays: 3 times faster on a thread of 10^5 operators. ``False``, adding nothing, when the spans do
    not nest (one ends after the span it started in, and another starts in between), the case the stack of
    :func:`_nest` is for.

    Notes:
        1. Depth: the spans open when a span starts (``end > start``) among those before it, which is its
           index less those ending at or before its start; of all spans, ``searchsorted`` counts the latter,
           plus the zero-length spans starting with it and sorted after it (last, at one start). Zero-length
           means ending at their start, as the stack sees it: spans of a few tenths of a microsecond do on
           absolute timestamps, which keep a quarter of a microsecond.
        2. Parent: the last span before it one level up, where the spans nest; every parent is checked to be
           open at its child's start, or nothing is added. A child may end after its parent (absolute
           timestamps, 1.7e15 us, keep a quarter of a microsecond): the stack keeps the parent under it until
           the child ends, which changes nothing unless a span starts in between (the stack makes it the
           overhanging child's descendant), which is checked for too.
        3. Nested spans are sorted in depth-first order: a span's descendants are the spans after it that
           start before its end, so device time over descendants is a difference of prefix sums.
        4. Operators whose only child has their name fold the child in (:func:`_finish`), children first.
    """
    n = len(ops)
    starts, durations, ends = columns.starts, columns.durations, columns.ends
    index = np.arange(n)
    zero_length = np.concatenate(([0], np.cumsum(ends == starts)))  # durations that rounding ate too
    same_start_end = np.searchsorted(starts, starts, side="right")
    closed = np.searchsorted(np.sort(ends), starts, side="right") - (zero_length[same_start_end] - zero_length[index])
    depth = index - closed

    stride = n + 1
    levels = np.sort(depth * stride + index)
    child = index[depth > 0]
    up = depth[child] - 1
    found = np.searchsorted(levels, up * stride + child) - 1
    parent = levels[np.maximum(found, 0)] % stride
    nested = (found >= 0) & (levels[np.maximum(found, 0)] // stride == up)
    if not (nested & (ends[parent] > starts[child])).all():
        return False
    overhang = ends[child] > ends[parent]  # see note 2
    if overhang.any():
        between = np.searchsorted(starts, ends[child[overhang]]) - np.searchsorted(starts, ends[parent[overhang]])
        if between.any():
            return False

    name_code, unique_names = columns.name_code, columns.names
    if group_by_input_shape:
        shapes = [None if (d := getattr(e.args, "input_dims", None)) is None else str(d) for e in ops]
        key_code, unique_keys = codes(list(zip(map(NAME_OF, ops), shapes, strict=True)))
    else:
        key_code, unique_keys = name_code, [(name, None) for name in unique_names]

    own = np.zeros(n)
    if launches.time:
        launcher = columns.of_category(RUNTIME_CATEGORIES if launches.by_runtime else OPERATOR_CATEGORIES)
        launching = launcher.nonzero()[0]  # only their External ids are looked up (a pass over their args)
        launched = np.zeros(n)
        launched[launching] = np.fromiter(
            map(launches.time.get, map(_EXTERNAL_ID_OF, map(ops.__getitem__, launching.tolist())), repeat(0.0)),
            dtype=np.float64,
            count=len(launching),
        )
        if launches.by_runtime:  # to the operator the call runs in
            moved = launcher[child]
            np.add.at(own, parent[moved], launched[child[moved]])
        else:  # launched by operators, not by the runtime calls in them (which carry the same id)
            own = np.where(launcher, launched, 0.0)
    subtree_end = np.maximum(np.searchsorted(starts, ends, side="left"), index + 1)
    own_sums = np.concatenate(([0.0], np.cumsum(own)))
    device_time = own_sums[subtree_end] - own_sums[index]

    children = np.bincount(parent, minlength=n)
    children_time = np.bincount(parent, weights=durations[child], minlength=n)
    last_child = np.full(n, -1)
    np.maximum.at(last_child, parent, child)
    self_cpu = np.maximum(durations - children_time, 0.0)
    self_device = own.copy()
    counted = np.ones(n, dtype=bool)
    folds = np.flatnonzero((children == 1) & (name_code[last_child] == name_code))
    for op in folds[np.argsort(-depth[folds], kind="stable")].tolist():  # children first
        only = last_child[op]
        children_time[op] -= self_cpu[only]
        self_cpu[op] = max(durations[op] - children_time[op], 0.0)
        self_device[op] += self_device[only]
        counted[only] = False

    m, code = len(unique_keys), key_code[counted]
    sums = [np.bincount(code, minlength=m).tolist()] + [
        np.bincount(code, weights=values[counted], minlength=m).tolist()
        for values in (self_cpu, durations, self_device, device_time)
    ]
    flops = [0] * m
    values = list(map(_FLOPS_OF, ops))
    if any(values):  # recorded with_flops=True
        for k, value in zip(key_code.tolist(), values, strict=True):
            if value:  # every operator's, folded or not, as _finish adds them
                flops[k] += value
    for k, key in enumerate(unique_keys):
        calls, self_cpu_k, cpu_k, self_device_k, device_k = (column[k] for column in sums)
        row = totals.get(key)
        if row is None:
            totals[key] = _Row(calls, self_cpu_k, cpu_k, self_device_k, device_k, 0, 0, flops[k])
        else:
            row.calls += calls
            row.self_cpu += self_cpu_k
            row.cpu += cpu_k
            row.self_device += self_device_k
            row.device += device_k
            row.flops += flops[k]
    return True
