"""
Trace summaries
===============

Two summaries of a Kineto trace, computed from one index of its events (:class:`_Index`: host spans per
thread sorted by start, device activity, memory events), which the first of them builds and keeps on the
trace for the second:

- :func:`operator_stats`: the same numbers ``torch.profiler``'s ``key_averages()`` gives (calls,
  self/total CPU time, self/total device time, self memory, input shapes), without building its
  ``FunctionEvent`` objects, which take seconds on a trace of tens of thousands of events;
- :func:`summarize_trace`: what a window's steps look like (data loading, optimizer, host framework
  overhead, device busy time, copies, synchronizations, communication), the input of the trace-level
  diagnosis rules.

Both take typed events (:mod:`lightning_perf.summarize.events`, what
:func:`lightning_perf.readers.load_kineto` reads) or a trace loaded with ``json`` (converted), of any
Kineto trace, ours (categories renamed by :func:`lightning_perf.traces.tensorboard_compatible`) or not, so
the callback and the offline CLI share them. This module imports neither torch nor lightning; numpy holds
the columns of the events that the analyses work through on arrays.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from lightning_perf.records import OperatorStat, TraceSummary
from lightning_perf.summarize.events import (
    MEMORY_EVENT_NAME,
    Complete,
    Instant,
    KinetoTrace,
    ShapedComplete,
    as_trace,
)
from lightning_perf.summarize.steps import percentile
from lightning_perf.traces import DATALOADER_PREFIX, DATALOADER_SUFFIX, PROFILER_STEP_PREFIX

# Host-side operator ranges (torch's ``record_function`` spans are ``user_annotation``), and the device
# runtime and driver calls they make (``Runtime`` is what :func:`lightning_perf.traces.tensorboard_compatible`
# renames those to). Runtime calls are rows of their own, as in ``key_averages()``, and count as their
# operator's children; device time is only ever attributed to operators.
OPERATOR_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
HOST_OP_CATEGORIES = OPERATOR_CATEGORIES | RUNTIME_CATEGORIES
_HOST_CATEGORIES = sorted(HOST_OP_CATEGORIES)  # a host span's category, as a code: its index here
_HOST_CATEGORY_CODE = {category: code for code, category in enumerate(_HOST_CATEGORIES)}
# Device activity launched by a host operator, tied to it by ``args["External id"]``.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
CUDA_DEVICE_TYPE = 1  # ``args["Device Type"]`` of a [memory] event: c10::DeviceType::CUDA


Thread = tuple[Any, Any]  # (pid, tid)
_TS, _DUR, _NAME_OF, _CAT_OF = attrgetter("ts"), attrgetter("dur"), attrgetter("name"), attrgetter("cat")
_EXTERNAL_ID_OF, _FLOPS_OF = attrgetter("args.external_id"), attrgetter("args.flops")
_COMPLETE_TYPES = (Complete, ShapedComplete)


@dataclass
class _Index:
    """What both summaries read of a trace's events, sorted out once: host spans per thread (sorted by start,
    the longer of two first, then in trace order; also as numpy columns), the ``ProfilerStep#N`` spans apart;
    device activity and ``[memory]`` events in trace order. Built once per trace (:meth:`of` keeps it on the
    trace)."""

    host: dict[Thread, list[Complete]]  # complete events of HOST_OP_CATEGORIES but ProfilerStep#N spans
    steps: dict[Thread, list[Complete]]  # the ProfilerStep#N spans, sorted as host
    device: list[Complete]  # kernels, copies, memsets
    memory: dict[Thread, list[Instant]]  # [memory] instants
    columns: dict[Thread, _Columns]  # host as arrays

    @classmethod
    def of(cls, trace: KinetoTrace) -> _Index:
        cached = trace.__dict__.get("_index")
        if cached is None:
            cached = trace.__dict__["_index"] = cls._build(trace)
        return cached

    @classmethod
    def _build(cls, trace: KinetoTrace) -> _Index:
        # A trace holds 10^5 events, and each pass over them costs: list comprehensions with type tests (twice
        # as fast as isinstance; faster than one loop sorting the events out with appends).
        events = trace.traceEvents
        complete = [e for e in events if type(e) in _COMPLETE_TYPES]
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
class _Columns:
    """One thread's host spans (as sorted in :class:`_Index`) as numpy arrays: times in microseconds, names as
    codes into the list of the distinct ones (in order of first appearance), categories as indices into
    :data:`_HOST_CATEGORIES`. What the operator table and the step summary read of a thread's spans, taken from
    the events once for both."""

    starts: Any
    durations: Any
    ends: Any
    name_code: Any
    names: list[str]
    category_code: Any

    @classmethod
    def empty(cls) -> _Columns:
        nothing = np.zeros(0)
        return cls(nothing, nothing, nothing, np.zeros(0, dtype=np.intp), [], np.zeros(0, dtype=np.intp))

    def named(self, names: Container[str]) -> Any:
        """Whether each span's name is one of ``names``."""
        return _by_code([name in names for name in self.names], self.name_code)

    def of_category(self, categories: Container[str]) -> Any:
        return _by_code([category in categories for category in _HOST_CATEGORIES], self.category_code)


def _by_code(flags: list[bool], codes: Any) -> Any:
    """Each code's flag, as a boolean array (``flags``: one per distinct value)."""
    return np.array(flags, dtype=bool)[codes] if flags else np.zeros(len(codes), dtype=bool)


def _by_thread(events: list[Any]) -> dict[Thread, list[Any]]:
    """``events`` by ``(pid, tid)``, in order."""
    groups: dict[Thread, list[Any]] = defaultdict(list)
    for event in events:
        groups[(event.pid, event.tid)].append(event)
    return dict(groups)


