"""
Step breakdown
==============

Where a profiled step's time went, in the five parts the PyTorch Profiler tab's Overview shows (data
loading, CPU execution, device busy, communication, other), from a window's
:class:`~lightning_perf.records.TraceSummary`: :func:`step_breakdown`. Pure: no torch, no Plotly.
"""

from __future__ import annotations

from lightning_perf.records import TraceSummary

DATA_LOADING = "data loading"
CPU_EXECUTION = "CPU execution"
DEVICE_BUSY = "device busy"
COMMUNICATION = "communication"
OTHER = "other"
PARTS = (DEVICE_BUSY, COMMUNICATION, DATA_LOADING, CPU_EXECUTION, OTHER)
"""The parts, in the order :func:`step_breakdown` returns them (the Overview's priority order)."""

DESCRIPTIONS = {
    DEVICE_BUSY: "a kernel, copy or memset ran on the device (exposed communication left out)",
    COMMUNICATION: "collectives no compute kernel overlapped (NCCL kernels; gloo's host collectives)",
    DATA_LOADING: "the DataLoader's __next__ on the main thread",
    CPU_EXECUTION: "torch operators and annotations on the main thread, outside the DataLoader",
    OTHER: "Python outside any torch operator (the loop, hooks, callbacks, logging)",
}
"""What each part holds, for the page's table (the host's parts: while the device was idle and no collective
ran, where there is a device or a collective: see :func:`host_scale`)."""
HOST_PARTS = (DATA_LOADING, CPU_EXECUTION, OTHER)


def step_breakdown(summary: TraceSummary) -> list[tuple[str, float]]:
    """A profiled step's mean time as disjoint parts that add up to ``summary.step_time`` (seconds), like the
    step-time breakdown of the PyTorch Profiler tab's Overview.

    Parts with nothing to measure them are left out: ``device busy`` on a CPU run (``device_busy`` is
    ``None``), ``communication`` in a single-process run; the others are always there (possibly 0).

    Notes:
        1. The Overview gives each instant of a step to one category, device work first (kernels, copies,
           memsets), then communication, then the host's (DataLoader, CPU execution), then other. A
           :class:`~lightning_perf.records.TraceSummary` holds per-step means of interval unions, not the
           intervals, so the parts follow the same priority on those means.
        2. ``communication`` = ``communication_exposed_time``: NCCL kernels during which no compute kernel
           ran, or, without NCCL kernels, the host collectives' spans (gloo), all exposed.
        3. ``device busy`` = ``device_busy`` less ``communication`` (an exposed NCCL kernel is device
           activity, counted once, as communication; a gloo collective of a GPU run is assumed to lie in the
           device's busy time too, which the means cannot tell).
        4. The rest of the step, ``step_time - device busy - communication``, is host time while the device
           was idle. It is split over the main thread's parts in proportion to their lengths (the means do
           not say which host spans the device's work overlapped): ``data loading`` (``dataloader_time``),
           ``CPU execution`` (``host_op_time - dataloader_time``: operators and annotations outside the
           DataLoader) and ``other`` (``framework_time``: the step's time outside any host span, the Python of
           the loop, hooks, callbacks, logging). On a CPU run without collectives the three add up to the
           step as they are, and are shown unscaled.
        5. Every part is clamped to ``[0, step_time]``; where the host parts are all 0, the rest is ``other``.
    """
    total = max(summary.step_time, 0.0)
    parts: list[tuple[str, float]] = []
    communication = _clamp(summary.communication_exposed_time or 0.0, total)
    device = 0.0
    if summary.device_busy is not None:
        device = _clamp(summary.device_busy - communication, total - communication)
        parts.append((DEVICE_BUSY, device))
    if summary.communication_exposed_time is not None:
        parts.append((COMMUNICATION, communication))
    rest = max(total - device - communication, 0.0)
    host = _host_parts(summary)
    measured = sum(value for _, value in host)
    if measured <= 0:
        return [*parts, (DATA_LOADING, 0.0), (CPU_EXECUTION, 0.0), (OTHER, rest)]
    scale = rest / measured
    return [*parts, *((label, value * scale) for label, value in host)]


def _host_parts(summary: TraceSummary) -> list[tuple[str, float]]:
    """The host's parts as measured, before :func:`step_breakdown` scales them (its note 4)."""
    loading = max(summary.dataloader_time, 0.0)
    return [
        (DATA_LOADING, loading),
        (CPU_EXECUTION, max(summary.host_op_time - loading, 0.0)),
        (OTHER, max(summary.framework_time, 0.0)),
    ]


UNSCALED = 0.01
"""A scale within 1% of 1 is no scaling: a CPU run's host parts add up to its step up to rounding."""


def host_scale(summary: TraceSummary) -> float | None:
    """The factor :func:`step_breakdown` scales the host's parts by (note 4 there: the host's measured
    lengths into the time the device was idle and no collective ran), so that a page can say its ``data
    loading`` and ``other`` read shorter than the trace's DataLoader time and time outside torch operators;
    ``None`` where they are shown as measured (within :data:`UNSCALED`) or there is nothing to scale."""
    parts = dict(step_breakdown(summary))
    measured = sum(value for _, value in _host_parts(summary))
    if measured <= 0:
        return None
    scale = sum(parts[p] for p in HOST_PARTS) / measured
    return None if abs(scale - 1) < UNSCALED else scale


def _clamp(value: float, high: float) -> float:
    return min(max(value, 0.0), max(high, 0.0))
