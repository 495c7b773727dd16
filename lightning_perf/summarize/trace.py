"""
Trace summaries
===============

Operator statistics computed from a Kineto trace in one lean pass over its events: the same numbers
``torch.profiler``'s ``key_averages()`` gives (calls, self/total CPU time, self/total device time, self
memory, input shapes), without building its ``FunctionEvent`` objects, which take seconds on a trace of
tens of thousands of events. It works on any Kineto JSON, ours or not, so the callback and (later) the
offline CLI share it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_perf.records import OperatorStat

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
    by_thread: dict[tuple[Any, Any], list[tuple[float, int, dict[str, Any]]]] = defaultdict(list)
    has_device = False
    for event in events:
        ph, cat = event.get("ph"), event.get("cat")
        if ph == "X" and cat in HOST_OP_CATEGORIES:
            name = event.get("name", "")
            if not name.startswith("ProfilerStep#"):
                # Sort key: start, then longer first, so a parent precedes a child that starts with it.
                by_thread[(event.get("pid"), event.get("tid"))].append((float(event["ts"]), 0, event))
        elif ph == "X" and cat in DEVICE_CATEGORIES:
            has_device = True
            external_id = event.get("args", {}).get("External id")
            if external_id is not None:
                device_by_external_id[external_id] += float(event.get("dur", 0))
        elif ph == "i" and event.get("name") == MEMORY_EVENT_NAME:
            by_thread[(event.get("pid"), event.get("tid"))].append((float(event["ts"]), 1, event))

    totals: dict[tuple[str, str | None], _Totals] = defaultdict(_Totals)
    for items in by_thread.values():
        items.sort(key=lambda item: (item[0], item[1], -float(item[2].get("dur", 0))))
        _nest(items, device_by_external_id, group_by_input_shape, totals)

    has_memory = "profile_memory" in trace or any(e.get("name") == MEMORY_EVENT_NAME for e in events)
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
    items: Iterable[tuple[float, int, dict[str, Any]]],
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

    for ts, is_memory, event in items:
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
