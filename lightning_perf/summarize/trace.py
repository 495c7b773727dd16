"""
Trace summaries
===============

Two summaries of a Kineto trace, each computed in one lean pass over its events:

- :func:`operator_stats`: the same numbers ``torch.profiler``'s ``key_averages()`` gives (calls,
  self/total CPU time, self/total device time, self memory, input shapes), without building its
  ``FunctionEvent`` objects, which take seconds on a trace of tens of thousands of events;
- :func:`summarize_trace`: what a window's steps look like (data loading, optimizer, host framework
  overhead, device busy time, copies, synchronizations, communication), the input of the trace-level
  diagnosis rules.

Both work on any Kineto JSON, ours (categories renamed by :func:`lightning_perf.traces.tensorboard_compatible`)
or not, so the callback and the offline CLI share them. This module imports neither torch nor lightning.
"""

from __future__ import annotations

import re
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.records import OperatorStat, TraceSummary
from lightning_perf.traces import DATALOADER_PREFIX, DATALOADER_SUFFIX, PROFILER_STEP_PREFIX

# Host-side operator ranges (torch's ``record_function`` spans are ``user_annotation``), and the device
# runtime and driver calls they make (``Runtime`` is what :func:`lightning_perf.traces.tensorboard_compatible`
# renames those to). Runtime calls are rows of their own, as in ``key_averages()``, and count as their
# operator's children; device time is only ever attributed to operators.
OPERATOR_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
HOST_OP_CATEGORIES = OPERATOR_CATEGORIES | RUNTIME_CATEGORIES
# Device activity launched by a host operator, tied to it by ``args["External id"]``.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
MEMORY_EVENT_NAME = "[memory]"
CUDA_DEVICE_TYPE = 1  # ``args["Device Type"]`` of a [memory] event: c10::DeviceType::CUDA


@dataclass
class _Op:
    name: str
    key: tuple[str, str | None]
    start: float
    end: float
    external_id: Any
    flops: int | None
    children_time: float = 0.0
    device_time: float = 0.0  # this op's and its descendants'
    cpu_memory: int = 0
    device_memory: int = 0
    children: int = 0
    last_child: _Op | None = None
    self_cpu: float = 0.0
    self_device: float = 0.0


@dataclass
class _Totals:
    calls: int = 0
    self_cpu: float = 0.0
    cpu: float = 0.0
    self_device: float = 0.0
    device: float = 0.0
    cpu_memory: int = 0
    device_memory: int = 0
    flops: int = 0


def operator_stats(trace: dict[str, Any], *, group_by_input_shape: bool = False) -> tuple[OperatorStat, ...]:
    """Per-operator statistics of a Kineto trace, like ``key_averages()``.

    Args:
        trace: A loaded Kineto trace (``{"traceEvents": [...], ...}``).
        group_by_input_shape: One row per operator and input shapes, as ``key_averages(group_by_input_shape=True)``.

    Notes:
        1. Host operators (``cpu_op`` and ``user_annotation`` spans, but not ``ProfilerStep#N``) and runtime
           calls are nested per thread by time; an operator's self time is its duration minus its direct
           children's.
        2. Kernels, copies and memsets add their duration to the self device time of the host operator
           with the same ``External id`` (the innermost operator that launched them); device total time
           adds up self device time over an operator and its descendants.
        3. ``[memory]`` events add their bytes to the innermost operator running on their thread.
        4. Device columns are ``None`` when the trace has no device activity, memory columns when it was
           recorded without ``profile_memory``.
    """
    events = trace.get("traceEvents", ())
    device_by_external_id: dict[Any, float] = defaultdict(float)
    # Per thread: (start, is_memory, -duration, sequence, event). Sorted as plain tuples: by start, an
    # operator before a memory event at the same time, a longer (parent) before a shorter (child) span.
    by_thread: dict[tuple[Any, Any], list[tuple[float, int, float, int, dict[str, Any]]]] = defaultdict(list)
    has_device = has_memory = False
    for seq, event in enumerate(events):
        ph, cat = event.get("ph"), event.get("cat")
        if ph == "X" and cat in HOST_OP_CATEGORIES:
            if not event.get("name", "").startswith("ProfilerStep#"):
                item = (float(event["ts"]), 0, -float(event.get("dur", 0)), seq, event)
                by_thread[(event.get("pid"), event.get("tid"))].append(item)
        elif ph == "X" and cat in DEVICE_CATEGORIES:
            has_device = True
            external_id = event.get("args", {}).get("External id")
            if external_id is not None:
                device_by_external_id[external_id] += float(event.get("dur", 0))
        elif ph == "i" and event.get("name") == MEMORY_EVENT_NAME:
            has_memory = True
            by_thread[(event.get("pid"), event.get("tid"))].append((float(event["ts"]), 1, 0.0, seq, event))

    totals: dict[tuple[str, str | None], _Totals] = defaultdict(_Totals)
    for items in by_thread.values():
        items.sort()
        _nest(items, device_by_external_id, group_by_input_shape, totals)

    has_memory = has_memory or "profile_memory" in trace
    return tuple(
        OperatorStat(
            name=name,
            calls=t.calls,
            self_cpu_time=t.self_cpu,
            cpu_time=t.cpu,
            self_device_time=t.self_device if has_device else None,
            device_time=t.device if has_device else None,
            self_cpu_memory=t.cpu_memory if has_memory else None,
            self_device_memory=t.device_memory if has_memory and has_device else None,
            input_shapes=shapes,
            flops=t.flops or None,
        )
        for (name, shapes), t in totals.items()
    )


