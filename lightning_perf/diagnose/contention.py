"""
CPU contention
==============

A busy machine, as a finding of its own (``cpu_contention``). What it does to the other findings is
:mod:`~lightning_perf.diagnose.busy_machine`.

The training thread's time waiting in the kernel's run queue for a CPU (``EpochSummary.cpu_wait_share``, from
``/proc/self/schedstat``) is time every host-side clock counts as work: the data wait of an in-memory
DataLoader, the Python between operators, an optimizer's kernels, a step's spread. On a 2-CPU machine with two
other CPU-bound processes it reached 50-90% of the epoch, and the other rules then blamed the program for it:
``dataloader_bound`` (critical) on an in-memory dataset, ``framework_overhead`` on a step with no hooks,
``step_time_unstable`` advising bucketing for fixed-size batches, ``optimizer_heavy`` on one fused kernel.

**Several ranks** step in lockstep: every step ends at a collective (DDP's gradient all-reduce, FSDP's gathers),
so a rank preempted for a scheduler slice stalls every other at the next one, and the ranks' steps wait for a
CPU whenever any rank does (:func:`wait_share`), rank zero's own wait being only its part. Measured:
Lightning's ``BoringModel`` under ``ddp`` on 2 gloo ranks sharing 2 CPUs, 40 epochs: ``step_time_unstable``
warned in 6-8 of them (p90 1.9-2.4x of 3.7-5 ms steps, the same on both ranks) while rank zero alone waited
4.5-9.4% of each, under ``cpu_contention``'s threshold.
"""

from __future__ import annotations

