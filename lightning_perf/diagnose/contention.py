"""
CPU contention
==============

A busy machine, as a finding of its own (``cpu_contention``), and what it does to the other findings.

The training thread's time waiting in the kernel's run queue for a CPU (``EpochSummary.cpu_wait_share``, from
``/proc/self/schedstat``) is time every host-side clock counts as work: the data wait of an in-memory
DataLoader, the Python between operators, an optimizer's kernels, a step's spread. On a 2-CPU machine with two
other CPU-bound processes it reached 50-90% of the epoch, and the other rules then blamed the program for it:
``dataloader_bound`` (critical) on an in-memory dataset, ``framework_overhead`` on a step with no hooks,
``step_time_unstable`` advising bucketing for fixed-size batches, ``optimizer_heavy`` on one fused kernel.

So, from ``cpu_contention`` on (:func:`measured_while_busy`), the findings of the :data:`TIME_SHARE_RULES` that
the waiting may explain (judged on CPU time, they would not fire: :func:`_explained`) are information only,
their evidence opening with "measured while the machine was busy": no change to the program would remove it.
Those that measure more (a callback that sleeps, a periodic stall) keep their severity.

**Several ranks** step in lockstep: every step ends at a collective (DDP's gradient all-reduce, FSDP's gathers),
so a rank preempted for a scheduler slice stalls every other at the next one, and the ranks' steps wait for a
CPU whenever any rank does (:func:`wait_share`), rank zero's own wait being only its part. Measured:
Lightning's ``BoringModel`` under ``ddp`` on 2 gloo ranks sharing 2 CPUs, 40 epochs: ``step_time_unstable``
warned in 6-8 of them (p90 1.9-2.4x of 3.7-5 ms steps, the same on both ranks) while rank zero alone waited
4.5-9.4% of each, under ``cpu_contention``'s threshold.

``dataloader_bound`` judges itself (in :mod:`~lightning_perf.diagnose.rules_data`, with :func:`busy_share` and
:func:`busy_note`), on the part of the data wait spent off the CPU, neither running nor queued for a CPU
(``1 - EpochSummary.loading_cpu_share`` of it: a dataset that sleeps, reads a disk or the network), which
contention does not explain: where that part alone reaches ``dataloader_warning``, the finding keeps a severity
set by it, so that a real bottleneck is still found on a busy machine (measured: a dataset sleeping 2 ms per
item beside two CPU burners on 2 CPUs waited 87% of the step, half of it off the CPU).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process, finding, on_cpu, reaches, stage_name
from lightning_perf.diagnose.rules_unstable import slow_cadence
from lightning_perf.diagnose.thresholds import SCHED_SLICE, Thresholds
from lightning_perf.records import TraceSummary
from lightning_perf.units import ms, percent, plural, seconds_or_ms

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
    }
)


def cpu_contention(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The training thread waited for a CPU: other threads or processes held the CPUs.

    Notes:
        1. Measures the share of the epoch's wall time the training thread was runnable but not running
           (``EpochSummary.cpu_wait_share``); Linux only.
        2. Fires at ``cpu_contention`` (warning), critical at ``cpu_contention_critical``.
        3. Evidence: the CPUs this process may use (affinity, cgroup quota) against the threads it runs (torch's
           intra-op threads on a CPU run, one feeding an accelerator, plus the DataLoader's workers).
        4. Advice: where those threads outnumber the CPUs, the change is the run's own (fewer torch threads,
           fewer workers); where the machine's other processes used less than :data:`OUTSIDE_LOAD` CPUs
           meanwhile (``EpochSummary.other_cpu_load``), the run's own threads held the CPUs (torch's
           intra-op threads spin after each operator: measured on 2 idle CPUs, a dataset sleeping 5 ms per
           sample under 2 torch threads left the training thread waiting 13% of the epoch, and
           ``torch.set_num_threads(1)`` made the fit 1.3x faster); else the load comes from outside the run,
           and the advice says so.
    """
    share = wait_share(ctx)
    if share is None or not reaches(share, t.cpu_contention):
        return None
    severity: Severity = "critical" if reaches(share, t.cpu_contention_critical) else "warning"
    facts = ctx.facts
    cpus = cpus_per_process(facts)
    threads = (facts.torch_threads or 1) if facts.device == "cpu" else 1
    workers = facts.num_workers or 0
    wall = ctx.epoch.wall_time
    evidence = [
        _waited(ctx, share)
        + (f" ({seconds_or_ms(share * wall)} of {seconds_or_ms(wall)})" if wall else "")
        + f" (warning >= {percent(t.cpu_contention)}, critical >= {percent(t.cpu_contention_critical)})",
        _cpus(facts.cpu_count, facts.cpu_quota, cpus, facts.world_size > 1),
        f"the process runs {plural(threads, 'torch thread' if facts.device == 'cpu' else 'thread')} and"
        f" {plural(workers, 'DataLoader worker')}",
    ]
    outside = load_is_outside(ctx)  # None: cannot tell
    if ctx.epoch.other_cpu_load is not None:
        evidence.append(
            f"other processes on the machine used {ctx.epoch.other_cpu_load:.1f} CPUs meanwhile"
            + ("" if outside is not None else f" (too short to tell from none: {TICKS_NOTE})")
        )
    busy = outside is True
    oversubscribed = cpus is not None and threads + workers > cpus
    if oversubscribed:
        assert cpus is not None
        fit = max(cpus - workers, 1)
        advice = [
            f"The run oversubscribes its CPUs: {threads} + {workers} busy threads on {plural(cpus, 'CPU')} take turns."
            f" Call `torch.set_num_threads({fit})` before training (e.g. at the top of the script or in"
            " `LightningModule.setup`)"
            + (f", or lower `DataLoader(num_workers=...)` below {workers}" if workers else "")
            + ", and compare the runs with `lightning-perf compare`."
        ]
    elif busy:
        advice = [
            _OUTSIDE_ADVICE.format(threads=plural(threads + workers, "busy thread"), cpus=plural(cpus or 1, "CPU"))
        ]
    else:
        unknown = None if outside is not None else LOAD_NOTE if ctx.epoch.other_cpu_load is not None else UNMEASURED
        advice = [_own_threads_advice(threads, workers, facts.device, unknown=unknown)]
    waited = share * (wall or 0.0) / max(ctx.epoch.batches, 1)
    if not busy and not oversubscribed and wall and waited < OWN_MIN_WAIT:
        severity = "info"
        evidence.append(f"{ms(waited)} a batch: below {ms(OWN_MIN_WAIT)}, fewer threads would cost more than they save")
    why = (
        "the machine is busy"
        if busy
        else "the run's own threads crowd it"
        if oversubscribed or outside is not None
        else ""
    )
    return finding(
        ctx,
        "cpu_contention",
        severity,
        f"{stage_name(ctx.stage)} waited for a CPU {percent(share)} of the time" + (f": {why}" if why else ""),
        evidence,
        advice,
    )


