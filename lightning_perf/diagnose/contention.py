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

So, from ``cpu_contention`` on (:func:`measured_while_busy`), the findings of the :data:`TIME_SHARE_RULES` are
information only, their evidence opening with "measured while the machine was busy": the waiting may explain
what they see, and no change to the program would remove it. One exception: ``dataloader_bound`` is judged on
the part of the data wait spent off the CPU, neither running nor waiting for a CPU (the sampled waits' share
the training process was not on or queued for a CPU, ``1 - EpochSummary.loading_cpu_share``: a dataset that
sleeps, reads a disk or the network), which contention does not explain: where that part alone reaches
``dataloader_warning``, the finding keeps a severity set by it, so that a real bottleneck is still found on a
busy machine (measured: a dataset sleeping 2 ms per item beside two CPU burners on 2 CPUs waited 87% of the
step, half of it off the CPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process, finding, reaches, stage_name
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.units import percent, plural, seconds_or_ms

# The rules whose measure is a share of host time that waiting for a CPU inflates.
TIME_SHARE_RULES = frozenset(
    {"dataloader_bound", "framework_overhead", "step_time_unstable", "optimizer_heavy", "launch_bound", "cpu_threads"}
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
           fewer workers); else the load comes from outside the run, and the advice says so.
    """
    share = ctx.epoch.cpu_wait_share
    if share is None or not reaches(share, t.cpu_contention):
        return None
    severity: Severity = "critical" if reaches(share, t.cpu_contention_critical) else "warning"
    facts = ctx.facts
    cpus = cpus_per_process(facts)
    threads = (facts.torch_threads or 1) if facts.device == "cpu" else 1
    workers = facts.num_workers or 0
    wall = ctx.epoch.wall_time
    evidence = [
        f"the training thread waited for a CPU {percent(share)} of the epoch"
        + (f" ({seconds_or_ms(share * wall)} of {seconds_or_ms(wall)})" if wall else "")
        + f" (warning >= {percent(t.cpu_contention)}, critical >= {percent(t.cpu_contention_critical)})",
        _cpus(facts.cpu_count, facts.cpu_quota, cpus, facts.world_size > 1),
        f"the process runs {plural(threads, 'torch thread' if facts.device == 'cpu' else 'thread')} and"
        f" {plural(workers, 'DataLoader worker')}",
    ]
    if cpus is not None and threads + workers > cpus:
        fit = max(cpus - workers, 1)
        advice = [
            f"The run oversubscribes its CPUs: {threads} + {workers} busy threads on {plural(cpus, 'CPU')} take turns."
            f" Call `torch.set_num_threads({fit})` before training (e.g. at the top of the script or in"
            " `LightningModule.setup`)"
            + (f", or lower `DataLoader(num_workers=...)` below {workers}" if workers else "")
            + ", and compare the runs with `lightning-perf compare`."
        ]
    else:
        advice = [
            f"The load comes from outside this run: its {plural(threads + workers, 'busy thread')} fit its"
            f" {plural(cpus or 1, 'CPU')}, yet the training thread waited for one, so other processes hold them."
            " Free the CPUs (stop or `renice` the other work, or give the run CPUs of its own with `taskset` or a"
            " container's CPU limit), and time runs only on an idle machine. The epoch's other time-share findings"
            " were measured while the machine was busy and are information only."
        ]
    return finding(
        ctx,
        "cpu_contention",
        severity,
        f"{stage_name(ctx.stage)} waited for a CPU {percent(share)} of the time: the machine is busy",
        evidence,
        advice,
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


def measured_while_busy(findings: Sequence[Finding], ctx: StageEpoch, t: Thresholds) -> list[Finding]:
    """``findings`` as they stand on a busy machine (see the module's docstring): on an epoch whose training
    thread waited for a CPU ``cpu_contention`` of the time or more, the time-share findings that waiting may
    explain become information, with what was measured."""
    share = ctx.epoch.cpu_wait_share
    if share is None or not reaches(share, t.cpu_contention):
        return list(findings)
    note = (
        f"measured while the machine was busy (the training thread waited for a CPU {percent(share)} of the"
        " epoch: see `cpu_contention`), which may explain it; "
    )
    judged = []
    for f in findings:
        if f.id not in TIME_SHARE_RULES or f.severity == "info":
            judged.append(f)
        elif (
            f.id == "dataloader_bound"
            and (off := _off_cpu_wait(ctx)) is not None
            and reaches(off, t.dataloader_warning)
        ):
            severity: Severity = "critical" if reaches(off, t.dataloader_critical) else "warning"
            judged.append(
                dataclasses.replace(
                    f,
                    severity=severity,
                    evidence=f"{percent(off)} of the step waited off the CPU (not explained by the busy machine:"
                    f" the training thread waited for a CPU {percent(share)} of the epoch); " + f.evidence,
                )
            )
        else:
            judged.append(dataclasses.replace(f, severity="info", evidence=note + f.evidence))
    return judged


def _off_cpu_wait(ctx: StageEpoch) -> float | None:
    """The share of the step the data wait spent neither on nor queued for a CPU; ``None`` where unmeasured."""
    on_cpu = ctx.epoch.loading_cpu_share
    if on_cpu is None:
        return None
    return ctx.epoch.data_wait_fraction * max(0.0, 1.0 - on_cpu)
