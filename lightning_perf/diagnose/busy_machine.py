"""
A busy machine
==============

What a busy machine (``cpu_contention``: :mod:`~lightning_perf.diagnose.contention`) does to the epoch's other
findings, and how the story is told on one screen.

From ``cpu_contention`` on (:func:`measured_while_busy`), the findings of the :data:`TIME_SHARE_RULES` that the
waiting may explain (judged on CPU time, they would not fire: :func:`_explained`) are information only, their
evidence opening with "measured while the machine was busy": no change to the program would remove it. Those
that measure more (a callback that sleeps, a periodic stall, a rank whose own work differs beyond its wait) keep
their severity, their evidence opening with "kept on a busy machine ..., as" what holds on CPU time; and
``cpu_contention``'s advice names both (:func:`told`): it said "the epoch's other time-share findings ... are
information only" beside a critical ``dataloader_bound`` and a ``framework_overhead`` warning.

``dataloader_bound`` judges itself (in :mod:`~lightning_perf.diagnose.rules_data`, with :func:`busy_share`,
:func:`busy_note` and :func:`kept_note`), on the part of the data wait spent off the CPU, neither running nor
queued for a CPU (``EpochSummary.loading_cpu_share`` and ``loading_queue_share``: a dataset that sleeps, reads a
disk or the network), which contention does not explain: where that part alone reaches ``dataloader_warning``,
the finding keeps a severity set by it, so that a real bottleneck is still found on a busy machine (measured: a
dataset sleeping 2 ms per item, 16 a batch, beside two CPU burners on 2 CPUs waited 87-96% of the step, 30-40%
of the step neither running nor queued).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

from lightning_perf.diagnose.contention import lockstep_waits, own_wait, wait_share
from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import on_cpu, reaches
from lightning_perf.diagnose.rules_unstable import slow_cadence
from lightning_perf.diagnose.thresholds import SCHED_SLICE, Thresholds
from lightning_perf.records import TraceSummary
from lightning_perf.units import percent

# The rules whose measure is a share of host time that waiting for a CPU inflates, and that do not judge on-CPU
# time themselves (dataloader_bound does: lightning_perf.diagnose.rules_data).
TIME_SHARE_RULES = frozenset(
    {
        "framework_overhead",
        "step_time_unstable",
        "optimizer_heavy",
        "launch_bound",
        "cpu_threads",
        "communication_bound",
        "rank_straggler",
    }
)


def busy_share(ctx: StageEpoch, t: Thresholds, *, ranks: bool = False) -> float | None:
    """The share of the epoch the training thread waited for a CPU (``ranks``: the steps, over every rank:
    :func:`~lightning_perf.diagnose.contention.wait_share`), where it reaches ``cpu_contention``; else ``None`` (a
    quiet machine, or not measured). ``dataloader_bound`` reads rank zero's own: its data wait is its own."""
    share = wait_share(ctx) if ranks else own_wait(ctx.epoch)
    return share if share is not None and reaches(share, t.cpu_contention) else None


def busy_note(share: float, *, ranks: bool = False) -> str:
    """The evidence's opening for a finding that waiting for a CPU may explain (``ranks``: any rank's wait,
    :func:`~lightning_perf.diagnose.contention.wait_share`)."""
    waited = f"{_who(ranks)} waited for a CPU {percent(share)} of the epoch"
    return f"{BUSY_NOTE} ({waited}: see `cpu_contention`), which may explain it; "


def kept_note(share: float, why: str, *, ranks: bool = False) -> str:
    """The evidence's opening for a finding that keeps its severity on a busy machine, and ``why``: what holds on
    CPU time (``ranks``: any rank's wait, :func:`~lightning_perf.diagnose.contention.wait_share`)."""
    return f"{KEPT_NOTE} ({_who(ranks)} waited for a CPU {percent(share)} of the epoch), as {why}; "


def _who(ranks: bool) -> str:
    return "some rank's training thread" if ranks else "the training thread"