from lightning_perf.diagnose.model import Finding, RunFacts, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process, finding, reaches, stage_name
from lightning_perf.diagnose.step_tried import thread_setting, tried_step_advice
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import EpochSummary
from lightning_perf.units import cpus as cpu_use
from lightning_perf.units import ms, percent, plural, seconds_or_ms


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
        5. A virtual machine's steal time (:func:`steal_share`: its host ran something else on the CPUs) counts
           with the wait (:func:`own_wait`); where it is at least :data:`STEAL_CAUSE` of the wait counted, the
           title and advice name the host.
        6. Where the advice's ``torch.set_num_threads(N)`` was tried on one real step (``StageEpoch.advice_trials``,
           :mod:`~lightning_perf.diagnose.step_tried`), the advice leads with the measurement; one not
           ``advice_trial_min_gain`` times as fast is withdrawn. The severity stays: the wait was measured.
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
    stolen = steal_share(ctx.epoch) or 0.0
    host = stolen >= STEAL_CAUSE * share
    if stolen > 0:
        evidence.append(
            f"the virtual machine's host took the CPUs {percent(stolen)} of the epoch (steal time, counted with the"
            " wait: the run queue cannot see it)"
        )
    outside = load_is_outside(ctx)  # None: cannot tell
    if ctx.epoch.other_cpu_load is not None:
        evidence.append(
            f"other processes on the machine used {ctx.epoch.other_cpu_load:.1f} CPUs meanwhile"
            + ("" if outside is not None else f" (too short to tell from none: {TICKS_NOTE})")
        )
    busy = outside is True
    oversubscribed = cpus is not None and threads + workers > cpus
    if host:
        advice = [_HOST_ADVICE]
    elif oversubscribed:
        assert cpus is not None
        fit = max(cpus - workers, 1)
        used = ctx.epoch.worker_cpu / wall if workers and ctx.epoch.worker_cpu is not None and wall else None
        busy_workers = f" (using {cpu_use(used)} in all)" if used is not None else ""
        named = "torch thread" if facts.device == "cpu" else "thread"
        advice = [
            f"The run oversubscribes its CPUs: {plural(threads, named)} and"
            f" {plural(workers, 'worker')}{busy_workers} on {plural(cpus, 'CPU')} take turns."
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
        advice = [_own_threads_advice(threads, workers, facts, unknown=unknown)]
    waited = share * (wall or 0.0) / max(ctx.epoch.batches, 1)
    if not host and not busy and not oversubscribed and wall and waited < OWN_MIN_WAIT:
        severity = "info"
        evidence.append(f"{ms(waited)} a batch: below {ms(OWN_MIN_WAIT)}, fewer threads would cost more than they save")
    advice, _ = tried_step_advice(
        ctx.advice_trials, "cpu_contention", advice, t.advice_trial_min_gain, thread_setting(advice)
    )
    why = (
        "the virtual machine's host took the CPU"
        if host
        else "the machine is busy"
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
    """The share of the epoch the run's steps waited for a CPU: the training thread's own (:func:`own_wait`, a
    virtual machine's steal time in it); under several
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
    own = own_wait(ctx.epoch)
    others = lockstep_waits(ctx)
    if own is None or not others:
        return own
    running = 1.0 - own
    for wait in others:
        running *= 1.0 - min(wait, 1.0)
    return 1.0 - running


def own_wait(epoch: EpochSummary) -> float | None:
    """The share of the epoch the training thread waited for a CPU: in the run queue (``cpu_wait_share``), or
    while a virtual machine's host held the CPUs (:func:`steal_share`), were the two independent:
    ``1 - (1 - wait) * (1 - steal)``. ``None`` where the run queue was not read.

    Notes:
        The host's steal is the CPUs' share, not the thread's own: a thread on a CPU the host took stops with it,
        and Linux counts that neither as its CPU time nor as its wait in the run queue (measured on this
        project's 2-CPU VM: 1.6% of the time since boot, in bursts).
    """
    wait = epoch.cpu_wait_share
    if wait is None:
        return None
    return 1.0 - (1.0 - wait) * (1.0 - (steal_share(epoch) or 0.0))


def steal_share(epoch: EpochSummary) -> float | None:
    """The share of the epoch a virtual machine's host took the CPUs (``EpochSummary.cpu_steal_share``), less
    what ``/proc/stat``'s 10 ms ticks may add over the epoch's wall time (:data:`LOAD_TICK`: under a tick per
    CPU); ``None`` where not measured."""
    steal, wall = epoch.cpu_steal_share, epoch.wall_time
    if steal is None or not wall:
        return None
    return max(steal - LOAD_TICK / wall, 0.0)


def lockstep_waits(ctx: StageEpoch) -> list[float]:
    """The other ranks' waits that :func:`wait_share` adds to rank zero's own: none outside lockstep (its Notes
    3), and none under :data:`LOCKSTEP_FLOOR`."""
    if ctx.stage != "train" and not any(s in (ctx.facts.strategy or "") for s in SHARDED):
        return []
    return [w for rank, w in (ctx.rank_cpu_waits or {}).items() if rank != 0 and w >= LOCKSTEP_FLOOR]


def _waited(ctx: StageEpoch, share: float) -> str:
    """Evidence: how long the epoch's steps waited for a CPU, and on which rank (:func:`wait_share`)."""
    if not lockstep_waits(ctx):
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


_HOST_ADVICE = (
    "The virtual machine's host ran other work on this machine's CPUs (steal time: `top` shows it as `st`): no"
    " change to the program removes it. Time runs on a dedicated or larger instance, or where steal stays near"
    " zero, and compare runs only from such machines."
)


def _own_threads_advice(threads: int, workers: int, facts: RunFacts, *, unknown: str | None) -> str:
    """Advice where the machine's other processes were idle, or, where ``unknown`` says why, not known to be;
    the suspects named are those the run has (workers where it has some, the other ranks of a distributed run)."""
    device = facts.device
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
    suspects = [
        *([f"the DataLoader's {plural(workers, 'worker')}"] if workers else []),
        *(["the run's other ranks on this node and their gloo threads"] if facts.world_size > 1 else []),
        "other callbacks' or loggers' threads",
        "a compile worker pool",
    ]
    return (
        f"{opening} ({', '.join(suspects)}). Look for threads that spin or poll (`top -H -p <pid>`), and compare"
        " runs with fewer of them (`lightning-perf compare`)."
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
# The host's steal is named as the cause (title and advice) where it is at least half of the wait counted (our
# judgment: the larger part).
STEAL_CAUSE = 0.5
# Where the wait is the run's own (or cannot be told to come from outside), a mean wait per batch below this is
# information only: fewer threads then cost more than the wait. Measured on 2 idle CPUs, Lightning's
# bug_report_model (200 epochs of 4 batches) waited 0.3 ms a batch (10-16% of its epochs) with torch's 2 threads,
# and `torch.set_num_threads(1)` made its fit 1.1-1.3x slower (2.8-3.3 s against 3.0-4.0 s, 3 rounds); a dataset
# sleeping 5 ms per sample left its training thread waiting 13% of the epoch, and one thread made the fit 1.3x
# faster. Our judgment between the two.
OWN_MIN_WAIT = 1e-3
