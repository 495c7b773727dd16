"""
Step summary
============

What a window's steps look like in its Kineto trace (data loading, optimizer, host framework overhead, device
busy time, copies, synchronizations, communication, compiled code), as means per ``ProfilerStep#N`` span: the
:class:`~lightning_perf.records.TraceSummary` the trace-level diagnosis rules read (:func:`summarize_trace`).

It takes typed events (:mod:`lightning_perf.summarize.events`, what :func:`lightning_perf.readers.load_trace`
reads) or a trace loaded with ``json`` (converted), of any Kineto trace, ours (categories renamed by
:func:`lightning_perf.traces.tensorboard_compatible`) or not, so the callback and the offline CLI share it.
The events are sorted out once per trace (:class:`~lightning_perf.summarize.index.TraceIndex`, shared with the
operator table), then by kind (:class:`~lightning_perf.summarize.step_spans.Scan`); times are lengths of
interval unions (:mod:`lightning_perf.summarize.intervals`).

This module imports neither torch nor lightning; numpy holds the columns of the events that the summary
works through on arrays.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_perf.records import TraceSummary
from lightning_perf.summarize.events import CPU_DEVICE_TYPE, Complete, KinetoTrace, as_trace
from lightning_perf.summarize.index import (
    CAT_OF,
    DUR_OF,
    NAME_OF,
    TS_OF,
    Columns,
    Thread,
    TraceIndex,
    by_code,
    codes,
    distinct_codes,
)
from lightning_perf.summarize.intervals import Interval, merge_arrays, outermost, starts_in, subtract, union
from lightning_perf.summarize.kernels import COMMUNICATION_KERNEL_MARK, device_properties, is_fp32_gemm
from lightning_perf.summarize.step_spans import US, Scan, Steps
from lightning_perf.summarize.steps import percentile
from lightning_perf.validation import is_int

# A tiny operator: a top-level host operator shorter than this, in microseconds. An eager operator pays about
# 5-20 us of dispatch (Python binding, dispatcher, allocation; the profiler adds a few more) whatever its
# tensor's size, so one under 20 us does little beyond its own call: a step of such operators is paced by
# their dispatch, not by arithmetic. Part of that cost is Python before the operator's span opens (argument
# parsing, wrapping scalars): each tiny operator's time counts the idle gap before it too where that gap is
# shorter than this same cutoff (a longer one is other Python: a loop's own logic, a hook). Profiled on the
# 2-core development machine, a loop of `torch.addcmul` on 1-element tensors spends 1.1 us in each
# operator's span and 5 us between them.
TINY_OP_US = 20.0


def summarize_trace(trace: KinetoTrace | Mapping[str, Any], *, window: str) -> TraceSummary:
    """What a window's trace shows, as means per ``ProfilerStep#N`` span, in seconds.

    Args:
        trace: A loaded Kineto trace (``{"traceEvents": [...], ...}``), with torch's categories or those
            :func:`lightning_perf.traces.tensorboard_compatible` renames (``Runtime``, DataLoader spans as
            ``cpu_op``): both give the same summary.
        window: The window's name, copied to the summary.

    Notes:
        1. The complete (``ph == "X"``) events are sorted out once
           (:class:`~lightning_perf.summarize.index.TraceIndex`): host spans (``cpu_op``, ``user_annotation``,
           runtime calls) per thread, as numpy columns, and by name the step, DataLoader, optimizer, backward,
           synchronization, collective, compiled-code and guard-check spans; kernels, copies and memsets. Flow
           events, ``python_function`` and ``gpu_user_annotation`` are skipped.
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
           shorter than :data:`TINY_OP_US`: the Python that dispatched it. The top-level operators that start
           in the steps and in a DataLoader span are ``dataloader_ops_per_step``: the dataset's and collate's
           own calls.
        7. Device: busy is the union of kernels, copies and memsets; exposed host-to-device copy time is the
           union of ``HtoD`` copies less the union of kernels; sync idle time is the union of top-level sync
           spans (a sync inside another on its thread, ``cudaStreamSynchronize`` in ``_local_scalar_dense``,
           counts once) less device busy time.
        8. Communication: NCCL kernels, exposed where no other kernel runs; without them, host collective
           spans on any thread (gloo runs its collectives on worker threads), all exposed.
        9. Compiled code (``torch.compile``): ``compiled_time`` is the union of the ``Torch-Compiled Region``,
           ``CompiledFunction`` and ``CompiledFunctionBackward`` spans on any thread (the forward's
           ``CompiledFunction`` lies inside its region and counts once), ``guard_time`` that of the
           ``TorchDynamo Cache Lookup`` spans; each ``None`` when the trace holds no such span.
        10. Memory (``profile_memory=True``, CPU): ``cpu_forward_peak`` is, for each ``ProfilerStep#N`` span up to
            its first backward node, the largest rise of the CPU ``[memory]`` events' ``Total Allocated`` above
            the lowest level before it (from the level before the first event on); the largest over the steps.
            The forward alone: torch leaves out the frees of tensors allocated before memory was profiled (the
            last step's gradients, in a window's first step), and a backward's new gradients would count as
            activations.
    """
    trace = as_trace(trace)
    scan = Scan.of(TraceIndex.of(trace))
    main, step_spans = scan.main_thread()
    steps = Steps.of(step_spans) if step_spans else Steps.whole(scan)
    host = _MainThread.of(scan, main)
    host_ops = host.union()
    host_op_time = steps.time(host_ops)
    # Host collectives (gloo, or nccl's host side) run on the process group's threads while the main thread
    # waits without a span of its own (in DDP's reducer, inside the optimizer's closure): that wait is
    # communication, neither the optimizer's update nor framework time.
    collectives = union(scan.collectives)
    waiting = steps.time(subtract(collectives, host_ops))
    top_starts, top_ends = host.top_level()
    in_steps = starts_in(top_starts, steps.ranges)
    dataloader = union(scan.dataloader)
    in_loader = starts_in(top_starts, dataloader)
    tiny_ops, tiny_op_time = _tiny_ops(top_starts, top_ends, in_steps & ~in_loader)
    update_parts = _optimizer_update_parts(scan, steps)
    multi_tensor: bool | None
    update_ops, multi_tensor, fused = host.update_ops(top_starts, update_parts)
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
        dataloader_ops_per_step=steps.per_step(int(np.count_nonzero(in_steps & in_loader))),
        optimizer_time=steps.time(union([(start, end) for start, end, _, _ in scan.optimizer])),
        optimizer_update_time=steps.time(subtract(update_parts, collectives)),
        optimizer_update_ops=steps.per_step(update_ops),
        optimizer_foreach=multi_tensor if optimizers else None,
        optimizer_fused=fused if optimizers else None,
        host_op_time=host_op_time,
        framework_time=max(step_time - host_op_time - waiting, 0.0),
        ops_per_step=steps.per_step(_operators_in(scan, steps.ranges)),
        median_op_time=percentile((top_ends - top_starts)[in_steps].tolist(), 50) * US,
        tiny_op_time=steps.mean(tiny_op_time),
        tiny_ops_per_step=steps.per_step(tiny_ops),
        **_device_and_communication(scan, steps),
        **device_properties(trace, scan.device_id),
        compiled_time=_time_if_any(scan.compiled, steps),
        guard_time=_time_if_any(scan.guards, steps),
        cpu_forward_peak=_cpu_forward_peak(scan.index, step_spans or steps.ranges, scan.backward),
    )


def _cpu_forward_peak(index: TraceIndex, steps: list[Interval], backward: list[Interval]) -> int | None:
    """The most CPU memory a step's forward allocated above the lowest it had held since the step began, over the
    steps: its activations and the forward's temporaries. From the CPU ``[memory]`` events' ``Total Allocated``
    (``profile_memory=True``); ``None`` without them."""
    events = sorted(
        (e for thread in index.memory.values() for e in thread if e.args.device_type == CPU_DEVICE_TYPE),
        key=TS_OF,
    )
    levels = [(e.ts, e.args.total_allocated, e.args.bytes) for e in events]
    levels = [(ts, total, change) for ts, total, change in levels if is_int(total) and is_int(change)]
    times = [ts for ts, _, _ in levels]
    backward_starts = sorted(start for start, _ in backward)
    peak = None
    for start, end in steps:
        first_backward = bisect_left(backward_starts, start)
        if first_backward < len(backward_starts) and backward_starts[first_backward] < end:
            end = backward_starts[first_backward]  # the forward ends where the backward's first node begins
        inside = levels[bisect_left(times, start) : bisect_left(times, end)]
        if not inside:
            continue
        lowest = inside[0][1] - inside[0][2]  # what it held before its first event
        rise = 0
        for _, total, _ in inside:
            lowest = min(lowest, total)
            rise = max(rise, total - lowest)
        peak = max(peak or 0, rise)
    return peak


def _time_if_any(spans: list[Interval], steps: Steps) -> float | None:
    """Seconds per step of the union of ``spans`` within the steps; ``None`` when there are none at all."""
    return steps.time(union(spans)) if spans else None


def _optimizer_update_parts(scan: Scan, steps: Steps) -> list[Interval]:
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
    return union(parts)


@dataclass(frozen=True)
class _MainThread:
    """The main thread's host spans (:class:`Columns`; none if the trace has no host spans), and which of them
    are operators: ``cpu_op`` spans that are no DataLoader or optimizer annotation (:attr:`Scan.not_ops
    <lightning_perf.summarize.step_spans.Scan.not_ops>`)."""

    columns: Columns
    is_op: Any

    @classmethod
    def of(cls, scan: Scan, main: Thread | None) -> _MainThread:
        columns = (scan.index.columns.get(main) if main is not None else None) or Columns.empty()
        return cls(columns=columns, is_op=_operator_mask(columns, scan.not_ops))

    def union(self) -> list[Interval]:
        """The union of the thread's host spans."""
        return merge_arrays(self.columns.starts, self.columns.ends)

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

    def update_ops(self, top_starts: Any, update_parts: list[Interval]) -> tuple[int, bool, bool]:
        """Top-level operators (their starts) starting in the update parts, and whether any operator there is
        multi-tensor, and fused (``aten::_fused_adamw_``: torch's ``fused=True``)."""
        if not update_parts:
            return 0, False, False
        count = int(np.count_nonzero(starts_in(top_starts, update_parts)))
        names = self.columns.names

        def used(kernels: set[str]) -> bool:
            ops = self.is_op & self.columns.named(kernels)
            return bool(starts_in(self.columns.starts[ops], update_parts).any())

        fused = used({name for name in names if "fused" in name})
        return count, fused or used({name for name in names if "_foreach_" in name}), fused


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