def told(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` (an epoch's, judged: :func:`measured_while_busy`), with ``cpu_contention``'s advice naming the
    findings the busy machine made information, and those that keep their severity (their evidence says why):
    one story on one screen."""
    demoted = [f.id for f in findings if f.severity == "info" and BUSY_NOTE in f.evidence]
    kept = [f.id for f in findings if f.severity != "info" and KEPT_NOTE in f.evidence]
    if not demoted and not kept:
        return list(findings)
    parts = []
    if demoted:
        parts.append(
            f"Measured while the machine was busy, this epoch's {_names(demoted)} {_are(demoted)} information only"
        )
    if kept:
        one = len(set(kept)) == 1
        holds = "keeps its severity" if one else "keep their severity"
        parts.append(f"{_names(kept)} {holds}: no wait for a CPU explains {'it' if one else 'them'} (see the evidence)")
    sentence = "; ".join(parts) + "."
    sentence = sentence[0].upper() + sentence[1:]
    return [
        dataclasses.replace(f, advice=f"{f.advice} {sentence}") if f.id == "cpu_contention" else f for f in findings
    ]


def _names(ids: Sequence[str]) -> str:
    named = [f"`{i}`" for i in dict.fromkeys(ids)]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + f" and {named[-1]}"


def _are(ids: Sequence[str]) -> str:
    return "is" if len(set(ids)) == 1 else "are"


def measured_while_busy(findings: Sequence[Finding], ctx: StageEpoch, t: Thresholds) -> list[Finding]:
    """``findings`` as they stand on a busy machine (see the module's docstring): on an epoch whose training
    thread waited for a CPU ``cpu_contention`` of the time or more, the findings of the :data:`TIME_SHARE_RULES`
    above info that the waiting may explain (:func:`_explained`) become information, with what was measured."""
    share = busy_share(ctx, t, ranks=True)
    if share is None:
        return list(findings)
    ranks = bool(lockstep_waits(ctx))
    judged = []
    for f in findings:
        if f.id not in TIME_SHARE_RULES or f.severity == "info":
            judged.append(f)
        elif _explained(f, ctx, t):
            judged.append(dataclasses.replace(f, severity="info", evidence=busy_note(share, ranks=ranks) + f.evidence))
        else:
            note = kept_note(share, _holds(f, ctx, t), ranks=ranks)
            judged.append(dataclasses.replace(f, evidence=note + f.evidence))
    return judged


def _holds(f: Finding, ctx: StageEpoch, t: Thresholds) -> str:
    """Why ``f``, a finding of the :data:`TIME_SHARE_RULES` that waiting for a CPU does not explain
    (:func:`_explained`), holds on CPU time."""
    if f.id == "rank_straggler":
        return "the ranks' own work per step differs beyond their waits for a CPU"
    if f.id == "step_time_unstable":
        if slow_cadence(ctx, t) is not None:
            return "its slow steps fall on a cadence, which no busy machine keeps"
        return "its slowest steps took longer beyond the median than the wait for a CPU explains"
    return (
        "what it measures, less the training thread's wait for a CPU while its window recorded, still reaches its"
        " threshold"
    )


def _explained(f: Finding, ctx: StageEpoch, t: Thresholds) -> bool:
    """Whether waiting for a CPU may explain ``f``: judged on CPU time, it would not reach its rule's threshold.

    Notes:
        1. A window's finding (``framework_overhead``, ``optimizer_heavy``, a CPU ``launch_bound``): of its measured
           time per step, what waiting for a CPU cannot hold (less the time the training thread waited for one per
           step while that window recorded, ``TraceSummary.cpu_wait_time``: :func:`~lightning_perf.diagnose.
           rule_helpers.on_cpu`), over the step less that wait, is below the rule's threshold, or that part is
           below the rule's time per step or the wait itself. Python between operators that took its time only
           because the thread waited for a CPU is explained; what is left beyond the wait, and at least as long,
           is not.
        2. ``step_time_unstable``: the step time's spread (p90 over the median) within :data:`STALL_SLICES`
           times the mean wait for a CPU per step, or a scheduler slice (:data:`SCHED_SLICE`) where that is more:
           a busy machine delays a step by a slice or a few; or the epoch's wait at least what its slowest tenth
           of steps took beyond the median (a wait held by a few steps, preempted for whole slices: beside two
           CPU burners a 22-ms step read p90 2.06x at a 26% wait). Not where the slow steps fall on a cadence
           (:func:`~lightning_perf.diagnose.rules_unstable.slow_cadence`): a stall every 8 batches is the
           program's. Under several ranks the wait is any rank's
           (:func:`~lightning_perf.diagnose.contention.wait_share`): a step waits for all.
        3. ``rank_straggler``: judged on each rank's work less its own wait for a CPU
           (:func:`_straggler_explained`).
        4. Where the wait was not measured, or for a measure that is no time (``cpu_threads``): explained.
    """
    if f.id == "rank_straggler":
        return _straggler_explained(ctx, t)
    if f.id == "step_time_unstable":
        epoch = ctx.epoch
        if slow_cadence(ctx, t) is not None:
            return False  # slow steps every N batches are the program's, busy machine or not
        share, batches = wait_share(ctx) or 0.0, max(epoch.measured_batches, 1)
        waited = share * epoch.step_time  # the epoch's steps' wait for a CPU, all of it
        spread = epoch.step_time_p90 - epoch.step_time_p50
        tail = math.ceil(batches / 10)  # the steps at or above p90
        return spread <= STALL_SLICES * max(waited / batches, SCHED_SLICE) or tail * spread <= waited
    window = next((w for w in ctx.windows if w.window == f.window), None)
    measure = _WINDOW_MEASURES.get(f.id)
    if window is None or measure is None or window.cpu_wait_time is None:
        return True
    if f.id == "launch_bound" and ctx.facts.device != "cpu":
        return True
    threshold, min_time = (getattr(t, name) for name in _THRESHOLDS[f.id])
    real, on_cpu_step = on_cpu(measure(window), window)
    # What is left beyond the wait must also reach the wait itself, and its rule's time per step once the busy
    # machine's slowdown on the CPU is taken out (BUSY_SLOWDOWN).
    waited = min(window.cpu_wait_time, window.step_time)
    return on_cpu_step <= 0 or real < max(min_time * BUSY_SLOWDOWN, waited) or real / on_cpu_step < threshold


def _straggler_explained(ctx: StageEpoch, t: Thresholds) -> bool:
    """Whether the ranks' waits for a CPU may explain ``rank_straggler``: each rank's own work per step less its
    mean wait for a CPU per step (``StageEpoch.rank_cpu_waits`` over the epoch's mean step), so judged on CPU time,
    would not reach the rule's thresholds. Identical ranks on a busy machine read 1.30-1.40x, a different rank
    each run. Where a rank's wait was not measured: explained (:func:`_explained`, Notes 3)."""
    works, waits = ctx.rank_step_times or {}, ctx.rank_cpu_waits or {}
    if len(works) < 2 or any(rank not in waits for rank in works):
        return True
    step = ctx.epoch.step_time / max(ctx.epoch.measured_batches, 1)
    on_cpu = {rank: max(work - waits[rank] * step, 0.0) for rank, work in works.items()}
    median, slowest = statistics.median(on_cpu.values()), max(on_cpu.values())
    excess = slowest - median
    p50 = ctx.epoch.step_time_p50
    return (
        median <= 0
        or slowest / median < t.rank_straggler
        or excess < t.rank_straggler_min_time
        or (p50 > 0 and excess / p50 < t.rank_straggler_cost)
    )


def idle_time(seconds: float, busy: float) -> float:
    """The least ``seconds`` of host time measured while the training thread waited for a CPU ``busy`` of the
    epoch could be on an idle machine: less the wait (spread evenly), and less :data:`BUSY_SLOWDOWN`."""
    return seconds * max(0.0, 1.0 - busy) / BUSY_SLOWDOWN


# The evidence's openings of a finding made information on a busy machine, and of one that keeps its severity there
# (told() finds them by these).
BUSY_NOTE = "measured while the machine was busy"
KEPT_NOTE = "kept on a busy machine"
# A busy machine slows a thread on its CPU too (shared caches, a busy SMT sibling), not only by the wait for one.
# Measured on this project's 2-CPU machine beside two burners: an in-memory MLP's Python between operators,
# 0.8 ms a step idle, 1.1-1.5 ms beyond the wait for a CPU (1.4-1.9x); Intel quotes up to 2x per SMT thread.
BUSY_SLOWDOWN = 2.0
# A busy machine delays a step by a scheduler slice or a few (Linux's CFS: a few ms each); our judgment.
STALL_SLICES = 3
# What a window's time-share finding measures per step, and the threshold its rule fires at.
_WINDOW_MEASURES: dict[str, Callable[[TraceSummary], float]] = {
    "framework_overhead": lambda w: w.framework_time,
    "optimizer_heavy": lambda w: w.optimizer_update_time,
    "launch_bound": lambda w: w.tiny_op_time or 0.0,
}
# The thresholds its rule fires at: the share of the step, and the time per step.
_THRESHOLDS = {
    "framework_overhead": ("framework_overhead", "framework_min_time"),
    "optimizer_heavy": ("optimizer_update", "optimizer_min_time"),
    "launch_bound": ("launch_cpu_tiny_ops", "launch_cpu_min_time"),
}
