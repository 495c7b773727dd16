"""
Collectives
===========

A window's collective communication, per kind and process group (:func:`collective_stats`): calls per step,
bytes, time, algorithm and bus bandwidth, and the share of their time that no compute overlapped.

Where they come from:

- On a GPU, each NCCL kernel is one call, timed by its duration on its stream; its exposed time is what of it
  no other (compute) kernel overlaps. Kineto describes the collective on the kernel (torch >= 2.1):
  ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``Group size``, ``dtype`` and the process group's
  name and description; an older trace's kernels are told apart by their names (``ncclKernel_AllReduce_...``:
  ``allreduce``), with no group (the world: ``distributedInfo``'s ``world_size``) and no bytes.
- Without NCCL kernels (gloo on CPU), each of gloo's own spans on its worker threads (``gloo:all_reduce``) is a
  call, timed by its duration and counted as exposed, as in :mod:`~lightning_perf.summarize.step_summary`;
  the group is the whole world (``distributedInfo``'s ``world_size``). torch 2.13 records no sizes for gloo
  (no ``record_param_comms``; ``c10d::allreduce_`` has its tensors' shapes with ``record_shapes=True`` but no
  dtype), so there are no bytes and no bandwidths.

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``): a call moves ``S`` bytes, the larger of its input and
output (an all-gather's output, a reduce-scatter's input); the *algorithm bandwidth* is ``S / time`` and the
*bus bandwidth* that times the kind's factor for ``n`` ranks (:data:`BUS_FACTORS`), which makes different kinds
comparable with the link's peak. ``wait`` records (a ``Work.wait()``) are no collectives and are left out.

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_perf.records import CollectiveStats
from lightning_perf.summarize.events import Complete, KinetoTrace, distributed_info
from lightning_perf.summarize.index import COMPLETE_TYPES, TraceIndex
from lightning_perf.summarize.intervals import length_within, union
from lightning_perf.summarize.kernels import COMMUNICATION_KERNEL_MARK

#: nccl-tests' bus bandwidth factors (``doc/PERFORMANCE.md``), by the kind's name with ``_`` removed, for
#: ``n`` ranks: what each rank's link carries for ``S`` bytes, over ``S``.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}

#: Bytes per element of the ``dtype`` names Kineto writes (c10's ``ScalarType`` names).
DTYPE_BYTES = {
    **dict.fromkeys(("Double", "Long", "ComplexFloat"), 8),
    **dict.fromkeys(("Float", "Int", "UInt32", "ComplexHalf"), 4),
    **dict.fromkeys(("Half", "BFloat16", "Short", "UInt16"), 2),
    **dict.fromkeys(("Byte", "Char", "Bool", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz"), 1),
    "ComplexDouble": 16,
}

_NOT_COLLECTIVES = {"wait"}  # Work.wait(): recorded with a Collective name, moves nothing
_BACKEND_PREFIXES = ("gloo:",)  # gloo's own span of a collective, on its worker thread
_KERNEL_KIND = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")  # ncclKernel_AllReduce_RING_LL_Sum_float(...)


def bus_factor(kind: str, ranks: int) -> float | None:
    """nccl-tests' factor of ``kind`` (any spelling: ``_allgather_base``, ``reduce_scatter_tensor``, ``all_to_all``)
    for ``ranks`` ranks; ``None`` for another kind or fewer than one rank."""
    plain = kind.replace("_", "").lower()
    for name, factor in BUS_FACTORS.items():
        if plain.startswith(name) or (name in ("allgather", "reducescatter", "alltoall") and name in plain):
            return factor(ranks) if ranks >= 1 else None
    return None


def message_bytes(args: Any) -> int | None:
    """``S`` of one call: the larger of its input and output elements times its ``dtype``'s bytes."""
    size = DTYPE_BYTES.get(args.dtype) if isinstance(args.dtype, str) else None
    counts = [n for n in (args.in_nelems, args.out_nelems) if isinstance(n, int | float) and n >= 0]
    return int(max(counts) * size) if size is not None and counts else None