def wait_share(ctx: StageEpoch) -> float | None:
    """The share of the epoch the run's steps waited for a CPU: the training thread's own wait; under several
    ranks in lockstep, the share during which any rank's did, were their waits independent: ``1 - prod(1 - w)``
    over rank zero's own and each other rank's from :data:`LOCKSTEP_FLOOR` (the module's docstring). ``None``
    where rank zero's own was not measured.

    Notes:
        1. Not the largest rank's: a step waits for whichever rank was preempted in it, and preemptions of a
           scheduler slice (those that make steps unstable) seldom fall in the same step on two ranks; the
           largest rank's is the least the steps waited, their sum the most (2 ranks at 8% and 15%: 15%, 22%,
           23%).
        2. The other ranks' waits are this epoch's, where rank zero's own may be over several short epochs
           judged together (``StageEpoch.pooled_epochs``): a share of each one's wall time either way.
        3. In lockstep: training (the gradients' all-reduce or reduce-scatter every step), and any stage of a
           strategy that gathers sharded parameters for each forward (:data:`SHARDED`). DDP's validation, test
           and predict steps meet no collective: each rank's wait is its own.
    """
    own = ctx.epoch.cpu_wait_share
    others = _other_waits(ctx)
    if own is None or not others:
        return own
    running = 1.0 - own
    for wait in others:
        running *= 1.0 - min(wait, 1.0)
    return 1.0 - running


def _other_waits(ctx: StageEpoch) -> list[float]:
    """The other ranks' waits that :func:`wait_share` adds to rank zero's own: none outside lockstep (its Notes
    3), and none under :data:`LOCKSTEP_FLOOR`."""
    if ctx.stage != "train" and not any(s in (ctx.facts.strategy or "") for s in SHARDED):
        return []
    return [w for rank, w in (ctx.rank_cpu_waits or {}).items() if rank != 0 and w >= LOCKSTEP_FLOOR]