def _operator_mask(columns: Columns, not_ops: set[str]) -> Any:
    return columns.of_category(("cpu_op",)) & ~columns.named(not_ops)


def _operators_in(scan: Scan, ranges: list[Interval]) -> int:
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
    def of(cls, device: list[Complete], steps: Steps) -> _DeviceSets:
        """From device events sorted by start: kinds of events by their category's and name's codes, unions by
        a running maximum of ends (:func:`merge_arrays`)."""
        n = len(device)
        starts = np.fromiter(map(TS_OF, device), dtype=np.float64, count=n)
        ends = starts + np.fromiter(map(DUR_OF, device), dtype=np.float64, count=n)
        category_code, categories = codes(list(map(CAT_OF, device)))
        name_code, names = codes(list(map(NAME_OF, device)))
        kernel = by_code([c == "kernel" for c in categories], category_code)
        memcpy = by_code([c == "gpu_memcpy" for c in categories], category_code)
        nccl = by_code([COMMUNICATION_KERNEL_MARK in name for name in names], name_code)
        h2d = memcpy & by_code(["HtoD" in name for name in names], name_code)
        pageable = h2d & by_code(["Pageable" in name for name in names], name_code)
        in_steps = np.zeros(n, dtype=bool)
        for low, high in steps.ranges:
            in_steps[np.searchsorted(starts, low, side="left") : np.searchsorted(starts, high, side="left")] = True
        step_kernels = np.flatnonzero(kernel & in_steps)
        fp32 = {int(code): is_fp32_gemm(names[code]) for code in distinct_codes(name_code[step_kernels])}
        times = ends[step_kernels] - starts[step_kernels]
        fp32_kernel = np.array([fp32[code] for code in name_code[step_kernels].tolist()], dtype=bool)
        return cls(
            busy=merge_arrays(starts, ends),
            kernels=merge_arrays(starts[kernel], ends[kernel]),
            h2d=merge_arrays(starts[h2d], ends[h2d]),
            nccl=merge_arrays(starts[kernel & nccl], ends[kernel & nccl]),
            compute=merge_arrays(starts[kernel & ~nccl], ends[kernel & ~nccl]),
            step_kernel_times=times.tolist(),
            step_fp32_gemm_time=sum(times[fp32_kernel].tolist()),
            h2d_pageable=bool((pageable & in_steps).any()),
        )


