"""
Profiling cost
==============

What a stage epoch's profiling cost the run, measured at its end from its own batches: each window's
``cost_seconds`` (:func:`~lightning_perf.budget.window_costs`), and the whole charged to the run's
:class:`~lightning_perf.budget.ProfilingBudget`, whose running total the report keeps under ``run.profiling``.
The windows' closes and the waits for their processing are charged as they happen
(:class:`~lightning_perf.hooks.profiler_windows.ProfilerWindows`); what is charged here is the batches'.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from lightning_perf.budget import ProfilingBudget, ProfilingCost, excess_time, window_costs
from lightning_perf.collect.steps import StepClock
from lightning_perf.records import CompileStats, WindowRecord


def cost_epoch(
    budget: ProfilingBudget,
    windows: list[WindowRecord],
    stage: str,
    epoch: int,
    clock: StepClock,
    compiled: CompileStats | None,
    median: float,
    waited: float,
) -> None:
    """Sets the ``cost_seconds`` of the stage epoch's records in ``windows`` (in place) and charges the epoch's
    batches of ours (run profiled, counted, or after a close while a trace was processed; not those that
    compiled: torch.compile's) beyond the epoch's ``median`` step to ``budget``; ``waited``: the epoch's end
    waited that long for its windows' processing. A window's warm-up batches are its own
    (``budget.warmup``)."""
    compiling = set(compiled.steps) if compiled is not None else set()
    ours = sorted(({i for i, profiled in enumerate(clock.profiled) if profiled} | set(clock.after_close)) - compiling)
    steps = [wait + work for wait, work in zip(clock.data_wait, clock.compute, strict=False)]
    budget.charge(excess_time(steps, ours, median))
    mine = [i for i, w in enumerate(windows) if w.stage == stage and w.epoch == epoch]
    if not mine:
        return
    costed, _ = window_costs([windows[i] for i in mine], steps, ours, median, warmup=budget.warmup, waited=waited)
    by_name = {w.name: w for w in costed}
    for i in mine:
        windows[i] = by_name[windows[i].name]


def profiling_report(budget: ProfilingBudget) -> dict[str, Any]:
    """The run's profiling cost so far as the report's ``run.profiling``: ``budget`` (a share, or ``None``),
    ``seconds``, ``run_seconds``, ``share`` (of the run's wall time), ``windows`` and ``skipped``."""
    cost = budget.cost(time.perf_counter())
    # Field by field: dataclasses.asdict deep-copies (0.037 ms a call against 0.006, at every epoch end).
    return {**{f.name: getattr(cost, f.name) for f in FIELDS}, "share": cost.share}


FIELDS = dataclasses.fields(ProfilingCost)