def _nest(
    items: Iterable[tuple[float, int, float, int, dict[str, Any]]],
    device_by_external_id: dict[Any, float],
    group_by_input_shape: bool,
    totals: dict[tuple[str, str | None], _Totals],
) -> None:
    stack: list[_Op] = []

    def finish(op: _Op) -> None:
        child = op.last_child
        if op.children == 1 and child is not None and child.name == op.name:
            # Like torch's EventList._remove_dup_nodes: an op whose only child has its own name (an overload
            # calling another) counts once, with the child's self time, device time and memory folded in.
            c = totals[child.key]
            c.calls -= 1
            c.cpu -= child.end - child.start
            c.self_cpu -= child.self_cpu
            c.self_device -= child.self_device
            c.device -= child.device_time
            c.cpu_memory -= child.cpu_memory
            c.device_memory -= child.device_memory
            op.children_time -= child.self_cpu
            op.self_device += child.self_device
            op.cpu_memory += child.cpu_memory
            op.device_memory += child.device_memory
        t = totals[op.key]
        t.calls += 1
        duration = op.end - op.start
        op.self_cpu = max(duration - op.children_time, 0.0)
        if op.external_id is not None:
            op.self_device += device_by_external_id.get(op.external_id, 0.0)
        op.device_time += device_by_external_id.get(op.external_id, 0.0) if op.external_id is not None else 0.0
        t.cpu += duration
        t.self_cpu += op.self_cpu
        t.self_device += op.self_device
        t.device += op.device_time
        t.cpu_memory += op.cpu_memory
        t.device_memory += op.device_memory
        t.flops += op.flops or 0
        if stack:
            parent = stack[-1]
            parent.children_time += duration
            parent.device_time += op.device_time
            parent.children += 1
            parent.last_child = op

    for ts, is_memory, _, _, event in items:
        while stack and stack[-1].end <= ts and not (is_memory and stack[-1].end == ts):
            finish(stack.pop())
        args = event.get("args", {})
        if is_memory:
            if stack:
                if args.get("Device Type") == CUDA_DEVICE_TYPE:
                    stack[-1].device_memory += int(args.get("Bytes", 0))
                else:
                    stack[-1].cpu_memory += int(args.get("Bytes", 0))
            continue
        shapes = args.get("Input Dims") if group_by_input_shape else None
        stack.append(
            _Op(
                name=event["name"],
                key=(event["name"], str(shapes) if shapes is not None else None),
                start=ts,
                end=ts + float(event.get("dur", 0)),
                external_id=args.get("External id") if event.get("cat") in OPERATOR_CATEGORIES else None,
                flops=args.get("flops"),
            )
        )
    while stack:
        finish(stack.pop())


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