def _waited(ctx: StageEpoch, share: float) -> str:
    """Evidence: how long the epoch's steps waited for a CPU, and on which rank (:func:`wait_share`)."""
    if not _other_waits(ctx):
        return f"the training thread waited for a CPU {percent(share)} of the epoch"
    ranks = ", ".join(f"rank {r} {percent(w)}" for r, w in sorted((ctx.rank_cpu_waits or {}).items()))
    return (
        f"some rank's training thread waited for a CPU {percent(share)} of the epoch ({ranks}): a step ends at a"
        " collective, so each rank's wait stalls every rank"
    )


def load_is_outside(ctx: StageEpoch) -> bool | None:
    """Whether the epoch's wait for a CPU is the machine's other processes' doing: they used :data:`OUTSIDE_LOAD`
    CPUs or more, or at least as many CPUs as the training thread waited for, from :data:`OUTSIDE_FLOOR`.
    ``None`` where the measure cannot tell (not measured, or too short for its ticks: :data:`LOAD_TICK`)."""
    load, wall, cpus = ctx.epoch.other_cpu_load, ctx.epoch.wall_time, ctx.facts.cpu_count or 1
    if load is None or not wall:
        return None
    error = 2 * LOAD_TICK * cpus / wall  # each CPU's count, read twice, is off by up to a tick each time
    threshold = min(OUTSIDE_LOAD, max(ctx.epoch.cpu_wait_share or 0.0, OUTSIDE_FLOOR))
    if load - error >= threshold:
        return True
    return False if load + error < threshold else None


_OUTSIDE_ADVICE = (
    "The load comes from outside this run: its {threads} fit its {cpus}, yet the training thread waited for one,"
    " so other processes hold them. Free the CPUs (stop or `renice` the other work, or give the run CPUs of its"
    " own with `taskset` or a container's CPU limit), and time runs only on an idle machine."
)


def _own_threads_advice(threads: int, workers: int, device: str, *, unknown: str | None) -> str:
    """Advice where the machine's other processes were idle, or, where ``unknown`` says why, not known to be."""
    if unknown is not None:
        opening = (
            f"Whose load held the CPUs is not known ({unknown}). If other work runs on"
            " this machine, free its CPUs and time runs only on an idle one; else the run's own threads held"
            " them"
        )
    else:
        opening = "The machine's other processes were idle: the run's own threads held the CPUs"
    if device == "cpu" and threads > 1:
        return (
            f"{opening}. torch's {threads} intra-op threads keep spinning on their CPUs for a while after each"
            " parallel operator (OpenMP's wait policy), so a training thread that wakes from a wait (loading"
            f" data, a sleep, I/O) may find none free. Call `torch.set_num_threads({threads - 1})` before training"
            " (e.g. at the top of the script or in `LightningModule.setup`) and compare the runs with"
            " `lightning-perf compare`."
        )
    return (
        f"{opening} (the DataLoader's {plural(workers, 'worker')}, other callbacks' or loggers' threads, a compile"
        " worker pool). Look for threads that spin or poll (`top -H -p <pid>`), and compare runs with fewer of"
        " them (`lightning-perf compare`)."
    )


def _cpus(count: int | None, quota: float | None, per_process: int | None, shared: bool) -> str:
    if count is None:
        return ""
    where = f"this process may use {plural(count, 'CPU')}"
    if quota is not None:
        where += f" (its cgroup's quota is {quota:.1f} CPUs)"
    if shared and per_process is not None:
        where += f", {plural(per_process, 'CPU')} per process of the run on this node"
    return where


def busy_share(ctx: StageEpoch, t: Thresholds, *, ranks: bool = False) -> float | None:
    """The share of the epoch the training thread waited for a CPU (``ranks``: the steps, over every rank:
    :func:`wait_share`), where it reaches ``cpu_contention``; else ``None`` (a quiet machine, or not measured).
    ``dataloader_bound`` reads rank zero's own: its data wait is its own."""
    share = wait_share(ctx) if ranks else ctx.epoch.cpu_wait_share
    return share if share is not None and reaches(share, t.cpu_contention) else None