def _device_and_communication(scan: Scan, steps: Steps) -> dict[str, Any]:
    """The device fields of :class:`~lightning_perf.records.TraceSummary` (none without device activity), and
    its communication fields."""
    if not scan.device:
        return _communication(scan, steps, None)
    sets = _DeviceSets.of(scan.device, steps)
    syncs = _top_level_syncs(scan.syncs, steps)
    return {
        "device_busy": steps.time(sets.busy),
        "kernels_per_step": steps.per_step(len(sets.step_kernel_times)),
        "median_kernel_time": percentile(sets.step_kernel_times, 50) * US,
        "kernel_time": steps.mean(sum(sets.step_kernel_times)),
        "fp32_gemm_time": steps.mean(sets.step_fp32_gemm_time),
        "h2d_time": steps.time(sets.h2d),
        "h2d_exposed_time": steps.time(subtract(sets.h2d, sets.kernels)),
        "h2d_pageable": sets.h2d_pageable,
        "syncs_per_step": steps.per_step(len(syncs)),
        "sync_idle_time": steps.time(subtract(union(syncs), sets.busy)),
        **_communication(scan, steps, sets),
    }


def _top_level_syncs(syncs: dict[Thread, list[Interval]], steps: Steps) -> list[Interval]:
    """Sync spans starting in the steps and inside no other sync span of their thread."""
    return [
        span
        for spans in syncs.values()
        for span in outermost(sorted(spans, key=lambda span: (span[0], -span[1])))
        if steps.hold(span[0])
    ]


def _communication(scan: Scan, steps: Steps, sets: _DeviceSets | None) -> dict[str, float | None]:
    if sets is not None and sets.nccl:
        return {
            "communication_time": steps.time(sets.nccl),
            "communication_exposed_time": steps.time(subtract(sets.nccl, sets.compute)),
        }
    if scan.collectives:
        host_time = steps.time(union(scan.collectives))
        return {"communication_time": host_time, "communication_exposed_time": host_time}
    return {"communication_time": None, "communication_exposed_time": None}