# Kernel-name marks of reduced-precision or tensor-core math, checked first (see is_fp32_gemm).
_NOT_FP32_MARKS = (
    *("tf32", "bf16", "fp16", "f16", "half"),
    *("int8", "i8i8", "imma", "fp8", "e4m3", "e5m2"),
    "tensorop",
)
# cuBLAS/cuDNN kernels whose template arguments say fp32: ``gemmk1_kernel<float, ...>``,
# ``cudnn::detail::dgrad_engine<float, ...>``, ``wgrad_alg0_engine<float, ...>``.
_FP32_TEMPLATE = re.compile(r"(gemm\w*|grad\w*_engine)<float\b")

Interval = tuple[float, float]
_OP, _RUNTIME, _ANNOTATION = 0, 1, 2  # kinds of host spans


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
    if any(mark in n for mark in _NOT_FP32_MARKS):
        return False
    if "sgemm" in n or "scudnn" in n:
        return True
    if "gemm" in n and ("f32" in n or "fp32" in n):
        return True
    return _FP32_TEMPLATE.search(n) is not None


@dataclass
class _Scan:
    """What one pass over a trace's events keeps: intervals in microseconds, grouped by what they are."""

    step_spans: dict[tuple[Any, Any], list[Interval]] = field(default_factory=lambda: defaultdict(list))
    host: dict[tuple[Any, Any], list[tuple[float, float, str, int]]] = field(default_factory=lambda: defaultdict(list))
    op_starts: list[float] = field(default_factory=list)  # cpu_ops of every thread
    dataloader: list[Interval] = field(default_factory=list)
    optimizer: list[tuple[float, float, str, tuple[Any, Any]]] = field(default_factory=list)
    backward: list[Interval] = field(default_factory=list)
    syncs: dict[tuple[Any, Any], list[Interval]] = field(default_factory=lambda: defaultdict(list))
    collectives: list[Interval] = field(default_factory=list)
    device: list[Interval] = field(default_factory=list)  # kernels, copies, memsets
    kernels: list[tuple[float, float, str]] = field(default_factory=list)
    h2d: list[tuple[float, float, bool]] = field(default_factory=list)  # (start, end, pageable)
    device_id: Any = None


def summarize_trace(trace: dict[str, Any], *, window: str) -> TraceSummary:
    """What a window's trace shows, as means per ``ProfilerStep#N`` span, in seconds.

    Args:
        trace: A loaded Kineto trace (``{"traceEvents": [...], ...}``), with torch's categories or those
            :func:`lightning_perf.traces.tensorboard_compatible` renames (``Runtime``, DataLoader spans as
            ``cpu_op``): both give the same summary.
        window: The window's name, copied to the summary.

    Notes:
        1. One pass sorts the complete (``ph == "X"``) events into lists of intervals: host spans
           (``cpu_op``, ``user_annotation``, runtime calls) per thread, and by name the step, DataLoader,
           optimizer, backward, synchronization and collective spans; kernels, copies and memsets. Flow
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
           ``framework_time`` the rest of the step.
        7. Device: busy is the union of kernels, copies and memsets; exposed host-to-device copy time is the
           union of ``HtoD`` copies less the union of kernels; sync idle time is the union of top-level sync
           spans (a sync inside another on its thread, ``cudaStreamSynchronize`` in ``_local_scalar_dense``,
           counts once) less device busy time.
        8. Communication: NCCL kernels, exposed where no other kernel runs; without them, host collective
           spans on any thread (gloo runs its collectives on worker threads), all exposed.
    """
    scan = _scan(trace.get("traceEvents", ()))
    main, step_spans = _main_thread(scan)
    steps = _Steps.of(step_spans) if step_spans else _Steps.whole(scan)
    host = sorted(scan.host.get(main, ()), key=lambda span: (span[0], -span[1]))
    host_ops = _union([(start, end) for start, end, _, _ in host])
    host_op_time = steps.time(host_ops)
    # Host collectives (gloo, or nccl's host side) run on the process group's threads while the main thread
    # waits without a span of its own (in DDP's reducer, inside the optimizer's closure): that wait is
    # communication, neither the optimizer's update nor framework time.
    collectives = _union(scan.collectives)
    waiting = steps.time(_subtract(collectives, host_ops))
    top_level = _top_level_ops(host)
    update_parts = _optimizer_update_parts(scan, steps)
    update_ops, multi_tensor = _update_ops(host, top_level, update_parts)
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
        dataloader_time=steps.time(_union(scan.dataloader)),
        optimizer_time=steps.time(_union([(start, end) for start, end, _, _ in scan.optimizer])),
        optimizer_update_time=steps.time(_subtract(update_parts, collectives)),
        optimizer_update_ops=steps.per_step(update_ops),
        optimizer_foreach=multi_tensor if optimizers else None,
        host_op_time=host_op_time,
        framework_time=max(step_time - host_op_time - waiting, 0.0),
        ops_per_step=steps.per_step(_count_inside(sorted(scan.op_starts), steps.ranges)),
        median_op_time=_median([end - start for start, end, _ in top_level if steps.hold(start)]) * _US,
        **(_device_fields(scan, steps) if scan.device else {}),
        **_communication(scan, steps),
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
        intervals = [(start, end) for spans in scan.host.values() for start, end, _, _ in spans] + scan.device
        if not intervals:
            return cls(count=1, ranges=[], total=0.0)
        whole = (min(start for start, _ in intervals), max(end for _, end in intervals))
        return cls(count=1, ranges=[whole], total=whole[1] - whole[0])

    def hold(self, point: float) -> bool:
        return _inside(point, self.ranges)

    def time(self, merged: Sequence[Interval]) -> float:
        """Seconds per step of merged intervals within the steps."""
        return self.mean(_length(_intersect(merged, self.ranges)))

    def mean(self, microseconds: float) -> float:
        """Seconds per step of a total in microseconds."""
        return microseconds * _US / self.count

    def per_step(self, count: int) -> float:
        return count / self.count