def busy_note(share: float, *, ranks: bool = False) -> str:
    """The evidence's opening for a finding that waiting for a CPU may explain (``ranks``: any rank's wait,
    :func:`wait_share`)."""
    waited = f"{_who(ranks)} waited for a CPU {percent(share)} of the epoch"
    return f"{BUSY_NOTE} ({waited}: see `cpu_contention`), which may explain it; "


def kept_note(share: float, why: str, *, ranks: bool = False) -> str:
    """The evidence's opening for a finding that keeps its severity on a busy machine, and ``why``: what holds on
    CPU time (``ranks``: any rank's wait, :func:`wait_share`)."""
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
        holds = "keeps its severity: what it measures holds" if one else "keep their severity: what they measure holds"
        parts.append(f"{_names(kept)} {holds} on CPU time (see {'its' if one else 'their'} evidence)")
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
    ranks = bool(_other_waits(ctx))
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
           program's. Under several ranks the wait is any rank's (:func:`wait_share`): a step waits for all.
        3. Where the wait was not measured, or for a measure that is no time (``cpu_threads``): explained.
    """
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


def idle_time(seconds: float, busy: float) -> float:
    """The least ``seconds`` of host time measured while the training thread waited for a CPU ``busy`` of the
    epoch could be on an idle machine: less the wait (spread evenly), and less :data:`BUSY_SLOWDOWN`."""
    return seconds * max(0.0, 1.0 - busy) / BUSY_SLOWDOWN


# The evidence's openings of a finding made information on a busy machine, and of one that keeps its severity there
# (told() finds them by these).
BUSY_NOTE = "measured while the machine was busy"
KEPT_NOTE = "kept on a busy machine"
# A rank whose training thread waited for a CPU less than this share of its epoch adds nothing to the ranks' wait
# (wait_share): on this project's idle 2-CPU machine a lone fit's training thread (one torch thread) waited
# 0.0-0.13% of each epoch (3 fits of the tests' TinyModel, 3 epochs each); over many ranks such waits would
# make a busy machine of an idle one. Our judgment, well above that.
LOCKSTEP_FLOOR = 0.02
# Strategies whose every forward gathers sharded parameters from the other ranks, in evaluation too (by the
# strategy's class name: Lightning's FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, and subclasses named
# after them).
SHARDED = ("FSDP", "DeepSpeed", "ModelParallel")
# Other processes are idle when they used less than half a CPU over the epoch (our judgment: on this project's
# idle 2-CPU machine, 0.0-0.1 CPUs; beside two CPU burners, 1.9-2.0): the wait is then the run's own doing.
OUTSIDE_LOAD = 0.5
# ... or less, down to this, where they used at least as many CPUs as the training thread waited for: beside two
# CPU burners on 2 CPUs, Lightning's PPO example (2 torch threads, a Python rollout) left the burners 0.4 CPUs,
# its thread waited 19% of the epoch, and it was titled "the run's own threads crowd it". An idle machine's other
# processes used 0.0-0.1 CPUs (our judgment between them).
OUTSIDE_FLOOR = 0.25
# /proc/stat counts each CPU's time in ticks of 1/USER_HZ = 10 ms (proc(5)), so over a short epoch the other
# processes' load is known to +-2 ticks per CPU over its wall time: a 16 ms validation epoch on 2 idle CPUs read
# 1.5-1.7 CPUs, and its cpu_contention said "the machine is busy". Judged only where that error leaves the
# measure on one side of OUTSIDE_LOAD (on 2 CPUs: from about 0.16 s of wall time).
LOAD_TICK = 0.01
TICKS_NOTE = "other processes' CPU time is counted in 10 ms ticks"
LOAD_NOTE = f"the epoch was too short: {TICKS_NOTE}"
UNMEASURED = "other processes' CPU time was not measured"
# Where the wait is the run's own (or cannot be told to come from outside), a mean wait per batch below this is
# information only: fewer threads then cost more than the wait. Measured on 2 idle CPUs, Lightning's
# bug_report_model (200 epochs of 4 batches) waited 0.3 ms a batch (10-16% of its epochs) with torch's 2 threads,
# and `torch.set_num_threads(1)` made its fit 1.1-1.3x slower (2.8-3.3 s against 3.0-4.0 s, 3 rounds); a dataset
# sleeping 5 ms per sample left its training thread waiting 13% of the epoch, and one thread made the fit 1.3x
# faster. Our judgment between the two.
OWN_MIN_WAIT = 1e-3
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