def _sorted(spans: list[Complete]) -> tuple[list[Complete], list[Complete], _Columns]:
    """A thread's host spans sorted by start, the longer of two starting together first, then in trace order
    (stable sorts of the arrays), the ``ProfilerStep#N`` spans apart, and the others' columns."""
    n = len(spans)
    starts = np.fromiter(map(_TS, spans), dtype=np.float64, count=n)
    durations = np.fromiter(map(_DUR, spans), dtype=np.float64, count=n)
    name_code, names = _codes(list(map(_NAME_OF, spans)))
    category_code = np.fromiter(map(_HOST_CATEGORY_CODE.__getitem__, map(_CAT_OF, spans)), dtype=np.intp, count=n)
    order = np.argsort(starts, kind="stable")  # quick on a nearly sorted trace; then the ties: longer first
    ordered = starts[order]
    tied = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(tied):
        runs = np.unique(np.concatenate((tied, tied + 1)))  # the positions of the runs of equal starts
        order[runs] = order[runs][np.lexsort((-durations[order[runs]], ordered[runs]))]
    is_step = _by_code([name.startswith(PROFILER_STEP_PREFIX) for name in names], name_code[order])
    steps, order = order[is_step], order[~is_step]
    name_code, names = _first_appearance(name_code[order], names)
    starts, durations = starts[order], durations[order]
    return (
        list(map(spans.__getitem__, order.tolist())),
        list(map(spans.__getitem__, steps.tolist())),
        _Columns(starts, durations, starts + durations, name_code, names, category_code[order]),
    )


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
    trace = as_trace(trace, shapes=group_by_input_shape)
    index = _Index.of(trace)
    launches = _Launches.of(index.device)

    totals: dict[tuple[str, str | None], list[Any]] = {}
    for thread, ops in index.host.items():
        memory = index.memory.get(thread)
        if memory:  # by start; at one time an operator before a memory event; then as sorted
            order = {id(e): seq for seq, e in enumerate(ops + memory)}
            ops = sorted(ops + memory, key=lambda e: (e.ts, type(e) is Instant, order[id(e)]))
            _nest(ops, launches, group_by_input_shape, totals)
        elif not _on_arrays(len(ops)) or not _nest_arrays(
            ops, index.columns[thread], launches, group_by_input_shape, totals
        ):
            _nest(ops, launches, group_by_input_shape, totals)  # a small thread, or spans that do not nest

    has_device = bool(index.device)
    has_memory = bool(index.memory) or trace.profile_memory is not msgspec.UNSET
    return tuple(
        OperatorStat(
            name=name,
            calls=t[_CALLS],
            self_cpu_time=t[_SELF_CPU],
            cpu_time=t[_CPU],
            self_device_time=t[_SELF_DEVICE] if has_device else None,
            device_time=t[_DEVICE] if has_device else None,
            self_cpu_memory=t[_CPU_MEMORY] if has_memory else None,
            self_device_memory=t[_DEVICE_MEMORY] if has_memory and has_device else None,
            input_shapes=shapes,
            flops=t[_FLOPS] or None,
        )
        for (name, shapes), t in totals.items()
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


# Threads with at least this many host spans are nested on arrays (_nest_arrays), the others one by one
# (_nest). Measured on the 2-core development machine: arrays take about
# 0.2 us per span and 40 us per thread, the stack 0.6 us per span, so arrays win from about 100 spans on.
ARRAY_MIN_OPERATORS = 100


def _on_arrays(spans: int) -> bool:
    """Whether a thread of ``spans`` host spans is nested on arrays."""
    return spans >= ARRAY_MIN_OPERATORS

# The totals of an operator row, a list indexed by these (lists: a trace has 10^5 operators to add up).
_CALLS, _SELF_CPU, _CPU, _SELF_DEVICE, _DEVICE, _CPU_MEMORY, _DEVICE_MEMORY, _FLOPS = range(8)
# One operator on the stack of _nest, a list indexed by these.
(_KEY, _NAME, _END, _DURATION, _CHILDREN_TIME, _DEVICE_TIME, _OWN_DEVICE, _OP_SELF_DEVICE, _OP_CPU_MEMORY,
 _OP_DEVICE_MEMORY, _CHILDREN, _LAST_CHILD, _OP_SELF_CPU, _OP_FLOPS) = range(14)  # fmt: skip
_SENTINEL = Complete(name="", ts=float("inf"), dur=0.0)


def _nest(
    events: list[Complete | Instant],
    launches: _Launches,
    group_by_input_shape: bool,
    totals: dict[tuple[str, str | None], list[Any]],
) -> None:
    """Adds one thread's operators, sorted, to ``totals``.

    Each operator is pushed on a stack when it starts and finished when an event starts at or after its end
    (a sentinel at infinity finishes the last ones): its self time is its duration less its direct
    children's, its device time what it launched (``launches``) plus its children's.
    """
    stack: list[list[Any]] = []
    for event in (*events, _SENTINEL):
        ts = event.ts
        is_memory = type(event) is Instant
        while stack and stack[-1][_END] <= ts and not (is_memory and stack[-1][_END] == ts):
            _finish(stack.pop(), stack, totals)
        if event is _SENTINEL:
            break
        args = event.args
        if is_memory:
            if stack and type(args.bytes) in (int, float):
                if args.device_type == CUDA_DEVICE_TYPE:
                    stack[-1][_OP_DEVICE_MEMORY] += int(args.bytes)
                else:
                    stack[-1][_OP_CPU_MEMORY] += int(args.bytes)
            continue
        name, own_device = event.name, 0.0
        if args.external_id is not None and launches.time:
            if not launches.by_runtime:
                if event.cat in OPERATOR_CATEGORIES:
                    own_device = launches.time.get(args.external_id, 0.0)
            elif stack and event.cat in RUNTIME_CATEGORIES:  # to the operator the call runs in
                launched = launches.time.get(args.external_id, 0.0)
                stack[-1][_OWN_DEVICE] += launched
                stack[-1][_OP_SELF_DEVICE] += launched
        shapes = getattr(args, "input_dims", None) if group_by_input_shape else None
        key = (name, None if shapes is None else str(shapes))
        # [key, name, end, duration, children_time, device_time, own_device, self_device, cpu_memory,
        #  device_memory, children, last_child, self_cpu, flops]
        stack.append([key, name, ts + event.dur, event.dur, 0.0, 0.0, own_device, own_device, 0, 0, 0, None, 0.0, args.flops])


def _finish(op: list[Any], stack: list[list[Any]], totals: dict[tuple[str, str | None], list[Any]]) -> None:
    """Adds a finished operator to its row and to its parent (the new top of the stack)."""
    child = op[_LAST_CHILD]
    if op[_CHILDREN] == 1 and child[_NAME] == op[_NAME]:
        # Like torch's EventList._remove_dup_nodes: an op whose only child has its own name (an overload
        # calling another) counts once, with the child's self time, device time and memory folded in.
        c = totals[child[_KEY]]
        c[_CALLS] -= 1
        c[_CPU] -= child[_DURATION]
        c[_SELF_CPU] -= child[_OP_SELF_CPU]
        c[_SELF_DEVICE] -= child[_OP_SELF_DEVICE]
        c[_DEVICE] -= child[_DEVICE_TIME]
        c[_CPU_MEMORY] -= child[_OP_CPU_MEMORY]
        c[_DEVICE_MEMORY] -= child[_OP_DEVICE_MEMORY]
        op[_CHILDREN_TIME] -= child[_OP_SELF_CPU]
        op[_OP_SELF_DEVICE] += child[_OP_SELF_DEVICE]
        op[_OP_CPU_MEMORY] += child[_OP_CPU_MEMORY]
        op[_OP_DEVICE_MEMORY] += child[_OP_DEVICE_MEMORY]
    duration = op[_DURATION]
    self_cpu = op[_OP_SELF_CPU] = max(duration - op[_CHILDREN_TIME], 0.0)
    device_time = op[_DEVICE_TIME] = op[_DEVICE_TIME] + op[_OWN_DEVICE]
    t = totals.get(op[_KEY])
    if t is None:
        totals[op[_KEY]] = [
            1, self_cpu, duration, op[_OP_SELF_DEVICE], device_time, op[_OP_CPU_MEMORY], op[_OP_DEVICE_MEMORY], op[_OP_FLOPS] or 0
        ]  # fmt: skip
    else:
        t[_CALLS] += 1
        t[_CPU] += duration
        t[_SELF_CPU] += self_cpu
        t[_SELF_DEVICE] += op[_OP_SELF_DEVICE]
        t[_DEVICE] += device_time
        t[_CPU_MEMORY] += op[_OP_CPU_MEMORY]
        t[_DEVICE_MEMORY] += op[_OP_DEVICE_MEMORY]
        t[_FLOPS] += op[_OP_FLOPS] or 0
    if stack:
        parent = stack[-1]
        parent[_CHILDREN_TIME] += duration
        parent[_DEVICE_TIME] += device_time
        parent[_CHILDREN] += 1
        parent[_LAST_CHILD] = op


def _nest_arrays(
    ops: list[Complete],
    columns: _Columns,
    launches: _Launches,
    group_by_input_shape: bool,
    totals: dict[tuple[str, str | None], list[Any]],
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
        key_code, unique_keys = _codes(list(zip(map(_NAME_OF, ops), shapes)))
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
    columns = [np.bincount(code, minlength=m).tolist()] + [
        np.bincount(code, weights=values[counted], minlength=m).tolist()
        for values in (self_cpu, durations, self_device, device_time)
    ]
    flops = [0] * m
    values = list(map(_FLOPS_OF, ops))
    if any(values):  # recorded with_flops=True
        for k, value in zip(key_code.tolist(), values):
            if value:  # every operator's, folded or not, as _finish adds them
                flops[k] += value
    for k, key in enumerate(unique_keys):
        calls, self_cpu_k, cpu_k, self_device_k, device_k = (column[k] for column in columns)
        t = totals.get(key)
        if t is None:
            totals[key] = [calls, self_cpu_k, cpu_k, self_device_k, device_k, 0, 0, flops[k]]
        else:
            t[_CALLS] += calls
            t[_SELF_CPU] += self_cpu_k
            t[_CPU] += cpu_k
            t[_SELF_DEVICE] += self_device_k
            t[_DEVICE] += device_k
            t[_FLOPS] += flops[k]
    return True


def _first_appearance(codes: Any, values: list[Any]) -> tuple[Any, list[Any]]:
    """``codes`` into ``values`` renumbered as :func:`_codes` numbers them: the values they hold, in order of
    first appearance."""
    held, first = np.unique(codes, return_index=True)
    held = held[np.argsort(first)]
    renumbered = np.zeros(len(values), dtype=np.intp)
    renumbered[held] = np.arange(len(held))
    return renumbered[codes], [values[code] for code in held.tolist()]


def _codes(values: list[Any]) -> tuple[Any, list[Any]]:
    """Each value's position among the distinct values (in order of first appearance), and those."""
    distinct = list(dict.fromkeys(values))
    code_of = {value: i for i, value in enumerate(distinct)}
    return np.fromiter(map(code_of.__getitem__, values), dtype=np.intp, count=len(values)), distinct


# --- Step summary ----------------------------------------------------------------------------------------

OPTIMIZER_STEP_PREFIX = "Optimizer.step#"  # torch.optim's record_function around every optimizer.step()
BACKWARD_PREFIX = "autograd::engine::evaluate_function"  # one per backward node the autograd engine runs
# Host calls that wait for the device: ``.item()`` / ``bool(tensor)`` end in ``aten::_local_scalar_dense``;
# the rest are the runtime calls ``torch.cuda.synchronize()``, ``Stream/Event.synchronize()`` and blocking
# copies make (``cudaMemcpyAsync`` returns at once and is not one).
SYNC_NAMES = frozenset(
    {
        "aten::_local_scalar_dense",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
    }
)
# Host spans of collectives: the backend's own (``gloo:all_reduce``, ``nccl:all_reduce``, on the backend's
# worker threads for gloo) and c10d's dispatch and parameter-recording wrappers around them.
HOST_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")
HOST_COLLECTIVE_NAMES = frozenset({"record_param_comms"})
COMMUNICATION_KERNEL_MARK = "nccl"  # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_SendRecv, ...
# Volta (compute capability 7.0) is the first generation with tensor cores (NVIDIA's CUDA C++ Programming
# Guide, "Warp matrix functions": compute capability 7.0 and above).
TENSOR_CORE_MIN_COMPUTE_MAJOR = 7
_US = 1e-6  # trace times are microseconds; summaries are seconds
# A tiny operator: a top-level host operator shorter than this, in microseconds. An eager operator pays about
# 5-20 us of dispatch (Python binding, dispatcher, allocation; the profiler adds a few more) whatever its
# tensor's size, so one under 20 us does little beyond its own call: a step of such operators is paced by
# their dispatch, not by arithmetic. Part of that cost is Python before the operator's span opens (argument
# parsing, wrapping scalars): each tiny operator's time counts the idle gap before it too where that gap is
# shorter than this same cutoff (a longer one is other Python: a loop's own logic, a hook). Profiled on the
# 2-core development machine, a loop of `torch.addcmul` on 1-element tensors spends 1.1 us in each
# operator's span and 5 us between them.
TINY_OP_US = 20.0

# Kernel-name marks of reduced-precision or tensor-core math, checked first (see is_fp32_gemm).
_NOT_FP32_MARKS = (
    *("tf32", "bf16", "fp16", "f16", "half"),
    *("int8", "i8i8", "imma", "fp8", "e4m3", "e5m2"),
    "tensorop",
)
# cuBLAS/cuDNN kernels whose template arguments say fp32: ``gemmk1_kernel<float, ...>``,
# ``cudnn::detail::dgrad_engine<float, ...>``, ``wgrad_alg0_engine<float, ...>``.
_FP32_TEMPLATE = re.compile(r"(gemm\w*|grad\w*_engine)<float\b")
_NOT_FP32 = re.compile("|".join(map(re.escape, _NOT_FP32_MARKS)))

Interval = tuple[float, float]


def is_fp32_gemm(name: str) -> bool:
    """Whether a kernel is an fp32 matrix multiplication or convolution that does not use tensor cores.

    Notes:
        1. Names marking reduced precision or tensor-core math are not: ``tf32`` (``sm80_xmma_..._tf32f32_...``,
           ``cutlass_tensorop_s1688fprop_optimized_tf32_...``), ``bf16``, ``fp16``/``f16``/``half``, int8
           (``int8``, ``i8i8``, ``imma``), fp8 (``fp8``, ``e4m3``, ``e5m2``) and CUTLASS's ``tensorop``
           (``cutlass_80_tensorop_s1688gemm_...`` runs fp32 inputs as TF32 on tensor cores).
        2. Then fp32 SIMT GEMMs are: names with ``sgemm`` (cuBLAS's ``volta_sgemm_128x64_nn``,
           ``ampere_sgemm_32x128_tn``, ``cutlass_80_simt_sgemm_...``, ``magma_sgemmEx_kernel``,
           ``sgemm_largek_lds64``, cuDNN's ``implicit_convolve_sgemm``).
        3. fp32 cuDNN convolutions: names with ``scudnn`` (``cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1``).
        4. Names with ``gemm`` and ``f32``/``fp32`` left after rule 1 (``sm80_xmma_gemm_f32f32_f32f32_f32_...``,
           ``sm86_xmma_fprop_implicit_gemm_f32f32_...``), and GEMM or convolution-gradient kernels templated
           on ``float`` (``gemmk1_kernel<float, ...>``, ``cudnn::detail::dgrad_engine<float, ...>``).
        5. FBGEMM's kernels (``fbgemm_gpu::...``) are no GEMMs: ``fbgemm`` is ignored in the name.
    """
    n = name.lower().replace("fbgemm", "")
    if "gemm" not in n and "scudnn" not in n and "_engine<float" not in n:
        return False  # what rules 2 to 4 need (most kernels: elementwise, reductions, copies, NCCL)
    if _NOT_FP32.search(n):
        return False
    if "sgemm" in n or "scudnn" in n:
        return True
    if "gemm" in n and ("f32" in n or "fp32" in n):
        return True
    return _FP32_TEMPLATE.search(n) is not None


@dataclass
class _Scan:
    """What one pass over a trace's events keeps: intervals in microseconds, grouped by what they are."""

    index: _Index
    step_spans: dict[Thread, list[Interval]] = field(default_factory=dict)
    dataloader: list[Interval] = field(default_factory=list)
    optimizer: list[tuple[float, float, str, Thread]] = field(default_factory=list)
    backward: list[Interval] = field(default_factory=list)
    syncs: dict[Thread, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    collectives: list[Interval] = field(default_factory=list)
    not_ops: set[str] = field(default_factory=set)  # names of host spans that are no operators, any category
    device: list[Complete] = field(default_factory=list)  # kernels, copies, memsets, sorted by start
    device_id: Any = None


def summarize_trace(trace: KinetoTrace | Mapping[str, Any], *, window: str) -> TraceSummary:
    """What a window's trace shows, as means per ``ProfilerStep#N`` span, in seconds.

    Args:
        trace: A loaded Kineto trace (``{"traceEvents": [...], ...}``), with torch's categories or those
            :func:`lightning_perf.traces.tensorboard_compatible` renames (``Runtime``, DataLoader spans as
            ``cpu_op``): both give the same summary.
        window: The window's name, copied to the summary.

    Notes:
        1. The complete (``ph == "X"``) events are sorted out once (:class:`_Index`): host spans
           (``cpu_op``, ``user_annotation``, runtime calls) per thread, as numpy columns, and by name the
           step, DataLoader, optimizer, backward, synchronization and collective spans; kernels, copies and
           memsets. Flow events, ``python_function`` and ``gpu_user_annotation`` are skipped.
        2. The main thread holds the ``ProfilerStep#N`` spans; the steps' time ranges ``S`` are their union.
           A trace without them counts as one step over its whole time range (``steps == 1``), and its main
           thread is the one holding an optimizer span, else the one with most host spans.
        3. Times are lengths of interval unions (sort and merge) intersected with ``S``, so nested or
           overlapping spans count once; counts are of events starting in ``S``; both are divided by the
           number of steps. Kernel time and fp32 GEMM time are sums of durations (concurrent kernels add up).
        4. Optimizer: each ``Optimizer.step#`` span's update part runs from the end of the last backward node
           (``autograd::engine::evaluate_function``, any thread) inside it, or its start, to its end.
        5. Top-level operators are the main thread's ``cpu_op`` events inside no other ``cpu_op``
           (annotations are no parents, or Lightning's ``Optimizer.step`` around the closure would be the only
           one). ``median_op_time`` is over those in the steps, ``optimizer_update_ops`` counts those in the
           update parts: the calls the optimizer's Python makes, 3 per step for ``SGD(foreach=True)`` however
           many parameters (counting all depths, the ``aten::result_type`` calls inside each ``_foreach_``
           operator make it hundreds). Multi-tensor: an operator (any depth) in the update parts is
           ``_foreach_`` or fused (``aten::_fused_adam_``), or the optimizer's class is (``FusedAdam``).
        6. Host: ``host_op_time`` is the main thread's union of host spans (the DataLoader's included);
           ``framework_time`` the rest of the step. Tiny operators (``tiny_op_time``, ``tiny_ops_per_step``)
           are the step's own: top-level operators shorter than :data:`TINY_OP_US` starting in the steps
           but not in a DataLoader span (per-sample transforms under ``num_workers=0`` run there). Their time
           is their durations plus, for each, the time since the previous top-level operator ended where
           shorter than :data:`TINY_OP_US`: the Python that dispatched it.
        7. Device: busy is the union of kernels, copies and memsets; exposed host-to-device copy time is the
           union of ``HtoD`` copies less the union of kernels; sync idle time is the union of top-level sync
           spans (a sync inside another on its thread, ``cudaStreamSynchronize`` in ``_local_scalar_dense``,
           counts once) less device busy time.
        8. Communication: NCCL kernels, exposed where no other kernel runs; without them, host collective
           spans on any thread (gloo runs its collectives on worker threads), all exposed.
    """
    trace = as_trace(trace)
    scan = _scan(_Index.of(trace))
    main, step_spans = _main_thread(scan)
    steps = _Steps.of(step_spans) if step_spans else _Steps.whole(scan)
    host = _MainThread.of(scan, main)
    host_ops = host.union()
    host_op_time = steps.time(host_ops)
    # Host collectives (gloo, or nccl's host side) run on the process group's threads while the main thread
    # waits without a span of its own (in DDP's reducer, inside the optimizer's closure): that wait is
    # communication, neither the optimizer's update nor framework time.
    collectives = _union(scan.collectives)
    waiting = steps.time(_subtract(collectives, host_ops))
    top_starts, top_ends = host.top_level()
    in_steps = _starts_in(top_starts, steps.ranges)
    dataloader = _union(scan.dataloader)
    tiny_ops, tiny_op_time = _tiny_ops(top_starts, top_ends, in_steps & ~_starts_in(top_starts, dataloader))
    update_parts = _optimizer_update_parts(scan, steps)
    update_ops, multi_tensor = host.update_ops(top_starts, update_parts)
    optimizers = [name for start, _, name, _ in scan.optimizer if steps.hold(start)]
    if any("fused" in name.lower() for name in optimizers):
        multi_tensor = True  # a fused optimizer class (apex's, DeepSpeed's, FBGEMM's FusedAdam)
    elif not update_ops:
        multi_tensor = None
    step_time = steps.mean(steps.total)
    return TraceSummary(
        window=window,
        steps=steps.count,
        step_time=step_time,
        dataloader_time=steps.time(dataloader),
        optimizer_time=steps.time(_union([(start, end) for start, end, _, _ in scan.optimizer])),
        optimizer_update_time=steps.time(_subtract(update_parts, collectives)),
        optimizer_update_ops=steps.per_step(update_ops),
        optimizer_foreach=multi_tensor if optimizers else None,
        host_op_time=host_op_time,
        framework_time=max(step_time - host_op_time - waiting, 0.0),
        ops_per_step=steps.per_step(_operators_in(scan, steps.ranges)),
        median_op_time=percentile((top_ends - top_starts)[in_steps].tolist(), 50) * _US,
        tiny_op_time=steps.mean(tiny_op_time),
        tiny_ops_per_step=steps.per_step(tiny_ops),
        **_device_and_communication(scan, steps),
        **_device_properties(trace, scan.device_id),
    )


@dataclass(frozen=True)
class _Steps:
    """The steps' time ranges (merged) and how to turn what happened in them into means per step."""

    count: int
    ranges: list[Interval]
    total: float  # summed step spans, microseconds

    @classmethod
    def of(cls, spans: list[Interval]) -> _Steps:
        return cls(count=len(spans), ranges=_union(spans), total=sum(end - start for start, end in spans))

    @classmethod
    def whole(cls, scan: _Scan) -> _Steps:
        """The whole trace as one step: from its first host or device event to its last."""
        bounds = [(c.starts.min(), c.ends.max()) for c in scan.index.columns.values() if len(c.starts)]
        bounds += [(e.ts, e.ts + e.dur) for e in scan.device]
        if not bounds:
            return cls(count=1, ranges=[], total=0.0)
        whole = (float(min(start for start, _ in bounds)), float(max(end for _, end in bounds)))
        return cls(count=1, ranges=[whole], total=whole[1] - whole[0])

    def hold(self, point: float) -> bool:
        return _inside(point, self.ranges)

    def time(self, merged: Sequence[Interval]) -> float:
        """Seconds per step of merged intervals within the steps."""
        return self.mean(_length_within(merged, self.ranges))

    def mean(self, microseconds: float) -> float:
        """Seconds per step of a total in microseconds."""
        return microseconds * _US / self.count

    def per_step(self, count: int) -> float:
        return count / self.count


# Flags of a host span's name, worked out once per name (a trace has 10^5 spans of a few hundred names).
_STEP, _DATALOADER, _OPTIMIZER, _BACKWARD, _SYNC, _COLLECTIVE = 1, 2, 4, 8, 16, 32
_NOT_OPS = _DATALOADER | _OPTIMIZER  # annotations by name, whatever their category (the rewrite makes them cpu_ops)


def _name_flags(name: str) -> int:
    flags = 0
    if name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
        flags |= _DATALOADER
    elif name.startswith(OPTIMIZER_STEP_PREFIX):
        flags |= _OPTIMIZER
    elif name.startswith(BACKWARD_PREFIX):
        flags |= _BACKWARD
    if name in SYNC_NAMES:
        flags |= _SYNC
    elif name.startswith(HOST_COLLECTIVE_PREFIXES) or name in HOST_COLLECTIVE_NAMES:
        flags |= _COLLECTIVE
    return flags


def _scan(index: _Index) -> _Scan:
    scan = _Scan(index=index)
    for thread, spans in index.steps.items():
        scan.step_spans[thread] = [(e.ts, e.ts + e.dur) for e in spans]
    for thread, spans in index.host.items():
        flags = {name: f for name in index.columns[thread].names if (f := _name_flags(name))}
        not_ops = {name for name, f in flags.items() if f & _NOT_OPS}
        scan.not_ops |= not_ops
        if not flags:
            continue
        for e in map(spans.__getitem__, index.columns[thread].named(flags).nonzero()[0].tolist()):  # by name
            f, span = flags[e.name], (e.ts, e.ts + e.dur)
            if f & _DATALOADER:
                scan.dataloader.append(span)
            elif f & _OPTIMIZER:
                scan.optimizer.append((*span, e.name, thread))
            elif f & _BACKWARD and e.cat == "cpu_op":
                scan.backward.append(span)
            if f & _SYNC:
                scan.syncs[thread].append(span)
            elif f & _COLLECTIVE:
                scan.collectives.append(span)
    scan.device = sorted(index.device, key=_TS)
    scan.device_id = next((e.args.device for e in index.device if e.cat == "kernel"), None)
    return scan


def _main_thread(scan: _Scan) -> tuple[tuple[Any, Any] | None, list[Interval]]:
    """The main thread and its step spans (none: the thread of an optimizer step, else the busiest)."""
    if scan.step_spans:
        main = max(scan.step_spans, key=lambda thread: len(scan.step_spans[thread]))
        return main, scan.step_spans[main]
    marked = [thread for _, _, _, thread in scan.optimizer]
    if marked:
        return marked[0], []
    if scan.index.host:
        return max(scan.index.host, key=lambda thread: len(scan.index.host[thread])), []
    return None, []


def _optimizer_update_parts(scan: _Scan, steps: _Steps) -> list[Interval]:
    """Union of each optimizer span's update part: after the last backward node that ran inside it."""
    backward = sorted(scan.backward)
    starts = [start for start, _ in backward]
    parts = []
    for start, end, _, _ in scan.optimizer:
        if not steps.hold(start):
            continue
        inside = backward[bisect_left(starts, start) : bisect_left(starts, end)]
        last_backward_end = max((b_end for _, b_end in inside), default=start)
        parts.append((min(max(start, last_backward_end), end), end))
    return _union(parts)


def _outermost(spans: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The spans (``(start, end, ...)`` sorted by start, longest first) that lie inside no other."""
    top = []
    covered_until = float("-inf")
    for span in spans:
        if span[0] >= covered_until:
            top.append(span)
            covered_until = span[1]
        else:
            covered_until = max(covered_until, span[1])
    return top


@dataclass(frozen=True)
class _MainThread:
    """The main thread's host spans (:class:`_Columns`; none if the trace has no host spans), and which of them
    are operators: ``cpu_op`` spans that are no DataLoader or optimizer annotation (:data:`_NOT_OPS`)."""

    columns: _Columns
    is_op: Any

    @classmethod
    def of(cls, scan: _Scan, main: Thread | None) -> _MainThread:
        columns = scan.index.columns.get(main) or _Columns.empty()
        return cls(columns=columns, is_op=_operator_mask(columns, scan.not_ops))

    def union(self) -> list[Interval]:
        """The union of the thread's host spans."""
        return _merge_arrays(self.columns.starts, self.columns.ends)

    def top_level(self) -> tuple[Any, Any]:
        """The starts and ends (arrays, sorted by start) of the operators inside no other operator
        (annotations are no parents): those starting at or after every earlier operator's end (spans sorted by
        start, longest first)."""
        starts, ends = self.columns.starts[self.is_op], self.columns.ends[self.is_op]
        if not len(starts):
            return starts, ends
        covered_until = np.concatenate(([-np.inf], np.maximum.accumulate(ends)[:-1]))
        top = starts >= covered_until
        return starts[top], ends[top]

    def update_ops(self, top_starts: Any, update_parts: list[Interval]) -> tuple[int, bool]:
        """Top-level operators (their starts) starting in the update parts, and whether any operator there is
        multi-tensor."""
        if not update_parts:
            return 0, False
        count = int(np.count_nonzero(_starts_in(top_starts, update_parts)))
        multi_tensor = self.is_op & self.columns.named(
            {name for name in self.columns.names if "_foreach_" in name or "fused" in name}
        )
        return count, bool(_starts_in(self.columns.starts[multi_tensor], update_parts).any())


def _tiny_ops(starts: Any, ends: Any, counted: Any) -> tuple[int, float]:
    """How many of the top-level operators ``starts``/``ends`` (arrays sorted by start) are tiny (shorter than
    :data:`TINY_OP_US`) among those ``counted`` (a mask: the step's own, in the steps and in no DataLoader
    span), and their time (microseconds): their durations, and for each the gap since the operators before it
    ended (the first: none) where shorter than :data:`TINY_OP_US`."""
    if not len(starts):
        return 0, 0.0
    durations = ends - starts
    gaps = starts - np.concatenate((starts[:1], np.maximum.accumulate(ends)[:-1]))
    dispatch = np.where((gaps > 0) & (gaps < TINY_OP_US), gaps, 0.0)
    tiny = (durations < TINY_OP_US) & counted
    return int(np.count_nonzero(tiny)), float((durations[tiny] + dispatch[tiny]).sum())


def _starts_in(points: Any, merged: Sequence[Interval]) -> Any:
    """Whether each point (an array) lies in one of the merged intervals (start included, end not), as
    :func:`_inside` tells one point."""
    if not merged or not len(points):
        return np.zeros(len(points), dtype=bool)
    bounds = np.array(merged, dtype=np.float64)
    i = np.searchsorted(bounds[:, 0], points, side="right") - 1
    return (i >= 0) & (points < bounds[np.maximum(i, 0), 1])


def _operator_mask(columns: _Columns, not_ops: set[str]) -> Any:
    return columns.of_category(("cpu_op",)) & ~columns.named(not_ops)


def _operators_in(scan: _Scan, ranges: list[Interval]) -> int:
    """The operators (:class:`_MainThread`'s) of every thread starting in ``ranges``."""
    count = 0
    for thread in scan.index.host:
        columns = scan.index.columns[thread]
        starts = columns.starts[_operator_mask(columns, scan.not_ops)]  # sorted
        for low, high in ranges:
            count += int(np.searchsorted(starts, high, side="left") - np.searchsorted(starts, low, side="left"))
    return count


@dataclass(frozen=True)
class _DeviceSets:
    """What the device fields are computed from: merged intervals of all device activity (``busy``), all
    kernels, host-to-device copies, NCCL and other kernels; and the kernels starting in the steps."""

    busy: list[Interval]
    kernels: list[Interval]
    h2d: list[Interval]
    nccl: list[Interval]
    compute: list[Interval]
    step_kernel_times: list[float]  # durations (end - start) of the kernels starting in the steps
    step_fp32_gemm_time: float  # their sum over fp32 GEMMs
    h2d_pageable: bool  # a pageable host-to-device copy starts in the steps

    @classmethod
    def of(cls, device: list[Complete], steps: _Steps) -> _DeviceSets:
        """From device events sorted by start: kinds of events by their category's and name's codes, unions by
        a running maximum of ends (:func:`_merge_arrays`)."""
        n = len(device)
        starts = np.fromiter(map(_TS, device), dtype=np.float64, count=n)
        ends = starts + np.fromiter(map(_DUR, device), dtype=np.float64, count=n)
        category_code, categories = _codes(list(map(_CAT_OF, device)))
        name_code, names = _codes(list(map(_NAME_OF, device)))
        kernel = _by_code([c == "kernel" for c in categories], category_code)
        memcpy = _by_code([c == "gpu_memcpy" for c in categories], category_code)
        nccl = _by_code([COMMUNICATION_KERNEL_MARK in name for name in names], name_code)
        h2d = memcpy & _by_code(["HtoD" in name for name in names], name_code)
        pageable = h2d & _by_code(["Pageable" in name for name in names], name_code)
        in_steps = np.zeros(n, dtype=bool)
        for low, high in steps.ranges:
            in_steps[np.searchsorted(starts, low, side="left") : np.searchsorted(starts, high, side="left")] = True
        step_kernels = np.flatnonzero(kernel & in_steps)
        fp32 = {int(code): is_fp32_gemm(names[code]) for code in np.unique(name_code[step_kernels])}
        times = ends[step_kernels] - starts[step_kernels]
        fp32_kernel = np.array([fp32[code] for code in name_code[step_kernels].tolist()], dtype=bool)
        return cls(
            busy=_merge_arrays(starts, ends),
            kernels=_merge_arrays(starts[kernel], ends[kernel]),
            h2d=_merge_arrays(starts[h2d], ends[h2d]),
            nccl=_merge_arrays(starts[kernel & nccl], ends[kernel & nccl]),
            compute=_merge_arrays(starts[kernel & ~nccl], ends[kernel & ~nccl]),
            step_kernel_times=times.tolist(),
            step_fp32_gemm_time=sum(times[fp32_kernel].tolist()),
            h2d_pageable=bool((pageable & in_steps).any()),
        )


def _device_and_communication(scan: _Scan, steps: _Steps) -> dict[str, Any]:
    """The device fields of :class:`~lightning_perf.records.TraceSummary` (none without device activity), and
    its communication fields."""
    if not scan.device:
        return _communication(scan, steps, None)
    sets = _DeviceSets.of(scan.device, steps)
    syncs = _top_level_syncs(scan.syncs, steps)
    return {
        "device_busy": steps.time(sets.busy),
        "kernels_per_step": steps.per_step(len(sets.step_kernel_times)),
        "median_kernel_time": percentile(sets.step_kernel_times, 50) * _US,
        "kernel_time": steps.mean(sum(sets.step_kernel_times)),
        "fp32_gemm_time": steps.mean(sets.step_fp32_gemm_time),
        "h2d_time": steps.time(sets.h2d),
        "h2d_exposed_time": steps.time(_subtract(sets.h2d, sets.kernels)),
        "h2d_pageable": sets.h2d_pageable,
        "syncs_per_step": steps.per_step(len(syncs)),
        "sync_idle_time": steps.time(_subtract(_union(syncs), sets.busy)),
        **_communication(scan, steps, sets),
    }


def _top_level_syncs(syncs: dict[tuple[Any, Any], list[Interval]], steps: _Steps) -> list[Interval]:
    """Sync spans starting in the steps and inside no other sync span of their thread."""
    return [
        span
        for spans in syncs.values()
        for span in _outermost(sorted(spans, key=lambda span: (span[0], -span[1])))
        if steps.hold(span[0])
    ]


def _communication(scan: _Scan, steps: _Steps, sets: _DeviceSets | None) -> dict[str, float | None]:
    if sets is not None and sets.nccl:
        return {
            "communication_time": steps.time(sets.nccl),
            "communication_exposed_time": steps.time(_subtract(sets.nccl, sets.compute)),
        }
    if scan.collectives:
        host_time = steps.time(_union(scan.collectives))
        return {"communication_time": host_time, "communication_exposed_time": host_time}
    return {"communication_time": None, "communication_exposed_time": None}


def _device_properties(trace: KinetoTrace, device_id: Any) -> dict[str, Any]:
    """Name and tensor cores of the device the kernels ran on (else the first listed)."""
    properties = [p for p in trace.deviceProperties or () if isinstance(p, dict)]
    if not properties:
        return {"device_name": None, "tensor_core_capable": None}
    chosen = next((p for p in properties if p.get("id") == device_id), properties[0])
    major = chosen.get("computeMajor")
    return {
        "device_name": chosen.get("name"),
        "tensor_core_capable": major >= TENSOR_CORE_MIN_COMPUTE_MAJOR if isinstance(major, int) else None,
    }


# --- Intervals: lists of (start, end), merged ones sorted and disjoint ------------------------------------


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (touching ones merged)."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        elif end > start:
            merged.append((start, end))
    return merged


def _merge_arrays(starts: Any, ends: Any) -> list[Interval]:
    """:func:`_union` of intervals given as arrays of starts (sorted) and ends: a new block starts where a
    start lies beyond every end before it; a block ends at the running maximum of ends."""
    if not len(starts):
        return []
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    block_starts, block_ends = starts[first], reach[np.append(first[1:] - 1, len(starts) - 1)]
    kept = block_ends > block_starts
    return list(zip(block_starts[kept].tolist(), block_ends[kept].tolist()))


def _length_within(merged: Sequence[Interval], ranges: Sequence[Interval]) -> float:
    """The length of merged intervals within merged ``ranges`` (the steps: one or a few): per range, the
    intervals overlapping it found by bisection, the first and last clipped to it."""
    total = 0.0
    for low, high in ranges:
        i = bisect_right(merged, (low, float("inf"))) - 1  # the last starting at or before low
        if i < 0 or merged[i][1] <= low:
            i += 1
        j = bisect_left(merged, (high, float("-inf")))  # the first starting at or after high
        if i >= j:
            continue
        if j - i == 1:
            total += max(min(merged[i][1], high) - max(merged[i][0], low), 0.0)
            continue
        total += min(merged[i][1], high) - max(merged[i][0], low)
        total += sum(end - start for start, end in merged[i + 1 : j - 1])
        total += min(merged[j - 1][1], high) - merged[j - 1][0]
    return total


def _subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The time in merged ``a`` and not in merged ``b``."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        cursor, k = start, j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def _inside(point: float, merged: Sequence[Interval]) -> bool:
    """Whether ``point`` lies in one of the merged intervals (start included, end not)."""
    i = bisect_right(merged, (point, float("inf"))) - 1
    return i >= 0 and point < merged[i][1]