def _scan(events: Iterable[dict[str, Any]]) -> _Scan:
    scan = _Scan()
    for event in events:
        if event.get("ph") != "X":
            continue
        cat = event.get("cat")
        if cat in HOST_OP_CATEGORIES:
            name = event.get("name", "")
            start = float(event["ts"])
            end = start + float(event.get("dur", 0))
            thread = (event.get("pid"), event.get("tid"))
            if name.startswith(PROFILER_STEP_PREFIX):
                scan.step_spans[thread].append((start, end))
                continue
            # By name first: the rewrite for TensorBoard turns DataLoader spans into cpu_ops.
            if name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
                kind = _ANNOTATION
                scan.dataloader.append((start, end))
            elif name.startswith(OPTIMIZER_STEP_PREFIX):
                kind = _ANNOTATION
                scan.optimizer.append((start, end, name, thread))
            elif cat == "cpu_op":
                kind = _OP
                scan.op_starts.append(start)
                if name.startswith(BACKWARD_PREFIX):
                    scan.backward.append((start, end))
            else:
                kind = _ANNOTATION if cat == "user_annotation" else _RUNTIME
            if name in SYNC_NAMES:
                scan.syncs[thread].append((start, end))
            elif name.startswith(HOST_COLLECTIVE_PREFIXES) or name in HOST_COLLECTIVE_NAMES:
                scan.collectives.append((start, end))
            scan.host[thread].append((start, end, name, kind))
        elif cat in DEVICE_CATEGORIES:
            start = float(event["ts"])
            end = start + float(event.get("dur", 0))
            scan.device.append((start, end))
            if cat == "kernel":
                scan.kernels.append((start, end, event.get("name", "")))
                if scan.device_id is None:
                    scan.device_id = event.get("args", {}).get("device")
            elif cat == "gpu_memcpy":
                name = event.get("name", "")
                if "HtoD" in name:
                    scan.h2d.append((start, end, "Pageable" in name))
    return scan


def _main_thread(scan: _Scan) -> tuple[tuple[Any, Any] | None, list[Interval]]:
    """The main thread and its step spans (none: the thread of an optimizer step, else the busiest)."""
    if scan.step_spans:
        main = max(scan.step_spans, key=lambda thread: len(scan.step_spans[thread]))
        return main, scan.step_spans[main]
    marked = [thread for _, _, _, thread in scan.optimizer]
    if marked:
        return marked[0], []
    if scan.host:
        return max(scan.host, key=lambda thread: len(scan.host[thread])), []
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


def _top_level_ops(host: list[tuple[float, float, str, int]]) -> list[tuple[float, float, str]]:
    """The operators of ``host`` (sorted by start, longest first) inside no other operator."""
    return _outermost([(start, end, name) for start, end, name, kind in host if kind == _OP])


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