def collective_stats(trace: KinetoTrace) -> tuple[CollectiveStats, ...]:
    """The window's collectives per kind and process group, the most time first (see the module docstring)."""
    # The trace's index (built once for the step summary and the operator table) holds its device events and
    # ProfilerStep#N spans sorted out: no pass over the 10^5 events here, but for gloo's spans.
    index = TraceIndex.of(trace)
    steps = max(sum(e.cat == "user_annotation" for spans in index.steps.values() for e in spans), 1)
    nccl: list[Complete] = []
    others: list[Complete] = []
    for e in index.device:
        if e.cat == "kernel":
            (nccl if COMMUNICATION_KERNEL_MARK in e.name.lower() else others).append(e)
    ranks = _world_size(trace)  # where a call does not say its group's size
    if nccl:
        compute = union((e.ts, e.ts + e.dur) for e in others)
        calls = [
            _Call(kind, e.args, e.dur, e.dur - length_within(compute, [(e.ts, e.ts + e.dur)]), ranks)
            for e in nccl
            if (kind := _kernel_kind(e)) is not None
        ]
        return _grouped(calls, steps, on_device=True)
    spans = [  # gloo's: any category but a GPU annotation's
        e
        for e in trace.traceEvents
        if type(e) in COMPLETE_TYPES and e.name.startswith(_BACKEND_PREFIXES) and e.cat != "gpu_user_annotation"
    ]
    calls = [_Call(e.name.split(":", 1)[1], None, e.dur, e.dur, ranks) for e in spans]
    return _grouped(calls, steps, on_device=False)


@dataclass(frozen=True)
class _Call:
    kind: str
    args: Any  # the event's args where they describe it (a kernel's), else None
    time: float  # microseconds
    exposed: float
    ranks: int = 1


def _kernel_kind(kernel: Complete) -> str | None:
    """A collective kernel's kind: its ``Collective name``, else read from its name (``ncclKernel_AllReduce_...``,
    ``ncclDevKernel_SendRecv(...)``: ``allreduce``, ``sendrecv``); ``None`` for a ``wait``."""
    kind = kernel.args.collective
    if not (isinstance(kind, str) and kind):
        match = _KERNEL_KIND.search(kernel.name)
        kind = match.group(1).lower() if match else kernel.name.split("(")[0]
    return None if kind in _NOT_COLLECTIVES else kind


def _world_size(trace: KinetoTrace) -> int:
    size = distributed_info(trace).get("world_size")
    return size if isinstance(size, int) and size >= 1 else 1


def _grouped(calls: list[_Call], steps: int, *, on_device: bool) -> tuple[CollectiveStats, ...]:
    groups: dict[tuple[str, str, int], list[_Call]] = {}
    for call in calls:
        args, group, ranks = call.args, "", call.ranks
        if args is not None:
            group = next((g for g in (args.group_desc, args.group_name) if isinstance(g, str) and g), "")
            ranks = int(args.group_size) if isinstance(args.group_size, int | float) else ranks
        groups.setdefault((call.kind, group, ranks), []).append(call)
    stats = []
    for (kind, group, ranks), members in groups.items():
        sizes = [message_bytes(call.args) if call.args is not None else None for call in members]
        total = None if None in sizes else sum(s for s in sizes if s is not None)
        seconds = sum(call.time for call in members) * 1e-6
        algorithm = total / seconds if total is not None and seconds > 0 else None
        factor = bus_factor(kind, ranks)
        stats.append(
            CollectiveStats(
                kind=kind,
                group=group,
                ranks=ranks,
                calls=len(members),
                per_step=len(members) / steps,
                bytes=total,
                seconds=seconds,
                exposed_seconds=sum(call.exposed for call in members) * 1e-6,
                on_device=on_device,
                algorithm_bandwidth=algorithm,
                bus_bandwidth=algorithm * factor if algorithm is not None and factor is not None else None,
            )
        )
    return tuple(sorted(stats, key=lambda s: (-s.seconds, s.kind, s.group)))