def _update_ops(
    host: list[tuple[float, float, str, int]], top_level: list[tuple[float, float, str]], update_parts: list[Interval]
) -> tuple[int, bool]:
    """Top-level operators starting in the update parts, and whether any operator there is multi-tensor."""
    if not update_parts:
        return 0, False
    count = sum(1 for start, _, _ in top_level if _inside(start, update_parts))
    multi_tensor = any(
        kind == _OP and ("_foreach_" in name or "fused" in name) and _inside(start, update_parts)
        for start, _, name, kind in host
    )
    return count, multi_tensor


def _device_fields(scan: _Scan, steps: _Steps) -> dict[str, Any]:
    busy = _union(scan.device)
    kernels = _starting_inside(sorted(scan.kernels), steps.ranges)
    all_kernels = _union([(start, end) for start, end, _ in scan.kernels])
    fp32 = {name: is_fp32_gemm(name) for name in {name for _, _, name in kernels}}
    h2d = _union([(start, end) for start, end, _ in scan.h2d])
    syncs = _top_level_syncs(scan.syncs, steps)
    return {
        "device_busy": steps.time(busy),
        "kernels_per_step": steps.per_step(len(kernels)),
        "median_kernel_time": _median([end - start for start, end, _ in kernels]) * _US,
        "kernel_time": steps.mean(sum(end - start for start, end, _ in kernels)),
        "fp32_gemm_time": steps.mean(sum(end - start for start, end, name in kernels if fp32[name])),
        "h2d_time": steps.time(h2d),
        "h2d_exposed_time": steps.time(_subtract(h2d, all_kernels)),
        "h2d_pageable": any(pageable for start, _, pageable in scan.h2d if steps.hold(start)),
        "syncs_per_step": steps.per_step(len(syncs)),
        "sync_idle_time": steps.time(_subtract(_union(syncs), busy)),
    }


def _top_level_syncs(syncs: dict[tuple[Any, Any], list[Interval]], steps: _Steps) -> list[Interval]:
    """Sync spans starting in the steps and inside no other sync span of their thread."""
    return [
        span
        for spans in syncs.values()
        for span in _outermost(sorted(spans, key=lambda span: (span[0], -span[1])))
        if steps.hold(span[0])
    ]


def _communication(scan: _Scan, steps: _Steps) -> dict[str, float | None]:
    nccl = [(start, end) for start, end, name in scan.kernels if COMMUNICATION_KERNEL_MARK in name]
    if nccl:
        communication = _union(nccl)
        compute = _union(
            [(start, end) for start, end, name in scan.kernels if COMMUNICATION_KERNEL_MARK not in name]
        )
        return {
            "communication_time": steps.time(communication),
            "communication_exposed_time": steps.time(_subtract(communication, compute)),
        }
    if scan.collectives:
        host_time = steps.time(_union(scan.collectives))
        return {"communication_time": host_time, "communication_exposed_time": host_time}
    return {"communication_time": None, "communication_exposed_time": None}


def _device_properties(trace: dict[str, Any], device_id: Any) -> dict[str, Any]:
    """Name and tensor cores of the device the kernels ran on (else the first listed)."""
    properties = [p for p in trace.get("deviceProperties") or () if isinstance(p, dict)]
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


def _intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The time in both of two merged interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


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


def _length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _inside(point: float, merged: Sequence[Interval]) -> bool:
    """Whether ``point`` lies in one of the merged intervals (start included, end not)."""
    i = bisect_right(merged, (point, float("inf"))) - 1
    return i >= 0 and point < merged[i][1]


def _count_inside(sorted_points: Sequence[float], merged: Sequence[Interval]) -> int:
    return sum(bisect_left(sorted_points, end) - bisect_left(sorted_points, start) for start, end in merged)


def _starting_inside(
    items: Sequence[tuple[float, float, str]], merged: Sequence[Interval]
) -> list[tuple[float, float, str]]:
    """The items (sorted by start) that start in one of the merged intervals."""
    starts = [item[0] for item in items]
    return [item for start, end in merged for item in items[bisect_left(starts, start) : bisect_left(starts, end)]]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
